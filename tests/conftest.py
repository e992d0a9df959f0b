"""The test session never writes to the real HOME: Ray (2.60) writes ``~/.ray/auth_token`` the
first time a local instance starts, and a token left there changes the auth mode of every
later Ray on the machine (the raylet test then fails on the next run). Every test, and every
process a test starts (``dpmarket run`` subprocesses, ``ray start``), gets a temporary HOME,
removed at the end of the session."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_SAVED: dict[str, str | None] = {}
_HOME: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    home = tempfile.mkdtemp(prefix="dpmarket-test-home-")
    _HOME.append(home)
    _SAVED["HOME"] = os.environ.get("HOME")
    os.environ["HOME"] = home  # Ray's token path is Path.home() / ".ray" / "auth_token"


def pytest_unconfigure(config: pytest.Config) -> None:
    for key, value in _SAVED.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    for home in _HOME:
        shutil.rmtree(home, ignore_errors=True)

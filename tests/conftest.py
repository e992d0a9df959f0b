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


# The Ray part's longest files (benchmarks/RESULTS.md, "Test suite time (issue 37)": each takes
# 2-5 minutes) are collected first, longest first: pytest-xdist's ``--dist loadfile`` hands the
# files to its workers in collection order, so these start at once and the short files fill in
# around them, and the two workers finish together instead of one starting a long file last.
FIRST = (
    "integration/test_remote_market.py",
    "integration/test_crash_resume.py",
    "integration/test_remote_faults.py",
    "integration/test_fault_matrix.py",
    "integration/test_raylet_cluster.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.path.as_posix()
        return next((i for i, name in enumerate(FIRST) if path.endswith(name)), len(FIRST))

    items.sort(key=rank)  # stable: collection order within a file and among the rest

"""The Python API refuses what the command line refuses, before Ray starts (no Ray here): a
configuration changed in code after it was parsed skipped the parse-time refusals, so
``dpmarket.run_market`` parses its text and overrides again and refuses any difference; and it
warns of noise from a public seed as ``dpmarket run`` does."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import dpmarket
from dpmarket.actors.commands.main import main
from dpmarket.actors.randomness import NOISE_WARNING

ROOT = Path(__file__).resolve().parents[1]
FILES = ROOT / "configs" / "files-example.toml"
DEMO = ROOT / "configs" / "demo.toml"


class _RayStarted(Exception):
    """Raised where the run would connect to Ray."""


def _no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    def connect(*args: Any, **kwargs: Any) -> Any:
        raise _RayStarted

    monkeypatch.setattr("dpmarket.actors.run.market.connect", connect)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"reproducible_noise": True}, "reproducible_noise"),
        ({"overrides": {"neighbouring": "add_remove"}}, "overrides"),
    ],
)
def test_a_files_config_changed_in_code_is_refused_before_ray(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict[str, Any], field: str
) -> None:
    """The parse refuses noise from a public seed and add/remove neighbours on private files;
    the same values put in with ``dataclasses.replace`` are refused by ``run_market``, naming
    the field, before Ray starts or OUT is written."""
    _no_ray(monkeypatch)
    config = dpmarket.load_config(FILES)
    replaced = dataclasses.replace(config, **change)
    out = tmp_path / "out"
    with pytest.raises(dpmarket.ConfigError, match=f"changed after it was parsed.*{field}"):
        dpmarket.run_market(replaced, out, echo=False)
    assert not out.exists()


def test_the_api_warns_of_noise_from_a_public_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A simulation with ``[run].reproducible_noise`` (allowed: no private data) bought from
    Python is warned about as from the command line, once, before Ray starts; ``validate``
    warns too."""
    _no_ray(monkeypatch)
    config = dpmarket.load_config(DEMO, ["run.reproducible_noise=true"])
    with pytest.raises(_RayStarted):
        dpmarket.run_market(config, tmp_path / "api", echo=False)
    assert capsys.readouterr().err.count(NOISE_WARNING) == 1
    with pytest.raises(_RayStarted):
        main(["run", str(DEMO), "--set", "run.reproducible_noise=true",
              "--out", str(tmp_path / "cli")])  # fmt: skip
    assert capsys.readouterr().err.count(NOISE_WARNING) == 1
    assert main(["validate", str(DEMO), "--set", "run.reproducible_noise=true"]) == 0
    assert capsys.readouterr().err.count(NOISE_WARNING) == 1


def test_a_config_as_parsed_runs_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaded with overrides (the way to change a value), the config passes the check and the
    run goes on to Ray."""
    _no_ray(monkeypatch)
    config = dpmarket.load_config(DEMO, {"data.n_points": 400, "summary.tau": 2})
    with pytest.raises(_RayStarted):
        dpmarket.run_market(config, tmp_path / "out", echo=False)

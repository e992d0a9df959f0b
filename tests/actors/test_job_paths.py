"""Paths of a run inside ``ray job submit`` (issue 27 parts 3-5): the job's working directory is
Ray's per-job package cache, so an output directory there is refused, a resume reads nothing
from it, and ``validate`` says which placed owners' files it did not check."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from dpmarket.actors.commands.main import main
from dpmarket.actors.config.journaled import journal_config, stage_consumer_files
from dpmarket.actors.config.market import ConfigError, MarketConfig, load_market_config
from dpmarket.actors.config.validate import RAY_JOB_ENV, check_inputs, ray_job_submission
from dpmarket.actors.run import market as market_module

EXAMPLE = Path(__file__).resolve().parents[2] / "configs"
JOB = "raysubmit_27"


def _in_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """What Ray 2.60's job supervisor hands its entrypoint (job_supervisor.py)."""
    value = {"runtime_env": {"working_dir": "gcs://_ray_pkg_x.zip"}, "metadata": {
        "job_submission_id": JOB, "job_name": JOB}}  # fmt: skip
    monkeypatch.setenv(RAY_JOB_ENV, json.dumps(value))


def _placed_example(working_dir: Path, placed: tuple[str, ...] = ("owner-2", "owner-3")) -> Path:
    """configs/files-example.toml in a job's working directory, ``placed`` owners on site_b
    with their files at absolute paths on that node."""
    shutil.copytree(EXAMPLE / "example-data", working_dir / "example-data")
    text = (EXAMPLE / "files-example.toml").read_text()
    for owner in placed:
        text = text.replace(f'"example-data/{owner}.csv"', f'"/srv/site-b/{owner}.csv"')
    text += "".join(f"\n[owners.{o}]\nresources = {{ site_b = 1 }}\n" for o in placed)
    path = working_dir / "market.toml"
    path.write_text(text)
    return path


def test_a_job_is_recognised_by_the_variable_the_job_supervisor_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(RAY_JOB_ENV, raising=False)
    assert ray_job_submission() is None
    _in_job(monkeypatch)
    assert ray_job_submission() == JOB


@pytest.mark.parametrize("out", [["--out", "out/x"], []])  # --out, and the default [run].out
def test_a_relative_out_inside_a_job_is_refused_with_the_reason(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    out: list[str],
) -> None:
    path = _placed_example(tmp_path)
    monkeypatch.chdir(tmp_path)  # the job's working directory
    _in_job(monkeypatch)
    assert main(["run", str(path), *out]) == 2
    err = capsys.readouterr().err
    assert JOB in err and "package cache" in err and "absolute --out" in err
    assert ("--out 'out/x'" if out else "[run].out 'out/files-example'") in err
    assert main(["validate", str(path), *out]) == 2  # validate says the same before a run
    assert main(["resume", "out/x"]) == 2
    assert "package cache" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written into the cache


def test_an_absolute_out_inside_a_job_and_a_relative_one_outside_are_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _placed_example(tmp_path / "job")
    monkeypatch.chdir(tmp_path / "job")
    _in_job(monkeypatch)
    assert main(["validate", str(path), "--out", str(tmp_path / "out")]) == 0
    assert f"out: {tmp_path / 'out'}" in capsys.readouterr().out
    monkeypatch.delenv(RAY_JOB_ENV)
    assert main(["validate", str(path), "--out", "out/x"]) == 0
    assert f"out: {tmp_path / 'job' / 'out' / 'x'}" in capsys.readouterr().out


def test_resume_reads_nothing_from_the_jobs_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Part 3: the config and the consumer's files are journaled under OUT/.journal when the run
    starts; after Ray clears the package cache (the whole working directory gone) the resume
    restores the same configuration, reading the consumer's copies."""
    working_dir = tmp_path / "runtime_resources" / "working_dir_files" / "_ray_pkg_x"
    config = load_market_config(_placed_example(working_dir, ("owner-1", "owner-2", "owner-3")))
    out = tmp_path / "srv" / "out"
    journal = out / ".journal"
    journal.mkdir(parents=True)
    staged = stage_consumer_files(config, journal)  # what run_market does before any spend
    journal_config(staged, journal)
    (journal / "journal.json").write_text(json.dumps({"state": "running"}))
    shutil.rmtree(tmp_path / "runtime_resources")  # the cache cleared, or the head rebooted
    seen: dict[str, Any] = {}

    def run(config: MarketConfig, *args: Any, **kwargs: Any) -> Any:
        seen["config"] = config
        return market_module.MarketOutcome(0, "ok", None)

    monkeypatch.setattr(market_module, "run_market", run)
    market_module.resume_market(out)
    restored: MarketConfig = seen["config"]
    for key in ("validation", "seed_set"):
        assert Path(restored.data[key]).parent == journal / "inputs"
        assert Path(restored.data[key]).is_file()
    assert restored.placement == config.placement
    assert restored.data["files"]["owner-2"] == ["/srv/site-b/owner-2.csv"]
    assert restored.written_data == config.written_data  # report.json: as written
    assert check_inputs(restored).schema == config.schema


def test_validate_names_each_placed_owner_whose_files_it_did_not_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(RAY_JOB_ENV, raising=False)
    path = _placed_example(tmp_path)
    assert main(["validate", str(path), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    for owner in ("owner-2", "owner-3"):
        line = next(x for x in captured.out.splitlines() if x.startswith(owner))
        assert f"/srv/site-b/{owner}.csv: NOT CHECKED here" in line
        assert "resources {'site_b': 1.0}" in line and "on its node" in line
    assert not any(
        x.startswith("owner-1") and "NOT CHECKED" in x for x in captured.out.splitlines()
    )
    assert "NOT CHECKED: the files of placed owners owner-2, owner-3" in captured.err
    assert not captured.err.rstrip().endswith(": valid")


def test_validate_of_a_market_without_placed_owners_says_valid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(EXAMPLE / "example-data", tmp_path / "example-data")
    shutil.copy(EXAMPLE / "files-example.toml", tmp_path / "files.toml")
    assert main(["validate", str(tmp_path / "files.toml"), "--out", str(tmp_path / "o")]) == 0
    captured = capsys.readouterr()
    assert "NOT CHECKED" not in captured.out + captured.err
    assert captured.err.rstrip().endswith(": valid")


def test_relative_out_refusal_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpmarket.actors.config.validate import check_out_in_job

    _in_job(monkeypatch)
    with pytest.raises(ConfigError, match="Ray job raysubmit_27"):
        check_out_in_job("out", "--out")
    check_out_in_job("/srv/out", "--out")


def test_resume_refuses_an_unplaced_owner_whose_files_were_in_the_cache(tmp_path: Path) -> None:
    """An owner's files are fingerprinted, not copied (they are the owner's): files that lived
    in the job's working directory are gone with it, and the resume says so by name."""
    working_dir = tmp_path / "runtime_resources" / "_ray_pkg_x"
    config = load_market_config(_placed_example(working_dir))  # owner-1's files in the cache
    journal = tmp_path / "out" / ".journal"
    journal.mkdir(parents=True)
    journal_config(stage_consumer_files(config, journal), journal)
    (journal / "journal.json").write_text(json.dumps({"state": "running"}))
    shutil.rmtree(tmp_path / "runtime_resources")
    with pytest.raises(ConfigError, match=r"\[data.files\].owner-1: .*owner-1.csv changed"):
        market_module.resume_market(tmp_path / "out")


def test_a_budget_store_in_the_jobs_working_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A relative ``ledger_dir`` is taken from the config's directory: in a job, Ray's cache."""
    path = _placed_example(tmp_path / "job")
    text = path.read_text().replace(
        "[privacy]\n", '[privacy]\nowner_budget = 2\nledger_dir = "stores"\n', 1
    )
    path.write_text(text)
    monkeypatch.chdir(tmp_path / "job")
    out = ["--out", str(tmp_path / "out")]
    monkeypatch.delenv(RAY_JOB_ENV, raising=False)
    assert main(["validate", str(path), *out]) == 0  # outside a job: a path like any other
    _in_job(monkeypatch)
    assert main(["validate", str(path), *out]) == 2
    err = capsys.readouterr().err
    assert "[owners.owner-1] ledger" in err and "package cache" in err and JOB in err
    absolute = text.replace('ledger_dir = "stores"', f'ledger_dir = "{tmp_path / "stores"}"')
    path.write_text(absolute)
    assert main(["validate", str(path), *out]) == 0

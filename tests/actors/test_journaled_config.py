"""The configuration a run journals when it starts and ``resume`` restores (issue 28 part 1):
every ``--set`` kept, the file never read again, input files that changed refused by name."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from dpmarket.actors.commands.main import main
from dpmarket.actors.config.inputs import FaultConfig
from dpmarket.actors.config.journaled import (
    journal_config,
    restore_config,
    same_unreleased_start,
    stage_consumer_files,
)
from dpmarket.actors.config.market import ConfigError, MarketConfig, load_market_config
from dpmarket.actors.run import market as market_module

ROOT = Path(__file__).resolve().parents[2]
ROWS = "".join(f"{0.1 * i:.1f},{1 - 0.1 * i:.1f},{i % 2}\n" for i in range(8))
OVERRIDES = ["privacy.eps_scan=2.0", "market.owners=8", "market.tolerance=3"]


def _demo(tmp_path: Path) -> Path:
    """A copy of configs/demo.toml the test may change on disk."""
    path = tmp_path / "demo.toml"
    path.write_text((ROOT / "configs" / "demo.toml").read_text())
    return path


def _files_market(tmp: Path) -> Path:
    """A 2-owner files market (2 features and a label), data relative to the config."""
    (tmp / "d").mkdir(exist_ok=True)
    for name in ("owner-1", "owner-2", "validation", "seed"):
        (tmp / "d" / f"{name}.csv").write_text(ROWS)
    config = tmp / "files.toml"
    config.write_text(
        "[run]\nname = 'v'\n[market]\nowners = 2\ntolerance = 0\nsummary_size = 4\n"
        "[data]\nsource = 'files'\nfeatures = 2\nlabel_column = 2\nlower = 0.0\nupper = 1.0\n"
        "validation = 'd/validation.csv'\nseed_set = 'd/seed.csv'\n"
        "[data.files]\n'owner-1' = ['d/owner-1.csv']\n'owner-2' = ['d/owner-2.csv']\n"
    )
    return config


def _journal(config: MarketConfig, out: Path) -> MarketConfig:
    """What a fresh run does before anything is spent (actors/run/market.py run_market)."""
    journal = out / ".journal"
    journal.mkdir(parents=True, exist_ok=True)
    staged = stage_consumer_files(config, journal)
    journal_config(staged, journal)
    return staged


def _without_faults(config: MarketConfig) -> MarketConfig:
    return dataclasses.replace(config, faults=FaultConfig())


def test_resume_restores_every_override_and_never_reads_the_file_again(tmp_path: Path) -> None:
    """The issue's cases: eps_scan = 2.0 (the scan's sigma), owners = 8 and T = 3 set on the
    command line survive a resume even after the file changed or vanished."""
    path = _demo(tmp_path)
    config = load_market_config(path, OVERRIDES)
    _journal(config, tmp_path / "out")
    path.write_text(path.read_text().replace("eps_scan = 0.5", "eps_scan = 0.1"))
    restored = restore_config(tmp_path / "out" / ".journal")
    assert _without_faults(restored) == _without_faults(config)
    assert restored.secure["eps_scan"] == 2.0
    assert (restored.owners, restored.tolerance) == (8, 3)
    path.unlink()
    assert restore_config(tmp_path / "out" / ".journal").owner_names == config.owner_names


def test_resume_market_hands_the_run_its_journaled_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``resume_market`` runs the journaled config (not the file, which now says otherwise)."""
    path = _demo(tmp_path)
    out = tmp_path / "out"
    _journal(load_market_config(path, OVERRIDES), out)
    (out / ".journal" / "journal.json").write_text(json.dumps({"state": "running"}))
    path.write_text(path.read_text().replace("owners = 4", "owners = 5"))
    seen: dict[str, Any] = {}

    def run(config: MarketConfig, *args: Any, **kwargs: Any) -> Any:
        seen["config"] = config
        return market_module.MarketOutcome(0, "ok", None)

    monkeypatch.setattr(market_module, "run_market", run)
    market_module.resume_market(out)
    assert seen["config"].owners == 8
    assert seen["config"].secure["eps_scan"] == 2.0


def test_a_journal_without_its_config_is_refused(tmp_path: Path) -> None:
    """A journal written before configs were journaled: exit 2, never the file's config."""
    journal = tmp_path / ".journal"
    journal.mkdir()
    (journal / "config_path").write_text(str(ROOT / "configs" / "demo.toml"))
    (journal / "journal.json").write_text(json.dumps({"state": "running"}))
    assert main(["resume", str(tmp_path)]) == 2
    with pytest.raises(ConfigError, match="no journaled configuration"):
        restore_config(journal)


def test_a_config_changed_in_code_is_journaled_as_not_restorable(tmp_path: Path) -> None:
    config = dataclasses.replace(load_market_config(_demo(tmp_path)), seed=99)
    _journal(config, tmp_path / "out")
    with pytest.raises(ConfigError, match="cannot be restored"):
        restore_config(tmp_path / "out" / ".journal")


def test_files_market_reads_the_consumer_copies_and_keeps_written_paths(tmp_path: Path) -> None:
    config = load_market_config(_files_market(tmp_path), ["summary.tau=2"])
    staged = _journal(config, tmp_path / "out")
    inputs = tmp_path / "out" / ".journal" / "inputs"
    assert Path(staged.data["validation"]).parent == inputs
    assert Path(staged.data["validation"]).read_text() == ROWS
    assert staged.written_data == config.written_data  # report.json: as the operator wrote it
    (tmp_path / "d" / "validation.csv").write_text(ROWS + "0.5,0.5,1\n")  # the original moved on
    (tmp_path / "d" / "seed.csv").unlink()
    restored = restore_config(tmp_path / "out" / ".journal")
    assert _without_faults(restored) == _without_faults(staged)
    assert restored.overrides["tau"] == 2


def test_a_consumer_file_whose_bytes_changed_is_refused_by_name(tmp_path: Path) -> None:
    staged = _journal(load_market_config(_files_market(tmp_path)), tmp_path / "out")
    Path(staged.data["seed_set"]).write_text(ROWS.replace("0.1", "0.2"))  # the copy damaged
    restored = restore_config(tmp_path / "out" / ".journal")  # the identical original is read
    assert restored.data["seed_set"] == str(tmp_path / "d" / "seed.csv")
    (tmp_path / "d" / "seed.csv").write_text(ROWS[:-1])  # and the original changed too
    with pytest.raises(ConfigError, match=r"\[data\]\.seed_set: the consumer's file changed"):
        restore_config(tmp_path / "out" / ".journal")


def test_owner_files_may_grow_or_rotate_but_not_change_what_was_read(tmp_path: Path) -> None:
    _journal(load_market_config(_files_market(tmp_path)), tmp_path / "out")
    journal = tmp_path / "out" / ".journal"
    owner = tmp_path / "d" / "owner-1.csv"
    with owner.open("a") as f:  # appended: owners keep ingesting
        f.write("0.3,0.3,1\n")
    restore_config(journal)
    os.rename(owner, tmp_path / "d" / "owner-1.csv.1")  # rotated: the tailer reads the sibling
    owner.write_text("0.9,0.9,0\n")
    restore_config(journal)
    (tmp_path / "d" / "owner-1.csv.1").write_text(ROWS.replace("0.4", "0.6"))  # rewritten
    with pytest.raises(ConfigError, match=r"\[data.files\]\.owner-1: .*owner-1\.csv changed"):
        restore_config(journal)
    assert main(["resume", str(tmp_path / "out")]) == 2  # no journal.json: refused all the same


def test_a_rerun_keeps_the_ledger_run_only_of_the_same_purchase_that_released_nothing(
    tmp_path: Path,
) -> None:
    """A run stopped before the curator's first snapshot (the warm-up) and run again into the
    same OUT with the same effective configuration keeps its ledger run (its up-front charges,
    the consumer's validation plan, are not paid twice); a changed configuration, a journal
    snapshot (something may have been released) or no journaled start is a new purchase."""
    config = _files_market(tmp_path)
    out, journal = tmp_path / "out", tmp_path / "out" / ".journal"
    first = _journal(load_market_config(config), out)
    assert same_unreleased_start(journal, stage_consumer_files(load_market_config(config), journal))
    assert same_unreleased_start(journal, first)
    changed = load_market_config(config, ["market.summary_size=5"])
    assert not same_unreleased_start(journal, stage_consumer_files(changed, journal))
    (tmp_path / "d" / "validation.csv").write_text(ROWS + "0.5,0.5,1\n")  # another consumer set
    other = stage_consumer_files(load_market_config(config), journal)
    assert not same_unreleased_start(journal, other)
    (journal / "journal.json").write_text(json.dumps({"state": "new"}))  # a snapshot: maybe seen
    assert not same_unreleased_start(journal, first)
    assert not same_unreleased_start(tmp_path / "elsewhere", first)


def test_a_resume_whose_config_now_selects_another_mechanism_is_refused(tmp_path: Path) -> None:
    """A journal written when a config without [summary] meant herding-select, resumed after
    the default became random-select: refused, naming both, instead of owners following one
    plan and the restored curator another."""
    from dpmarket.actors.config.journaled import check_resumed_mechanism

    demo = (ROOT / "configs" / "demo.toml").read_text(encoding="utf-8")
    plain = tmp_path / "plain.toml"
    plain.write_text(demo[: demo.index("[summary]")], encoding="utf-8")
    now = load_market_config(plain).curator_params(0.5, 200)  # random-select, the default
    then = load_market_config(ROOT / "configs" / "demo.toml").curator_params(0.5, 200)
    assert (now.mechanism, then.mechanism) == ("random-select", "herding-select")
    snapshot = {"params": dataclasses.asdict(then), "state": "epochs"}
    with pytest.raises(ConfigError, match="runs herding-select, but its configuration now"):
        check_resumed_mechanism(snapshot, now, tmp_path)
    check_resumed_mechanism(snapshot, then, tmp_path)  # the same mechanism: resumed
    check_resumed_mechanism({"params": dataclasses.asdict(now)}, now, tmp_path)


class _Started(Exception):
    """Raised where the run would spawn its actors: the plan it was given is recorded."""


@pytest.mark.parametrize("change", ["grown", "rotated"])
def test_a_resume_and_a_rerun_plan_the_normalise_round_the_run_journaled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """The normalise round is skipped when the owners' files hold too few records for its
    noise (16 records against sigma 32 here; 208 clear 3 sigma). Owners' files may grow
    between a run and its resume, or rotate (the count at the path falls): either way a resume
    and a rerun of the unreleased start plan the round as the run journaled it, never from a
    recount, so no charged round opens that the run skipped and no charged round is reported
    skipped."""
    config = _files_market(tmp_path)
    text = config.read_text().replace("upper = 1.0\n", "upper = 1.0\nbound = 1.0\n")
    config.write_text(text + "[privacy]\neps_normalise = 0.3\n")
    owners = [tmp_path / "d" / f"owner-{i}.csv" for i in (1, 2)]
    if change == "rotated":  # the run starts with 208 records: the round runs
        for owner in owners:
            owner.write_text(ROWS * 13)
    plans: list[Any] = []

    def drive(config: MarketConfig, inputs: Any, run_plan: Any, *args: Any) -> Any:
        plans.append(run_plan)
        raise _Started

    monkeypatch.setattr(market_module, "connect", lambda address: {})
    monkeypatch.setattr(market_module, "_drive", drive)
    out = tmp_path / "out"
    with pytest.raises(_Started):
        market_module.run_market(load_market_config(config), out)
    skipped = plans[0].normalise_skipped
    assert (skipped is not None) == (change == "grown")
    for owner in owners:
        if change == "grown":  # 208 records now: a recount would run the round
            with owner.open("a") as f:
                f.write(ROWS * 12)
        else:  # rotated: 8 records at each path, the read bytes in the sibling
            os.rename(owner, owner.with_name(owner.name + ".1"))
            owner.write_text(ROWS)
    with pytest.raises(_Started):  # the same purchase's unreleased start, run again
        market_module.run_market(load_market_config(config), out)
    (out / ".journal" / "journal.json").write_text(json.dumps({"state": "new"}))
    with pytest.raises(_Started):
        market_module.resume_market(out)
    assert [plan.normalise_skipped for plan in plans] == [skipped] * 3
    assert plans[1].records == plans[2].records == plans[0].records

"""Issue 14 item 7: a small fault matrix on Ray. K = 6 owners, T = 2 (configs/dropout.toml made
small); 0, 1, 2 and 3 owner actors killed from outside (``ray.kill`` by name) at phases a fixed
seed picks: warm-up (as soon as the actor exists), the secure sums (normalise opened in the
journal) or an epoch (the journal's epoch number). Up to T the run completes (exit 0) with a
full summary; above T it refuses (exit 3) and ``dpmarket resume OUT`` does what the journal
allows. Every ledger is compared with an uninterrupted run under the same reproducible noise."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dpmarket.actors.commands.main import main
from tests.integration.test_market import ROOT

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

K, T, P = 6, 2, 6
RUN = "dropout"  # [run].name: actors are dpmarket:dropout:owner-N in namespace dpmarket-dropout
SECURE = ("normalise (secure sum)", "scan (secure sum)")
SMALL = [
    "--set", f"market.summary_size={P}", "--set", "data.n_points=1200",
    "--set", "data.n_test=200", "--set", "run.deadline_seconds=3.0",
    "--set", "run.reproducible_noise=true", "--set", "market.owners_per_actor=1",
    "--set", "faults.kill={}", "--set", "faults.slow={}",
]  # fmt: skip
# nothing random without a kill: one uninterrupted cell; for 1, 2 and 3 kills the seeds whose
# plans (below) cover every phase within T and above it. Seeds 1-2 (one kill at epoch 2) and
# 2-2 (two kills in the epochs) repeated 1-0 and 2-0's phases and were left out (issue 37):
#   1-0 epoch | 1-1 warm-up | 2-0 secure sums + epoch | 2-1 secure sums + warm-up
#   3-0, 3-2 warm-up + secure sums + epoch | 3-1 secure sums twice + epoch
CELLS = [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]


def _run(out: Path) -> int:
    return main(["run", str(ROOT / "configs" / "dropout.toml"), "--out", str(out), *SMALL])


def _journal(out: Path) -> dict[str, Any]:
    try:
        return json.loads((out / ".journal" / "journal.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def _plan(killed: int, seed: int) -> dict[str, tuple[str, int]]:
    """owner -> (phase, epoch) for the cell: which owners die and when, from the seed."""
    rng = random.Random(1000 * killed + seed)
    owners = rng.sample([f"owner-{i + 1}" for i in range(K)], killed)
    return {o: (rng.choice(["warm-up", "secure sums", "epoch"]), rng.randint(1, 3)) for o in owners}


def _due(out: Path, phase: str, epoch: int) -> bool:
    if phase == "warm-up":  # the actor exists: the driver spawned the market
        return (out / ".journal" / "config_path").exists()
    snapshot = _journal(out)
    if phase == "secure sums":
        rounds = snapshot.get("secure_phases", {}).get("rounds", {})
        return "normalise" in rounds
    return int((snapshot.get("epoch") or {}).get("number", 0)) >= epoch


def _run_killing(out: Path, plan: dict[str, tuple[str, int]]) -> tuple[int, list[str]]:
    import ray

    finished, killed = threading.Event(), []

    def killer() -> None:
        todo = dict(plan)
        while todo and not finished.is_set():
            for owner, (phase, epoch) in list(todo.items()):
                if not _due(out, phase, epoch):
                    continue
                try:
                    handle = ray.get_actor(f"dpmarket:{RUN}:{owner}", namespace=f"dpmarket-{RUN}")
                except ValueError:
                    continue  # not spawned yet
                ray.kill(handle, no_restart=True)
                killed.append(owner)
                del todo[owner]
            time.sleep(0.01)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        code = _run(out)
    finally:
        finished.set()
        thread.join()
    return code, killed


def _events(ledgers: dict[str, Any], party: str) -> list[tuple[str, int, float]]:
    return sorted((e["label"], e["count"], e.get("sigma", 0.0)) for e in ledgers[party])


def _ledgers(report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {p: v["events"]["events"] for p, v in report["privacy"]["parties"].items()}


def _steps(events: list[dict[str, Any]]) -> int:
    return sum(e["count"] for e in events if e["label"] == "auction step")


def _check_ledgers(report: dict[str, Any], whole: dict[str, Any], lost: set[str]) -> None:
    """Survivors: the secure-sum and validation events exactly as uninterrupted, one auction step
    per auction epoch; a lost owner: a subset of them (each at most once), fewer steps."""
    got, ref = _ledgers(report), _ledgers(whole)
    assert set(got) == set(ref)
    auction_epochs = report["outcome"]["epochs"] - report["outcome"]["exploration_epochs"]
    assert got["validation"] == ref["validation"]
    for party in (p for p in got if p != "validation"):
        secure = [e for e in _events(got, party) if e[0] in SECURE]
        expected = [e for e in _events(ref, party) if e[0] in SECURE]
        assert all(e[1] == 1 for e in secure), (party, secure)  # each secure sum once
        if party in lost:
            assert set(secure) <= set(expected), party
            assert _steps(got[party]) <= auction_epochs, party
        else:
            assert secure == expected, party
            assert _steps(got[party]) == auction_epochs, party


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("matrix") / "whole"
    assert _run(out) == 0
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    assert report["parsimony"]["summary_size"] == P
    return report


@pytest.mark.parametrize(("n_killed", "seed"), CELLS)
def test_owners_killed_from_outside(
    tmp_path: Path, whole: dict[str, Any], n_killed: int, seed: int
) -> None:
    plan = _plan(n_killed, seed)
    out = tmp_path / "run"
    code, killed = _run_killing(out, plan)
    assert sorted(killed) == sorted(plan), f"kills {plan} landed for {killed} only"
    if n_killed <= T:
        assert code == 0, plan
        report = json.loads((out / "report.json").read_text())
        assert report["outcome"]["state"] == "done"
        assert report["parsimony"]["summary_size"] == P
        assert len((out / "summary.csv").read_text().splitlines()) == P + 1
        assert set(report["faults"]["lost"]) <= set(killed)
        _check_ledgers(report, whole, set(killed))
        return
    assert code == 3, plan
    # nothing partial: the journal and the stopped run's report (exit 3)
    assert sorted(p.name for p in out.iterdir()) == [".journal", "report.json"]
    assert json.loads((out / "report.json").read_text())["outcome"]["state"] == "refused"
    snapshot = _journal(out)
    assert snapshot["state"] == "refused"
    if (snapshot.get("refusal") or {}).get("before_start"):
        # refused in a secure sum, before any epoch: nothing to resume, run again
        assert main(["resume", str(out)]) == 2
        return
    # refused at an epoch: resume spawns the owners' actors anew (the killed ones restored)
    assert main(["resume", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["outcome"]["state"] == "done" and report["parsimony"]["summary_size"] == P
    _check_ledgers(report, whole, set(killed))

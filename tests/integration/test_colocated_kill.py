"""Co-located owners die with their actor process (issue 29, part 3): the owners lost, not the
actors, count against T; the report lists them; above T exit 3; resume completes.

K = 24 owners, four per actor process (six owner actors), T = 5.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpmarket.actors.commands.main import main
from tests.integration.test_market import SMALL  # the small demo market's --set

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

ROOT = Path(__file__).resolve().parents[2]
OWNERS = [
    "market.owners=24",
    "market.owners_per_actor=4",
    "market.tolerance=5",
    "run.deadline_seconds=5.0",
]
MARKET = [*SMALL, *(a for s in [*OWNERS, "data.n_points=2400"] for a in ("--set", s))]
FIRST_ACTOR = ["owner-1", "owner-2", "owner-3", "owner-4"]  # owners-1-2-3-4


def _run(out: Path, kill: str) -> int:
    demo = str(ROOT / "configs" / "demo.toml")
    return main(["run", demo, "--out", str(out), *MARKET, "--set", f"faults.kill_actor={kill}"])


def test_an_actor_of_four_owners_killed_loses_four_owners_within_t(tmp_path: Path) -> None:
    out = tmp_path / "four"
    assert _run(out, "{owner-2 = 3}") == 0
    report = json.loads((out / "report.json").read_text())
    assert report["faults"]["lost"] == dict.fromkeys(FIRST_ACTOR, 3)
    [verdict] = report["faults"]["verdicts"]
    assert verdict["fault"] == "owner actor killed at epoch 3" and verdict["party"] == "owner-2"
    assert verdict["verdict"] == "tolerated" and verdict["owners_lost"] == FIRST_ACTOR
    assert verdict["t_used"] == "4 of T = 5"


def test_two_actors_killed_lose_eight_owners_above_t_and_resume_completes(
    tmp_path: Path,
) -> None:
    out = tmp_path / "eight"
    assert _run(out, "{owner-2 = 3, owner-7 = 3}") == 3
    # nothing partial: the journal and the stopped run's report (exit 3)
    assert sorted(p.name for p in out.iterdir()) == [".journal", "report.json"]
    assert json.loads((out / "report.json").read_text())["outcome"]["state"] == "refused"
    snapshot = json.loads((out / ".journal" / "journal.json").read_text())
    assert snapshot["state"] == "refused"
    assert len(snapshot["refusal"]["lost"]) > 5  # owners counted, not the two actors
    assert set(snapshot["refusal"]["lost"]) <= set(FIRST_ACTOR) | {
        f"owner-{i}" for i in range(5, 9)
    }
    assert main(["resume", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["outcome"]["state"] == "done" and report["parsimony"]["summary_size"] == 12

"""The remote market under faults (issue 38): stop before charging, never skip a phase.

Every party is its own agent process (tests/integration/remote_setup.py). A party that "does not
join" is one whose agent is never started: at the join deadline the market sees it as refused
or absent, the same as an agent whose connection the network or the gateway refuses. No
assertion reads a clock.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.remote_setup import build, charged_rows, release_counts

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RUN = 900.0  # seconds a market run may take on 2 loaded cores (generous; never asserted)
JOIN = 90.0  # the join deadline: the absent parties are waited for this long


def _report(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "report.json").read_text()))


def test_two_owners_absent_at_the_join_stop_before_any_release_and_a_rerun_is_clean(
    tmp_path: Path,
) -> None:
    """Two of four owners absent at the join deadline with T = 1: exit 3 before the normalise
    round opens, owner-1 and owner-2 (who joined and accepted) charged nothing, report.json
    names the absent owners and why; the same command run again with every owner back
    completes and charges each release once."""
    with build(tmp_path / "m", join_deadline=JOIN) as market:
        out = tmp_path / "out"
        driver = market.run(out)
        market.start_agents([*market.nodes, "owner-1", "owner-2"])
        assert driver.wait(timeout=RUN) == 3
        for owner in market.owners:
            assert charged_rows(market.store(owner)) == [], owner  # nothing released or paid
        report = _report(out)
        assert report["outcome"]["state"] == "refused"
        assert report["outcome"]["phase"] == "join" and not report["outcome"]["resumable"]
        assert report["faults"]["lost"] == ["owner-3", "owner-4"]
        assert report["faults"]["remote"]["absent"] == ["owner-3", "owner-4"]
        assert "not joined by the deadline" in report["outcome"]["reason"]
        assert {c["pld"] for c in report["charged"].values()} == {0.0}
        stopped = [*market.nodes, "owner-1", "owner-2"]
        assert market.wait_agents(stopped) == dict.fromkeys(stopped, 3)  # told: stopped short

        again = market.run(out)  # the same command
        market.start_agents()
        assert again.wait(timeout=RUN) == 0
        assert _report(out)["outcome"]["state"] == "done"
        for owner in market.owners:
            counts = release_counts(market.store(owner))
            assert counts and max(counts.values()) == 1, (owner, counts)


def test_a_compute_node_missing_stops_the_purchase_naming_it(tmp_path: Path) -> None:
    """node-3 never joins: the run does not complete; it stops before any release with exit 3
    naming node-3 (in its own output and in report.json), nobody is charged, and no raw
    traceback reaches the operator."""
    with build(tmp_path / "m", join_deadline=JOIN) as market:
        out = tmp_path / "out"
        driver = market.run(out)
        market.start_agents([*market.nodes[:2], *market.owners])
        assert driver.wait(timeout=RUN) == 3
        log = market.log("market").read_text()
        assert "node-3" in log and "Traceback" not in log, log[-3000:]
        report = _report(out)
        assert report["outcome"]["state"] == "refused"
        assert "node-3" in report["outcome"]["reason"] and report["faults"]["nodes"] == ["node-3"]
        for owner in market.owners:
            assert charged_rows(market.store(owner)) == [], owner
        assert {c["pld"] for c in report["charged"].values()} == {0.0}

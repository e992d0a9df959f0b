"""A market that lies about its secure sums' sensitivities gets nothing (issue 36, "Done when").

The market process is tests/integration/lying_market.py: ``dpmarket run`` whose normalise and
scan sensitivities are understated 20x, sigma calibrated to the lie, so every declared noise
multiplier looks honest. The agents are configs/remote/'s as shipped (their policies, bounds
and noise; only the address and their folders adjusted: remote_setup.py ``build_shipped``).
Every owner derives each round's sensitivity from what it sends and declines, naming the
declared and its own figure; the run stops short and no owner's store holds a charge. The same
shipped build with an honest market completes (tests/integration/test_agent_install.py, with the
agents from their own install): the shipped agents decline the lie, not the market.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.integration.remote_setup import build_shipped, charged_rows

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RUN = 900.0  # seconds a market run may take on 2 loaded cores (generous; never asserted)
LIAR = [sys.executable, str(Path(__file__).with_name("lying_market.py"))]
DECLARES = re.compile(
    r"secure sum '(\w+)': the market declares L2 sensitivity ([\d.e+-]+), "
    r"this owner's own figure for what it sends is ([\d.e+-]+)"
)


def test_a_market_understating_its_sensitivities_20x_gets_nothing(tmp_path: Path) -> None:
    with build_shipped(tmp_path / "m") as market:
        parties = [*market.nodes, *market.owners]
        out = tmp_path / "lying"
        driver = market.run(out, entry=LIAR)
        market.start_agents()
        assert driver.wait(timeout=RUN) == 3  # every owner lost, T = 1: stopped short
        assert market.wait_agents(parties) == dict.fromkeys(parties, 3)  # told: stopped short
        market_log = market.log("market").read_text()
        # every owner declined the offer: the market stops at the joins, before any round
        assert "dpmarket: refused before any release (join): 4 owners cannot take part" in (
            market_log
        )
        assert "no release was made; nothing to resume" in market_log
        stopped = json.loads((out / "report.json").read_text())  # a stopped run's report
        assert stopped["outcome"]["state"] == "refused"
        assert stopped["outcome"]["phase"] == "join"
        assert stopped["faults"]["lost"] == market.owners
        assert stopped["charged"] == {o: {"pld": 0.0, "releases": 0} for o in market.owners}
        for owner in market.owners:
            told = f"dpmarket: {owner} takes no part in this purchase: "
            (declined,) = [line for line in market_log.splitlines() if line.startswith(told)]
            (own,) = [
                line
                for line in market.log(owner).read_text().splitlines()
                if "declined purchase" in line
            ]
            assert declined.removeprefix(told) in own  # the owner's own reason, as it gave it
            figures = {label: (said, own) for label, said, own in DECLARES.findall(declined)}
            assert sorted(figures) == ["normalise", "scan"]
            for declared, actual in figures.values():  # the lie, found by the owner itself
                assert float(actual) / float(declared) == pytest.approx(20.0, rel=1e-5)
            assert charged_rows(market.store(owner)) == []

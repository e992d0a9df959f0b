"""Owners that come back (issue 38): T counts the owners absent from each epoch, and a lost
owner the runtime reports reachable again takes part from the next epoch. In-process, on
simulated time (LoopbackTransport)."""

from __future__ import annotations

import pytest

from dpmarket.actors.parties.transport import FaultPlan, LoopbackTransport
from dpmarket.protocol.summary.curator import Curator
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.wire.codec import Message
from dpmarket.streams.synthetic import Scenario
from tests.small import small_curator, small_params, small_scenario

RUN = "returning-run"


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return small_scenario(11)


def _market(scenario: Scenario, silent: dict[str, int]) -> tuple[Curator, LoopbackTransport]:
    """T = 1; each owner in ``silent`` has its answers of that one epoch lost (a blink)."""
    curator = small_curator(RUN, scenario, small_params(scenario, max_lost=1), 0)
    owners = [
        Owner(n, RUN, X, y) for n, (X, y) in zip(scenario.owner_names, scenario.owners, strict=True)
    ]

    def blink(msg: Message) -> bool:
        return silent.get(msg.sender) == msg.round

    transport = LoopbackTransport([curator, *owners], faults=FaultPlan(drop=blink))
    transport.send(curator.start())
    return curator, transport


def _finished(curator: Curator) -> bool:
    return curator.state in ("done", "refused")


def test_two_owners_each_absent_from_one_epoch_are_within_t_when_they_come_back(
    scenario: Scenario,
) -> None:
    first, second = scenario.owner_names[:2]
    curator, transport = _market(scenario, {first: 2, second: 4})
    for owner in (first, second):
        transport.run_until(lambda o=owner: o in curator.lost or _finished(curator))
        assert curator.state not in ("done", "refused")
        curator.returned({owner})  # its link is back: it takes part from the next epoch
    transport.run_until(lambda: _finished(curator))
    assert curator.state == "done", curator.reason  # never more than one absent from an epoch
    assert {first, second} <= curator.live
    assert sorted((o, e) for e, o, _ in curator.dropped) == [(first, 2), (second, 4)]


def test_without_coming_back_the_second_loss_exceeds_t(scenario: Scenario) -> None:
    first, second = scenario.owner_names[:2]
    curator, transport = _market(scenario, {first: 2, second: 4})
    transport.run_until(lambda: _finished(curator))
    assert curator.state == "refused"
    assert curator.refusal["lost"] == sorted([first, second])


def test_only_lost_owners_are_taken_back(scenario: Scenario) -> None:
    """``returned`` names owners the runtime can reach; only the lost ones come back (a live
    owner or a stranger is not added)."""
    first, second = scenario.owner_names[:2]
    curator, transport = _market(scenario, dict.fromkeys([first], 2))
    transport.run_until(lambda: first in curator.lost or _finished(curator))
    curator.returned({first, second, "stranger"})
    assert curator.back == {first}

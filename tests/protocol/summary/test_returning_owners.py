"""Owners that come back (issue 38): T counts the owners absent from each epoch, and a lost
owner the runtime reports reachable again takes part from the next epoch. In-process, on
simulated time (LoopbackTransport)."""

from __future__ import annotations

import pytest

from dpmarket.actors.parties.transport import FaultPlan, LoopbackTransport
from dpmarket.protocol.summary.curator import MAX_RETURNS, Curator
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.wire.codec import Message
from dpmarket.streams.synthetic import Scenario
from tests.small import small_curator, small_params, small_scenario

RUN = "returning-run"


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return small_scenario(11)


def _market(
    scenario: Scenario, silent: dict[str, int], for_good: bool = False, epochs: int = 10
) -> tuple[Curator, LoopbackTransport]:
    """T = 1; each owner in ``silent`` has its answers of that one epoch lost (a blink), or of
    that epoch and every later one (``for_good``: an owner that stays silent on purpose)."""
    params = small_params(scenario, max_lost=1, max_epochs=epochs)
    curator = small_curator(RUN, scenario, params, 0)
    owners = [
        Owner(n, RUN, X, y) for n, (X, y) in zip(scenario.owner_names, scenario.owners, strict=True)
    ]

    def blink(msg: Message) -> bool:
        start = silent.get(msg.sender)
        return start is not None and (msg.round == start or (for_good and msg.round > start))

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


def test_an_owner_that_keeps_missing_the_deadline_is_taken_back_at_most_max_returns_times(
    scenario: Scenario,
) -> None:
    """The runtime says a silent owner is reachable after every loss (an agent that dials in
    again each time): it is taken back MAX_RETURNS times, each costing the run one deadline,
    and then stays lost with the reason in ``kept_out``; the run finishes (one owner absent
    from each epoch is within T = 1)."""
    silent = scenario.owner_names[0]
    curator, transport = _market(scenario, {silent: 2}, for_good=True, epochs=12)

    def done() -> bool:
        if silent in curator.lost and silent not in curator.live:
            curator.returned({silent})  # reachable again, by the runtime's word
        return _finished(curator)

    transport.run_until(done)
    assert curator.state == "done", curator.reason
    assert curator.epoch.number > 2 + 2 * MAX_RETURNS  # room for more returns than allowed
    drops = [e for e, o, _ in curator.dropped if o == silent]
    assert len(drops) == MAX_RETURNS + 1  # the first loss and one after each return
    assert curator.returns == {silent: MAX_RETURNS}
    assert silent in curator.kept_out() and "not taken back" in curator.kept_out()[silent]
    curator.returned({silent})
    assert silent not in curator.back

"""``max_points`` (issue 18): the curator never receives more distinct owner points than the
budget, in exploration and steering epochs, under allocate-select, and across a resume."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from dpmarket.actors.parties.transport import FaultPlan, LoopbackTransport
from dpmarket.protocol.summary.allocate import plan_allocation
from dpmarket.protocol.summary.curator import Curator, CuratorParams
from dpmarket.protocol.summary.journal import restore_curator, snapshot_curator
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.summary.params import ParamError
from dpmarket.streams.synthetic import Scenario
from tests.small import small_curator, small_params, small_scenario

RUN = "budget-run"


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return small_scenario(5)


def _owners(scenario: Scenario, seed: int = 0, floor: float | None = None) -> list[Owner]:
    return [
        Owner(n, RUN, X, y, rng=np.random.default_rng([seed, i]), profile_floor=floor)
        for i, (n, (X, y)) in enumerate(zip(scenario.owner_names, scenario.owners, strict=True))
    ]


def _run(
    curator: Curator, owners: list[Owner], first: list, faults: FaultPlan | None = None
) -> None:
    transport = LoopbackTransport([curator, *owners], faults=faults)
    transport.send(first)
    transport.run_until(lambda: curator.state in ("done", "refused"))


def _select(scenario: Scenario, **kw: object) -> CuratorParams:
    """herding-select with one exploration point per summary point (as the configs default)."""
    options: dict[str, object] = {"explore_share": 1.0} | kw
    return small_params(
        scenario, summary_release="herding", validation_release="gaussian",
        auction_variant="pure", tau=1, eps_auction=1e-6, max_deliveries=1,
        final_selection="exact", **options,
    )  # fmt: skip


def test_params_refuse_a_budget_below_p_and_allocate_without_one(scenario: Scenario) -> None:
    with pytest.raises(ParamError, match=r"max_points: 9 is below p = 10") as info:
        small_params(scenario, max_points=9)
    assert info.value.field == "max_points"
    with pytest.raises(ParamError, match=r"max_points: expected an integer >= 1"):
        small_params(scenario, max_points=2.5)
    with pytest.raises(
        ParamError, match=r"max_points: max_points = None cannot be used with allocate-select"
    ) as refused:
        small_params(scenario, allocate=True, final_selection="exact")
    assert refused.value.passing == ("max_points", 15)  # the key that fails, a value that passes
    assert small_params(scenario, max_points=10).max_points == 10


@pytest.mark.parametrize("budget", [10, 15, 23])
def test_exploration_and_steering_never_exceed_the_budget(scenario: Scenario, budget: int) -> None:
    # exploration alone would ask ceil(10 / 4) * 4 = 12 points, steering about 4 per epoch
    unbounded = small_curator(RUN, scenario, _select(scenario), 0)
    _run(unbounded, _owners(scenario), unbounded.start())
    assert unbounded.transfers.distinct_points > 23  # the budget binds in every case below

    curator = small_curator(RUN, scenario, _select(scenario, max_points=budget), 0)
    _run(curator, _owners(scenario), curator.start())
    assert curator.state == "done" and curator.reason == "point budget reached"
    assert curator.transfers.distinct_points == budget
    assert len(curator.pool) <= budget
    assert len(curator.result().provenance) == 10  # the summary is still p points


def test_the_budget_holds_across_a_refusal_and_resume(scenario: Scenario) -> None:
    names = list(scenario.owner_names)
    params = _select(scenario, max_points=17, max_lost=1)
    curator = small_curator(RUN, scenario, params, 1)
    faults = FaultPlan(kill_at={names[0]: 3, names[1]: 3})  # in the exploration epochs
    _run(curator, _owners(scenario), curator.start(), faults)
    assert curator.state == "refused"
    seen = curator.transfers.distinct_points
    assert 0 < seen <= 17

    snap = json.loads(json.dumps(snapshot_curator(curator)))
    resumed = restore_curator(
        snap, scenario.validation, scenario.seed_set, rng=np.random.default_rng(2)
    )
    assert resumed.transfers.distinct_points == seen
    _run(resumed, _owners(scenario), resumed.resume())
    assert resumed.state == "done" and resumed.reason == "point budget reached"
    assert resumed.transfers.distinct_points == 17


def test_allocate_select_buys_exactly_its_budget_and_resumes_within_it(scenario: Scenario) -> None:
    base = _select(scenario, explore_share=0.0)
    params = dataclasses.replace(base, **plan_allocation(1.0, 1e-5, base.p, 15))
    curator = small_curator(RUN, scenario, params, 3)
    _run(curator, _owners(scenario, floor=params.profile_floor), curator.start())
    assert curator.state == "done"
    assert curator.quotas is not None and sum(curator.quotas.values()) == 15
    assert curator.transfers.distinct_points <= 15 and len(curator.result().provenance) == 10

    # killed mid-run, then resumed from the journal: the quotas and the count carry over
    names = list(scenario.owner_names)
    second = small_curator(RUN, scenario, dataclasses.replace(params, max_lost=1), 3)
    faults = FaultPlan(kill_at={names[0]: 4, names[2]: 4})
    _run(second, _owners(scenario, floor=params.profile_floor), second.start(), faults)
    assert second.state == "refused"
    snap = json.loads(json.dumps(snapshot_curator(second)))
    resumed = restore_curator(
        snap, scenario.validation, scenario.seed_set, rng=np.random.default_rng(4)
    )
    assert resumed.quotas == second.quotas
    hedge = dict(second.random_quotas)  # the plan's hedge: the budget beyond p, at random
    assert sum(hedge.values()) == 5 and resumed.random_quotas == hedge
    _run(resumed, _owners(scenario, floor=params.profile_floor), resumed.resume())
    assert resumed.state == "done" and resumed.transfers.distinct_points <= 15
    assert resumed.random_quotas == hedge  # other coins after the resume: never drawn again
    # the histogram (the default rule) is charged once per owner, not again on resume
    for owner in names:
        labels = [e.label for e in resumed.ledgers[owner].events]
        assert sum(label.startswith("allocation") for label in labels) == 1


def test_max_points_default_is_unbounded(scenario: Scenario) -> None:
    params = _select(scenario)
    assert params.max_points is None
    curator = small_curator(RUN, scenario, params, 0)
    _run(curator, _owners(scenario), curator.start())
    assert curator.reason == "complete"  # no budget: the run ends on p winners, as before

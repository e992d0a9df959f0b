"""random-select (issue 30): counts, quotas drawn by the curator's coins, uniform draws without
replacement by the owners, the exact final selection, and nothing charged to anybody; and the
allocation floor of allocate-select (no owner starved by its histogram)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpmarket.protocol.summary.allocate import floored_weights, plan_allocation, quotas
from dpmarket.protocol.summary.curator import Curator
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.summary.params import CuratorParams, ParamError
from dpmarket.protocol.summary.random_select import plan_random_select, random_quotas
from dpmarket.protocol.summary.snr import (
    owners_check,
    planned_owner_ledger,
    planned_validation_ledger,
    validation_check,
)
from dpmarket.streams.synthetic import Scenario
from tests.small import run_small, small_curator, small_params, small_scenario

RUN = "random-run"


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return small_scenario(11)


def _run(
    scenario: Scenario, seed: int, budget: int = 15, owner_seed: int = 0
) -> tuple[Curator, list[Owner]]:
    base = small_params(scenario, final_selection="exact")
    params = dataclasses.replace(base, **plan_random_select(base.p, budget))
    curator = small_curator(RUN, scenario, params, seed)
    return curator, run_small(RUN, scenario, curator, owner_seed)


def test_quotas_are_a_hypergeometric_draw_of_the_budget() -> None:
    counts = {"a": 50, "b": 30, "c": 20, "d": 0}
    draws = [random_quotas(counts, 40, np.random.default_rng(s)) for s in range(400)]
    assert all(sum(q.values()) == 40 and q["d"] == 0 for q in draws)
    assert all(q[o] <= counts[o] for q in draws for o in counts)
    means = {o: np.mean([q[o] for q in draws]) for o in counts}
    for owner, n in counts.items():  # E[q_i] = budget n_i / N
        assert means[owner] == pytest.approx(40 * n / 100, abs=0.6)
    assert random_quotas(counts, 500, np.random.default_rng(0)) == counts  # the whole pool
    one = random_quotas(counts, 40, np.random.default_rng(3))
    assert one == random_quotas(counts, 40, np.random.default_rng(3))  # same coins, same quotas


def test_a_run_buys_the_budget_once_each_and_selects_p(scenario: Scenario) -> None:
    curator, _ = _run(scenario, 0)
    res = curator.result()
    assert res.reason in ("allocation delivered", "point budget reached")
    assert res.transfers.distinct_points == 15 == res.transfers.total_transfers  # no repeats
    assert curator.quotas is not None and sum(curator.quotas.values()) == 15
    for owner, (X, _) in zip(scenario.owner_names, scenario.owners, strict=True):
        assert curator.records[owner] == len(X)  # the counts the owners sent
        got = sum(1 for o, _ in res.transfers.deliveries if o == owner)
        assert got == curator.quotas[owner]
    assert res.points is not None and len(res.points) == curator.params.p
    pool = {(e.owner, e.token) for e in curator.pool.entries}
    assert {(pr.owner, pr.token) for pr in res.provenance} <= pool  # kept among the bought


def test_nothing_is_charged_and_no_g_tilde_is_released(scenario: Scenario) -> None:
    curator, owners = _run(scenario, 1)
    for name in [*scenario.owner_names, "validation"]:
        assert not curator.ledgers[name].events, name
        assert curator.ledgers[name].epsilon(1e-5) == 0.0
    for owner in owners:  # what an owner was given in place of g_tilde: a public zero
        assert owner._g_validation is not None and not owner._g_validation.any()
    params = curator.params
    assert not planned_owner_ledger(params).events
    assert not planned_validation_ledger(params).events
    assert validation_check(params, 20, 1e-5).epsilon == 0.0
    assert "delivered points only" in owners_check(params, 1e-5).what


def test_the_purchase_is_uniform_over_the_pool(scenario: Scenario) -> None:
    """Over many runs every pooled record is bought about budget / N of the time (no owner and
    no record favoured): the curator's coins pick the quotas, the owners' keys the records."""
    hits: dict[tuple[str, int], int] = {}
    runs = 60
    for seed in range(runs):
        curator, _ = _run(scenario, seed, budget=15, owner_seed=1000 + seed)
        for key in curator.transfers.deliveries:
            hits[key] = hits.get(key, 0) + 1
    sizes = {n: len(X) for n, (X, _) in zip(scenario.owner_names, scenario.owners, strict=True)}
    total = sum(sizes.values())
    for owner, n in sizes.items():
        bought = sum(v for (o, _), v in hits.items() if o == owner)
        expected = runs * 15 * n / total
        assert abs(bought - expected) < 4 * np.sqrt(expected) + 1, (owner, bought, expected)


def test_random_select_needs_a_budget_and_the_exact_selection(scenario: Scenario) -> None:
    with pytest.raises(ParamError, match="random_purchase"):
        CuratorParams(p=5, random_purchase=True, final_selection="exact")  # no max_points
    with pytest.raises(ParamError, match="random_purchase"):
        CuratorParams(p=5, random_purchase=True, max_points=8)  # no final selection
    with pytest.raises(ParamError, match="random-select"):
        CuratorParams(p=5, neighbouring="add_remove", **plan_random_select(5))  # counts sent
    assert CuratorParams(p=5, **plan_random_select(5)).mechanism == "random-select"
    assert CuratorParams(p=5, **plan_random_select(5)).max_points == 8


def test_the_floor_keeps_an_owner_the_histograms_starve() -> None:
    weights = {"a": 12.0, "b": 3.0, "c": 0.0}  # c's histogram showed nothing above threshold
    records = {"a": 60, "b": 60, "c": 60}
    assert quotas(weights, 15, records)["c"] == 0  # the wine failure
    floored = floored_weights(weights, records, 0.3)
    assert sum(floored.values()) == pytest.approx(1.0)
    assert floored["c"] == pytest.approx(0.1)  # 0.3 * 60 / 180
    assert quotas(floored, 15, records)["c"] >= 1
    assert floored_weights(weights, records, 0.0) == pytest.approx({"a": 0.8, "b": 0.2, "c": 0})
    with pytest.raises(ValueError, match="floor"):
        floored_weights(weights, records, 1.5)


def test_the_floor_charges_nothing_more(scenario: Scenario) -> None:
    base = small_params(
        scenario, summary_release="herding", validation_release="gaussian", tau=1,
        auction_variant="pure", eps_auction=1e-6, max_deliveries=1, final_selection="exact",
    )  # fmt: skip
    params = dataclasses.replace(base, **plan_allocation(0.8, 1e-5, base.p, 15, floor=0.5))
    curator = small_curator(RUN, scenario, params, 0)
    run_small(RUN, scenario, curator, 4)
    assert curator.quotas is not None
    total = sum(curator.records.values())
    for owner in scenario.owner_names:  # at least about half its size-proportional share
        assert curator.quotas[owner] >= int(0.5 * 15 * curator.records[owner] / total)
        assert len(curator.ledgers[owner].events) == 1  # its histogram, as without a floor
        assert curator.ledgers[owner].epsilon(1e-5) == pytest.approx(0.8, rel=1e-3)

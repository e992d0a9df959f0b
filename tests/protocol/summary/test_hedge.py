"""The hedge (issue 30): allocate-select buys ``random_share`` of its budget uniformly at random
(random-select's quotas and draws) and steers the rest; the random part is charged nothing, the
steered part exactly allocate-select's histogram; the split survives a journal round trip."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from dpmarket.protocol.summary.allocate import plan_allocation
from dpmarket.protocol.summary.curator import Curator
from dpmarket.protocol.summary.journal import restore_curator, snapshot_curator
from dpmarket.protocol.summary.messages import EpochBody
from dpmarket.protocol.summary.params import CuratorParams, ParamError
from dpmarket.protocol.summary.random_select import hedge_split
from dpmarket.protocol.summary.snr import (
    STEER_MIN_SNR,
    ReleaseCheck,
    recommend_mechanism,
    validation_check,
)
from dpmarket.streams.synthetic import Scenario
from tests.small import run_small, small_curator, small_params, small_scenario

RUN = "hedge-run"
BUDGET = 16


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return small_scenario(13)


def _hedged(
    scenario: Scenario, share: float, seed: int
) -> tuple[Curator, list[tuple[str, int, bool]]]:
    """A hedged allocate-select run in-process; also every epoch body the curator opened, as
    (owner, epoch, explore)."""
    base = small_params(
        scenario, summary_release="herding", validation_release="gaussian", tau=1,
        auction_variant="pure", eps_auction=1e-6, max_deliveries=1, final_selection="exact",
    )  # fmt: skip
    plan = plan_allocation(0.8, 1e-5, base.p, BUDGET, random_share=share)
    params = dataclasses.replace(base, **plan)
    curator = small_curator(RUN, scenario, params, seed)
    opened: list[tuple[str, int, bool]] = []
    body_of = curator._epoch_body

    def spy(owner: str, number: int, g: np.ndarray, q: int, explore: bool) -> EpochBody:
        body = body_of(owner, number, g, q, explore)
        opened.append((owner, number, body.explore))
        return body

    curator._epoch_body = spy  # type: ignore[method-assign]
    run_small(RUN, scenario, curator, seed)
    return curator, opened


def test_the_split_draws_the_random_share_from_the_counts() -> None:
    counts = {"a": 50, "b": 30, "c": 20, "d": 0}
    rng = np.random.default_rng(5)
    state = rng.bit_generator.state
    drawn, steered, left = hedge_split(counts, 40, 0.0, rng)
    assert (drawn, steered, left) == ({}, 40, counts)
    assert rng.bit_generator.state == state  # share 0 spends none of the curator's coins
    drawn, steered, left = hedge_split(counts, 40, 0.5, np.random.default_rng(5))
    assert sum(drawn.values()) == 20 and steered == 20 and drawn["d"] == 0
    assert all(left[o] == counts[o] - drawn[o] >= 0 for o in counts)
    drawn, steered, _ = hedge_split(counts, 40, 1.0, np.random.default_rng(5))
    assert sum(drawn.values()) == 40 and steered == 0
    with pytest.raises(ValueError, match="share"):
        hedge_split(counts, 40, 1.5, rng)


def test_each_owner_draws_its_random_quota_first_then_steers(scenario: Scenario) -> None:
    curator, opened = _hedged(scenario, 0.5, 0)
    res = curator.result()
    assert curator.quotas is not None
    assert sum(curator.quotas.values()) == BUDGET == res.transfers.distinct_points
    assert sum(curator.random_quotas.values()) == BUDGET // 2
    assert res.points is not None and len(res.points) == curator.params.p
    for owner in scenario.owner_names:
        assert curator.random_quotas[owner] <= curator.quotas[owner]
        delivered = sorted(e.epoch for e in curator.pool.entries if e.owner == owner)
        assert len(delivered) == curator.quotas[owner]
        # the epochs in which it delivered: the first random_quotas[owner] of them explored
        flags = [x for o, n, x in opened if o == owner and n in delivered]
        k = curator.random_quotas[owner]
        assert flags == [True] * k + [False] * (len(delivered) - k), owner


def test_the_random_share_is_charged_nothing(scenario: Scenario) -> None:
    """Hedged or not, each owner's ledger holds its one histogram event and the validation
    ledger its one release: the random part adds no event."""
    plain, _ = _hedged(scenario, 0.0, 1)
    hedged, _ = _hedged(scenario, 0.75, 1)
    assert sum(hedged.random_quotas.values()) == 12 and not plain.random_quotas
    for name in [*scenario.owner_names, "validation"]:
        assert len(hedged.ledgers[name].events) == len(plain.ledgers[name].events), name
        assert hedged.ledgers[name].epsilon(1e-5) == pytest.approx(
            plain.ledgers[name].epsilon(1e-5)
        )
    for owner in scenario.owner_names:
        assert len(hedged.ledgers[owner].events) == 1
        assert hedged.ledgers[owner].epsilon(1e-5) == pytest.approx(0.8, rel=1e-3)


def test_the_split_is_journaled(scenario: Scenario) -> None:
    curator, _ = _hedged(scenario, 0.5, 2)
    snap = json.loads(json.dumps(snapshot_curator(curator)))
    again = restore_curator(
        snap, scenario.validation, scenario.seed_set, rng=np.random.default_rng(0)
    )
    assert again.random_quotas == curator.random_quotas and again.quotas == curator.quotas
    del snap["allocation"]["random_quotas"]  # a journal written before the hedge
    older = restore_curator(
        snap, scenario.validation, scenario.seed_set, rng=np.random.default_rng(0)
    )
    assert older.random_quotas == {}


def test_a_random_share_needs_allocate_select() -> None:
    with pytest.raises(ParamError, match="random_share"):
        CuratorParams(p=5, random_share=0.5)
    with pytest.raises(ParamError, match="random_share"):
        CuratorParams(p=5, **plan_allocation(1.0, 1e-5, 5, random_share=1.5))
    params = CuratorParams(p=5, **plan_allocation(1.0, 1e-5, 5, random_share=0.5))
    assert params.mechanism == "allocate-select" and params.random_share == 0.5
    # None: the budget beyond p is bought at random, p points are steered
    assert plan_allocation(1.0, 1e-5, 20, 30, random_share=None)["random_share"] == 1 / 3
    assert plan_allocation(1.0, 1e-5, 20, 20, random_share=None)["random_share"] == 0
    drawn, steered, _ = hedge_split({"a": 100, "b": 100}, 30, 1 / 3, np.random.default_rng(0))
    assert sum(drawn.values()) == 10 and steered == 20


def _check(snr: float | None) -> ReleaseCheck:
    signal, noise = (None, None) if snr is None else (snr, 1.0)
    return ReleaseCheck("validation", "validation set", signal, noise, 3.0, 1e-5, "g_tilde")


def test_the_plan_recommends_by_budget_and_snr() -> None:
    """RESULTS.md "utility_vs_random": the hedged allocate-select ahead at a tight budget from
    SNR 0.45 on; random-select as good from 3 p on, and below the SNRs measured."""
    tight = CuratorParams(p=20, **plan_allocation(1.0, 1e-5, 20))  # 30 points = 1.5 p
    assert recommend_mechanism(tight, _check(0.5), 4)[0] == "allocate-select"
    assert recommend_mechanism(tight, _check(None), 4)[0] == "allocate-select"  # MWEM
    low, why = recommend_mechanism(tight, _check(STEER_MIN_SNR / 2), 4)
    assert low == "random-select" and "SNR" in why
    wide = CuratorParams(p=20, **plan_allocation(1.0, 1e-5, 20, 60))  # 3 p
    assert recommend_mechanism(wide, _check(0.9), 4)[0] == "random-select"
    unbounded = CuratorParams(p=20)  # herding-select accesses about (K + 1) p = 5 p
    name, why = recommend_mechanism(unbounded, _check(0.9), 4)
    assert name == "random-select" and "100 points" in why


def test_the_random_part_reads_only_the_counts(scenario: Scenario) -> None:
    """The adversary's question for the hedge: does the random part depend on anyone's records
    beyond the public counts? The same curator coins with owner 1's records replaced by others
    (same count, so other histograms and steered quotas) give the same random quotas."""
    X, y = scenario.owners[0]
    moved = np.clip(X[::-1] * 0.5 + 0.25, X.min(), X.max())  # other records, same count
    other = dataclasses.replace(scenario, owners=((moved, y), *scenario.owners[1:]))
    first, _ = _hedged(scenario, 0.5, 3)
    second, _ = _hedged(other, 0.5, 3)
    assert not all(
        np.array_equal(first.profiles[o], second.profiles[o]) for o in first.profiles
    )  # the histograms did see the change
    assert first.random_quotas == second.random_quotas
    assert sum(first.random_quotas.values()) == BUDGET // 2


def test_a_share_leaving_nothing_to_steer_is_refused() -> None:
    """Every owner would pay the histogram for a release that steers nothing."""
    with pytest.raises(ParamError, match="no point of max_points = 10 to steer"):
        CuratorParams(p=5, **plan_allocation(1.0, 1e-5, 5, 10, random_share=1.0))
    assert CuratorParams(p=5, **plan_allocation(1.0, 1e-5, 5, 10, random_share=0.9)).allocate
    with pytest.raises(ParamError, match="max_deliveries = 1"):
        CuratorParams(p=5, **(plan_allocation(1.0, 1e-5, 5, 10) | {"max_deliveries": 3}))


def test_the_preflight_warning_and_recommendation_agree_on_g_tilde() -> None:
    """Under allocate-select g_tilde is weak (a warning, a refusal under --strict) only below
    the SNR under which the plan recommends random-select; herding-select keeps SNR 1."""
    herding = CuratorParams(p=10, validation_sigma=4.0, validation_release="gaussian")
    steered = dataclasses.replace(herding, **plan_allocation(1.0, 1e-5, 10))
    per_point = validation_check(steered, 1, 1e-5).snr or 0.0  # the SNR grows as m
    assert 0 < per_point < 0.1
    m, low = round(0.7 / per_point), int(0.3 / per_point)  # SNR about 0.7, and below 0.3
    assert validation_check(herding, m, 1e-5).weak
    check = validation_check(steered, m, 1e-5)
    assert STEER_MIN_SNR <= (check.snr or 0) < 1.0 and not check.weak
    assert recommend_mechanism(steered, check, 4)[0] == "allocate-select"
    weak = validation_check(steered, low, 1e-5)
    assert weak.weak and recommend_mechanism(steered, weak, 4)[0] == "random-select"

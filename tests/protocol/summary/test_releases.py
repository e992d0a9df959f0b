"""Release mechanisms (protocol/summary/releases.py, channels.py): noise scales, tree
aggregation, herding, ledger.

Statistical checks estimate a noise variance from >= 8,000 independent draws, so a variance
ratio has standard error <= sqrt(2/8000) = 1.6%; windows are 5 standard errors wide, far
narrower than a factor-2 error in sigma (a factor 4 in variance).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from dp_accounting import gaussian_mechanism

from dpmarket.actors.harness.inprocess import run_inprocess
from dpmarket.protocol.privacy.ledger import ADD_REMOVE, REPLACE_ONE_RECORD, PrivacyLedger
from dpmarket.protocol.summary.channels import (
    GaussianChannel,
    HerdingChannel,
    TreeAggregator,
    TreeChannel,
)
from dpmarket.protocol.summary.curator import CuratorParams
from dpmarket.protocol.summary.h1 import RandomFourierFeatures
from dpmarket.protocol.summary.h2 import MwemHash
from dpmarket.protocol.summary.objective import greedy_hashed, hashed_bids
from dpmarket.protocol.summary.plan import dimension_rule, gaussian_noise_multiplier, plan_releases
from dpmarket.protocol.summary.releases import clip_rows, public_candidates, release_validation
from dpmarket.streams.synthetic import Scenario, gaussian_mixture_shift

DELTA = 1e-5


def hashed(n: int, d: int = 32, seed: int = 0) -> np.ndarray:
    h1 = RandomFourierFeatures(3, d, 0.5, seed)
    return h1(np.random.default_rng(seed).normal(size=(n, 3))).astype(np.float64)


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return gaussian_mixture_shift(
        np.random.default_rng(3), n_points=1500, n_owners=4, n_components=4, dim=5,
        n_validation=80, n_test=200, n_seed=20,
    )  # fmt: skip


def test_clip_rows_bounds_norms_and_keeps_short_rows() -> None:
    H = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    out = clip_rows(H, 1.0)
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]])
    with pytest.raises(ValueError, match="clip_norm"):
        clip_rows(H, 0.0)


def test_gaussian_multiplier_matches_dp_accounting_and_composes() -> None:
    for eps in (0.5, 1.0, 3.0):
        expected = gaussian_mechanism.get_sigma_gaussian(eps, DELTA)
        assert gaussian_noise_multiplier(eps, DELTA) == pytest.approx(expected, rel=1e-6)
    assert gaussian_noise_multiplier(1.0, DELTA, 9) == pytest.approx(
        3 * gaussian_noise_multiplier(1.0, DELTA), rel=1e-9
    )
    with pytest.raises(ValueError, match="eps"):
        gaussian_noise_multiplier(0.0, DELTA)


@pytest.mark.parametrize("neighbouring", ["add_remove", "replace"])
def test_gaussian_validation_noise_scale_and_ledger(neighbouring: str) -> None:
    d, m, z, clip = 64, 10, gaussian_noise_multiplier(3.0, DELTA), 1.1
    params = CuratorParams(
        p=1, d=d, validation_release="gaussian", validation_sigma=z, clip_norm=clip,
        neighbouring=neighbouring,
    )  # fmt: skip
    H = hashed(m, d)
    exact = clip_rows(H, clip).sum(axis=0)
    rng = np.random.default_rng(1)
    noise = np.array(
        [release_validation(H, params, PrivacyLedger("v"), rng) * m - exact for _ in range(150)]
    )
    delta_l2 = clip * (2.0 if neighbouring == "replace" else 1.0)
    ratio = float(np.mean(noise**2)) / (z * delta_l2) ** 2
    assert abs(ratio - 1.0) < 5 * math.sqrt(2.0 / noise.size)
    ledger = PrivacyLedger("validation")
    release_validation(H, params, ledger, rng)
    (event,) = ledger.events
    assert event.mechanism == "gaussian" and event.sensitivity == pytest.approx(delta_l2)
    assert ledger.epsilon(DELTA) == pytest.approx(3.0, abs=0.01)


def test_mwem_validation_is_the_papers_h2_and_is_fully_charged() -> None:
    params = CuratorParams(p=1, d=16, validation_iterations=40, eps_validation=0.5)
    H = hashed(20, 16)
    ledger = PrivacyLedger("validation")
    got = release_validation(H, params, ledger, np.random.default_rng(4))
    direct = MwemHash(16, params.grid_step).release(H, 0.5, 40, np.random.default_rng(4))
    np.testing.assert_array_equal(got, direct.mean)
    counts = {e.mechanism: e.count for e in ledger.events}
    assert counts == {"exponential": 40, "laplace": 40}


def test_tree_prefix_is_exact_without_noise_and_levels_grow_at_powers_of_two() -> None:
    rows = hashed(37, 8)
    tree = TreeAggregator(8, 0.0)
    rng = np.random.default_rng(0)
    for t, row in enumerate(rows, start=1):
        tree.append(row, rng)
        np.testing.assert_allclose(tree.prefix(), rows[:t].sum(axis=0), atol=1e-12)
        assert tree.levels == t.bit_length()
        containing_first = [key for key in tree._nodes if key[1] == 0]
        assert len(containing_first) == t.bit_length()  # the first point: one node per level
    with pytest.raises(ValueError, match="shape"):
        tree.append(np.zeros(3), rng)


def test_tree_prefix_noise_variance_is_popcount_sigma_squared() -> None:
    d, sigma = 4000, 2.0
    tree = TreeAggregator(d, sigma)
    rng = np.random.default_rng(5)
    for t in range(1, 12):
        tree.append(np.zeros(d), rng)
        ratio = float(np.mean(tree.prefix() ** 2)) / (bin(t).count("1") * sigma**2)
        assert abs(ratio - 1.0) < 5 * math.sqrt(2.0 / d)


def test_tree_channel_charges_one_gaussian_per_level() -> None:
    params = CuratorParams(p=30, d=8, summary_sigma=3.0, clip_norm=1.2)
    channel, ledger = TreeChannel(params), PrivacyLedger("owner")
    rows = hashed(29, 8).astype(np.float32)
    charged_at = []
    for q in range(1, 30):
        release = channel.release(rows[:q], np.random.default_rng(q))
        for event in release.events:
            ledger.record(event)
            charged_at.append(q)
        assert release.g_summary.shape == (8,)
    assert charged_at == [1, 2, 4, 8, 16]
    (event,) = ledger.events
    # replace-one (the default: q is public): Delta = 2 clip, sigma = z Delta
    assert event.count == (29).bit_length() and event.param("sigma") == pytest.approx(7.2)
    assert event.sensitivity == pytest.approx(2.4) and event.neighbouring == REPLACE_ONE_RECORD
    gaussian = GaussianChannel(params).release(rows[:3], np.random.default_rng(0))
    assert [e.count for e in gaussian.events] == [1]


def test_herding_broadcast_makes_the_owners_bid_along_w_and_costs_nothing() -> None:
    g = hashed(30, 16, 1).mean(axis=0)
    candidates = hashed(200, 16, 2)
    channel = HerdingChannel(g, candidates, residual_weight=0.7)
    pool = hashed(50, 16, 3)
    for q in (1, 2, 3, 7):
        release = channel.release(np.zeros((q, 16), dtype=np.float32), np.random.default_rng())
        assert release.events == ()
        z = candidates[channel._sequence[q]]
        virtual = candidates[channel._sequence[:q]].sum(axis=0)
        w = z + 0.7 * (g - virtual / (q + 1))
        bids = hashed_bids(pool, g, release.g_summary, q)
        np.testing.assert_allclose(bids, pool @ w, atol=1e-5)
    assert len(set(channel._sequence)) == len(channel._sequence)  # without replacement


def test_herding_sequence_is_hashed_greedy_over_the_candidates() -> None:
    validation = hashed(40, 16, 4)
    candidates = hashed(120, 16, 5)
    channel = HerdingChannel(validation.mean(axis=0), candidates, residual_weight=1.0)
    channel.release(np.zeros((24, 16), dtype=np.float32), np.random.default_rng())
    expected = greedy_hashed(candidates.astype(np.float32), validation, 25)
    assert channel._sequence == expected.tolist()


def test_public_candidates_follow_the_declared_domain_and_seed() -> None:
    params = CuratorParams(
        p=1, h1_seed=9, n_candidates=5000, candidate_distribution="uniform",
        candidate_center=0.5, candidate_scale=0.5,
    )  # fmt: skip
    c = public_candidates(params, 3)
    assert c.shape == (5000, 3) and c.min() >= 0.0 and c.max() <= 1.0
    np.testing.assert_array_equal(c, public_candidates(params, 3))
    gauss = public_candidates(dataclasses.replace(params, candidate_distribution="gaussian"), 3)
    assert abs(float(gauss.std()) - 0.5) < 0.02


def test_dimension_rule() -> None:
    assert dimension_rule(32, 1.39, 1.1, (64, 4096)) == 16 * math.ceil(
        2 / (1.39 * 1.1 / 32) ** 2 / 16
    )
    assert dimension_rule(500, 1.39, 1.1, (64, 256)) == 256
    assert dimension_rule(1, 10.0, 1.4, (64, 256)) == 64
    with pytest.raises(ValueError, match="bounds"):
        dimension_rule(10, 1.0, 1.0, (300, 200))


@pytest.mark.parametrize(
    ("summary", "auction"), [("tree", "all"), ("gaussian", "pure"), ("herding", "pure")]
)
def test_plan_meets_the_budgets_with_every_planned_event(summary: str, auction: str) -> None:
    plan = plan_releases(40, 50, 4, 1.0, 3.0, DELTA, summary=summary, auction=auction)
    ledger = PrivacyLedger("owner")
    ledger.auction(plan.eps_auction, plan.auction_variant, count=plan.max_epochs)
    if plan.summary_events:
        delta_l2 = plan.clip_norm
        ledger.gaussian(plan.summary_sigma * delta_l2, delta_l2, count=plan.summary_events)
    assert 0.9 <= ledger.epsilon(DELTA) <= 1.0
    assert plan.tau == (1 if auction == "all" else 3)  # ceil(K^(2/3)), K = 4
    assert plan.summary_events == {"tree": (39).bit_length(), "gaussian": 39, "herding": 0}[summary]
    assert plan.overrides()["max_deliveries"] == (1 if summary == "herding" else 3)
    assert plan.overrides()["herding_ascent_steps"] == (30 if summary == "herding" else 0)
    with pytest.raises(ValueError, match="summary"):
        plan_releases(40, 50, 4, summary="mwem")


@pytest.mark.parametrize("summary", ["gaussian", "tree", "herding"])
def test_planned_runs_stay_within_budget_and_the_ledger_counts_what_ran(
    scenario: Scenario, summary: str
) -> None:
    plan = plan_releases(12, len(scenario.validation), 4, 1.0, 3.0, DELTA, summary=summary)
    params = CuratorParams(p=12, gamma=scenario.gamma, h1_seed=2, n_candidates=3000,
                           **{**plan.overrides(), "d": 64})  # fmt: skip
    res = run_inprocess(scenario, params, np.random.default_rng(0)).result
    assert res.reason == "complete" and len(res.provenance) == 12
    assert res.ledgers["validation"].epsilon(DELTA) == pytest.approx(3.0, abs=0.01)
    owner = res.ledgers[scenario.owner_names[0]]
    kinds = {e.mechanism: e.count for e in owner.events}
    expected = {"gaussian": 11, "tree": (11).bit_length()}.get(summary)
    assert kinds.get("gaussian") == expected and kinds["auction"] == res.epochs
    assert owner.epsilon(DELTA) <= 1.0
    again = run_inprocess(scenario, params, np.random.default_rng(0)).result
    assert again.provenance == res.provenance  # same seed, same summary


def test_default_params_keep_the_paper_mechanisms_and_bad_names_are_refused() -> None:
    params = CuratorParams(p=3)
    assert (params.validation_release, params.summary_release) == ("mwem", "mwem")
    with pytest.raises(ValueError, match="summary_release"):
        CuratorParams(p=3, summary_release="laplace")
    with pytest.raises(ValueError, match="clip_norm"):
        CuratorParams(p=3, clip_norm=2.0)


def test_replace_neighbouring_doubles_delta_and_still_meets_the_budget(scenario: Scenario) -> None:
    plan = plan_releases(6, len(scenario.validation), 4, 1.0, 3.0, DELTA, "tree", replace=True)
    assert plan.overrides()["neighbouring"] == "replace"
    params = CuratorParams(p=6, gamma=scenario.gamma, **{**plan.overrides(), "d": 32})
    res = run_inprocess(scenario, params, np.random.default_rng(9)).result
    (event,) = res.ledgers["validation"].events
    assert event.sensitivity == pytest.approx(2 * plan.clip_norm)
    assert res.ledgers["validation"].epsilon(DELTA) <= 3.0
    assert res.ledgers[scenario.owner_names[1]].epsilon(DELTA) <= 1.0


def test_planned_herding_never_lets_a_duplicate_hand_the_epoch_to_another_owner(
    scenario: Scenario,
) -> None:
    """Herding's steering does not depend on S, so an owner's kept point keeps its top score.
    Withdrawn after one delivery (the plan), it is never re-bid; with three deliveries it is, the
    curator refuses it as a duplicate and another owner's point takes the epoch."""
    plan = plan_releases(30, len(scenario.validation), 4, 1.0, 3.0, DELTA, summary="herding")
    params = CuratorParams(p=30, gamma=scenario.gamma, h1_seed=2, n_candidates=3000,
                           **{**plan.overrides(), "d": 64})  # fmt: skip

    def duplicates(max_deliveries: int) -> int:
        run = dataclasses.replace(params, max_deliveries=max_deliveries)
        res = run_inprocess(scenario, run, np.random.default_rng(4)).result
        assert res.reason == "complete" and len(res.provenance) == 30
        return sum("already in the summary" in why for _, _, why in res.rejected)

    assert duplicates(1) == 0
    assert duplicates(3) > 0


def test_herding_ascent_moves_virtual_points_up_the_residual_inside_the_box() -> None:
    h1 = RandomFourierFeatures(4, 64, 0.5, 7)
    rng = np.random.default_rng(8)
    g = h1.hash_standardized(rng.normal(0.3, 0.1, (50, 4))).mean(axis=0).astype(np.float64)
    Z = rng.uniform(-1.0, 1.0, (300, 4))
    plain = HerdingChannel(g, h1.hash_standardized(Z), 1.0)
    moved = HerdingChannel(g, h1.hash_standardized(Z), 1.0, (h1, Z, 25, -1.0, 1.0))
    summary = np.zeros((6, 64), dtype=np.float32)
    plain.release(summary, rng)
    moved.release(summary, rng)
    assert moved._sequence[0] == plain._sequence[0]  # same start, then moved uphill
    assert float(moved._points[0] @ g) > float(plain._points[0] @ g) + 1e-3
    again = HerdingChannel(g, h1.hash_standardized(Z), 1.0, (h1, Z, 25, -1.0, 1.0))
    again.release(summary, rng)
    np.testing.assert_array_equal(np.array(again._points), np.array(moved._points))  # replay
    assert plan_releases(40, 50, 4, summary="herding").herding_ascent_steps == 30
    assert plan_releases(40, 50, 4, summary="tree").herding_ascent_steps == 0


# ------------------------------------------------------- neighbouring relation (issue 12.3)
def test_replace_one_is_the_default_and_the_honest_relation_with_m_public() -> None:
    """m = |D_v| is published, so neighbours have the same size and differ in one substituted
    point; one substitution moves the clipped sum by up to 2 clip (more than the add/remove
    sensitivity clip), which is what the ledger now charges."""
    params = CuratorParams(p=10, d=64, validation_release="gaussian", clip_norm=1.1)
    assert params.neighbouring == "replace" and params.sensitivity == 2.0
    H = hashed(2000, 64)
    C = clip_rows(H, 1.1)
    moved = max(float(np.linalg.norm(C[i] - C[j])) for i in range(50) for j in range(50))
    assert 1.1 < moved <= 2 * 1.1 + 1e-12  # add/remove's Delta = clip would under-charge
    z = gaussian_noise_multiplier(3.0 * (1 - 1e-4), DELTA)
    ledger = PrivacyLedger("validation")
    release_validation(H[:40], dataclasses.replace(params, validation_sigma=z), ledger,
                       np.random.default_rng(0))  # fmt: skip
    (event,) = ledger.events
    assert event.neighbouring == REPLACE_ONE_RECORD
    assert event.sensitivity == pytest.approx(2.2) and event.param("sigma") == pytest.approx(
        2.2 * z
    )
    assert ledger.epsilon(DELTA) == pytest.approx(3.0, abs=0.01)
    paper = PrivacyLedger("validation")
    release_validation(H[:40], dataclasses.replace(params, validation_sigma=z,
                       neighbouring="add_remove"), paper, np.random.default_rng(0))  # fmt: skip
    assert paper.events[0].neighbouring == ADD_REMOVE and paper.events[0].sensitivity == 1.1


def test_validation_noise_scale_under_replace_one() -> None:
    """The released sum's noise has standard deviation z * 2 clip (8,000 draws: a variance
    window of 5 standard errors; a sigma off by two fails)."""
    z, clip, d = 1.39, 1.1, 64
    params = CuratorParams(p=10, d=d, validation_release="gaussian", clip_norm=clip,
                           validation_sigma=z)  # fmt: skip
    H = hashed(40, d)
    exact = clip_rows(H, clip).sum(axis=0)
    rng = np.random.default_rng(11)
    noise = np.stack([
        release_validation(H, params, PrivacyLedger("v"), rng) * len(H) - exact
        for _ in range(125)
    ])  # fmt: skip
    ratio = float(np.mean(noise**2)) / (z * 2 * clip) ** 2
    assert abs(ratio - 1.0) < 5 * math.sqrt(2.0 / noise.size)


def test_plan_charges_replace_one_by_default() -> None:
    plan = plan_releases(100, 32, 5, select=True)
    assert plan.neighbouring == "replace"
    paper = plan_releases(100, 32, 5, select=True, replace=False)
    assert paper.neighbouring == "add_remove" and paper.d >= plan.d

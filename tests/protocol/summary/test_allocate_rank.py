"""allocate-select's score histograms (issue 18): noise scale, sensitivity, the allocation
rule, the seed-centred validation release, and which party each release is charged to."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpmarket.actors.parties.transport import LoopbackTransport
from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.summary.allocate import plan_allocation
from dpmarket.protocol.summary.allocate_rank import (
    SCORE_EDGES,
    histogram_scale,
    histogram_weights,
    owner_histogram,
    project_to_simplex,
    score_frame,
)
from dpmarket.protocol.summary.h1 import RandomFourierFeatures
from dpmarket.protocol.summary.messages import EpochBody, SetupBody, ValidationBody
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.summary.releases import release_validation, validation_frame
from dpmarket.protocol.wire.codec import Message
from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.streams.synthetic import Scenario
from tests.small import small_curator, small_params, small_scenario

RUN = "allocate-rank-run"


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return small_scenario(7)


def _direction(d: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    u = rng.normal(size=d)
    return u / np.linalg.norm(u), rng.normal(size=d) * 0.1


def test_histogram_noise_has_the_stated_scale() -> None:
    u, c = _direction()
    HT = np.random.default_rng(1).normal(size=(10, 60))
    edges = np.array([-1.0, -0.3, 0.0, 0.3, 1.0])
    exact = np.bincount(np.searchsorted(edges, u @ (HT - c[:, None]), side="right"), minlength=6)
    z, rng = 1.5, np.random.default_rng(2)
    draws = np.array([owner_histogram(HT, u, c, edges, z, rng) for _ in range(3000)]) - exact
    assert histogram_scale(z) == pytest.approx(z * np.sqrt(2.0))  # replace-one: sqrt(2)
    # 18,000 bins: the sample sd is within 3% of z sqrt(2); a scale off by two is far outside
    assert np.std(draws) == pytest.approx(z * np.sqrt(2.0), rel=0.03)
    assert abs(np.mean(draws)) < 0.05 * z


def test_replacing_one_record_moves_the_counts_by_at_most_sqrt_two() -> None:
    u, c = _direction(seed=3)
    rng = np.random.default_rng(4)
    HT = rng.normal(size=(10, 30))
    edges = np.linspace(-2.0, 2.0, 9)
    tiny = 1e-12  # noise far below one count: compares the counts alone
    base = owner_histogram(HT, u, c, edges, tiny, np.random.default_rng(0))
    moved = []
    for trial in range(200):
        other = HT.copy()
        other[:, trial % 30] = rng.normal(size=10) * 3
        diff = owner_histogram(other, u, c, edges, tiny, np.random.default_rng(0)) - base
        assert np.linalg.norm(diff) <= np.sqrt(2.0) + 1e-9
        moved.append(np.linalg.norm(diff) > 1)
    assert any(moved)  # the bound is attained: a record did change bins


def test_score_frame_is_public_and_measured_in_seed_spreads() -> None:
    rng = np.random.default_rng(5)
    H_seed = rng.normal(size=(30, 10))
    g = rng.normal(size=10)
    u, c, edges = score_frame(g, H_seed, ridge=0.0)
    np.testing.assert_allclose(c, H_seed.mean(axis=0))
    assert np.linalg.norm(u) == pytest.approx(1.0)
    np.testing.assert_allclose(u, (g - c) / np.linalg.norm(g - c))
    seed_scores = (H_seed - c) @ u
    np.testing.assert_allclose(
        edges, seed_scores.mean() + seed_scores.std() * np.array(SCORE_EDGES)
    )
    with pytest.raises(ValueError, match="no score direction"):
        score_frame(c, H_seed)


def test_the_ridge_direction_is_the_regularised_discriminant_of_g_tilde_and_the_seed() -> None:
    rng = np.random.default_rng(6)
    d, n = 40, 12  # fewer seed points than dimensions, as with h1 (rank n - 1)
    H_seed = rng.normal(size=(n, d)) * np.linspace(2.0, 0.1, d)
    g = rng.normal(size=d)
    u, c, edges = score_frame(g, H_seed, ridge=0.5)
    centred = H_seed - c
    cov = centred.T @ centred / n
    lam = 0.5 * np.trace(cov) / (n - 1)
    expected = np.linalg.solve(cov + lam * np.eye(d), g - c)
    np.testing.assert_allclose(u, expected / np.linalg.norm(expected), atol=1e-10)
    seed_scores = centred @ u  # the edges follow the new direction's seed spread
    np.testing.assert_allclose(
        edges, seed_scores.mean() + seed_scores.std() * np.array(SCORE_EDGES)
    )
    # a direction the seed never varies along is kept whole; one it varies along is shrunk
    top = np.linalg.svd(centred, full_matrices=False)[2][0]
    outside = np.linalg.svd(centred, full_matrices=True)[2][-1]
    mixed, _, _ = score_frame(c + top + outside, H_seed, ridge=0.5)
    assert abs(mixed @ outside) > 3 * abs(mixed @ top)
    raw, _, _ = score_frame(c + top + outside, H_seed, ridge=0.0)
    assert raw @ outside == pytest.approx(raw @ top)
    # a larger ridge tends to the raw direction
    far, _, _ = score_frame(g, H_seed, ridge=1e9)
    np.testing.assert_allclose(far, score_frame(g, H_seed, ridge=0.0)[0], atol=1e-6)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="ridge"):
            score_frame(g, H_seed, ridge=bad)
    with pytest.raises(ValueError, match="must be finite"):
        score_frame(np.full(d, np.nan), H_seed)
    # a seed set spanning every dimension and a tiny ridge: still lambda (S + lambda I)^-1 v
    full = rng.normal(size=(3 * d, d))
    tiny, _, _ = score_frame(g, full, ridge=1e-9)
    cf = full - full.mean(axis=0)
    cov_f = cf.T @ cf / len(full)
    lam_f = 1e-9 * np.trace(cov_f) / (len(full) - 1)
    solved = np.linalg.solve(cov_f + lam_f * np.eye(d), g - full.mean(axis=0))
    assert tiny @ (solved / np.linalg.norm(solved)) > 0.999


def test_projection_onto_the_simplex() -> None:
    h = project_to_simplex([5.0, -3.0, 2.0, 0.5], 6.0)
    assert h.min() >= 0 and h.sum() == pytest.approx(6.0)
    np.testing.assert_allclose(h, [4.5, 0.0, 1.5, 0.0])  # subtract 0.5, clip at zero
    np.testing.assert_allclose(project_to_simplex([1.0, 2.0], 3.0), [1.0, 2.0])  # already on it
    np.testing.assert_allclose(project_to_simplex([1.0, 2.0], 0.0), [0.0, 0.0])


def test_the_budget_goes_to_the_owners_holding_the_best_scores() -> None:
    # bins from low to high score; owner "b" holds the top records, "c" a few, "a" none
    hist = {
        "a": np.array([50.0, 50.0, 0.0, 0.0]),
        "b": np.array([10.0, 20.0, 30.0, 40.0]),
        "c": np.array([60.0, 20.0, 15.0, 5.0]),
    }
    records = {"a": 100, "b": 100, "c": 100}
    w = histogram_weights(hist, records, 45)  # the top bin holds exactly 45
    assert w == pytest.approx({"a": 0.0, "b": 40.0, "c": 5.0})
    w = histogram_weights(hist, records, 60)  # a third into the next bin (45 more there)
    assert w == pytest.approx({"a": 0.0, "b": 50.0, "c": 10.0})
    w = histogram_weights(hist, records, 500)  # more than everybody holds: all records count
    assert w == pytest.approx({"a": 100.0, "b": 100.0, "c": 100.0})
    with pytest.raises(ValueError, match="same bins"):
        histogram_weights({"a": np.ones(3), "b": np.ones(4)}, {"a": 3, "b": 4}, 2)


def test_the_seed_centred_validation_release_has_the_stated_scale(scenario: Scenario) -> None:
    params = small_params(scenario, validation_release="gaussian", validation_center="seed")
    rng = np.random.default_rng(6)
    H_seed = rng.normal(size=(40, params.d)) * 0.2 + 0.3
    H = rng.normal(size=(25, params.d)) * 0.01 + 0.3  # inside the clip: nothing clipped
    center, clip = validation_frame(params, H_seed)
    np.testing.assert_allclose(center, H_seed.mean(axis=0))
    assert clip < params.clip_norm
    ledger = PrivacyLedger("validation")
    draws = np.array(
        [release_validation(H, params, ledger, rng, H_seed) for _ in range(400)]
    ) * len(H) - H.sum(axis=0)
    expected = params.validation_sigma * params.sensitivity * clip  # z * 2 r
    assert np.std(draws) == pytest.approx(expected, rel=0.03)
    (event,) = {e.label: e for e in ledger.events}.values()
    assert event.sensitivity == pytest.approx(2 * clip) and "seed mean" in event.label
    origin = dataclasses.replace(params, validation_center="origin")
    assert validation_frame(origin, H_seed)[1] == params.clip_norm


def _histogram_run(
    scenario: Scenario, seed: int, seen: list[object] | None = None
) -> tuple[object, list[Owner]]:
    base = small_params(
        scenario, summary_release="herding", validation_release="gaussian", tau=1,
        auction_variant="pure", eps_auction=1e-6, max_deliveries=1, final_selection="exact",
    )  # fmt: skip
    params = dataclasses.replace(base, **plan_allocation(1.0, 1e-5, base.p, 15, "histogram"))
    curator = small_curator(RUN, scenario, params, seed)
    owners = [
        Owner(
            n, RUN, X, y, rng=np.random.default_rng([seed, i]), profile_floor=params.profile_floor
        )
        for i, (n, (X, y)) in enumerate(zip(scenario.owner_names, scenario.owners, strict=True))
    ]
    if seen is not None:  # what owner-1 receives: decoded from its frames by the transport
        first = owners[0]
        receive = first.receive

        def spy(msg: Message) -> list[Message]:
            seen.append(msg.body)
            return receive(msg)

        first.receive = spy  # type: ignore[method-assign]
    transport = LoopbackTransport([curator, *owners])
    transport.send(curator.start())
    transport.run_until(lambda: curator.done)
    return curator, owners


def test_an_owner_can_rebuild_its_score_frame_from_g_tilde_and_public_values(
    scenario: Scenario,
) -> None:
    """Adversary view (a curious owner): the score frame of the histogram round is a function
    of the g_tilde the owner already received and of public values (the h1 map it was set up
    with, the public seed set, the ridge), so the ridge-regularised direction tells it nothing
    more about D_v than the charged g_tilde release does."""
    seen: list[object] = []
    curator, _ = _histogram_run(scenario, 4, seen)
    setup = next(b for b in seen if isinstance(b, SetupBody))
    g = next(b for b in seen if isinstance(b, ValidationBody)).g_validation
    frame = next(b for b in seen if isinstance(b, EpochBody) and b.profile_edges is not None)
    h1 = RandomFourierFeatures(setup.n_features, setup.d, setup.gamma, setup.h1_seed)
    ridge = curator.params.allocation_ridge  # type: ignore[attr-defined]
    assert ridge > 0
    u, c, edges = score_frame(g, h1(scenario.seed_set), ridge)
    np.testing.assert_allclose(frame.profile_basis, u, atol=1e-9)
    np.testing.assert_allclose(frame.profile_center, c, atol=1e-9)
    np.testing.assert_allclose(frame.profile_edges, edges, atol=1e-9)
    raw = score_frame(g, h1(scenario.seed_set), 0.0)[0]
    assert not np.allclose(frame.profile_basis, raw)  # the ridge did change the direction


def test_each_owner_is_charged_its_histogram_and_the_validation_set_its_release(
    scenario: Scenario,
) -> None:
    curator, owners = _histogram_run(scenario, 2)
    params = curator.params  # type: ignore[attr-defined]
    assert params.allocation_rule == "histogram" and params.validation_center == "seed"
    ledgers = curator.ledgers  # type: ignore[attr-defined]
    for owner in owners:
        (event,) = ledgers[owner.name].events  # one histogram, no auction, no summary release
        assert event.mechanism == "gaussian" and event.count == 1 and event.sensitivity == 1.0
        assert dict(event.parameters)["sigma"] == pytest.approx(params.allocation_sigma)
        assert "score histogram" in event.label and "replace" in event.neighbouring
        assert ledgers[owner.name].epsilon(1e-5) == pytest.approx(1.0, rel=1e-3)
        assert owner._profile is not None and len(owner._profile) == len(SCORE_EDGES) + 1
    (v_event,) = ledgers["validation"].events
    _, clip = validation_frame(params, curator._H_seed)  # type: ignore[attr-defined]
    assert v_event.sensitivity == pytest.approx(2 * clip) and "seed mean" in v_event.label
    quotas = curator.quotas  # type: ignore[attr-defined]
    assert quotas is not None and sum(quotas.values()) == 15
    assert curator.transfers.distinct_points <= 15  # type: ignore[attr-defined]


def test_an_owner_refuses_a_histogram_below_the_floor_or_with_bad_edges(
    scenario: Scenario,
) -> None:
    """Adversary view: a curator asking for a histogram with less noise than the operator's
    floor, or over edges that are not increasing, gets nothing and no noise is drawn."""
    X, y = scenario.owners[0]
    d = small_params(scenario).d
    u, c = _direction(d=d, seed=8)
    for sigma, edges in ((0.5, np.array([0.0, 1.0])), (2.0, np.array([1.0, 0.0]))):
        rng = np.random.default_rng(9)
        owner = Owner("owner-1", RUN, X, y, rng=rng, profile_floor=1.0)
        owner._store.HT = np.zeros((d, len(X)), dtype=np.float32)
        owner._setup = type("S", (), {"d": d})()  # type: ignore[assignment]
        body = EpochBody(np.zeros(d), 0, profile_sigma=sigma, profile_clip=1.0,
                         profile_basis=u, profile_center=c, profile_edges=edges)  # fmt: skip
        state = rng.bit_generator.state
        with pytest.raises(RemoteProtocolError):
            owner._release_profile(body)
        assert owner._profile is None and rng.bit_generator.state == state


def test_an_owners_histogram_never_reads_its_retired_records(scenario: Scenario) -> None:
    """Issue 24 review: records whose budget block is spent are retired (Owner.retire) and no
    release may read them, the histogram included: it counts live records only and sends
    their number. Same noise draws, 40 records of which 30 retired: the release is the one of
    the 10 live records alone."""
    X, y = scenario.owners[0]
    X, y = X[:40], y[:40]
    d = small_params(scenario).d
    u, c = _direction(d=d, seed=8)
    H = np.random.default_rng(5).normal(size=(d, 40)).astype(np.float32)
    edges = np.array([-1.0, 0.0, 1.0])
    releases = []
    for retired, records in ((np.arange(40) >= 10, 40), (None, 10)):
        owner = Owner("owner-1", RUN, X[:records], y[:records], rng=np.random.default_rng(9),
                      profile_floor=1.0)  # fmt: skip
        owner._store.HT = H[:, :records]
        owner._setup = type("S", (), {"d": d})()  # type: ignore[assignment]
        if retired is not None:
            owner.retire(retired)
        body = EpochBody(np.zeros(d), 0, profile_sigma=1.0, profile_clip=1.0,
                         profile_basis=u, profile_center=c, profile_edges=edges)  # fmt: skip
        releases.append(owner._release_profile(body))
    assert releases[0].records == releases[1].records == 10
    np.testing.assert_array_equal(releases[0].mean, releases[1].mean)

"""Per-feature standardisation from the normalise release (protocol/summary/standardise.py)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from dpmarket.protocol.summary.standardise import (
    MAX_AMPLIFICATION,
    spread_standard_errors,
    standardisation,
)

F64 = npt.NDArray[np.float64]


def _release(X: F64, sigma: float, seed: int) -> tuple[F64, F64, float]:
    """(mean, spread, count) as actors/securephase_journal.py ``moments_summary`` derives them
    from (sum, sum of squares, count) each with Gaussian noise ``sigma`` (a fixed draw)."""
    k = X.shape[1]
    noise = np.random.default_rng(seed).normal(0.0, sigma, 2 * k + 1)
    sums = np.concatenate([X.sum(axis=0), (X**2).sum(axis=0), [len(X)]]) + noise
    n = max(float(sums[-1]), 1.0)
    mean = sums[:k] / n
    spread = np.sqrt(np.maximum(sums[k : 2 * k] / n - mean**2, 1e-12))
    return mean, spread, float(sums[-1])


def _digits_like(seed: int, n: int = 900) -> F64:
    """64 features in [0, 1] like digits' pixels: 30 with spreads about 0.3, 30 with rare ink
    (spreads about 0.1-0.3, variances 0.01-0.07, within a few standard errors of the
    normalise noise), 4 constant at 0."""
    rng = np.random.default_rng(seed)
    wide = np.clip(rng.normal(0.5, 0.3, (n, 30)), 0.0, 1.0)
    ink = rng.random((n, 30)) < np.linspace(0.02, 0.12, 30)
    rare = np.where(ink, rng.uniform(0.5, 1.0, (n, 30)), 0.0)
    return np.concatenate([wide, rare, np.zeros((n, 4))], axis=1)


def test_constant_features_keep_the_public_scale() -> None:
    X = np.concatenate([np.random.default_rng(0).normal(3.0, 2.0, (500, 2)), np.ones((500, 2))], 1)
    mean, spread, count = _release(X, sigma=20.0, seed=1)
    result = standardisation(mean, spread, count, 20.0, 10.0, X[:30])
    assert result.decisions == ("dp", "dp", "public", "public")
    assert result.scale[2:] == (1.0, 1.0)
    assert abs(result.scale[0] - 2.0) < 0.3


def test_low_variance_features_keep_the_public_scale_and_gamma_does_not_collapse() -> None:
    X = _digits_like(0, n=10_000)
    sigma = 79.9  # the normalise round's sigma at eps 0.5, bound 1, k = 64 (configs/digits.toml)
    mean, spread, count = _release(X, sigma, seed=2)
    seed_set = _digits_like(1, n=30)
    result = standardisation(mean, spread, count, sigma, 1.0, seed_set)
    decisions = np.asarray(result.decisions)
    scale, true_spread = np.asarray(result.scale), X.std(axis=0)
    assert (decisions[60:] == "public").all() and (scale[60:] == 1.0).all()
    assert (decisions[:30] == "dp").sum() >= 25
    dp = decisions == "dp"
    assert (np.abs(np.log(scale[dp] / true_spread[dp])) < np.log(2.0)).all()
    assert result.report()["kept_public_scale"] == np.flatnonzero(~dp).tolist()
    assert scale.min() >= 0.05  # no feature blown up by a spread that is noise
    # the median heuristic in standardised units stays near 1 / (2 x the features' spreads):
    assert 1e-3 < result.gamma < 0.1


def test_spreads_within_their_noise_all_keep_the_public_scale() -> None:
    """digits' own budget: 900 records against sigma 80, a pixel's DP variance (noise about
    0.13) says nothing, so h1 hashes the raw pixels and gamma is the raw median heuristic."""
    X = _digits_like(0, n=900)
    mean, spread, count = _release(X, 79.9, seed=2)
    seed_set = _digits_like(1, n=30)
    result = standardisation(mean, spread, count, 79.9, 1.0, seed_set)
    assert set(result.decisions) == {"public"}
    d2 = ((seed_set[:, None, :] - seed_set[None, :, :]) ** 2).sum(axis=2)
    assert result.gamma == pytest.approx(1.0 / np.median(d2[np.triu_indices(30, k=1)]))
    # the rule it replaces, DP spreads floored at 1e-3 x bound, collapses on the same release
    old_scale = np.maximum(spread, 1e-3)
    assert (old_scale[:60] < 0.01).sum() >= 5
    z = (seed_set - mean) / old_scale
    d2 = ((z[:, None, :] - z[None, :, :]) ** 2).sum(axis=2)
    assert 1.0 / np.median(d2[np.triu_indices(30, k=1)]) < 1e-3


def test_standard_error_is_the_delta_method() -> None:
    se = spread_standard_errors([0.0, 0.5], [0.0, 0.25], 100.0, 10.0, 1.0)
    assert se[0] == pytest.approx(0.1)
    assert se[1] == pytest.approx(0.1 * np.sqrt(1.0 + 1.0 + 0.0))


def test_a_confident_tiny_spread_is_floored_at_the_seed_sets_spread() -> None:
    rng = np.random.default_rng(3)
    pool = np.stack([rng.normal(0, 1.0, 4000), rng.normal(0, 0.001, 4000)], axis=1)
    seed_set = np.stack([rng.normal(0, 1.0, 40), rng.normal(0, 1.0, 40)], axis=1)
    mean, spread, count = _release(pool, sigma=0.0, seed=0)
    result = standardisation(mean, spread, count, 0.0, 1e-3, seed_set)
    assert result.decisions == ("dp", "seed floor")
    assert result.scale[1] == pytest.approx(seed_set[:, 1].std() / MAX_AMPLIFICATION)


def test_a_fixed_gamma_is_kept_and_bad_shapes_are_refused() -> None:
    X = _digits_like(4, n=200)
    mean, spread, count = _release(X, 1.0, seed=5)
    assert standardisation(mean, spread, count, 1.0, 1.0, X[:10], gamma=0.25).gamma == 0.25
    with pytest.raises(ValueError, match="seed_set"):
        standardisation(mean, spread, count, 1.0, 1.0, X[:10, :5])
    with pytest.raises(ValueError, match="count"):
        spread_standard_errors(mean, spread, 0.0, 1.0, 1.0)


def test_the_features_kept_at_the_public_scale_are_the_same_run_after_run() -> None:
    """Issue 40: the decision reads the public seed set, not the DP variance, so twenty
    releases of one pool (twenty runs of one config) standardise the same features; deciding by
    each release's DP variance (the rule before) picks different sets on the same releases."""
    X = _digits_like(0, n=10_000)
    seed_set = _digits_like(1, n=40)
    sigma = 79.9
    decisions, by_dp_variance = set(), set()
    for draw in range(20):
        mean, spread, count = _release(X, sigma, seed=100 + draw)
        result = standardisation(mean, spread, count, sigma, 1.0, seed_set, records=len(X))
        decisions.add(tuple(d == "public" for d in result.decisions))  # kept at public scale
        se = spread_standard_errors(mean, spread**2, count, sigma, 1.0)
        by_dp_variance.add(tuple(spread**2 < 3.0 * se))
    assert len(decisions) == 1
    assert 0 < sum(next(iter(decisions))) < 64  # some of each: a real decision
    assert len(by_dp_variance) > 1  # the noise the old rule followed

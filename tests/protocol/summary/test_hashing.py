"""Tests for h1 (random Fourier features, protocol/summary/h1.py), quantisation and h2 (MWEM,
protocol/summary/h2.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.typing import NDArray

from dpmarket.protocol.summary.h1 import RandomFourierFeatures, rahimi_recht_bound, rbf_kernel
from dpmarket.protocol.summary.h2 import (
    H2Release,
    MwemHash,
    mwem_marginal_means,
    quantization_grid,
    quantize,
)


def _points(n: int = 40, dim: int = 5, seed: int = 3) -> NDArray[np.float64]:
    return np.random.default_rng(seed).random((n, dim))


def _hashed(n: int = 400, d: int = 32, seed: int = 0) -> NDArray[np.float32]:
    hashed: NDArray[np.float32] = RandomFourierFeatures(8, d, 0.5, seed=1)(
        np.random.default_rng(seed).random((n, 8))
    )
    return hashed


def _scaled_error(release: H2Release, hashed: NDArray[np.float32]) -> float:
    """Max coordinate error of the release in [-1, 1] units (h1 units times sqrt(d/2))."""
    d = hashed.shape[1]
    return float(np.abs(release.mean - hashed.mean(axis=0)).max() * math.sqrt(d / 2))


# ------------------------------------------------------------------------------------ h1


def test_h1_shape_dtype_range_and_single_point() -> None:
    h1 = RandomFourierFeatures(5, 64, 1.0, seed=7)
    X = _points()
    out = h1(X)
    assert out.shape == (40, 64)
    assert out.dtype == np.float32
    assert np.abs(out).max() <= math.sqrt(2 / 64) * (1 + 1e-6)
    single = h1(X[3])
    assert single.shape == (64,)
    # float32 BLAS: a 1-row and a 40-row matmul may round the last bit differently (seen with
    # numpy 2.4.6's OpenBLAS); the hash of one point is the same to float32 precision
    np.testing.assert_allclose(single, out[3], rtol=0, atol=4 * np.finfo(np.float32).eps)
    assert h1(np.zeros((0, 5))).shape == (0, 64)


def test_h1_matches_float64_formula_across_chunks() -> None:
    h1 = RandomFourierFeatures(4, 300, 0.2, seed=11)
    X = np.random.default_rng(0).random((5000, 4))  # more rows than one work chunk
    expected = math.sqrt(2 / 300) * np.cos(X @ h1.omega.astype(np.float64) + h1.b)
    np.testing.assert_allclose(h1(X), expected, atol=2e-5)


def test_h1_parameter_distribution() -> None:
    h1 = RandomFourierFeatures(8, 2000, 0.3, seed=5)
    assert h1.omega.shape == (8, 2000) and h1.b.shape == (2000,)
    # 16000 normal draws: relative standard error of the std is about 0.6%.
    assert abs(h1.omega.std() / math.sqrt(2 * 0.3) - 1) < 0.03
    assert h1.b.min() >= 0 and h1.b.max() < 2 * math.pi
    assert abs(h1.b.mean() - math.pi) < 5 * (2 * math.pi / math.sqrt(12 * 2000))


def test_h1_seed_determinism_and_equality() -> None:
    X = _points()
    a = RandomFourierFeatures(5, 50, 1.0, seed=1)
    b = RandomFourierFeatures(5, 50, 1.0, seed=1)
    c = RandomFourierFeatures(5, 50, 1.0, seed=2)
    np.testing.assert_array_equal(a(X), b(X))
    assert not np.allclose(a(X), c(X))
    assert a == b and hash(a) == hash(b)
    assert a != c
    assert a != RandomFourierFeatures(5, 50, 2.0, seed=1)
    assert a != RandomFourierFeatures(5, 51, 1.0, seed=1)


def test_h1_inner_products_within_rahimi_recht_bound() -> None:
    X = _points()
    d, gamma = 4000, 1.0
    exact = rbf_kernel(X, X, gamma)
    rows, cols = np.triu_indices(len(X), 1)
    assert exact[rows, cols].min() < 0.2 and exact[rows, cols].max() > 0.9  # spread out
    hashed = RandomFourierFeatures(5, d, gamma, seed=0)(X).astype(np.float64)
    approx = hashed @ hashed.T
    bound = rahimi_recht_bound(d, 1e-3 / rows.size)  # union bound over all pairs
    assert np.abs(approx - exact)[rows, cols].max() <= bound
    # A kernel of twice or half the bandwidth would be off by more than the bound.
    assert np.abs(rbf_kernel(X, X, gamma / 2) - exact)[rows, cols].max() > bound


def test_h1_error_shrinks_like_inverse_sqrt_d() -> None:
    X = _points()
    exact = rbf_kernel(X, X, 1.0)
    rows, cols = np.triu_indices(len(X), 1)

    def mean_abs_error(d: int) -> float:
        errors = []
        for seed in range(10):
            hashed = RandomFourierFeatures(5, d, 1.0, seed=seed)(X).astype(np.float64)
            errors.append(np.abs(hashed @ hashed.T - exact)[rows, cols].mean())
        return float(np.mean(errors))

    ratio = mean_abs_error(100) / mean_abs_error(1600)
    assert 2.5 < ratio < 6.5  # sqrt(1600 / 100) = 4


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((3, 4)),
        np.zeros((2, 3, 5)),
        np.zeros(4),
        np.array([[np.nan] * 5]),
        np.array([["a"] * 5]),
    ],
)
def test_h1_rejects_bad_input(bad: NDArray[np.generic]) -> None:
    with pytest.raises(ValueError):
        RandomFourierFeatures(5, 16, 1.0, seed=0)(bad)


@pytest.mark.parametrize(
    ("n_features", "d", "gamma", "seed"),
    [(0, 8, 1.0, 0), (4, 0, 1.0, 0), (4, 8, 0.0, 0), (4, 8, math.inf, 0), (4, 8, 1.0, -1)],
)
def test_h1_rejects_bad_parameters(n_features: int, d: int, gamma: float, seed: int) -> None:
    with pytest.raises(ValueError):
        RandomFourierFeatures(n_features, d, gamma, seed)


def test_rahimi_recht_bound_and_kernel() -> None:
    assert rahimi_recht_bound(100, math.exp(-25)) == pytest.approx(1.0)
    for bad_prob in (0.0, 1.0, -0.5):
        with pytest.raises(ValueError):
            rahimi_recht_bound(100, bad_prob)
    with pytest.raises(ValueError):
        rahimi_recht_bound(0, 0.1)
    X, Y = _points(6, 3, seed=1), _points(4, 3, seed=2)
    brute = np.exp(-0.7 * ((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1))
    kernel = rbf_kernel(X, Y, 0.7)
    assert kernel.dtype == np.float64
    np.testing.assert_allclose(kernel, brute, rtol=1e-12)
    np.testing.assert_allclose(np.diag(rbf_kernel(X, X, 0.7)), 1.0)
    with pytest.raises(ValueError):
        rbf_kernel(X, _points(4, 2), 0.7)


# ------------------------------------------------------------------------------ quantize


def test_quantize_on_grid_and_neighbouring() -> None:
    hashed = _hashed(n=200, d=32)
    eta = 0.1
    out = quantize(hashed, eta, np.random.default_rng(0))
    assert out.shape == hashed.shape and out.dtype == np.float64
    steps = (out + 1) / eta
    np.testing.assert_allclose(steps, np.round(steps), atol=1e-9)
    assert out.min() >= -1 and out.max() <= 1
    assert np.abs(out - hashed * math.sqrt(32 / 2)).max() < eta
    grid = quantization_grid(eta)
    assert grid.size == 21 and grid[0] == -1 and grid[-1] == 1
    # Points already on the grid are returned unchanged.
    on_grid = np.tile(grid, (3, 1)) * math.sqrt(2 / grid.size)
    np.testing.assert_allclose(
        quantize(on_grid, eta, np.random.default_rng(1)), np.tile(grid, (3, 1))
    )


def test_quantize_is_unbiased() -> None:
    d, eta, draws = 8, 0.25, 40000
    scaled = np.array([-1.0, -0.93, -0.4, -0.1, 0.05, 0.33, 0.8, 1.0])
    V = np.tile(scaled * math.sqrt(2 / d), (draws, 1))
    out = quantize(V, eta, np.random.default_rng(2))
    position = (scaled + 1) / eta
    frac = position - np.floor(position)
    stderr = eta * np.sqrt(frac * (1 - frac) / draws) + 1e-12
    assert np.all(np.abs(out.mean(axis=0) - scaled) <= 5 * stderr)
    # Rounding up happens with probability frac: a wrong probability fails the mean test above,
    # and only the two neighbouring grid points occur.
    assert np.all(np.abs(out - scaled) < eta)


@pytest.mark.parametrize("eta", [0.3, 0.0, -0.1, 2.5, math.nan, 0.7])
def test_quantize_rejects_bad_eta(eta: float) -> None:
    with pytest.raises(ValueError, match="eta"):
        quantize(np.zeros((2, 4)), eta, np.random.default_rng(0))


def test_quantize_rejects_out_of_range_and_bad_shape() -> None:
    with pytest.raises(ValueError, match="outside"):
        quantize(np.full((2, 8), 0.6), 0.5, np.random.default_rng(0))  # sqrt(2/8) = 0.5
    with pytest.raises(ValueError):
        quantize(np.zeros(8), 0.5, np.random.default_rng(0))
    assert quantize(np.full((1, 2), 1.0), 2.0, np.random.default_rng(0)).tolist() == [[1.0, 1.0]]


# ------------------------------------------------------------------------------------ h2


def test_h2_noiseless_limit_converges_to_true_mean() -> None:
    hashed = _hashed()
    errors = [
        _scaled_error(MwemHash(32, 0.1).release(hashed, 1e6, t, np.random.default_rng(1)), hashed)
        for t in (300, 3000)
    ]
    assert errors[1] < 0.08
    assert errors[1] < errors[0] / 3


def test_h2_one_step_update_matches_formula() -> None:
    q, eta = 10, 0.5
    sums = np.array([0.0, 6.0, -2.0])
    trace = mwem_marginal_means(sums, q, 1e6, 1, np.random.default_rng(0), eta)
    assert trace.selected.tolist() == [1]  # largest score |0 - 6|
    grid = quantization_grid(eta)
    tilt = np.exp(grid * (trace.measurements[0] - 0.0) / (2 * q))
    expected_mean = float((grid * tilt).sum() / tilt.sum())
    np.testing.assert_allclose(trace.average_sums, [0.0, q * expected_mean, 0.0], atol=1e-12)
    np.testing.assert_allclose(np.exp(trace.final_logp).sum(axis=1), 1.0)


def test_h2_class_is_quantize_then_core() -> None:
    hashed, eta, eps, rounds = _hashed(n=100, d=16), 0.25, 0.8, 50
    release = MwemHash(16, eta).release(hashed, eps, rounds, np.random.default_rng(5))
    rng = np.random.default_rng(5)
    sums = quantize(hashed, eta, rng).sum(axis=0)
    trace = mwem_marginal_means(sums, 100, eps, rounds, rng, eta)
    np.testing.assert_array_equal(release.mean, math.sqrt(2 / 16) * trace.average_sums / 100)
    np.testing.assert_array_equal(release.selected, trace.selected)
    assert (release.eps, release.iterations, release.q) == (eps, rounds, 100)
    assert release.mean.shape == (16,) and release.selected.dtype == np.int64


def test_h2_warm_start_carries_marginals_over() -> None:
    hashed = _hashed()
    warm = MwemHash(32, 0.1, warm_start=True)
    assert warm.marginals is None
    warm.release(hashed, 1e6, 3000, np.random.default_rng(1))
    carried = warm.marginals
    assert carried is not None and carried.shape == (32, 21)
    warm_error = _scaled_error(warm.release(hashed, 1e6, 50, np.random.default_rng(2)), hashed)
    cold = MwemHash(32, 0.1)
    cold_error = _scaled_error(cold.release(hashed, 1e6, 50, np.random.default_rng(2)), hashed)
    assert cold.marginals is None
    assert warm_error < 0.03 < 0.3 < cold_error
    warm.reset()
    reset_error = _scaled_error(warm.release(hashed, 1e6, 50, np.random.default_rng(2)), hashed)
    assert reset_error == cold_error


def test_h2_refuses_other_dimension_and_keeps_state() -> None:
    warm = MwemHash(32, 0.1, warm_start=True)
    warm.release(_hashed(), 1e3, 20, np.random.default_rng(0))
    before = warm.marginals
    with pytest.raises(ValueError, match="hashed"):
        warm.release(_hashed(d=16), 1e3, 20, np.random.default_rng(0))
    with pytest.raises(ValueError, match="eps"):
        warm.release(_hashed(), 0.0, 20, np.random.default_rng(0))
    after = warm.marginals
    assert before is not None and after is not None
    np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize(
    ("eps", "iterations", "rows"),
    [(0.0, 10, 5), (-1.0, 10, 5), (math.nan, 10, 5), (1.0, 0, 5), (1.0, 10, 0)],
)
def test_h2_rejects_bad_arguments(eps: float, iterations: int, rows: int) -> None:
    with pytest.raises(ValueError):
        MwemHash(32, 0.1).release(
            _hashed(n=max(rows, 1))[:rows], eps, iterations, np.random.default_rng(0)
        )


def test_core_rejects_bad_arguments() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="column_sums"):
        mwem_marginal_means([0.0, 11.0], 10, 1.0, 5, rng, 0.5)
    with pytest.raises(ValueError, match="init_logp"):
        mwem_marginal_means([0.0, 1.0], 10, 1.0, 5, rng, 0.5, init_logp=np.zeros((2, 4)))
    with pytest.raises(ValueError, match="q"):
        mwem_marginal_means([0.0, 1.0], 0, 1.0, 5, rng, 0.5)
    with pytest.raises(ValueError, match="eta"):
        MwemHash(8, 0.3)


def test_h2_laplace_noise_scale_from_transcript() -> None:
    hashed, eta, eps, rounds = _hashed(n=300, d=24), 0.1, 0.5, 4000
    release = MwemHash(24, eta).release(hashed, eps, rounds, np.random.default_rng(9))
    sums = quantize(hashed, eta, np.random.default_rng(9)).sum(axis=0)  # same draws as release
    residuals = release.measurements - sums[release.selected]
    # Lap(1/eps): std sqrt(2)/eps, mean |x| = 1/eps; 4000 draws give ~2% standard errors.
    assert abs(residuals.std() * eps / math.sqrt(2) - 1) < 0.12
    assert abs(np.abs(residuals).mean() * eps - 1) < 0.1
    assert abs(residuals.mean()) < 5 * math.sqrt(2) / eps / math.sqrt(rounds)


def test_h2_selection_is_exponential_in_eps_times_score() -> None:
    eps, repetitions = 1.0, 10000
    sums = np.array([0.0, 1.0, -2.0])  # cold start: w(P_0, i) = 0, so scores are 0, 1, 2
    rng = np.random.default_rng(4)
    first = [
        int(mwem_marginal_means(sums, 50, eps, 1, rng, 0.5).selected[0]) for _ in range(repetitions)
    ]
    counts = np.bincount(first, minlength=3)
    # Standard error of each log ratio is below 0.05; eps/2 and 2*eps are 0.5 away.
    assert abs(math.log(counts[1] / counts[0]) - eps) < 0.2
    assert abs(math.log(counts[2] / counts[1]) - eps) < 0.2


def test_h2_same_seed_same_release() -> None:
    hashed = _hashed(n=100, d=16)
    first = MwemHash(16, 0.25).release(hashed, 0.5, 200, np.random.default_rng(3))
    second = MwemHash(16, 0.25).release(hashed, 0.5, 200, np.random.default_rng(3))
    other = MwemHash(16, 0.25).release(hashed, 0.5, 200, np.random.default_rng(4))
    np.testing.assert_array_equal(first.mean, second.mean)
    np.testing.assert_array_equal(first.selected, second.selected)
    np.testing.assert_array_equal(first.measurements, second.measurements)
    assert not np.array_equal(first.measurements, other.measurements)
    assert not first.mean.flags.writeable


def test_h1_standardisation_is_hashing_the_standardised_point() -> None:
    rng = np.random.default_rng(4)
    X = rng.normal(50.0, 7.0, size=(30, 3))
    center, scale = np.array([50.0, 49.0, 51.0]), np.array([7.0, 6.5, 8.0])
    plain = RandomFourierFeatures(3, 64, 0.3, seed=2)
    standard = RandomFourierFeatures(3, 64, 0.3, seed=2, center=center, scale=scale)
    Z = (X - center) / scale
    np.testing.assert_allclose(standard(X), plain(Z), atol=1e-6)
    np.testing.assert_allclose(standard.hash_standardized(Z), plain(Z), atol=1e-6)
    np.testing.assert_allclose(standard(X[0]), plain(Z[0]), atol=1e-6)
    assert standard != plain  # the map differs, so equality must see the standardisation
    # the kernel it approximates is the RBF in standardised units
    big = RandomFourierFeatures(3, 20000, 0.3, seed=2, center=center, scale=scale)
    H = big(X[:5]).astype(np.float64)
    np.testing.assert_allclose(H @ H.T, rbf_kernel(Z[:5], Z[:5], 0.3), atol=0.05)


@pytest.mark.parametrize(
    ("center", "scale", "message"),
    [
        (np.zeros(3), None, "both or neither"),
        (np.zeros(2), np.ones(2), "shape"),
        (np.zeros(3), np.array([1.0, 0.0, 1.0]), "positive"),
        (np.array([0.0, np.nan, 0.0]), np.ones(3), "NaN"),
    ],
)
def test_h1_standardisation_rejects_bad_center_or_scale(
    center: NDArray[np.float64], scale: NDArray[np.float64] | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        RandomFourierFeatures(3, 8, 0.3, seed=0, center=center, scale=scale)

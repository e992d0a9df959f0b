"""Tests for dpmarket.protocol.summary.objective: Eq. 1, Eq. 3, the marginal gain, the bid,
baselines."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from dpmarket.protocol.summary.objective import (
    bid_to_gain,
    greedy_exact,
    greedy_hashed,
    hashed_bids,
    marginal_gains,
    mmd2,
    objective_j,
    rbf_gram,
    uniform_sample,
)

Array = npt.NDArray[np.float64]


def naive_rbf(X: Array, Y: Array, gamma: float) -> Array:
    return np.array([[np.exp(-gamma * np.sum((x - y) ** 2)) for y in Y] for x in X])


def j_from_gram(K_sv: Array, K_ss: Array) -> float:
    """Eq. 3 from explicit Gram blocks (summary x validation, summary x summary)."""
    q, m = K_sv.shape
    return float(2.0 * K_sv.sum() / (m * q) - K_ss.sum() / q**2) if q else 0.0


def j_linear(S: Array, V: Array) -> float:
    """Eq. 3 for the dot-product kernel k(x, y) = x . y (an explicit feature map)."""
    return j_from_gram(S @ V.T, S @ S.T)


def fourier_features(X: Array, rng: np.random.Generator, d: int, gamma: float) -> Array:
    W = rng.normal(0.0, np.sqrt(2.0 * gamma), (X.shape[1], d))
    b = rng.uniform(0.0, 2.0 * np.pi, d)
    return np.asarray(np.sqrt(2.0 / d) * np.cos(X @ W + b), dtype=np.float64)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20190101)


def test_rbf_gram_matches_definition(rng: np.random.Generator) -> None:
    X, Y = rng.normal(size=(7, 4)), rng.normal(size=(5, 4))
    np.testing.assert_allclose(rbf_gram(X, Y, 0.3), naive_rbf(X, Y, 0.3), rtol=0, atol=1e-12)
    K = rbf_gram(X, X, 0.3)
    np.testing.assert_allclose(np.diag(K), 1.0, atol=1e-12)
    assert K.dtype == np.float64


@pytest.mark.parametrize("gamma", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_gamma_raises(gamma: float) -> None:
    X = np.zeros((2, 3))
    with pytest.raises(ValueError, match="gamma"):
        rbf_gram(X, X, gamma)


def test_shape_mismatch_and_nonfinite_raise() -> None:
    with pytest.raises(ValueError, match="Y must have 3 columns"):
        rbf_gram(np.zeros((2, 3)), np.zeros((2, 4)), 1.0)
    with pytest.raises(ValueError, match="finite"):
        mmd2(np.array([[np.nan]]), np.zeros((1, 1)), 1.0)
    with pytest.raises(ValueError, match="2-D"):
        objective_j(np.zeros(3), np.zeros((2, 3)), 1.0)


def test_mmd2_is_eq1_v_statistic(rng: np.random.Generator) -> None:
    X, Y, g = rng.normal(size=(9, 3)), rng.normal(1.0, 1.0, size=(6, 3)), 0.5
    expected = naive_rbf(X, X, g).mean() - 2 * naive_rbf(X, Y, g).mean() + naive_rbf(Y, Y, g).mean()
    assert mmd2(X, Y, g) == pytest.approx(expected, abs=1e-12)
    assert mmd2(X, X, g) == pytest.approx(0.0, abs=1e-12)
    assert mmd2(X, Y, g) > 0.01


def test_objective_j_is_self_similarity_minus_mmd(rng: np.random.Generator) -> None:
    S, V, g = rng.normal(size=(8, 3)), rng.normal(size=(12, 3)), 0.7
    assert objective_j(S, V, g) == pytest.approx(
        j_from_gram(naive_rbf(S, V, g), naive_rbf(S, S, g)), abs=1e-12
    )
    assert objective_j(S, V, g) == pytest.approx(
        naive_rbf(V, V, g).mean() - mmd2(V, S, g), abs=1e-12
    )
    assert objective_j(np.empty((0, 3)), V, g) == 0.0


@pytest.mark.parametrize("q", [0, 1, 7])
def test_marginal_gains_match_brute_force(rng: np.random.Generator, q: int) -> None:
    V, S, C, g = rng.normal(size=(15, 4)), rng.normal(size=(q, 4)), rng.normal(size=(30, 4)), 0.4
    gains = marginal_gains(C, S, V, g)
    brute = [objective_j(np.vstack([S, c]), V, g) - objective_j(S, V, g) for c in C]
    np.testing.assert_allclose(gains, brute, rtol=0, atol=1e-9)


@pytest.mark.parametrize("q", [0, 1, 12])
def test_corrected_bid_is_exact_gain_up_to_a_constant(rng: np.random.Generator, q: int) -> None:
    # Linear kernel on explicit features: k(x, y) = h(x) . h(y) holds exactly.
    V, S, C = rng.normal(size=(25, 6)), rng.normal(0.5, 1, (q, 6)), rng.normal(size=(40, 6))
    g_s = S.mean(axis=0) if q else np.zeros(6)
    bids = hashed_bids(C, V.mean(axis=0), g_s, q)
    estimate = bid_to_gain(bids, q, self_kernel=(C * C).sum(axis=1))
    brute = np.array([j_linear(np.vstack([S, c]), V) - j_linear(S, V) for c in C])
    constant = j_from_gram((S @ V.T) * q / (q + 1), (S @ S.T) * q**2 / (q + 1) ** 2) - j_linear(
        S, V
    )
    np.testing.assert_allclose(estimate + constant, brute, rtol=0, atol=1e-9)
    np.testing.assert_allclose(np.diff(estimate), np.diff(brute), rtol=0, atol=1e-9)


def test_bid_ranks_like_gain_for_unit_norm_features(rng: np.random.Generator) -> None:
    # k(x, x) = 1 (as for the RBF kernel), so the default self_kernel is exact and the bid alone
    # ranks candidates exactly as the true gain does.
    unit = rng.normal(size=(120, 8))
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    V, S, C = unit[:30], unit[30:50], unit[50:]
    q = S.shape[0]
    bids = hashed_bids(C, V.mean(axis=0), S.mean(axis=0), q)
    brute = np.array([j_linear(np.vstack([S, c]), V) - j_linear(S, V) for c in C])
    assert np.array_equal(np.argsort(bids), np.argsort(brute))
    np.testing.assert_allclose(np.diff(bid_to_gain(bids, q)), np.diff(brute), rtol=0, atol=1e-9)


def test_printed_paper_bid_is_anticorrelated_with_gain(rng: np.random.Generator) -> None:
    """Algorithm 3 line 6 as printed, g_l.h1(x) - g~.h1(x) l/(l+1), ranks candidates backwards.

    Its leading term h.(g_s - g_v) is the negative of the true gain's h.(g_v - g_s): the sign is
    flipped and the l/(l+1) weight sits on the validation term (PAPER-NOTES item 1).
    """
    gamma, d = 0.2, 200
    points = np.vstack(
        [rng.normal(1, 1, (60, 5)), rng.normal(-1, 1, (20, 5)), rng.normal(0, 1.5, (400, 5))]
    )
    H = fourier_features(points, rng, d, gamma)
    V, S, C = H[:60], H[60:80], H[80:]
    q = ell = S.shape[0]
    true = np.array([j_linear(np.vstack([S, c]), V) - j_linear(S, V) for c in C])
    printed = C @ S.mean(axis=0) - (C @ V.mean(axis=0)) * ell / (ell + 1)
    corrected = hashed_bids(C, V.mean(axis=0), S.mean(axis=0), q)
    assert np.corrcoef(printed, true)[0, 1] < -0.9
    assert np.corrcoef(corrected, true)[0, 1] > 0.99


def test_hashed_bids_validates_arguments() -> None:
    H = np.ones((3, 4))
    with pytest.raises(ValueError, match="q must be"):
        hashed_bids(H, np.ones(4), np.ones(4), -1)
    with pytest.raises(ValueError, match="g_validation must have 4 columns"):
        hashed_bids(H, np.ones(5), np.ones(4), 1)
    with pytest.raises(ValueError, match="q must be"):
        not_an_int: Any = 2.5
        bid_to_gain(np.ones(3), not_an_int)


def brute_greedy(pool: Array, V: Array, p: int, gamma: float) -> list[int]:
    picks: list[int] = []
    for _ in range(p):
        gains = marginal_gains(pool, pool[picks], V, gamma)
        gains[picks] = -np.inf
        picks.append(int(np.argmax(gains)))
    return picks


def test_greedy_exact_matches_brute_force_greedy(rng: np.random.Generator) -> None:
    pool, V = rng.normal(size=(80, 3)), rng.normal(0.7, 0.5, (20, 3))
    picks = greedy_exact(pool, V, 15, 0.5)
    assert picks.dtype == np.int64
    assert picks.tolist() == brute_greedy(pool, V, 15, 0.5)
    assert len(set(picks.tolist())) == 15


def test_greedy_exact_beats_random_subsets(rng: np.random.Generator) -> None:
    pool, V = rng.normal(size=(300, 4)), rng.normal(1.0, 0.5, (40, 4))
    greedy = objective_j(pool[greedy_exact(pool, V, 20, 0.3)], V, 0.3)
    random = [objective_j(pool[rng.choice(300, 20, replace=False)], V, 0.3) for _ in range(50)]
    assert greedy > max(random)


def test_greedy_exact_edge_cases(rng: np.random.Generator) -> None:
    pool, V = rng.normal(size=(5, 2)), rng.normal(size=(3, 2))
    assert greedy_exact(pool, V, 0, 1.0).shape == (0,)
    assert sorted(greedy_exact(pool, V, 5, 1.0).tolist()) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="p must be"):
        greedy_exact(pool, V, 6, 1.0)


def test_greedy_hashed_is_greedy_on_the_linear_kernel(rng: np.random.Generator) -> None:
    unit = rng.normal(size=(130, 6)) + np.r_[1.5, 0, 0, 0, 0, 0]
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    H_pool, H_val = unit[:100], unit[100:]
    picks = greedy_hashed(H_pool, H_val, 12)
    expected: list[int] = []
    for _ in range(12):
        base = j_linear(H_pool[expected], H_val)
        gains = np.array(
            [j_linear(H_pool[[*expected, i]], H_val) - base for i in range(H_pool.shape[0])]
        )
        gains[expected] = -np.inf
        expected.append(int(np.argmax(gains)))
    assert picks.tolist() == expected


def test_greedy_hashed_keeps_a_float32_pool_float32(rng: np.random.Generator) -> None:
    """h1 hashes into float32; the harness's pool of hashed points is its largest array. The
    greedy picks what it picks from the exact float64 widening, without widening the whole pool
    at once (tracemalloc sees numpy's allocations), and refuses a non-finite value in any row."""
    import tracemalloc

    H = rng.normal(size=(200_000, 64)).astype(np.float32)  # 51 MB, above a block of rows
    V = rng.normal(size=(40, 64)).astype(np.float32)
    expected = greedy_hashed(H.astype(np.float64), V, 10)
    tracemalloc.start()
    try:
        picks = greedy_hashed(H, V, 10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert picks.tolist() == expected.tolist()
    assert peak < H.nbytes  # a float64 copy would be twice H's size
    H[199_999, 3] = np.inf
    with pytest.raises(ValueError, match="H_pool must contain only finite values"):
        greedy_hashed(H, V, 10)


def test_greedy_hashed_tracks_exact_greedy_with_fourier_features(
    rng: np.random.Generator,
) -> None:
    gamma = 0.25
    pool = np.vstack([rng.normal(0, 1, (300, 3)), rng.normal(2, 0.5, (100, 3))])
    V = rng.normal(2, 0.5, (50, 3))
    H = fourier_features(np.vstack([pool, V]), rng, 2000, gamma)
    exact = objective_j(pool[greedy_exact(pool, V, 30, gamma)], V, gamma)
    hashed = objective_j(pool[greedy_hashed(H[:400], H[400:], 30)], V, gamma)
    uniform = objective_j(pool[rng.choice(400, 30, replace=False)], V, gamma)
    assert hashed > uniform
    assert hashed > exact - 0.1 * (exact - uniform)


def test_uniform_sample_equal_shares_and_random_remainder() -> None:
    owner_of = np.repeat(np.arange(4), 50)
    extras = np.zeros(4, dtype=int)
    for seed in range(40):
        picks = uniform_sample(owner_of, 22, np.random.default_rng(seed))
        assert len(np.unique(picks)) == 22
        counts = np.bincount(owner_of[picks], minlength=4)
        assert sorted(counts.tolist()) == [5, 5, 6, 6]
        extras += counts == 6
    assert np.all(extras > 5)  # each owner gets a remainder point in some runs


def test_uniform_sample_redistributes_small_owner() -> None:
    owner_of = np.array([7] * 2 + [3] * 30 + [9] * 30)
    picks = uniform_sample(owner_of, 30, np.random.default_rng(1))
    counts = {o: int(np.sum(owner_of[picks] == o)) for o in (7, 3, 9)}
    assert counts == {7: 2, 3: 14, 9: 14}
    assert len(np.unique(picks)) == 30


def test_uniform_sample_deterministic_and_validated() -> None:
    owner_of = np.repeat(np.arange(3), 10)
    a = uniform_sample(owner_of, 9, np.random.default_rng(5))
    b = uniform_sample(owner_of, 9, np.random.default_rng(5))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, uniform_sample(owner_of, 9, np.random.default_rng(6)))
    assert uniform_sample(owner_of, 30, np.random.default_rng(0)).tolist() == list(range(30))
    assert uniform_sample(np.empty(0, dtype=np.int64), 0, np.random.default_rng(0)).shape == (0,)
    assert np.bincount(owner_of[uniform_sample(owner_of, 2, np.random.default_rng(0))]).max() == 1
    with pytest.raises(ValueError, match="p must be"):
        uniform_sample(owner_of, 31, np.random.default_rng(0))
    with pytest.raises(ValueError, match="owner_of"):
        uniform_sample(np.zeros(3), 1, np.random.default_rng(0))

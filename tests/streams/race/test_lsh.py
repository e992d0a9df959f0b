"""Contract suite for the LSH families in streams/race/lsh.py (run over every family).

Collision tests: for a fixed pair (x, y), the rows of one family are independent draws of the
hash function, so the fraction of rows whose codes agree is a binomial estimate of the kernel
k(x, y) with standard error sqrt(k (1 - k) / R). Tolerances are 5 standard errors (plus the
formula's 3e-7), and every test also checks that a kernel with its parameter off by a factor of
two is rejected by the same criterion, so the test has the power it claims.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dpmarket.streams.race.lsh import (
    MAX_ABS_INPUT,
    L2Lsh,
    LshFamily,
    SrpLsh,
    as_points,
    l2_collision_probability,
    make_family,
    srp_collision_probability,
)

DIM = 4
FAMILIES: dict[str, Callable[[int, int], LshFamily]] = {
    "l2": lambda rows, seed: L2Lsh(DIM, rows, bandwidth=1.5, seed=seed),
    "srp1": lambda rows, seed: SrpLsh(DIM, rows, bits=1, seed=seed),
    "srp3": lambda rows, seed: SrpLsh(DIM, rows, bits=3, seed=seed),
}


def _points(n: int, seed: int = 0) -> NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def _pairs(seed: int = 7) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """Pairs of points at a spread of distances and angles (kernel values from ~0.05 to 1)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((18, DIM))
    spread = np.geomspace(0.05, 2.0, 12)[:, None]
    near = x[:12] + rng.standard_normal((12, DIM)) * spread
    opposite = -x[12:] + 0.5 * rng.standard_normal((6, DIM))
    return x.astype(np.float32), np.concatenate([near, opposite]).astype(np.float32)


def _empirical(family: LshFamily, x: NDArray[np.float32], y: NDArray[np.float32]) -> NDArray[Any]:
    return (family.hash(x) == family.hash(y)).mean(axis=1)


def _within(
    empirical: NDArray[np.float64], kernel: NDArray[np.float64], rows: int
) -> NDArray[np.bool_]:
    se = np.sqrt(np.maximum(kernel * (1 - kernel), 1e-4) / rows)
    return np.abs(empirical - kernel) <= 5 * se + 3e-7


# --------------------------------------------------------------------------- contract suite
@pytest.fixture(params=sorted(FAMILIES))
def make(request: pytest.FixtureRequest) -> Callable[[int, int], LshFamily]:
    return FAMILIES[request.param]


def test_codes_are_int32_and_deterministic_per_seed(make: Callable[[int, int], LshFamily]) -> None:
    X = _points(200)
    codes = make(50, 3).hash(X)
    assert codes.dtype == np.int32 and codes.shape == (200, 50)
    assert np.array_equal(codes, make(50, 3).hash(X))
    assert not np.array_equal(codes, make(50, 4).hash(X))
    assert make(50, 3) == make(50, 3) and hash(make(50, 3)) == hash(make(50, 3))
    assert make(50, 3) != make(50, 4)


def test_one_row_and_float64_input_hash_like_the_batch(
    make: Callable[[int, int], LshFamily],
) -> None:
    family = make(30, 1)
    X = _points(5)
    assert np.array_equal(family.hash(X[2]), family.hash(X)[2:3])
    assert np.array_equal(family.hash(X.astype(np.float64)), family.hash(X))
    assert family.hash(np.zeros((0, DIM))).shape == (0, 30)


def test_empirical_collision_rate_matches_the_formula(
    make: Callable[[int, int], LshFamily],
) -> None:
    rows = 20_000
    family = make(rows, 11)
    x, y = _pairs()
    kernel = family.collision_probability(x, y)
    assert kernel.min() < 0.2 and kernel.max() > 0.9
    assert _within(_empirical(family, x, y), kernel, rows).all()


def test_collision_test_rejects_a_kernel_with_a_doubled_parameter(
    make: Callable[[int, int], LshFamily],
) -> None:
    rows = 20_000
    family = make(rows, 11)
    x, y = _pairs()
    if isinstance(family, L2Lsh):
        wrong = l2_collision_probability(np.linalg.norm(x - y, axis=1), 2 * family.bandwidth)
    else:
        cosine = (x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)
        wrong = srp_collision_probability(cosine, 2 * family.bits)
    assert not _within(_empirical(family, x, y), wrong, rows).all()


def test_kernel_sum_is_the_sum_of_pairwise_kernels(make: Callable[[int, int], LshFamily]) -> None:
    family = make(10, 0)
    X, Q = _points(37, 1), _points(5, 2)
    weights = np.arange(37, dtype=np.float64) - 10
    brute = np.array(
        [(weights * family.collision_probability(X, np.repeat(q[None], 37, 0))).sum() for q in Q]
    )
    assert np.allclose(family.kernel_sum(X, Q, weights), brute, rtol=1e-12, atol=1e-9)
    assert np.allclose(family.kernel_sum(X, X[:3]), family.kernel_sum(X, X)[:3])
    with pytest.raises(ValueError, match="weights"):
        family.kernel_sum(X, Q, np.ones(3))


def test_kernel_is_one_at_zero_distance_and_symmetric(
    make: Callable[[int, int], LshFamily],
) -> None:
    family = make(10, 0)
    X, Y = _points(20, 1), _points(20, 2)
    assert np.allclose(family.collision_probability(X, X), 1.0)
    assert np.allclose(family.collision_probability(X, Y), family.collision_probability(Y, X))
    assert (
        (family.collision_probability(X, Y) >= 0) & (family.collision_probability(X, Y) <= 1)
    ).all()


def test_make_family_rebuilds_an_equal_family(make: Callable[[int, int], LshFamily]) -> None:
    family = make(25, 9)
    rebuilt = make_family(
        family.name,
        family.dim,
        family.rows,
        family.seed,
        bandwidth=getattr(family, "bandwidth", None),
        bits=family.bits,
    )
    assert rebuilt == family
    assert np.array_equal(rebuilt.projections, family.projections)
    assert not family.projections.flags.writeable


# ------------------------------------------------------------------------- family specifics
def test_l2_formula_limits_and_monotonicity() -> None:
    distances = np.geomspace(1e-3, 1e3, 400)
    k = l2_collision_probability(distances, 1.0)
    assert l2_collision_probability(0.0, 1.0) == 1.0
    assert np.all(np.diff(k) < 0)
    assert k[0] > 0.999 and k[-1] < 1e-3
    # small-s expansion: k ~ s / sqrt(2 pi) for s = r/c -> 0
    assert math.isclose(
        float(l2_collision_probability(1e3, 1.0)), 1e-3 / math.sqrt(2 * math.pi), rel_tol=1e-3
    )


def test_erf_approximation_error_is_below_the_documented_bound() -> None:
    # 1 - 2 Phi(-s) = erf(s / sqrt 2) is the first term of the L2 kernel
    s = np.linspace(0.0, 8.0, 2001)
    tail = np.array([-math.expm1(-0.5 * v * v) * 2 / (math.sqrt(2 * math.pi) * v) for v in s[1:]])
    exact = np.array([math.erf(v / math.sqrt(2)) for v in s[1:]]) - tail
    approx = l2_collision_probability(1.0 / s[1:], 1.0)
    assert np.abs(approx - np.clip(exact, 0, 1)).max() <= 3e-7


def test_srp_zero_vector_collides_with_probability_two_to_minus_bits() -> None:
    rows = 20_000
    family = SrpLsh(DIM, rows, bits=2, seed=5)
    zero = np.zeros((1, DIM), dtype=np.float32)
    other = _points(1, 3)
    rate = float((family.hash(zero) == family.hash(other)).mean())
    assert abs(rate - 0.25) <= 5 * math.sqrt(0.25 * 0.75 / rows)
    assert family.collision_probability(zero, other)[0] == pytest.approx(0.25)
    assert family.collision_probability(zero, zero)[0] == 1.0
    assert (family.hash(zero) == 3).all()


def test_srp_codes_stay_below_two_to_the_bits() -> None:
    codes = SrpLsh(DIM, 100, bits=5, seed=1).hash(_points(300))
    assert codes.min() >= 0 and codes.max() < 32 and len(np.unique(codes)) == 32


def test_l2_codes_are_clamped_for_far_away_points() -> None:
    family = L2Lsh(DIM, 50, bandwidth=1e-6, seed=1)
    codes = family.hash(np.full((1, DIM), 1e14, dtype=np.float32))
    assert np.abs(codes.astype(np.int64)).max() <= 2**30


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dim": 0}, "dim"),
        ({"rows": -1}, "rows"),
        ({"seed": -2}, "seed"),
        ({"bandwidth": 0.0}, "bandwidth"),
        ({"rows": 2**24, "dim": 4}, "exceeds"),
    ],
)
def test_l2_parameters_are_checked(kwargs: dict[str, float], message: str) -> None:
    args: dict[str, float] = {"dim": 3, "rows": 10, "bandwidth": 1.0, "seed": 0} | kwargs
    with pytest.raises(ValueError, match=message):
        L2Lsh(**args)  # type: ignore[arg-type]


def test_srp_and_make_family_parameters_are_checked() -> None:
    with pytest.raises(ValueError, match="bits"):
        SrpLsh(3, 10, bits=31, seed=0)
    with pytest.raises(ValueError, match="family"):
        make_family("cosine", 3, 10, 0)
    with pytest.raises(ValueError, match="bandwidth"):
        make_family("l2", 3, 10, 0)
    with pytest.raises(ValueError, match="bandwidth"):
        make_family("srp", 3, 10, 0, bandwidth=1.0, bits=2)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (np.full((2, DIM), np.nan), "NaN"),
        (np.full((2, DIM), np.inf), "NaN"),
        (np.full((2, DIM), 2 * MAX_ABS_INPUT), "above"),
        (np.zeros((2, DIM + 1)), "shape"),
        (np.array([["a"] * DIM]), "numeric"),
    ],
)
def test_bad_points_are_refused(value: NDArray[np.float64], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        as_points(value, DIM)

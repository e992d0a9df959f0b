"""Fixed-point ring Z_2^64: exact modular sums, encoding error, and the capacity check."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmarket.protocol.securesum.fixedpoint import (
    FixedPoint,
    RingConfig,
    check_capacity,
    choose_frac_bits,
    grid_sensitivity,
    noise_tail_bound,
    ring_sum,
    to_signed,
)

U64_MAX = 2**64 - 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, U64_MAX), min_size=3, max_size=3), min_size=1, max_size=40))
def test_ring_sum_is_exact_modulo_2_64(rows: list[list[int]]) -> None:
    arr = np.array(rows, dtype=np.uint64)
    expected = [sum(col) % 2**64 for col in zip(*rows, strict=True)]
    assert [int(v) for v in ring_sum(arr)] == expected


@pytest.mark.parametrize(
    "values",
    [
        [0, 2**64 - 1, 1],  # -1 + 1 wraps to 0
        [2**63, 2**63],  # the two most negative values wrap to 0
        [2**63 - 1, 1],  # the largest positive plus one is the most negative
        [2**64 - 1] * 1000,
    ],
)
def test_ring_boundaries(values: list[int]) -> None:
    arr = np.array(values, dtype=np.uint64)
    assert int(ring_sum(arr)) == sum(values) % 2**64


def test_signed_reading_is_twos_complement() -> None:
    ring = np.array([0, 1, 2**63 - 1, 2**63, 2**64 - 1], dtype=np.uint64)
    assert to_signed(ring).tolist() == [0, 1, 2**63 - 1, -(2**63), -1]
    with pytest.raises(ValueError, match="uint64"):
        to_signed(np.zeros(2, dtype=np.int64))


@settings(max_examples=50, deadline=None)
@given(
    st.integers(0, 40),
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=30),
)
def test_encoding_error_is_half_a_grid_step(frac_bits: int, values: list[float]) -> None:
    codec = FixedPoint(frac_bits)
    x = np.array(values)
    err = np.abs(codec.decode(codec.encode(x)) - x)
    assert err.max() <= 0.5 * codec.resolution + np.abs(x).max() * 2.0**-52


def test_sum_of_encodings_decodes_to_the_exact_grid_sum() -> None:
    rng = np.random.default_rng(3)
    codec = FixedPoint(20)
    for n, d in [(1, 1), (7, 3), (250, 17)]:
        x = rng.uniform(-1000, 1000, (n, d))
        grid = codec.to_grid(x)
        total = ring_sum(codec.encode(x))
        exact = [sum(int(v) for v in col) for col in grid.T]
        assert to_signed(total).tolist() == exact
        assert np.all(np.abs(codec.decode(total) - x.sum(axis=0)) <= n * codec.resolution)


@pytest.mark.parametrize("sign", [1, -1])
def test_sums_near_the_ring_edge(sign: int) -> None:
    codec = FixedPoint(0)
    x = sign * np.array([[2.0**61, 1.0], [2.0**61, -1.0], [2.0**61 - 2**10, 0.0]])
    check_capacity(3, 2.0**61, 0)  # 3 * (2^61 + 1/2) < 2^63
    total = to_signed(ring_sum(codec.encode(x))).tolist()
    assert total == [sign * (3 * 2**61 - 2**10), 0]


def test_encode_refuses_non_finite_and_out_of_range() -> None:
    codec = FixedPoint(32)
    with pytest.raises(ValueError, match="NaN or infinity"):
        codec.encode([1.0, math.nan])
    with pytest.raises(ValueError, match="NaN or infinity"):
        codec.encode([math.inf])
    with pytest.raises(ValueError, match="does not fit 64 bits"):
        codec.encode([2.0**31])
    assert int(to_signed(codec.encode([2.0**31 - 1]))[0]) == (2**31 - 1) * 2**32
    with pytest.raises(ValueError, match="frac_bits"):
        FixedPoint(53)


def test_capacity_accepts_the_boundary_and_refuses_just_beyond() -> None:
    # 2 clients at bound 2^61 - 2^8 with f = 1: need 2 ((2^61 - 2^8) 2 + 1/2) = 2^63 - 1023.
    assert check_capacity(2, 2.0**61 - 2**8, 1) >= 0.0  # accepted, with almost no headroom
    with pytest.raises(ValueError, match="could wrap"):
        check_capacity(2, 2.0**61, 1)  # 2^63 + 1 >= 2^63


def _suggested(message: str, name: str) -> float:
    match = re.search(rf"{name}(?: to <=)? ([0-9.e+-]+)", message)
    assert match, message
    return float(match.group(1))


def test_capacity_error_names_each_number_that_would_fit() -> None:
    n, bound, f, noise = 10_000, 100.0, 48, 5.0
    with pytest.raises(ValueError) as info:
        check_capacity(n, bound, f, noise)
    msg = str(info.value)
    best_f = int(_suggested(msg, "frac_bits"))
    check_capacity(n, bound, best_f, noise)
    with pytest.raises(ValueError):
        check_capacity(n, bound, best_f + 1, noise)
    check_capacity(n, _suggested(msg, "bound below") * (1 - 1e-6), f, noise)
    check_capacity(int(_suggested(msg, "clients")), bound, f, noise)
    assert "noise_bound" not in msg  # the values alone already overflow: no noise bound fits


def test_capacity_counts_the_noise() -> None:
    check_capacity(100, 1.0, 40)
    with pytest.raises(ValueError, match="noise_bound below"):
        check_capacity(100, 1.0, 40, noise_bound=2.0**23)


def test_ring_config_and_choose_frac_bits() -> None:
    with pytest.raises(ValueError, match="could wrap"):
        RingConfig(n_clients=2**20, bound=2.0**20, frac_bits=30)
    f = choose_frac_bits(2**20, 2.0**20, noise_bound=1e3)
    config = RingConfig(2**20, 2.0**20, f, 1e3)
    assert config.headroom_bits >= 2
    assert check_capacity(2**20, 2.0**20, f + 1, 1e3) < 2  # one bit finer leaves < 2 spare
    with pytest.raises(ValueError, match="n_clients"):
        check_capacity(0, 1.0, 10)
    with pytest.raises(ValueError, match="bound"):
        check_capacity(3, -1.0, 10)


def test_noise_tail_bound() -> None:
    # d = 1, failure 2^-128: k = sqrt(2 ln(2 * 2^128))
    k = math.sqrt(2 * (math.log(2) + 128 * math.log(2)))
    assert noise_tail_bound(3.0, 1) == pytest.approx(3.0 * k)
    assert noise_tail_bound(1.0, 10_000) > noise_tail_bound(1.0, 10)
    # the tail bound holds for a real sample far beyond any seed's reach
    rng = np.random.default_rng(0)
    assert np.abs(rng.normal(0, 2.0, 10**6)).max() < noise_tail_bound(2.0, 10**6, -20)


def test_grid_sensitivity_bounds_rounded_differences() -> None:
    rng = np.random.default_rng(1)
    codec = FixedPoint(3)
    d = 50
    for _ in range(200):
        x = rng.uniform(-2, 2, d)
        y = x + rng.normal(0, 1, d) * 0.1
        delta = float(np.linalg.norm(x - y))
        diff = (codec.to_grid(x) - codec.to_grid(y)) * codec.resolution
        assert np.linalg.norm(diff) <= grid_sensitivity(delta, d, 3) + 1e-12

"""Tests for the RACE sketch, its releases and their privacy statements (streams/race/sketch.py).

Noise-scale tests compare the empirical noise of a release (released minus true counters) with
the documented scale over thousands of independent counters: mean |Laplace(b)| = b with a
relative standard error of 1/sqrt(cells), so 10% margins are more than 5 standard errors, and a
scale off by a factor of two (or the authors' R/(N eps)) is far outside them.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
from dp_accounting import gaussian_mechanism
from numpy.typing import NDArray

from dpmarket.protocol.privacy import ledger as accounting
from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.wire.codec import Message, encode
from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.streams.race import sketch as race
from dpmarket.streams.race.kernels import mean_of_one
from dpmarket.streams.race.lsh import L2Lsh, LshFamily, SrpLsh
from dpmarket.streams.race.sketch import (
    PrivacyStatement,
    RaceRelease,
    RaceSketch,
    gaussian_epsilon,
    gaussian_sigma,
)

DIM = 3


def _data(n: int = 3000, seed: int = 0) -> NDArray[np.float32]:
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-4, 4, size=(5, DIM))
    return (centres[rng.integers(0, 5, n)] + rng.standard_normal((n, DIM))).astype(np.float32)


def _l2(rows: int = 64, seed: int = 1, bandwidth: float = 1.0) -> L2Lsh:
    return L2Lsh(DIM, rows, bandwidth=bandwidth, seed=seed)


def _sketch(family: LshFamily | None = None, width: int = 256, n: int = 3000) -> RaceSketch:
    sketch = RaceSketch(family or _l2(), width)
    sketch.update(_data(n))
    return sketch


# -------------------------------------------------------------------------------- counting
@pytest.mark.parametrize(
    ("family", "width"),
    [(_l2(), 1000), (_l2(), 1024), (_l2(), 7), (SrpLsh(DIM, 40, 4, seed=2), 16),
     (SrpLsh(DIM, 40, 3, seed=2), 1000)],
)  # fmt: skip
def test_numba_and_numpy_backends_give_identical_counts(family: LshFamily, width: int) -> None:
    X = _data(5000) * 3
    weights = np.random.default_rng(4).integers(-3, 4, X.shape[0])
    fast = RaceSketch(family, width, weight_bound=3, backend="numba")
    slow = RaceSketch(family, width, weight_bound=3, backend="numpy")
    for sketch in (fast, slow):
        sketch.update(X)
        sketch.update(X[:1234], weights[:1234])
    assert fast == slow
    Q = _data(40, seed=9)
    assert np.array_equal(fast.query(Q), slow.query(Q))
    assert np.array_equal(fast.query(Q[:3]), slow.query(Q[:3]))
    assert np.array_equal(fast.query(Q[0]), slow.query(Q[0]))  # the single-query fast path
    assert np.array_equal(fast.query(Q[:3]), fast.query(Q)[:3])  # same as the parallel kernel
    assert np.allclose(fast.query(Q, "median_of_means"), slow.query(Q, "median_of_means"))


@pytest.mark.parametrize(
    ("family", "width"), [(_l2(), 1000), (_l2(), 1024), (SrpLsh(DIM, 40, 3, seed=2), 7)]
)
def test_single_query_fast_path_is_bit_identical_to_the_batch_kernel(
    family: LshFamily, width: int
) -> None:
    sketch = RaceSketch(family, width, weight_bound=3)
    X = _data(4000) * 3
    sketch.update(X)
    sketch.update(X[:700], np.random.default_rng(5).integers(-3, 4, 700))
    release = sketch.release_laplace(1.0, np.random.default_rng(6))
    Q = _data(40, seed=11) * 3
    for target in (sketch, release):
        batch = target.query(Q)  # 40 queries: the parallel gather kernel
        for i, q in enumerate(Q):
            assert mean_of_one(q, family, target.counts) is not None  # the fast path applies
            assert np.array_equal(target.query(q), batch[i : i + 1])
            assert np.array_equal(target.query(q.astype(np.float64)), batch[i : i + 1])
        strided = np.asfortranarray(Q)[5]  # a non-contiguous float32 row
        assert not strided.flags.c_contiguous
        assert np.array_equal(target.query(strided), batch[5:6])


def test_numpy_and_numba_sum_rows_in_the_same_order_past_exact_float_sums() -> None:
    """Counters past 2^53 / R make float64 partial sums inexact: the numpy path must add rows
    in order as the compiled kernel does (a pairwise sum, as numpy's add.reduce and reduceat
    do over more than eight rows, gives 2^53 + 63 here instead of 2^53)."""
    rows, width = 64, 8
    values = np.ones((rows, width), dtype=np.int64)
    values[0] = 2**53  # row order: 2^53 + 1 rounds back to 2^53 at every step
    statement = PrivacyStatement("laplace", (1.0,), 4.0, race.ADD_REMOVE, 4.0, 0.0)
    Q = _data(40, seed=3)
    answers = {}
    for backend in ("numba", "numpy"):
        template = RaceSketch(_l2(rows=rows), width, backend=backend)
        release = RaceRelease(template, values, statement)
        answers[backend] = (
            release.query(Q),
            release.query(Q[:3]),
            release.query(Q, "median_of_means", groups=1),
            release.query(Q, "median_of_means", groups=5),
        )
    for fast, slow in zip(answers["numba"], answers["numpy"], strict=True):
        assert np.array_equal(fast, slow)
    assert answers["numpy"][0][0] == 2.0**53 / rows  # every row added in order
    assert answers["numpy"][2][0] == 2.0**53 / rows


def test_single_query_takes_the_float_path_when_an_int64_sum_could_differ() -> None:
    template = RaceSketch(_l2(rows=4), 8)
    values = np.ones((4, 8), dtype=np.int64)
    values[0] = 2**53  # float64 row-order sum: 2^53 + 1 + 1 + 1 rounds to 2^53 at every step
    statement = PrivacyStatement("laplace", (1.0,), 4.0, race.ADD_REMOVE, 4.0, 0.0)
    release = RaceRelease(template, values, statement)
    q = _data(1)[0]
    assert mean_of_one(q, template.family, release.counts) is None
    assert release.query(q)[0] == 2.0**51 != float(2**53 + 3) / 4  # not the exact int64 sum
    assert np.array_equal(release.query(q), release.query(q[None]))


@pytest.mark.parametrize(
    ("query", "message"),
    [([np.nan, 0, 0], "NaN"), ([0, -np.inf, 0], "NaN"), ([0, 0, 3e15], "above"),
     ([0, 0], "shape"), ([0, 0, 0, 0], "shape")],
)  # fmt: skip
def test_bad_single_queries_are_refused_with_the_general_messages(
    query: list[float], message: str
) -> None:
    sketch = _sketch()
    point = np.array(query, dtype=np.float32)
    assert mean_of_one(point, sketch.family, sketch.counts) is None
    with pytest.raises(ValueError, match=message):
        sketch.query(point)


def test_counters_hold_one_increment_per_row_at_the_hashed_column() -> None:
    family = _l2(rows=20)
    X = _data(50)
    sketch = RaceSketch(family, 64)
    sketch.update(X)
    expected = np.zeros((20, 64), dtype=np.int64)
    for row, col in enumerate(np.mod(family.hash(X).astype(np.int64), 64).T):
        np.add.at(expected[row], col, 1)
    assert np.array_equal(sketch.counts, expected)
    assert np.array_equal(sketch.columns(X), np.mod(family.hash(X), 64))
    assert (sketch.counts.sum(axis=1) == 50).all() and sketch.estimated_size() == 50


def test_batches_deletions_and_weights_are_one_pass_linear() -> None:
    X = _data(2000)
    whole = RaceSketch(_l2(), 128, weight_bound=2)
    whole.update(X)
    parts = RaceSketch(_l2(), 128, weight_bound=2)
    for block in np.array_split(X, 7):
        parts.update(block)
    assert parts == whole
    parts.update(X[:500], -np.ones(500, dtype=np.int64))
    tail = RaceSketch(_l2(), 128, weight_bound=2)
    tail.update(X[500:])
    assert parts == tail
    doubled = RaceSketch(_l2(), 128, weight_bound=2)
    doubled.update(X, np.full(2000, 2.0))
    whole.merge(whole.copy())
    assert doubled == whole


@pytest.mark.parametrize(
    ("weights", "message"),
    [(np.full(10, 2), "weight_bound"), (np.full(10, 0.5), "integers"),
     (np.ones(9), "shape"), (np.array(["a"] * 10), "integers")],
)  # fmt: skip
def test_bad_updates_are_refused_and_leave_the_sketch_untouched(
    weights: NDArray[np.float64], message: str
) -> None:
    sketch = _sketch()
    before = sketch.copy()
    with pytest.raises(ValueError, match=message):
        sketch.update(_data(10), weights)
    with pytest.raises(ValueError, match="NaN"):
        sketch.update(np.full((4, DIM), np.nan))
    with pytest.raises(ValueError, match="shape"):
        sketch.update(np.zeros((4, DIM + 1)))
    assert sketch == before


def test_constructor_checks_its_arguments() -> None:
    cases = [({"width": 0}, "width"), ({"width": 2**31}, "width"),
             ({"weight_bound": 0}, "weight_bound"), ({"backend": "gpu"}, "backend")]  # fmt: skip
    for kwargs, message in cases:
        args = {"width": 16} | kwargs
        with pytest.raises(ValueError, match=message):
            RaceSketch(_l2(), **args)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="family"):
        RaceSketch("l2", 16)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------- queries
@pytest.mark.parametrize("family", [_l2(rows=2000), SrpLsh(DIM, 2000, 2, seed=3)])
def test_mean_query_estimates_the_exact_kernel_sum(family: LshFamily) -> None:
    width = 4096 if isinstance(family, L2Lsh) else 4
    X, Q = _data(2000), _data(20, seed=5)
    sketch = RaceSketch(family, width)
    sketch.update(X)
    exact = family.kernel_sum(X, Q)
    f_tilde = np.sqrt(np.array([family.collision_probability(X, np.repeat(q[None], 2000, 0))
                                for q in Q])).sum(axis=1)  # fmt: skip
    # Theorem 2.5: each row has variance <= f~^2; the mean of R rows: f~/sqrt(R) per std.
    # The codes take fewer than W values here (no collisions mod W), so the mean is unbiased.
    assert len(np.unique(family.hash(X))) <= width
    error = np.abs(sketch.query(Q) - exact)
    assert (error <= 5 * f_tilde / math.sqrt(family.rows) + 1).all()
    mom = sketch.query(Q, "median_of_means", groups=20)
    assert (np.abs(mom - exact) <= 10 * f_tilde / math.sqrt(family.rows) + 1).all()


def test_normalized_query_divides_by_the_estimated_size() -> None:
    sketch = _sketch()
    Q = _data(10, seed=3)
    assert np.allclose(sketch.query(Q, normalize=True), sketch.query(Q) / 3000)
    with pytest.raises(ValueError, match="N_hat"):
        RaceSketch(_l2(), 16).query(Q, normalize=True)
    with pytest.raises(ValueError, match="estimator"):
        sketch.query(Q, "median")
    with pytest.raises(ValueError, match="groups"):
        sketch.query(Q, "median_of_means", groups=65)
    assert np.array_equal(sketch.query(Q, "median_of_means", groups=1), sketch.query(Q))


# --------------------------------------------------------------------- merge, copy, bytes
@pytest.mark.parametrize(
    ("other", "message"),
    [(RaceSketch(_l2(seed=2), 256), "seeds"), (RaceSketch(_l2(), 128), "widths"),
     (RaceSketch(SrpLsh(DIM, 64, 1, seed=1), 256), "families"),
     (RaceSketch(_l2(rows=32), 256), "rows"), (RaceSketch(_l2(bandwidth=2.0), 256), "hash"),
     (RaceSketch(_l2(), 256, weight_bound=2), "weight bounds")],
)  # fmt: skip
def test_merge_refuses_other_parameters_and_names_them(other: RaceSketch, message: str) -> None:
    sketch = _sketch()
    before = sketch.copy()
    with pytest.raises(ValueError, match=message):
        sketch.merge(other)
    assert sketch == before


def test_merge_is_the_sketch_of_the_union_and_copy_is_independent() -> None:
    X = _data(3000)
    a, b, union = (RaceSketch(_l2(), 256) for _ in range(3))
    a.update(X[:1000])
    b.update(X[1000:])
    union.update(X)
    twin = a.copy()
    a.merge(b)
    assert a == union and twin != union and twin.estimated_size() == 1000
    assert a != "sketch" and not a.counts.flags.writeable


def test_bytes_round_trip_and_bad_frames() -> None:
    for family in (_l2(), SrpLsh(DIM, 30, 5, seed=8)):
        sketch = _sketch(family)
        again = RaceSketch.from_bytes(sketch.to_bytes())
        assert again == sketch and again.family == family
    frame = sketch.to_bytes()
    with pytest.raises(RemoteProtocolError):
        RaceSketch.from_bytes(frame[:-5])
    with pytest.raises(RemoteProtocolError):
        RaceSketch.from_bytes(b"\x00garbage")
    release = sketch.release_laplace(1.0, np.random.default_rng(0))
    with pytest.raises(RemoteProtocolError, match=r"race\.sketch"):
        RaceSketch.from_bytes(release.to_bytes())
    bad = frame.replace(b"srp", b"xyz")
    with pytest.raises(RemoteProtocolError, match="family"):
        RaceSketch.from_bytes(bad)


# -------------------------------------------------------------------------------- releases
def _laplace_noise(rows: int, epsilon: float, n: int, seed: int = 0) -> NDArray[np.float64]:
    sketch = _sketch(_l2(rows=rows), width=128, n=n)
    release = sketch.release_laplace(epsilon, np.random.default_rng(seed))
    return np.asarray(release.counts - sketch.counts, dtype=np.float64)


@pytest.mark.parametrize(("rows", "epsilon"), [(40, 0.5), (80, 4.0)])
def test_laplace_release_has_scale_r_over_epsilon(rows: int, epsilon: float) -> None:
    noise = _laplace_noise(rows, epsilon, n=2000)
    scale = rows / epsilon
    mean_abs = float(np.abs(noise).mean())
    assert abs(mean_abs / scale - 1) < 0.1
    assert abs(noise.var() / (2 * scale**2) - 1) < 0.25
    assert abs(float(np.median(np.abs(noise))) / (scale * math.log(2)) - 1) < 0.1
    # the criterion rejects a factor of two either way and the authors' R/(N eps)
    for wrong in (2 * scale, scale / 2, scale / 2000):
        assert abs(mean_abs / wrong - 1) >= 0.1


def test_release_is_deterministic_in_the_generator_and_states_its_cost() -> None:
    sketch = _sketch()
    a = sketch.release_laplace(0.7, np.random.default_rng(3))
    assert a == sketch.release_laplace(0.7, np.random.default_rng(3))
    assert a != sketch.release_laplace(0.7, np.random.default_rng(4))
    s = a.statement
    assert (s.mechanism, s.noise, s.sensitivity, s.epsilon, s.delta) == (
        "laplace", (64 / 0.7,), 64.0, 0.7, 0.0)  # fmt: skip
    assert s.neighbouring == accounting.ADD_REMOVE == race.ADD_REMOVE and s.releases == 1
    ledger = PrivacyLedger("owner-1")
    s.record(ledger)
    assert ledger.events[0].dp_parameters() == pytest.approx((0.7, 0.0))
    with pytest.raises(ValueError, match="epsilon"):
        sketch.release_laplace(0.0, np.random.default_rng(0))


def test_sensitivity_of_the_counter_vector_is_r_in_l1_and_sqrt_r_in_l2() -> None:
    sketch = _sketch(_l2(rows=50))
    before = sketch.counter_vector()
    sketch.update(_data(1, seed=42))
    change = sketch.counter_vector() - before
    assert before.dtype == np.int64 and before.shape == (50 * 256,)
    assert np.abs(change).sum() == sketch.l1_sensitivity == 50
    assert math.isclose(float(np.linalg.norm(change)), sketch.l2_sensitivity)
    heavy = RaceSketch(_l2(rows=50), 256, weight_bound=3)
    assert heavy.l1_sensitivity == 150 and heavy.l2_sensitivity == pytest.approx(3 * math.sqrt(50))
    noisy = heavy.release_laplace(1.0, np.random.default_rng(0)).statement
    assert noisy.noise == (150.0,) and "3" in noisy.neighbouring


def test_gaussian_release_noise_and_statement() -> None:
    sketch = _sketch(_l2(rows=64), width=128)
    sigma = gaussian_sigma(1.0, 1e-6, sketch.l2_sensitivity)
    release = sketch.release_gaussian(sigma, np.random.default_rng(1), delta=1e-6)
    noise = np.asarray(release.counts - sketch.counts)
    assert abs(noise.std() / sigma - 1) < 0.05
    assert release.statement.epsilon == pytest.approx(1.0, rel=1e-6)
    assert release.statement.sensitivity == pytest.approx(8.0)
    assert sketch.release_gaussian(sigma, np.random.default_rng(1)).statement.epsilon is None


@pytest.mark.parametrize(("sigma", "delta"), [(1.0, 1e-5), (30.0, 1e-6), (0.3, 1e-3)])
def test_gaussian_calibration_agrees_with_dp_accounting(sigma: float, delta: float) -> None:
    eps = gaussian_epsilon(sigma, 1.0, delta)
    assert eps == pytest.approx(gaussian_mechanism.get_epsilon_gaussian(sigma, delta), rel=1e-4)
    assert gaussian_sigma(eps, delta, 1.0) == pytest.approx(sigma, rel=1e-6)
    assert gaussian_epsilon(5 * sigma, 5.0, delta) == pytest.approx(eps, rel=1e-6)


def test_streaming_refresh_accumulates_disjoint_deltas_and_their_noise() -> None:
    X = _data(4000)
    family, T, epsilon = _l2(rows=40), 4, 2.0
    delta, full = RaceSketch(family, 128), RaceSketch(family, 128)
    full.update(X)
    rng = np.random.default_rng(11)
    total: RaceRelease | None = None
    for block in np.array_split(X, T):
        delta.update(block)
        part = delta.release_laplace(epsilon, rng)
        total = part if total is None else total.accumulate(part)
        delta.clear()
    assert total is not None
    noise = np.asarray(total.counts - full.counts)
    b = 40 / epsilon
    # variance adds: T * 2 b^2 (a single release would have 2 b^2)
    assert total.statement.noise_variance == pytest.approx(T * (2 * b**2 + 1 / 12))
    assert abs(noise.var() / (T * 2 * b**2) - 1) < 0.15
    assert abs(noise.var() / (2 * b**2) - 1) > 1
    assert total.statement.releases == T and total.statement.epsilon == epsilon
    ledger = PrivacyLedger("owner")
    total.statement.record(ledger)
    assert ledger.events[0].count == T


def test_releases_round_trip_and_refuse_mismatched_accumulation() -> None:
    sketch = _sketch()
    laplace = sketch.release_laplace(1.0, np.random.default_rng(0))
    gauss = sketch.release_gaussian(3.0, np.random.default_rng(0), delta=1e-6)
    for release in (laplace, gauss):
        assert RaceRelease.from_bytes(release.to_bytes()) == release
    with pytest.raises(ValueError, match="mechanism"):
        laplace.accumulate(gauss)
    other = _sketch(_l2(seed=9)).release_laplace(1.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="seeds"):
        laplace.accumulate(other)
    Q = _data(5, seed=1)
    assert np.allclose(laplace.query(Q), laplace.query(Q.astype(np.float64)))


def test_release_from_a_securely_summed_counter_vector() -> None:
    a, b = _sketch(n=1000), _sketch(n=2000)
    summed = a.counter_vector() + b.counter_vector()
    noisy = summed + np.random.default_rng(0).normal(0, 5.0, summed.shape)
    statement = PrivacyStatement(
        "gaussian", (5.0,), a.l2_sensitivity, "add/remove one record", None, 0.0
    )
    release = RaceRelease.from_counter_vector(a, noisy, statement)
    a.merge(b)
    assert np.allclose(release.counts, a.counts, atol=40)
    # N_hat = (sum of R W counters) / R: noise std 5 sqrt(W / R) = 10
    assert release.estimated_size() == pytest.approx(3000, abs=60)
    with pytest.raises(ValueError, match="shape"):
        RaceRelease.from_counter_vector(a, noisy[:-1], statement)


def test_semantically_bad_frames_and_mutations_raise_only_remote_errors() -> None:
    sketch = _sketch(_l2(rows=8), width=16, n=100)
    frame = sketch.to_bytes()
    fields = {"family": "l2", "dim": DIM, "rows": 8, "width": 16, "seed": 1, "bits": 1,
              "weight_bound": 1, "bandwidth": 1.0}  # fmt: skip
    wrong_shape = race.RaceSketchBody(**fields, counts=np.zeros((8, 15), dtype=np.int64))
    message = Message(run="r", round=0, sender="a", recipient="b", seq=0, body=wrong_shape)
    with pytest.raises(RemoteProtocolError, match="shape"):
        RaceSketch.from_bytes(encode(message))
    rng = np.random.default_rng(0)
    accepted = 0
    for _ in range(300):
        mutated = bytearray(frame)
        for position in rng.integers(0, len(frame), size=3):
            mutated[position] = int(rng.integers(0, 256))
        with contextlib.suppress(RemoteProtocolError):  # anything else fails the test
            accepted += isinstance(RaceSketch.from_bytes(bytes(mutated)), RaceSketch)
    assert 0 < accepted < 300

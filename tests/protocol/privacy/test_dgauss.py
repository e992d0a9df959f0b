"""Gaussian calibration (classical, analytic) and the discrete Gaussian sampler."""

from __future__ import annotations

import math
from decimal import Decimal, getcontext

import numpy as np
import numpy.typing as npt
import pytest
from dp_accounting import gaussian_mechanism
from scipy import stats

from dpmarket.actors.randomness import NoiseSource
from dpmarket.protocol.privacy import dgauss
from dpmarket.protocol.privacy.dgauss import (
    Keystream,
    Proposal,
    _Pass,
    analytic_sigma,
    classical_sigma,
    client_sigma,
    gaussian_sigma,
    sample_discrete_gaussian,
)


def exact_moments(sigma: float) -> tuple[float, float]:
    """Variance and fourth moment of N_Z(0, sigma^2), by summing the pmf."""
    k = np.arange(-int(40 * sigma) - 40, int(40 * sigma) + 41, dtype=np.float64)
    p = np.exp(-(k**2) / (2 * sigma**2))
    p /= p.sum()
    return float((p * k**2).sum()), float((p * k**4).sum())


def test_classical_sigma_is_eq_1_and_refuses_large_epsilon() -> None:
    assert classical_sigma(0.5, 1e-5, 2.0) == pytest.approx(
        2.0 * math.sqrt(2 * math.log(1.25e5)) / 0.5
    )
    with pytest.raises(ValueError, match="epsilon < 1"):
        classical_sigma(1.0, 1e-5, 1.0)
    with pytest.raises(ValueError, match="delta"):
        classical_sigma(0.5, 0.0, 1.0)


@pytest.mark.parametrize("epsilon", [0.05, 0.5, 1.0, 4.0, 20.0])
@pytest.mark.parametrize("delta", [1e-2, 1e-5, 1e-10])
def test_analytic_sigma_matches_dp_accounting(epsilon: float, delta: float) -> None:
    sigma = analytic_sigma(epsilon, delta, 3.0)
    assert sigma == pytest.approx(
        3.0 * gaussian_mechanism.get_sigma_gaussian(epsilon, delta), rel=1e-6
    )
    # and it really achieves (epsilon, delta): the exact epsilon at that sigma is <= epsilon
    assert gaussian_mechanism.get_epsilon_gaussian(sigma / 3.0, delta) <= epsilon * (1 + 1e-9)
    if epsilon < 1:
        assert sigma < classical_sigma(epsilon, delta, 3.0)


def test_gaussian_sigma_selects_the_method() -> None:
    assert gaussian_sigma(0.5, 1e-5, 1.0, "classical") == classical_sigma(0.5, 1e-5, 1.0)
    assert gaussian_sigma(0.5, 1e-5, 1.0) == analytic_sigma(0.5, 1e-5, 1.0)
    with pytest.raises(ValueError, match="method"):
        gaussian_sigma(0.5, 1e-5, 1.0, "laplace")


def test_client_sigma_is_theorem_1() -> None:
    assert client_sigma(6.0, 13, 3) == pytest.approx(6.0 / 3.0)  # N - T - 1 = 9
    assert client_sigma(2.0, 2, 0) == 2.0
    with pytest.raises(ValueError, match="n_clients"):
        client_sigma(1.0, 4, 3)
    with pytest.raises(ValueError, match="tolerance"):
        client_sigma(1.0, 4, -1)


@pytest.mark.parametrize("sigma", [0.7, 1.0, 4.0, 1e3, 3e9])
def test_sampler_variance_and_mean(sigma: float) -> None:
    """Sample variance within 5 standard errors of the exact one: a factor-2 error in sigma
    (a factor 4 in variance), or even 10% in variance, is far outside."""
    n = 400_000
    y = sample_discrete_gaussian(sigma, n, np.random.default_rng(11))
    var, fourth = exact_moments(sigma) if sigma < 1e4 else (sigma**2, 3 * sigma**4)
    se = math.sqrt((fourth - var**2) / n)
    assert y.dtype == np.int64
    assert abs(float(np.mean(y.astype(np.float64) ** 2)) - var) < 5 * se
    assert 5 * se < 0.1 * var  # the window is narrower than a 10% variance error
    assert abs(float(y.mean())) < 5 * math.sqrt(var / n)


def test_sampler_pmf_matches_the_discrete_gaussian() -> None:
    sigma, n = 1.5, 300_000
    y = sample_discrete_gaussian(sigma, n, np.random.default_rng(5))
    k = np.arange(-6, 7)
    p = np.exp(-(k**2) / (2 * sigma**2))
    p /= np.exp(-(np.arange(-60, 61) ** 2) / (2 * sigma**2)).sum()
    counts = np.array([(y == v).sum() for v in k])
    expected = n * p
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 45.0  # 13 cells: the 1e-5 quantile of chi-square(12) is about 41
    assert (np.abs(y) > 6).sum() < 5 * n * (1 - p.sum()) + 10
    # a continuous Gaussian rounded would put 0.2611 at 0; the discrete one puts 0.2660
    assert abs(counts[6] / n - p[6]) < 5 * math.sqrt(p[6] * (1 - p[6]) / n)


def test_sampler_is_reproducible_and_shaped() -> None:
    a = sample_discrete_gaussian(50.0, (3, 4), np.random.default_rng(9))
    b = sample_discrete_gaussian(50.0, (3, 4), np.random.default_rng(9))
    assert a.shape == (3, 4)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, sample_discrete_gaussian(50.0, (3, 4), np.random.default_rng(10)))
    assert not sample_discrete_gaussian(0.0, 5, np.random.default_rng(0)).any()
    with pytest.raises(ValueError, match="sigma"):
        sample_discrete_gaussian(-1.0, 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="2\\^48"):
        sample_discrete_gaussian(2.0**49, 3, np.random.default_rng(0))


# --- the sampler's law against the exact discrete Gaussian (issue 39) ------------------------


def exact_cells(sigma: float, n: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Cells (upper edges; the first cell is open below, the last open above) and their exact
    N_Z(0, sigma^2) probabilities, by summing exp(-y^2 / (2 sigma^2)) over every integer within
    12 sigma + 12 (the mass left out is below 1e-31). Below sigma = 10 the cells are single
    integers expecting at least 20 of ``n`` draws; above, 40 cells of about equal mass."""
    reach = math.ceil(12 * sigma) + 12
    if sigma < 10:
        k = np.arange(-reach, reach + 1)
        p = np.exp(-(k.astype(np.float64) ** 2) / (2 * sigma**2))
        inner = k[n * p / p.sum() >= 20]
        upper = np.arange(inner.min(), inner.max(), dtype=np.int64)  # last cell: > max - 1
    else:
        quantiles = stats.norm.ppf(np.arange(1, 40) / 40) * sigma
        upper = np.unique(np.round(quantiles).astype(np.int64))
    sums = np.zeros(upper.size + 1)
    for start in range(-reach, reach + 1, 1 << 22):
        y = np.arange(start, min(start + (1 << 22), reach + 1), dtype=np.int64)
        weights = np.exp(-(y.astype(np.float64) ** 2) / (2 * sigma**2))
        sums += np.bincount(np.searchsorted(upper, y), weights=weights, minlength=sums.size)
    return upper, sums / sums.sum()


def chi_square(draws: npt.NDArray[np.int64], upper: npt.NDArray[np.int64],
               p: npt.NDArray[np.float64]) -> float:  # fmt: skip
    counts = np.bincount(np.searchsorted(upper, draws), minlength=p.size)
    expected = draws.size * p
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("sigma", [0.5, 2.0, 1e3, 1e6])
def test_pmf_matches_the_exact_discrete_gaussian_and_a_factor_2_fails(sigma: float) -> None:
    """Chi-square of 200,000 draws (fixed seed) against the exact PMF, below its 1e-6 upper
    quantile (a fresh seed fails one time in a million); the same statistic for draws at
    2 sigma, or at sigma / 2, against sigma's PMF lies far above it."""
    n = 200_000
    upper, p = exact_cells(sigma, n)
    limit = float(stats.chi2.isf(1e-6, p.size - 1))
    good = chi_square(sample_discrete_gaussian(sigma, n, np.random.default_rng(21)), upper, p)
    assert good < limit
    for wrong in (2 * sigma, sigma / 2):
        y = sample_discrete_gaussian(wrong, n, np.random.default_rng(22))
        assert chi_square(y, upper, p) > 20 * limit


def test_emission_rate_is_the_one_passes_are_sized_by() -> None:
    """A pass over uniform words emits Proposal.rate of its candidates (within 5 standard
    errors), so passes sized by it rarely fall short and never waste a fixed 60%."""
    for sigma in (0.3, 2.0, 77.0, 1e6, 2.0**48):
        proposal = Proposal.of(sigma)
        scratch = _Pass(100_000)
        Keystream(np.random.default_rng(3)).fill(scratch.words)
        emitted = scratch.run(proposal).size
        se = math.sqrt(proposal.rate * (1 - proposal.rate) / 100_000)
        assert abs(emitted / 100_000 - proposal.rate) < 5 * se
        assert proposal.rate > 0.24


def test_acceptance_boundary_is_within_18_units_of_2_to_the_minus_53() -> None:
    """The guarantee's one inexact step, checked against exact decimal arithmetic: for
    candidates (R, V, sign) at several sigmas the implemented test accepts exactly the
    uniforms m < M, and |M - pi 2^53| <= 18 with pi = 2^V exp(-(Y^2 + c^2) / (2 sigma^2))."""
    getcontext().prec = 60
    rng = np.random.default_rng(4)
    worst = 0.0
    for sigma in (0.3, 1.0, 2.0, 3.7, 1e3, 1e6, 3e9, 2.0**48):
        proposal = Proposal.of(sigma)
        k, n = proposal.k, 2000
        v = np.minimum(rng.geometric(0.5, n) - 1, 20).astype(np.uint64)
        r = rng.integers(0, 2**k, n, dtype=np.uint64) if k else np.zeros(n, np.uint64)
        sign = rng.integers(0, 2, n, dtype=np.uint64)
        scratch = _Pass(n)
        scratch.w_r[:] = r << np.uint64(64 - k) if k else 0
        scratch.w_v[:] = np.uint64(1) << v
        low, high = np.zeros(n, np.uint64), np.full(n, 2**53, np.uint64)
        while np.any(high - low > 1):  # bisection for M, the first rejected m (high)
            mid = (low + high) // np.uint64(2)
            scratch.w_u[:] = mid | (sign << np.uint64(63))
            scratch.run(proposal)
            low, high = np.where(scratch.keep, mid, low), np.where(scratch.keep, high, mid)
        scratch.w_u[:] = sign << np.uint64(63)  # m = 0
        scratch.run(proposal)
        first = np.where(scratch.keep, high, 0)  # M = 0 when even m = 0 is rejected
        t = Decimal(2) ** k
        half_s2 = (Decimal(sigma) * Decimal(2).ln() / t) ** 2 / 2
        for i in range(n):
            x = int(v[i]) * (1 << k) + int(r[i])
            y = -(x + 1) if sign[i] else x
            pi = (
                Decimal(2) ** int(v[i])
                * (-(Decimal(y) ** 2) / (2 * Decimal(sigma) ** 2) - half_s2).exp()
            )
            worst = max(worst, float(abs(Decimal(int(first[i])) - pi * Decimal(2) ** 53)))
    assert worst <= 18.0


def test_noise_of_two_calls_on_one_generator_never_cancels() -> None:
    """No key serves twice: two rounds' noise from one generator differ, are uncorrelated, and
    their difference is zero only as often as two independent draws coincide."""
    rng = NoiseSource.secure().generator("dca:owner-1")
    n, sigma = 100_000, 1e3
    a = sample_discrete_gaussian(sigma, n, rng)
    b = sample_discrete_gaussian(sigma, n, rng)
    assert not np.array_equal(a, b)
    assert abs(float(np.corrcoef(a, b)[0, 1])) < 5 / math.sqrt(n)
    coincide = 1 / (2 * sigma * math.sqrt(math.pi))  # sum of p(y)^2 for large sigma
    assert int(np.count_nonzero(a == b)) < 3 * n * coincide + 20


def test_noise_cannot_be_regenerated_from_the_label_or_a_public_seed() -> None:
    """A party that knows the label (public) cannot rebuild an owner's noise: a second secure
    generator with the same label, or any reproducible one, gives other noise."""
    label, n = "dca:owner-3", 20_000
    own = sample_discrete_gaussian(1e6, n, NoiseSource.secure().generator(label))
    guesses = [NoiseSource.secure().generator(label)] + [
        NoiseSource.reproducible(seed).generator(label) for seed in (0, 1, 7)
    ]
    for guess in guesses:
        other = sample_discrete_gaussian(1e6, n, guess)
        assert np.count_nonzero(own == other) < 20
        assert abs(float(np.corrcoef(own, other)[0, 1])) < 5 / math.sqrt(n)


def test_same_generator_state_gives_identical_noise_and_the_state_advances() -> None:
    """Reproducible simulation: a generator in the same state gives bit-identical noise (also
    across passes and keys), and the next call differs."""
    rng = NoiseSource.reproducible(5).generator("dca:owner-1")
    state = rng.bit_generator.state
    first = sample_discrete_gaussian(3e9, (4, 20_000), rng)
    second = sample_discrete_gaussian(3e9, (4, 20_000), rng)
    rng.bit_generator.state = state
    assert np.array_equal(sample_discrete_gaussian(3e9, (4, 20_000), rng), first)
    assert not np.array_equal(first, second)
    assert np.count_nonzero(first == second) < 20


def test_keystream_draws_a_fresh_key_every_words_per_key_words() -> None:
    stream = Keystream(np.random.default_rng(8), words_per_key=1000)
    words = np.empty(3500, dtype=np.uint64)
    stream.fill(words)
    assert stream.keys == 4
    blocks = [words[i : i + 1000] for i in range(0, 3000, 1000)]
    assert len({w for block in blocks for w in block.tolist()}) == 3000  # no word repeats
    again = np.empty(3500, dtype=np.uint64)
    Keystream(np.random.default_rng(8), words_per_key=1000).fill(again)
    assert np.array_equal(words, again)
    with pytest.raises(ValueError, match="words_per_key"):
        Keystream(np.random.default_rng(8), words_per_key=0)


def test_many_keys_in_one_call_keep_the_law(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key every 1000 words (so keys change inside passes) still gives N_Z(0, sigma^2)."""
    monkeypatch.setattr(dgauss, "WORDS_PER_KEY", 1000)
    n, sigma = 200_000, 2.0
    upper, p = exact_cells(sigma, n)
    y = sample_discrete_gaussian(sigma, n, np.random.default_rng(23))
    assert chi_square(y, upper, p) < float(stats.chi2.isf(1e-6, p.size - 1))


@pytest.mark.parametrize(
    ("sigma", "shape", "message"),
    [
        (-1.0, 3, "sigma"),
        (float("nan"), 3, "sigma"),
        (float("inf"), 3, "sigma"),
        ("2", 3, "sigma"),
        (2.0**49, 3, "2\\^48"),
        (1.0, -1, "shape"),
        (1.0, (2, -3), "shape"),
        (1.0, (-2, -3), "shape"),
        (1.0, 2.5, "shape"),
        (1.0, (2, True), "shape"),
        (1.0, "3", "shape"),
    ],
)
def test_bad_input_is_refused(sigma: object, shape: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sample_discrete_gaussian(sigma, shape, np.random.default_rng(0))  # type: ignore[arg-type]


def test_tiny_and_empty_requests() -> None:
    assert not sample_discrete_gaussian(2.0**-31, (2, 3), np.random.default_rng(0)).any()
    assert sample_discrete_gaussian(5.0, (0, 4), np.random.default_rng(0)).shape == (0, 4)
    assert sample_discrete_gaussian(5.0, (), np.random.default_rng(0)).shape == ()

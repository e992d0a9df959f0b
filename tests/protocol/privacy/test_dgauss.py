"""Gaussian calibration (classical, analytic) and the discrete Gaussian sampler."""

from __future__ import annotations

import math
from collections.abc import Iterable
from decimal import ROUND_UP, Context, Decimal, FloatOperation, Inexact, Rounded, localcontext
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from dp_accounting import gaussian_mechanism
from scipy import stats

from dpmarket.actors.randomness import NoiseSource
from dpmarket.protocol.privacy import dgauss
from dpmarket.protocol.privacy.acceptance import pi_bracket, pi_factor
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
    """Sample variance within 5 standard errors of the exact one (a factor-2 error in sigma
    fails the chi-square tests below)."""
    n = 400_000
    y = sample_discrete_gaussian(sigma, n, np.random.default_rng(11))
    var, fourth = exact_moments(sigma) if sigma < 1e4 else (sigma**2, 3 * sigma**4)
    se = math.sqrt((fourth - var**2) / n)
    assert y.dtype == np.int64
    assert abs(float(np.mean(y.astype(np.float64) ** 2)) - var) < 5 * se
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


def exact_cells(
    sigma: float, n: int, integers: bool = False
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Cells (upper edges; the first cell is open below, the last open above) and their exact
    N_Z(0, sigma^2) probabilities, by summing exp(-y^2 / (2 sigma^2)) over every integer within
    12 sigma + 12 (the mass left out is below 1e-31). Below sigma = 10, or with ``integers``,
    the cells are single integers expecting at least 20 of ``n`` draws; else 40 cells of about
    equal mass."""
    reach = math.ceil(12 * sigma) + 12
    if sigma < 10 or integers:
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


@pytest.mark.parametrize("sigma", [6.0, 37.0])
def test_single_integer_pmf_with_multi_bit_blocks_and_a_factor_2_fails(sigma: float) -> None:
    """Blocks of t = 2^k >= 4 integers (R and V both matter): one chi-square cell per integer
    (all those expecting >= 20 of 400,000 draws, fixed seed) below the 1e-6 quantile; draws at
    2 sigma or sigma / 2 lie far above it."""
    assert Proposal.of(sigma).k >= 2
    n = 400_000
    upper, p = exact_cells(sigma, n, integers=True)
    assert p.size > 4 * sigma  # single integers, out to beyond 2 sigma on each side
    limit = float(stats.chi2.isf(1e-6, p.size - 1))
    assert (
        chi_square(sample_discrete_gaussian(sigma, n, np.random.default_rng(51)), upper, p) < limit
    )
    for wrong in (2 * sigma, sigma / 2):
        y = sample_discrete_gaussian(wrong, n, np.random.default_rng(52))
        assert chi_square(y, upper, p) > 20 * limit


def test_emission_rate_is_the_one_passes_are_sized_by() -> None:
    """A pass over uniform words emits Proposal.rate of its candidates (within 5 standard
    errors), so passes sized by it rarely fall short and never waste a fixed 60%."""
    for sigma in (0.3, 2.0, 77.0, 1e6, 2.0**48):
        proposal = Proposal.of(sigma)
        scratch, stream = _Pass(100_000), Keystream(np.random.default_rng(3))
        stream.fill(scratch.words)
        emitted = scratch.run(proposal, stream).size
        se = math.sqrt(proposal.rate * (1 - proposal.rate) / 100_000)
        assert abs(emitted / 100_000 - proposal.rate) < 5 * se
        assert proposal.rate > 0.24


def test_float_estimate_of_pi_is_well_within_the_margin() -> None:
    """The float path's P^ (pi 2^52 in float64) against exact decimal
    arithmetic, for candidates over all blocks V that matter at several sigmas: within
    10 units (the docstring's 6.2 + e_exp with e_exp <= 3.8 ulps), well within the margin
    A = 64 by which the float path decides."""
    rng = np.random.default_rng(4)
    worst = 0.0
    # 1.3594 2^35 / ln 2: s = sigma ln 2 / t near its largest (1.3596), where pi z peaks
    for sigma in (0.3, 1.0, 2.0, 3.7, 37.0, 1e3, 1e6, 3e9, 1.3594 * 2**35 / math.log(2), 2.0**48):
        proposal = Proposal.of(sigma)
        k, n = proposal.k, 2000
        v = np.minimum(rng.geometric(0.5, n) - 1, 40).astype(np.uint64)
        r = rng.integers(0, 2**k, n, dtype=np.uint64) if k else np.zeros(n, np.uint64)
        sign = rng.integers(0, 2, n, dtype=np.uint64)
        scratch = _Pass(n)
        scratch.w_r[:] = r << np.uint64(64 - k) if k else 0
        scratch.w_v[:] = np.uint64(1) << v
        scratch.w_u[:] = sign << np.uint64(63)
        scratch.estimate(proposal)
        for i in range(n):
            y = candidate(k, int(v[i]), int(r[i]), int(sign[i]))
            assert int(scratch.draws[i]) == y
            exact = exact_p(sigma, k, y, int(v[i]))
            worst = max(worst, float(abs(Decimal(float(scratch.bound[i])) - exact)))
    assert worst <= 10.0


def test_pi_bracket_holds_pi_whatever_the_threads_decimal_context() -> None:
    """pi_bracket's bounds hold pi 2^52 (a 400-digit evaluation made beforehand) for random
    and extreme (sigma, y, v) at 40, 80 and 160 digits, while the thread's own decimal context
    has 3 digits, rounds up, has a tiny exponent range and traps Inexact, Rounded and
    FloatOperation: the exact path reads nothing of it (nor raises through it)."""
    rnd = np.random.default_rng(5)
    cases = [(2.0**48, 62 * 2**48, 62), (2.0**48, -(63 * 2**48), 62), (2.0**-30, 1, 0),
             (2.0**-30, 0, 0), (2.0**-30, -64, 62), (0.3, 0, 0), (1.0, 0, 0)]  # fmt: skip
    for _ in range(40):
        sigma = float(2.0 ** rnd.uniform(-30, 48))
        k, v = Proposal.of(sigma).k, int(rnd.integers(0, 63))
        x = (v << k) + int(rnd.integers(0, 1 << k))
        cases.append((sigma, x if rnd.random() < 0.5 else -(x + 1), v))
    exact = {}
    for sigma, y, v in cases:
        k = Proposal.of(sigma).k
        with localcontext(Context(prec=400, Emin=-(10**9), Emax=10**9)):
            s = Decimal.from_float(sigma) * Decimal(2).ln() / 2**k
            a = Decimal(y) ** 2 / (2 * Decimal.from_float(sigma) ** 2) + s * s / 2
            # a >= 10^6: pi is below 2^-10^6, never made a fraction (its denominator is huge)
            p = Fraction(Decimal(2) ** (v + 52) * (-a).exp()) if a < 10**6 else None
            exact[sigma, y, v] = (p, a)
    hostile = Context(prec=3, rounding=ROUND_UP, Emin=-5, Emax=5)
    for trap in (Inexact, Rounded, FloatOperation):
        hostile.traps[trap] = True
    with localcontext(hostile):
        for sigma, y, v in cases:
            p, a = exact[sigma, y, v]
            for digits in (40, 80, 160):
                low, high, refinable = pi_bracket(sigma, Proposal.of(sigma).k, y, v, digits)
                if refinable:
                    assert p is not None and low <= p <= high and low < high, (sigma, y, v)
                else:  # a >= 10^6: the upper bound 2^(v + 52) exp(-10^6) alone, which decides
                    assert low == 0 and a >= 10**6 - 1 and high > 0


def candidate(k: int, v: int, r: int, sign: int) -> int:
    """Y for block v, offset r and sign bit ``sign``: X = v 2^k + r, then X or -(X + 1)."""
    x = (v << k) + r
    return -(x + 1) if sign else x


def exact_p(sigma: float, k: int, y: int, v: int) -> Decimal:
    """P = pi 2^52 = 2^(v + 52) exp(-(y^2 / (2 sigma^2) + (sigma ln 2 / 2^k)^2 / 2)) to 80
    digits (a local decimal context; the thread's own is untouched)."""
    with localcontext() as ctx:
        ctx.prec = 80
        s = Decimal(sigma) * Decimal(2).ln() / 2**k
        a = Decimal(y) ** 2 / (2 * Decimal(sigma) ** 2) + s * s / 2
        return Decimal(2) ** (v + 52) * (-a).exp()


def exact_decision(p: Decimal, m: int, words: Iterable[int]) -> tuple[bool, int]:
    """U < P / 2^52 for U's first 52 bits m, then ``words``: the decision and how many words it took
    (the first j with U's interval after j words on one side of P)."""
    low, width, target = Fraction(m), Fraction(1), Fraction(p)
    for used, word in enumerate([None, *words]):
        if word is not None:
            width /= 2**64
            low += word * width
        if low + width <= target:
            return True, used
        if low >= target:
            return False, used
    raise AssertionError("the words given do not decide U < P")


class ScriptedStream(Keystream):
    """A keystream that yields chosen words (and counts them): the exact path's further words."""

    def __init__(self, words: Iterable[int]) -> None:
        super().__init__(np.random.default_rng(0))
        self.script, self.used = list(words), 0

    def fill(self, out: npt.NDArray[np.uint64]) -> None:
        out[:] = self.script[self.used : self.used + out.size]
        self.used += out.size


def one_candidate(proposal: Proposal, v_word: int, r: int, m: int, sign: int) -> _Pass:
    scratch = _Pass(1)
    scratch.w_r[0] = r << (64 - proposal.k) if proposal.k else 0
    scratch.w_v[0], scratch.w_u[0] = v_word, m | (sign << 63)
    return scratch


@pytest.mark.parametrize("sigma", [0.3, 2.0, 6.0, 37.0, 1e6, 3e9, 2.0**48])
def test_candidates_at_the_boundary_are_decided_exactly(sigma: float) -> None:
    """m = floor(P) - 1, floor(P), floor(P) + 1 (just below, at and just above the boundary)
    and, at floor(P), further words just below, at and just above P's next 64 bits: every
    decision is the exact U < pi, taken after the words that decide it; the float test the
    sampler had before accepted every m < P, whatever U's further bits."""
    proposal = Proposal.of(sigma)
    k, rng = proposal.k, np.random.default_rng(17)
    for v, r, sign in [(0, 0, 0), (0, 0, 1), (1, 0, 0), (2, 1, 1)] + [
        (int(rng.integers(0, 4)), int(rng.integers(0, 2**k)), int(rng.integers(0, 2)))
        for _ in range(6)
    ]:
        y = candidate(k, v, r % (1 << k), sign)
        p = exact_p(sigma, k, y, v)
        floor = int(p)
        fraction = (p - floor) * 2**64
        first = int(fraction)
        second = int((fraction - first) * 2**64)
        cases: list[list[int]] = [[]]
        cases += [[first + d] for d in (-1, 1) if 0 <= first + d < 2**64]
        cases += [[first, second + d] for d in (-1, 1) if 0 <= second + d < 2**64]
        tried = [(floor - 1, []), (floor + 1, [])] + [(floor, words) for words in cases[1:]]
        for m, words in tried:
            if not 0 <= m < 2**52:
                continue
            scripted = ScriptedStream([*words, *range(1, 9)])
            scratch = one_candidate(proposal, 1 << v, r % (1 << k), m, sign)
            emitted = scratch.run(proposal, scripted)
            accept, needed = exact_decision(p, m, scripted.script)
            assert bool(scratch.keep[0]) is accept, (v, r, sign, m, words)
            assert emitted.tolist() == ([y] if accept else [])
            assert scripted.used >= needed  # a word more only where its bracket was too wide
            assert scripted.used <= needed + 1


class RecordingStream(Keystream):
    """Another keystream's words, passed on and recorded."""

    def __init__(self, inner: Keystream) -> None:
        super().__init__(np.random.default_rng(0))
        self.inner, self.words = inner, list[int]()

    def fill(self, out: npt.NDArray[np.uint64]) -> None:
        self.inner.fill(out)
        self.words += out.tolist()


def test_exact_decisions_draw_further_words_deterministically() -> None:
    """Candidates at m = floor(P) decided on a real keystream: each decision is the exact one
    for the words it drew, the same generator state gives the same decisions from the same
    words, and about half are accepted (P - floor(P) is spread over [0, 1))."""
    proposal, rng = Proposal.of(6.0), np.random.default_rng(31)
    k = proposal.k
    sampled = [
        (int(rng.integers(0, 3)), int(rng.integers(0, 2**k)), int(rng.integers(0, 2)))
        for _ in range(200)
    ]
    outcomes = []
    for _ in range(2):
        stream = Keystream(np.random.default_rng(8))
        decisions, drawn = [], []
        for v, r, sign in sampled:
            y = candidate(k, v, r, sign)
            p = exact_p(6.0, k, y, v)
            scratch = one_candidate(proposal, 1 << v, r, int(p), sign)
            recorder = RecordingStream(stream)
            scratch.run(proposal, recorder)
            accept, needed = exact_decision(p, int(p), recorder.words)
            assert bool(scratch.keep[0]) is accept
            assert needed >= 1 and len(recorder.words) in (needed, needed + 1)
            decisions.append(accept)
            drawn.append(tuple(recorder.words))
        outcomes.append((decisions, drawn))
    assert outcomes[0] == outcomes[1]
    assert 60 < sum(outcomes[0][0]) < 140


def test_blocks_from_a_v_word_of_0_or_2_to_the_63_are_rejected() -> None:
    """A V word of 0 (V >= 64) or 2^63 (V = 63) is rejected by both paths whatever the other
    words: small m reach the exact path, which rejects without drawing a word."""
    for sigma in (0.3, 6.0, 1e6, 2.0**48):
        proposal = Proposal.of(sigma)
        for v_word in (0, 1 << 63):
            for m in (0, 1, 63, 64, 65, 1 << 51, (1 << 52) - 1):
                for r, sign in ((0, 0), (0, 1), ((1 << proposal.k) - 1, 1)):
                    scripted = ScriptedStream([])
                    scratch = one_candidate(proposal, v_word, r, m, sign)
                    assert scratch.run(proposal, scripted).size == 0
                    assert scripted.used == 0


def test_every_candidate_through_the_exact_path_keeps_the_law_and_the_draws(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a margin so wide that the float path decides nothing but blocks V >= 63 (rejected
    in float as always), every candidate is decided exactly: the draws are those of the float
    path for the same generator state (they decide alike wherever the float path decides) and
    follow N_Z(0, sigma^2) (chi-square, fixed seed, below the 1e-6 quantile)."""
    sigma, n = 6.0, 6000
    fast = sample_discrete_gaussian(sigma, n, np.random.default_rng(41))
    monkeypatch.setattr(dgauss, "_MARGIN", 2.0**60)
    exact = sample_discrete_gaussian(sigma, n, np.random.default_rng(41))
    assert np.array_equal(exact, fast)
    upper, p = exact_cells(sigma, n, integers=True)
    assert chi_square(exact, upper, p) < float(stats.chi2.isf(1e-6, p.size - 1))


def test_pi_factor_is_the_nearest_float() -> None:
    for sigma in (0.3, 2.0, 37.0, 3e9, 2.0**48):
        k = Proposal.of(sigma).k
        with localcontext() as ctx:
            ctx.prec = 60
            s = Decimal(sigma) * Decimal(2).ln() / 2**k
            exact = Decimal(2) ** 52 * (-(s * s) / 2).exp()
        factor = pi_factor(sigma, k)
        assert abs(Decimal(factor) - exact) <= Decimal(math.ulp(factor)) / 2
        assert Proposal.of(sigma).pi_factor == factor


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
        (True, 3, "sigma"),
        (np.True_, 3, "sigma"),
        (Decimal("2"), 3, "sigma"),
        (10**400, 3, "sigma"),
        (-(10**400), 3, "sigma"),
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


def test_numpy_and_python_numbers_are_accepted_as_sigma() -> None:
    """Any real number but a bool: numpy scalars and fractions give the draws of the same
    float."""
    for number, value in [
        (np.float32(2.5), 2.5),
        (np.int64(3), 3.0),
        (np.float64(1e6), 1e6),
        (Fraction(5, 2), 2.5),
        (7, 7.0),
    ]:
        got = sample_discrete_gaussian(number, 50, np.random.default_rng(6))  # type: ignore[arg-type]
        assert np.array_equal(got, sample_discrete_gaussian(value, 50, np.random.default_rng(6)))


def test_keystream_refuses_an_out_it_cannot_fill_in_order() -> None:
    stream = Keystream(np.random.default_rng(8))
    words = np.zeros(16, dtype=np.uint64)
    read_only = np.zeros(4, dtype=np.uint64)
    read_only.flags.writeable = False
    for bad in (
        np.zeros(4, dtype=np.float64),
        np.zeros(4, dtype=np.int64),
        np.zeros(4, dtype=np.uint32),
        words[::2],
        np.zeros((4, 4), dtype=np.uint64, order="F"),
        read_only,
        [0, 0, 0],
    ):
        with pytest.raises(ValueError, match="C-contiguous uint64"):
            stream.fill(bad)  # type: ignore[arg-type]
    assert not words.any() and stream.keys == 0  # nothing written, no key drawn
    grid = np.zeros((4, 4), dtype=np.uint64)
    Keystream(np.random.default_rng(8)).fill(grid)
    flat = np.zeros(16, dtype=np.uint64)
    Keystream(np.random.default_rng(8)).fill(flat)
    assert np.array_equal(grid.reshape(-1), flat)


def test_tiny_and_empty_requests() -> None:
    assert not sample_discrete_gaussian(2.0**-31, (2, 3), np.random.default_rng(0)).any()
    assert sample_discrete_gaussian(5.0, (0, 4), np.random.default_rng(0)).shape == (0, 4)
    assert sample_discrete_gaussian(5.0, (), np.random.default_rng(0)).shape == ()

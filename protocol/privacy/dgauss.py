"""Gaussian noise for the DCA secure sum: calibration and a discrete Gaussian sampler.

Calibration (Heikkilä et al. 2017, Sec. 3.1 and Theorem 1 / supplement Sec. 9):

* :func:`classical_sigma` -- Eq. (1), sigma = Delta sqrt(2 ln(1.25/delta)) / eps, proven only
  for eps < 1 (Dwork & Roth, Theorem 3.22), so larger eps is refused;
* :func:`analytic_sigma` -- the smallest sigma for which the Gaussian mechanism is exactly
  (eps, delta)-DP (Balle & Wang 2018, Theorem 8), valid for any eps > 0 and never larger;
* :func:`client_sigma` -- Theorem 1: each of N clients adds variance sigma_std^2 / (N - T - 1),
  so that the noise of any N - T - 1 honest clients alone has variance >= sigma_std^2.

Sampling: :func:`sample_discrete_gaussian` draws N_Z(0, sigma^2), the discrete Gaussian on the
integers (P(y) proportional to exp(-y^2 / (2 sigma^2))), by the rejection sampler of Canonne,
Kamath & Steinke (2020, Algorithms 2 and 3) vectorised over the batch. For the power of two
t = 2^k with the best acceptance rate (near t = sigma ln 2) a candidate X = V t + R is drawn
exactly from uniform bits: V the number of trailing zero bits of one word (P(V = j) = 2^-(j+1)),
R the top k bits of another (uniform on [0, t)). This block-geometric X is not itself a
discrete Laplace: P(X = x) = 2^-(V+1) / t is flat within a block. CKS's inner
Bernoulli(2^(-R/t)), which would make it the discrete Laplace with ratio 2^(-1/t) per step
(scale tau = t / ln 2), is merged into the acceptance test instead. A sign bit maps X to Y = X
or Y = -(X + 1) (so 0 is proposed once and no "-0" needs rejecting). That Bernoulli and
Algorithm 3's acceptance multiply to one test: accept with probability
pi = 2^V exp(-(Y^2 + c^2) / (2 sigma^2)), c = sigma^2 / tau (pi <= 1 since Y^2 + c^2 >= 2 |Y| c
and |Y| >= V t). A candidate is then emitted as y with probability
exp(-c^2 / (2 sigma^2)) exp(-y^2 / (2 sigma^2)) / (4t): exactly N_Z(0, sigma^2), at the rate
Theta(sigma) exp(-c^2 / (2 sigma^2)) / (4t) (>= 0.2461 for every sigma, >= 0.4877 for
sigma >= 2; minima 0.24616 and 0.48779) by which each pass is sized. The output lies on the
integer grid, so no low-order bits of a floating-point draw are released.

Randomness. The caller's ``numpy.random.Generator`` is the only source: each call draws fresh
256-bit keys from it (a new key every :data:`WORDS_PER_KEY` words, zero nonce, never reused,
stored, returned or logged) and expands them with OpenSSL's ChaCha20 through ``cryptography``
(:class:`Keystream`), three 64-bit words per candidate at about 2 ns a word (randomgen's
ChaCha behind numpy takes about 18), plus further words, in a fixed order, for the rare
candidates decided exactly (below). The same generator state gives the same output
(reproducible simulation); a deployed generator keyed from OS entropy gives noise nobody can
regenerate. Computational assumption: ChaCha20 under a uniformly random key is a pseudorandom
generator, so to a computationally bounded adversary the words are uniform and the guarantee
below holds as long as the caller's generator is a CSPRNG with a secret key
(``actors/randomness.py``); noise from a seeded (public) generator has no privacy at all.

Guarantee: the law of one draw against N_Z(0, sigma^2), given uniform words. R, V and the sign
are exact, and so is the acceptance test. U in [0, 1) is read from the third word's low 52 bits
m and, where needed, further keystream words; the ideal test is U < pi. With P = pi 2^52 (one
unit is 2^-52): accept surely if m + 1 <= P, reject surely if m >= P, else (m = floor(P))
U's further bits decide. The pass computes in float64 P^ = fl(np.exp(fl(fl(Y^2) scale))
2^V pi_factor) and D = fl(P^ - m), and decides there only where a margin of A = 64 units
proves the decision: accept if D > 1 + A, reject if D <= -A. Every other candidate (m within
65 of P: probability <= 130 * 2^-52 ~ 2^-45) goes to :func:`~dpmarket.protocol.privacy.
acceptance.accept_exactly`, which decides U < pi exactly (rigorous decimal brackets of pi, as
many further words as needed).

Why every float decision is right: with u = 2^-53, fl(Y) exact below 2^53 (within u above)
and scale = fl(-0.5 / fl(sigma^2)) within 2u, the exponent -z = -Y^2 / (2 sigma^2) is computed
within 6u relative, so its exp is off by a factor within 6.02 u z (z < 709 where np.exp's
result is a normal float); np.exp adds e_exp ulps (at most 2 e_exp u); 2^V pi_factor is exact,
pi_factor (the float nearest 2^52 exp(-s^2 / 2), s = sigma ln 2 / t <= 1.36) is off by u and
the product by u. So |P^ - P| <= (2.01 + 2 e_exp + 6.02 z) u P = (1.01 + e_exp + 3.01 z) pi
units, and pi z <= max_q (q^2 / 2) exp(-(q - s)^2 / 2) <= 1.71 (q = |Y| / sigma, as
2^V <= exp(q s)): |P^ - P| <= 6.2 + e_exp units. Where np.exp's result is subnormal or 0, P and
P^ are below 2^-900. Subtracting from P^ (at most 2^52 (1 + 2^-40)) the float 2^52 + m, whose
bits are m's, rounds by at most half a unit. So |D - (P - m)| <= 6.7 + e_exp, below A as long
as np.exp is within 57 ulps (the assumption; measured: 0.65 ulps on numpy 2.4, and
``tests/protocol/privacy/test_dgauss.py`` checks |P^ - P| against exact decimal arithmetic;
an independent search aimed at s near its maximum found at most 2.49 units). Then D > 1 + A
gives m + 1 < P and D <= -A gives m >= P: the exact test's decisions.

What is left is the block cap: a V word of 2^63 or 0 (V >= 63, probability 2^-63) is always
rejected (by both paths), so the draws follow N_Z(0, sigma^2) conditioned on
-63 t <= Y < 63 t. As s <= 1.36, 63 t >= 32.1 sigma, and the total-variation distance of one
draw from N_Z(0, sigma^2) is at most 2 P(Y >= 63 t) < 2^-743 (for sigma >= 1 the tail sum is
below exp(-(63 t)^2 / (2 sigma^2)) (1 / sigma + sigma / (63 t)) / sqrt(2 pi); for sigma < 1,
t >= 1 and it is below exp(-1984)). A mechanism that is (eps, delta)-DP with ideal noise and
whose noise is within TV tau of it is (eps, delta + (1 + e^eps) tau)-DP per release; 1024
owners x 12,800 draws give tau < 2^-719 (about 1e-216), nothing next to any delta. The
remaining assumptions are the two above (ChaCha20 a PRG under a secret key from a CSPRNG;
np.exp within 57 ulps for the float path's margin) and, outside this module, the calibration:
the secure sums calibrate and account their sum of per-client discrete Gaussian shares (grid
sigma >= 4 each, ``protocol/securesum/spec.py``) as one continuous Gaussian. That gap is
negligible, not zero: a discrete Gaussian has the zero-concentrated DP of the continuous one
(Canonne, Kamath & Steinke 2020), and a sum of such shares is within a term Kairouz, Liu &
Steinke (2021) bound by 10 n exp(-pi^2 sigma^2) (below 1e-60 here) of one discrete Gaussian.
"""

from __future__ import annotations

import functools
import math
import numbers
import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.privacy.acceptance import accept_exactly, pi_factor
from dpmarket.protocol.privacy.keystream import WORDS_PER_KEY, Keystream

__all__ = [
    "CALIBRATIONS",
    "MAX_GRID_SIGMA",
    "WORDS_PER_KEY",
    "Keystream",
    "Proposal",
    "analytic_sigma",
    "classical_sigma",
    "client_sigma",
    "discrete_gaussian_mass",
    "gaussian_sigma",
    "sample_discrete_gaussian",
]

CALIBRATIONS = ("analytic", "classical")
MAX_GRID_SIGMA = float(2**48)  # keeps t <= 2^48: draws that can be accepted are exact in float64


def _check_privacy(epsilon: float, delta: float, sensitivity: float) -> None:
    if not (isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite positive number, got {epsilon!r}")
    if not (isinstance(delta, int | float) and 0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if not (
        isinstance(sensitivity, int | float) and math.isfinite(sensitivity) and sensitivity > 0
    ):
        raise ValueError(f"sensitivity must be a finite positive number, got {sensitivity!r}")


def classical_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Eq. (1): (eps, delta)-DP for eps < 1 with sigma = Delta sqrt(2 ln(1.25/delta)) / eps."""
    _check_privacy(epsilon, delta, sensitivity)
    if epsilon >= 1.0:
        raise ValueError(
            f"epsilon={epsilon} >= 1: the classical Gaussian mechanism is only proven for "
            "epsilon < 1; use the analytic calibration"
        )
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def _phi(x: float) -> float:
    """Standard normal CDF."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _analytic_delta(ratio: float, epsilon: float) -> float:
    """delta of the Gaussian mechanism with sigma / Delta = ``ratio`` at ``epsilon`` (B&W Thm 8)."""
    a, b = 0.5 / ratio, epsilon * ratio
    tail = _phi(-a - b)
    second = math.exp(epsilon + math.log(tail)) if tail > 0.0 else 0.0
    return _phi(a - b) - second


def analytic_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The smallest sigma (to 1e-12 relative) making the Gaussian mechanism (eps, delta)-DP.

    Balle & Wang (2018), Theorem 8: the mechanism is (eps, delta)-DP iff
    Phi(Delta/(2 sigma) - eps sigma/Delta) - e^eps Phi(-Delta/(2 sigma) - eps sigma/Delta)
    <= delta. The left side decreases in sigma; bisection in log(sigma) returns the upper end
    of the final bracket, so the guarantee always holds.
    """
    _check_privacy(epsilon, delta, sensitivity)
    low, high = 1e-6, 1.0
    while _analytic_delta(high, epsilon) > delta:
        low, high = high, high * 2.0
        if high > 1e12:
            raise ValueError(f"delta={delta} is too small to calibrate at epsilon={epsilon}")
    while high / low > 1.0 + 1e-12:
        mid = math.sqrt(low * high)
        if _analytic_delta(mid, epsilon) > delta:
            low = mid
        else:
            high = mid
    return high * sensitivity


def gaussian_sigma(
    epsilon: float, delta: float, sensitivity: float, method: str = "analytic"
) -> float:
    """sigma_std of the trusted-aggregator Gaussian mechanism by ``method`` in CALIBRATIONS."""
    if method == "analytic":
        return analytic_sigma(epsilon, delta, sensitivity)
    if method == "classical":
        return classical_sigma(epsilon, delta, sensitivity)
    raise ValueError(f"method must be one of {CALIBRATIONS}, got {method!r}")


def client_sigma(sigma_std: float, n_clients: int, tolerance: int) -> float:
    """Theorem 1: per-client sigma = sigma_std / sqrt(N - T - 1).

    Privacy argument: noises are independent, so any N - T - 1 clients' noise sums to variance
    (N - T - 1) sigma_std^2 / (N - T - 1) = sigma_std^2; with at most T clients colluding or
    dropped and one more (any curious client) removing its own noise, the released sum still
    carries the trusted-aggregator mechanism's noise.
    """
    if not (math.isfinite(sigma_std) and sigma_std >= 0):
        raise ValueError(f"sigma_std must be a finite number >= 0, got {sigma_std!r}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, int) or tolerance < 0:
        raise ValueError(f"tolerance must be an integer >= 0, got {tolerance!r}")
    if isinstance(n_clients, bool) or not isinstance(n_clients, int) or n_clients < tolerance + 2:
        raise ValueError(f"n_clients must be an integer >= tolerance + 2, got {n_clients!r}")
    return sigma_std / math.sqrt(n_clients - tolerance - 1)


# --- the sampler (guarantee in the module docstring) ------------------------------------------

_CHUNK = 1 << 14  # candidates per vectorised pass: the pass's arrays stay in L2 cache
_WORDS = 3  # keystream words per candidate: R, V, acceptance (its top bit the sign)
_MASK52 = np.uint64((1 << 52) - 1)
_TWO52 = 2.0**52
_TWO52_BITS = np.uint64(0x4330000000000000)  # the float 2^52: OR-ing m < 2^52 in gives 2^52 + m
_TINY_SIGMA = 2.0**-30  # below this P(Y != 0) < 2 exp(-2^59): every draw is 0
_MARGIN = 64.0  # A: the float path decides only where |D - (P - m)| <= 6.7 + e_exp < A
_LN2 = math.log(2.0)


def discrete_gaussian_mass(sigma: float) -> float:
    """Theta(sigma), the sum over all integers y of exp(-y^2 / (2 sigma^2)) for sigma > 0:
    Poisson summation from sigma = 1 (the first term left out is below 1e-30), else a direct
    sum (the terms left out are below 1e-300)."""
    if sigma >= 1.0:
        return sigma * math.sqrt(2 * math.pi) * (1.0 + 2.0 * math.exp(-2 * (math.pi * sigma) ** 2))
    return 1.0 + 2.0 * math.fsum(math.exp(-(y * y) / (2 * sigma * sigma)) for y in range(1, 40))


@dataclass(frozen=True)
class Proposal:
    """The constants of one sigma: block bits k (t = 2^k; with the merged Bernoulli the
    proposal is the discrete Laplace of scale tau = t / ln 2), the emission rate and the float
    constants of the vectorised pass."""

    sigma: float
    k: int
    rate: float  # P(a candidate is emitted) = Theta(sigma) exp(-s^2 / 2) / (4 t), s = sigma/tau
    scale: float  # -1 / (2 sigma^2)
    pi_factor: float  # the float nearest 2^52 exp(-s^2 / 2): P = 2^V exp(-z) pi_factor
    exponent_shift: np.uint64  # 52 - k: a float's exponent field, times t
    block_shift: np.uint64  # 64 - k: R, the top k bits of a word
    bias: np.uint64  # pi_factor's bits >> (52 - k): the shifted bits of 2^V pi_factor at V = 0

    @staticmethod
    def rate_at(sigma: float, k: int) -> float:
        """The emission rate with t = 2^k (its optimum over real t is at t = sigma ln 2)."""
        t = 2.0**k
        s = sigma * _LN2 / t
        return discrete_gaussian_mass(sigma) * math.exp(-s * s / 2) / (4 * t)

    @classmethod
    @functools.lru_cache(maxsize=64)
    def of(cls, sigma: float) -> Proposal:
        """The power of two t next to sigma ln 2 with the higher rate (k >= 0)."""
        low = max(0, math.floor(math.log2(sigma * _LN2)))
        k = max((low, low + 1), key=lambda j: cls.rate_at(sigma, j))
        factor = pi_factor(sigma, k)
        rate, scale = cls.rate_at(sigma, k), -0.5 / (sigma * sigma)
        factor_bits = struct.unpack("<Q", struct.pack("<d", factor))[0]
        shifts = np.uint64(52 - k), np.uint64(64 - k), np.uint64(factor_bits >> (52 - k))
        return cls(sigma, k, rate, scale, factor, *shifts)


class _Pass:
    """The scratch arrays of a pass of ``size`` candidates, with the typed views made once
    (small calls are dominated by per-operation overhead).

    One allocation for all of them: glibc then serves a call's 1 MiB of scratch from its heap
    after the first call, where six separate arrays went back to mmap and cost about 230 page
    faults (0.3 ms) per call of 12,800 draws."""

    def __init__(self, size: int) -> None:
        self.size = size
        block = np.empty((_WORDS + 5) * size, dtype=np.uint64)
        self.words = block[: _WORDS * size]
        self.w_r, self.w_v, self.w_u = (
            block[:size],
            block[size : 2 * size],
            block[2 * size : 3 * size],
        )
        self.bits, self.signed = block[3 * size : 4 * size], block[4 * size : 5 * size]
        self.power = block[5 * size : 6 * size].view(np.float64)
        self.bound = block[6 * size : 7 * size].view(np.float64)
        flags = block[7 * size :].view(np.bool_)
        self.keep, self.near = flags[:size], flags[size : 2 * size]
        self.bits_int, self.draws = self.bits.view(np.int64), self.signed.view(np.int64)

    def estimate(self, proposal: Proposal) -> None:
        """The candidates Y of ``self.words`` into ``self.draws`` and P^, the float64 value of
        pi 2^52 (module docstring), into ``self.bound``. Ufuncs take their output positionally
        (about 0.1 us less per call)."""
        w_r, w_v, w_u, bits, signed = self.w_r, self.w_v, self.w_u, self.bits, self.signed
        power, bound = self.power, self.bound
        # 2^V, the lowest set bit of w_v (0 for a zero word), times pi_factor: exact, and its
        # exponent field is V plus pi_factor's (2^63 -> -2^63 pi_factor, 0 -> 0: never accepted)
        np.negative(w_v, bits)
        np.bitwise_and(bits, w_v, bits)
        np.multiply(self.bits_int, proposal.pi_factor, power)
        # X = V t + R: the bits from the exponent field on, shifted so the field lands at bit k,
        # less those of pi_factor alone, are V t; R is the top k bits of w_r (uint64
        # arithmetic, so the never-accepted words wrap harmlessly)
        np.right_shift(power.view(np.uint64), proposal.exponent_shift, signed)
        np.subtract(signed, proposal.bias, signed)
        if proposal.k:
            np.right_shift(w_r, proposal.block_shift, bits)
            np.bitwise_or(signed, bits, signed)
        # the sign is w_u's top bit: Y = X or -(X + 1) = ~X, so 0 is proposed once
        np.right_shift(w_u.view(np.int64), 63, self.bits_int)
        np.bitwise_xor(signed, bits, signed)
        # P^ = exp(Y^2 * scale) 2^V pi_factor
        np.copyto(bound, self.draws)  # exact below 2^53
        np.multiply(bound, bound, bound)
        np.multiply(bound, proposal.scale, bound)
        np.exp(bound, bound)
        np.multiply(bound, power, bound)

    def run(self, proposal: Proposal, stream: Keystream) -> npt.NDArray[np.int64]:
        """One pass over the candidates of ``self.words`` (filled by the caller from
        ``stream``): the emitted draws, in candidate order. With D = fl(P^ - m), m the low 52
        bits of w_u, D > 1 + A accepts and D <= -A rejects; the candidates between (about
        2^-45 of them) are decided exactly, with further words from ``stream`` in candidate
        order."""
        self.estimate(proposal)
        # fl(P^ - (2^52 + m)), 2^52 + m the float whose bits are m | 2^52's: D - 2^52 rounded
        np.bitwise_and(self.w_u, _MASK52, self.bits)
        np.bitwise_or(self.bits, _TWO52_BITS, self.bits)
        np.subtract(self.bound, self.bits.view(np.float64), self.bound)
        np.greater(self.bound, 1.0 + _MARGIN - _TWO52, self.keep)
        np.greater(self.bound, -_MARGIN - _TWO52, self.near)  # not surely rejected: keep's superset
        emitted = np.compress(self.keep, self.draws)  # 4x faster than draws[keep] on a random mask
        if np.count_nonzero(self.near) == emitted.size:
            return emitted
        self._decide_exactly(proposal, stream)
        return np.compress(self.keep, self.draws)

    def _decide_exactly(self, proposal: Proposal, stream: Keystream) -> None:
        """Set ``keep`` for every candidate the float path left open, by
        :func:`~dpmarket.protocol.privacy.acceptance.accept_exactly`."""
        word = np.empty(1, dtype=np.uint64)

        def next_word() -> int:
            stream.fill(word)
            return int(word[0])

        for i in np.flatnonzero(self.near & ~self.keep).tolist():
            w_v = int(self.w_v[i])
            block = (w_v & -w_v).bit_length() - 1 if w_v else 64
            m = int(self.w_u[i]) & int(_MASK52)
            y = int(self.draws[i])
            self.keep[i] = accept_exactly(proposal.sigma, proposal.k, y, block, m, next_word)


def _check_sigma(sigma: object) -> float:
    """``sigma`` as a float: any real number (numpy scalars too, never a bool) that is finite,
    >= 0 and at most :data:`MAX_GRID_SIGMA`; ``ValueError`` naming the problem otherwise."""
    if type(sigma) is float and 0.0 <= sigma <= MAX_GRID_SIGMA:  # the common case, fast
        return sigma
    if isinstance(sigma, bool | np.bool_) or not isinstance(sigma, numbers.Real):
        raise ValueError(f"sigma must be a real number, got {type(sigma).__name__} {sigma!r}")
    try:
        value = float(sigma)
    except OverflowError:
        raise ValueError(
            "sigma must be a finite number >= 0, got one too large for a float"
        ) from None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"sigma must be a finite number >= 0, got {sigma!r}")
    if value > MAX_GRID_SIGMA:
        raise ValueError(f"sigma={value:.6g} grid units exceeds 2^48; reduce frac_bits")
    return value


def _check_shape(shape: int | tuple[int, ...]) -> int:
    """The number of draws ``shape`` asks for; ``ValueError`` naming a bad shape."""
    dims = shape if isinstance(shape, tuple) else (shape,)
    for dim in dims:
        if isinstance(dim, bool) or not isinstance(dim, int | np.integer) or dim < 0:
            raise ValueError(
                f"shape must be a non-negative int or tuple of such ints, got {shape!r}"
            )
    return math.prod(int(dim) for dim in dims)


def sample_discrete_gaussian(
    sigma: float, shape: int | tuple[int, ...], rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """``shape`` independent draws of N_Z(0, sigma^2) (``sigma`` in integer grid units), with
    randomness only from ``rng`` (keys for :class:`Keystream`); the guarantee and its
    assumption are in the module docstring.

    ``sigma == 0`` returns zeros. Each pass proposes enough candidates for the rest at the
    exact emission rate (:class:`Proposal`) with a margin of 4 sqrt(rest) + 4 draws, at most
    ``_CHUNK`` at a time; a short pass is followed by another.
    """
    sigma = _check_sigma(sigma)
    total = _check_shape(shape)
    if sigma < _TINY_SIGMA or total == 0:
        return np.zeros(shape, dtype=np.int64)
    out = np.empty(total, dtype=np.int64)
    proposal = Proposal.of(sigma)
    stream = Keystream(rng, WORDS_PER_KEY)
    scratch: _Pass | None = None
    filled = 0
    while filled < total:
        need = total - filled
        n = min(_CHUNK, math.ceil((need + 4 * math.sqrt(need) + 4) / proposal.rate))
        scratch = scratch if scratch is not None and scratch.size == n else _Pass(n)
        stream.fill(scratch.words)
        emitted = scratch.run(proposal, stream)
        take = min(emitted.size, need)
        out[filled : filled + take] = emitted[:take]
        filled += take
    return out.reshape(shape)

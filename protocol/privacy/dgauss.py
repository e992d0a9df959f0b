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
Kamath & Steinke (2020, Algorithms 2 and 3) vectorised over the batch. The proposal is the
discrete Laplace with ratio 2^(-1/t) per step (scale tau = t / ln 2) for the power of two
t = 2^k with the best acceptance rate (near t = sigma ln 2), drawn exactly from uniform bits:
X = V t + R with V the number of trailing zero bits of one word (P(V = j) = 2^-(j+1)) and R the
top k bits of another. A sign bit maps X to Y = X or Y = -(X + 1) (so 0 is proposed once and no
"-0" needs rejecting). CKS's inner Bernoulli(2^(-R/t)) and Algorithm 3's acceptance multiply to
one test: accept with probability pi = 2^V exp(-(Y^2 + c^2) / (2 sigma^2)), c = sigma^2 / tau
(pi <= 1 since Y^2 + c^2 >= 2 |Y| c and |Y| >= V t). A candidate is then emitted as y with
probability exp(-c^2 / (2 sigma^2)) exp(-y^2 / (2 sigma^2)) / (4t): exactly N_Z(0, sigma^2), at
the rate Theta(sigma) exp(-c^2 / (2 sigma^2)) / (4t) (>= 0.246, >= 0.488 for sigma >= 2) by
which each pass is sized. The output lies on the integer grid, so no low-order bits of a
floating-point draw are released.

Randomness. The caller's ``numpy.random.Generator`` is the only source: each call draws fresh
256-bit keys from it (a new key every :data:`WORDS_PER_KEY` words, zero nonce, never reused,
stored, returned or logged) and expands them with OpenSSL's ChaCha20 through ``cryptography``
(:class:`Keystream`), three 64-bit words per candidate at about 2 ns a word (randomgen's
ChaCha behind numpy takes about 18). The same generator state gives the same output
(reproducible simulation); a deployed generator keyed from OS entropy gives noise nobody can
regenerate. Computational assumption: ChaCha20 under a uniformly random key is a pseudorandom
generator, so to a computationally bounded adversary the words are uniform and the guarantee
below holds as long as the caller's generator is a CSPRNG with a secret key
(``actors/randomness.py``); noise from a seeded (public) generator has no privacy at all.

Guarantee: the law of one draw against N_Z(0, sigma^2), given uniform words. R, V and the sign
are exact. The acceptance test is the only inexact step: in float64, accept iff
m exp(s^2 / 2) 2^-53 < 2^V exp(-Y^2 / (2 sigma^2)), m the low 53 bits of the third word,
s = sigma / tau <= 1.36. With every operation's relative error <= 2^-53 and np.exp's <= e_exp
2^-53, the accepted m are those below some M with |M 2^-53 - pi| <= eps_pi =
(6.6 + 4 max(pi z) + 2 e_exp) 2^-53, z = Y^2 / (2 sigma^2), pi z <= 1.71; with e_exp <= 2
(1.15 measured on numpy 2.4) eps_pi <= 18 * 2^-53, which ``tests/protocol/privacy/
test_dgauss.py`` checks against exact decimal arithmetic (largest deviation seen: 3.1 units).
Where pi > 2^-100, |Y| < 2^53 is exact in float64; a V word of 0 or 2^63 (probability 2^-63) is
always rejected. The candidates' law being exact, one draw is within total-variation distance
tau_1 <= (eps_pi + 2^-63) / (rate - eps_pi) <= 8.2e-15 of N_Z(0, sigma^2) (4.1e-15 for
sigma >= 2). A mechanism that is (eps, delta)-DP with ideal noise and whose noise is within TV
tau of it is (eps, delta + (1 + e^eps) tau)-DP per release. d = 12,800 draws: tau <= 1.04e-10,
delta grows by at most 3.9e-10 at eps = 1. A secure-sum release rests on every contributing
owner's share: 1024 owners x 12,800 draws give tau <= 1.07e-7 and at eps = 1 at most 4.0e-7 more
delta (2.0e-7 for sigma >= 2; 4% and 2% of delta = 1e-5; worst-case bounds). A geometric built
as floor(t E) from a float64 exponential E (the previous sampler) cannot do as well: each of
its ~10 sigma bin probabilities is resolved only to about 2^-53, so its TV grows like
sigma 2^-53 per draw (about 1e-7 at the grid sigma of 1e9 that 32 fractional bits give);
the exact discrete Laplace above avoids it.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms

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

_U64 = npt.NDArray[np.uint64]
_CHUNK = 1 << 14  # candidates per vectorised pass: the pass's arrays stay in L2 cache
_WORDS = 3  # keystream words per candidate: R, V, acceptance (its top bit the sign)
WORDS_PER_KEY = 1 << 22  # ChaCha20 words under one key: 2^19 blocks, far below the 2^32 counter
_ZEROS = memoryview(bytes(8 * _WORDS * _CHUNK))  # ChaCha20 encrypts zeros to its keystream
_MASK53 = np.uint64((1 << 53) - 1)
_MASK64 = (1 << 64) - 1
_TINY_SIGMA = 2.0**-30  # below this P(Y != 0) < 2 exp(-2^59): every draw is 0
_LN2 = math.log(2.0)


class Keystream:
    """Uniform 64-bit words for one call: OpenSSL's ChaCha20 (through ``cryptography``) under
    keys drawn from the caller's generator, a fresh key every ``words_per_key`` words.

    A key is 4 raw words of ``rng``'s bit generator, each XOR-ed with another raw word shifted
    left by 32, so it is uniform also when raw words carry only 32 bits (numpy's MT19937). The
    nonce is zero and no key serves twice; a key lives only in this call's cipher object and is
    never stored, returned or logged.
    """

    def __init__(self, rng: np.random.Generator, words_per_key: int = WORDS_PER_KEY) -> None:
        if (
            isinstance(words_per_key, bool)
            or not isinstance(words_per_key, int)
            or words_per_key < 1
        ):
            raise ValueError(f"words_per_key must be an integer >= 1, got {words_per_key!r}")
        self._rng = rng
        self._per_key = words_per_key
        self._left = 0
        self._cipher: CipherContext | None = None
        self.keys = 0  # keys drawn so far

    def _rekey(self) -> CipherContext:
        raw = self._rng.bit_generator.random_raw(8).tolist()
        key = struct.pack("<4Q", *(((raw[i] ^ (raw[i + 4] << 32)) & _MASK64) for i in range(4)))
        self.keys += 1
        self._left = self._per_key
        return Cipher(algorithms.ChaCha20(key, bytes(16)), None).encryptor()

    def fill(self, out: _U64) -> None:
        """Overwrite the contiguous 1-d ``out`` with the next ``out.size`` words."""
        done = 0
        while done < out.size:
            if self._cipher is None or self._left == 0:
                self._cipher = self._rekey()
            n = min(out.size - done, self._left, len(_ZEROS) // 8)
            target = out[done : done + n].view(np.uint8).data  # a writable memoryview
            self._cipher.update_into(_ZEROS[: 8 * n], target)
            self._left -= n
            done += n


def discrete_gaussian_mass(sigma: float) -> float:
    """Theta(sigma), the sum over all integers y of exp(-y^2 / (2 sigma^2)) for sigma > 0:
    Poisson summation from sigma = 1 (the first term left out is below 1e-30), else a direct
    sum (the terms left out are below 1e-300)."""
    if sigma >= 1.0:
        return sigma * math.sqrt(2 * math.pi) * (1.0 + 2.0 * math.exp(-2 * (math.pi * sigma) ** 2))
    return 1.0 + 2.0 * math.fsum(math.exp(-(y * y) / (2 * sigma * sigma)) for y in range(1, 40))


@dataclass(frozen=True)
class Proposal:
    """The constants of one sigma: block bits k (t = 2^k, Laplace scale tau = t / ln 2), the
    emission rate and the two float factors of the acceptance test."""

    sigma: float
    k: int
    rate: float  # P(a candidate is emitted) = Theta(sigma) exp(-s^2 / 2) / (4 t), s = sigma/tau
    scale: float  # -1 / (2 sigma^2)
    uniform_factor: float  # exp(s^2 / 2) 2^-53: moves the constant of pi onto the uniform
    exponent_shift: np.uint64  # 52 - k: a float's exponent field, times t
    block_shift: np.uint64  # 64 - k: R, the top k bits of a word
    bias: np.uint64  # 1023 t, the exponent bias times t

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
        s = sigma * _LN2 / 2.0**k
        uniform_factor = math.exp(s * s / 2) * 2.0**-53
        rate, scale = cls.rate_at(sigma, k), -0.5 / (sigma * sigma)
        shifts = np.uint64(52 - k), np.uint64(64 - k), np.uint64(1023 << k)
        return cls(sigma, k, rate, scale, uniform_factor, *shifts)


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
        self.keep = block[7 * size :].view(np.bool_)[:size]
        self.bits_int, self.draws = self.bits.view(np.int64), self.signed.view(np.int64)

    def run(self, proposal: Proposal) -> npt.NDArray[np.int64]:
        """One pass over the candidates of ``self.words`` (filled by the caller): the emitted
        draws. Ufuncs take their output positionally (about 0.1 us less per call)."""
        w_r, w_v, w_u, bits, signed = self.w_r, self.w_v, self.w_u, self.bits, self.signed
        power, bound = self.power, self.bound
        # 2^V, the lowest set bit of w_v (0 for a zero word), as a float: exponent field V + 1023
        np.negative(w_v, bits)
        np.bitwise_and(bits, w_v, bits)
        np.copyto(power, self.bits_int)  # 2^63 -> -2^63, 0 -> 0: both never accepted
        # X = V t + R: the exponent field shifted to bit k is (V + 1023) t, R the top k bits of
        # w_r (uint64 arithmetic, so a never-accepted zero word wraps harmlessly)
        np.right_shift(power.view(np.uint64), proposal.exponent_shift, signed)
        if proposal.k:
            np.right_shift(w_r, proposal.block_shift, bits)
            np.bitwise_or(signed, bits, signed)
        np.subtract(signed, proposal.bias, signed)
        # the sign is w_u's top bit: Y = X or -(X + 1) = ~X, so 0 is proposed once
        np.right_shift(w_u.view(np.int64), 63, self.bits_int)
        np.bitwise_xor(signed, bits, signed)
        # accept iff m exp(s^2/2) 2^-53 < 2^V exp(-Y^2 / (2 sigma^2)), m the low 53 bits of w_u
        np.copyto(bound, self.draws)  # exact below 2^53
        np.multiply(bound, bound, bound)
        np.multiply(bound, proposal.scale, bound)
        np.exp(bound, bound)
        np.multiply(bound, power, bound)
        np.bitwise_and(w_u, _MASK53, bits)
        np.multiply(self.bits_int, proposal.uniform_factor, power)
        np.less(power, bound, self.keep)
        return np.compress(self.keep, self.draws)  # 4x faster than draws[keep] on a random mask


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
    if not (isinstance(sigma, int | float) and math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be a finite number >= 0, got {sigma!r}")
    if sigma > MAX_GRID_SIGMA:
        raise ValueError(f"sigma={sigma:.6g} grid units exceeds 2^48; reduce frac_bits")
    total = _check_shape(shape)
    if sigma < _TINY_SIGMA or total == 0:
        return np.zeros(shape, dtype=np.int64)
    out = np.empty(total, dtype=np.int64)
    proposal = Proposal.of(float(sigma))
    stream = Keystream(rng, WORDS_PER_KEY)
    scratch: _Pass | None = None
    filled = 0
    while filled < total:
        need = total - filled
        n = min(_CHUNK, math.ceil((need + 4 * math.sqrt(need) + 4) / proposal.rate))
        scratch = scratch if scratch is not None and scratch.size == n else _Pass(n)
        stream.fill(scratch.words)
        emitted = scratch.run(proposal)
        take = min(emitted.size, need)
        out[filled : filled + take] = emitted[:take]
        filled += take
    return out.reshape(shape)

"""Fixed-point reals in the ring Z_2^64, for the DCA secure sum (Heikkilä et al. 2017, Sec. 4).

A real x is encoded as the integer round(x * 2^f) in two's complement, stored as ``uint64``;
``f`` (``frac_bits``) is the number of fractional bits, so the grid step is 2^-f. Sums of shares
are taken modulo 2^64 (numpy's ``uint64`` arithmetic wraps silently), which is what makes the
blinding shares cancel *exactly*: the released sum equals the sum of the encoded inputs and the
encoded noise with no rounding at all.

The one thing modular arithmetic cannot do is tell a true sum from one that wrapped. So a
configuration is checked *before* any data is seen (:func:`check_capacity`): the worst-case
magnitude of the decoded total, in grid units,

    N * (B * 2^f + 1/2) + noise_bound * 2^f,

must stay below 2^63 (N clients, per-coordinate bound B, ``noise_bound`` a high-probability bound
on the summed noise; the 1/2 is each client's rounding). A refused configuration raises
``ValueError`` naming the largest frac_bits, bound, client count and noise bound that would fit.

Error bound of one encoding: |decode(encode(x)) - x| <= 2^-(f+1) for |x| 2^f <= 2^53, and
<= |x| 2^-53 beyond (float64 resolution). Rounding can move a difference of two inputs by one grid
step per coordinate, so an L2 sensitivity Delta becomes at most Delta + sqrt(d) 2^-f on the grid
(:func:`grid_sensitivity`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

__all__ = [
    "MAX_FRAC_BITS",
    "RING_BITS",
    "FixedPoint",
    "RingConfig",
    "check_capacity",
    "choose_frac_bits",
    "grid_sensitivity",
    "noise_tail_bound",
    "ring_sum",
    "to_signed",
]

RING_BITS = 64
MAX_FRAC_BITS = 52
_HALF = 1 << (RING_BITS - 1)  # 2^63: decoded totals must lie in [-2^63, 2^63)

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


def _check_frac_bits(frac_bits: int) -> None:
    if isinstance(frac_bits, bool) or not isinstance(frac_bits, int):
        raise ValueError(f"frac_bits must be an integer, got {frac_bits!r}")
    if not 0 <= frac_bits <= MAX_FRAC_BITS:
        raise ValueError(f"frac_bits must be in 0..{MAX_FRAC_BITS}, got {frac_bits}")


@dataclass(frozen=True)
class FixedPoint:
    """Encoder between float64 arrays and the ring Z_2^64 with ``frac_bits`` fractional bits."""

    frac_bits: int = 32

    def __post_init__(self) -> None:
        _check_frac_bits(self.frac_bits)

    @property
    def scale(self) -> float:
        """2^f: grid units per unit of value."""
        return math.ldexp(1.0, self.frac_bits)

    @property
    def resolution(self) -> float:
        """2^-f: the grid step."""
        return math.ldexp(1.0, -self.frac_bits)

    def to_grid(self, values: npt.ArrayLike) -> I64:
        """round(x 2^f) as int64 (ties to even); ``ValueError`` if not finite or >= 2^63 units."""
        scaled = np.asarray(values, dtype=np.float64) * self.scale
        np.rint(scaled, out=scaled)
        if scaled.size:
            low, high = float(scaled.min()), float(scaled.max())  # NaN propagates
            if not (math.isfinite(low) and math.isfinite(high)):
                raise ValueError("values: contain NaN or infinity")
            if max(-low, high) >= _HALF:
                worst = max(-low, high) * self.resolution
                raise ValueError(
                    f"values: |x| = {worst:.6g} does not fit 64 bits at frac_bits={self.frac_bits}"
                )
        return scaled.astype(np.int64)

    def encode(self, values: npt.ArrayLike) -> U64:
        """Values -> ring elements (two's complement of the grid integers)."""
        return self.to_grid(values).view(np.uint64)

    def decode(self, ring: npt.NDArray[np.uint64]) -> F64:
        """Ring elements -> values, reading each element as a signed 64-bit integer."""
        return to_signed(ring).astype(np.float64) * self.resolution


def to_signed(ring: npt.NDArray[np.uint64]) -> I64:
    """The two's complement reading of ring elements (a view, no copy when possible)."""
    arr = np.asarray(ring)
    if arr.dtype != np.uint64:
        raise ValueError(f"ring: expected uint64 elements, got {arr.dtype}")
    return arr.view(np.int64)


def ring_sum(elements: npt.NDArray[np.uint64], axis: int = 0) -> U64:
    """Exact sum modulo 2^64 along ``axis``."""
    arr = np.asarray(elements)
    if arr.dtype != np.uint64:
        raise ValueError(f"elements: expected uint64, got {arr.dtype}")
    return np.asarray(arr.sum(axis=axis, dtype=np.uint64), dtype=np.uint64)


def _need(n_clients: int, bound: Fraction, frac_bits: int, noise: Fraction) -> Fraction:
    """Worst-case |decoded total| in grid units (see the module docstring)."""
    scale = Fraction(2) ** frac_bits
    return n_clients * (bound * scale + Fraction(1, 2)) + noise * scale


def _limits(n_clients: int, bound: Fraction, frac_bits: int, noise: Fraction) -> str:
    """What each number could be, the others fixed, for the total to fit (exact arithmetic)."""
    scale = Fraction(2) ** frac_bits
    per_client = bound * scale + Fraction(1, 2)
    best_f = frac_bits
    while best_f >= 0 and _need(n_clients, bound, best_f, noise) >= _HALF:
        best_f -= 1
    parts = [f"frac_bits to <= {best_f}" if best_f >= 0 else "frac_bits (no value fits)"]
    max_bound = ((_HALF - noise * scale) / n_clients - Fraction(1, 2)) / scale
    parts.append(f"bound below {float(max_bound):.6g}" if max_bound > 0 else "bound (none fits)")
    max_clients = math.ceil((_HALF - noise * scale) / per_client) - 1
    parts.append(f"clients to <= {max_clients}" if max_clients >= 1 else "clients (none fit)")
    max_noise = (_HALF - n_clients * per_client) / scale
    if max_noise > 0:
        parts.append(f"noise_bound below {float(max_noise):.6g}")
    return ", or ".join(parts)


def check_capacity(n_clients: int, bound: float, frac_bits: int, noise_bound: float = 0.0) -> float:
    """Refuse a configuration whose decoded total could leave [-2^63, 2^63); return the headroom.

    ``bound`` is the largest |value| of one coordinate of one client, ``noise_bound`` a bound on
    |summed noise| of one coordinate (see :func:`noise_tail_bound`). Returns the spare bits,
    log2(2^63 / worst case). Exact rational arithmetic, so the check is never off by rounding.
    """
    if isinstance(n_clients, bool) or not isinstance(n_clients, int) or n_clients < 1:
        raise ValueError(f"n_clients must be an integer >= 1, got {n_clients!r}")
    _check_frac_bits(frac_bits)
    for name, value in (("bound", bound), ("noise_bound", noise_bound)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    b, noise = Fraction(bound), Fraction(noise_bound)
    need = _need(n_clients, b, frac_bits, noise)
    if need >= _HALF:
        raise ValueError(
            f"ring Z_2^64 could wrap: {n_clients} clients x bound {bound:g} + noise bound "
            f"{noise_bound:g} at frac_bits={frac_bits} needs 2^{math.log2(need):.2f} > 2^63; "
            f"reduce {_limits(n_clients, b, frac_bits, noise)}"
        )
    return 63.0 - math.log2(need)


def choose_frac_bits(
    n_clients: int, bound: float, noise_bound: float = 0.0, headroom_bits: int = 2
) -> int:
    """The largest frac_bits <= 40 leaving ``headroom_bits`` spare bits; ``ValueError`` if none."""
    for frac_bits in range(40, -1, -1):
        try:
            spare = check_capacity(n_clients, bound, frac_bits, noise_bound)
        except ValueError:
            continue
        if spare >= headroom_bits:
            return frac_bits
    check_capacity(n_clients, bound, 0, noise_bound)  # raises with the limits if nothing fits
    raise ValueError(
        f"headroom_bits: no frac_bits leaves {headroom_bits} spare bits for {n_clients} clients "
        f"at bound {bound:g}"
    )


def noise_tail_bound(sigma: float, d: int, failure_log2: float = -128.0) -> float:
    """A bound on |sum of noise| in each of ``d`` coordinates, failing with prob <= 2^failure_log2.

    The summed noise is sub-Gaussian with parameter ``sigma`` (discrete Gaussians are; Canonne,
    Kamath & Steinke 2020, and sums of independent ones add variances), so
    P(any |coordinate| >= k sigma) <= 2 d exp(-k^2/2); k = sqrt(2 ln(2 d / p)).
    """
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be a finite number >= 0, got {sigma!r}")
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"d must be an integer >= 1, got {d!r}")
    if not failure_log2 < 0:
        raise ValueError(f"failure_log2 must be negative, got {failure_log2!r}")
    k = math.sqrt(2.0 * (math.log(2.0 * d) - failure_log2 * math.log(2.0)))
    return k * sigma


def grid_sensitivity(sensitivity: float, d: int, frac_bits: int) -> float:
    """L2 sensitivity after rounding to the grid: Delta + sqrt(d) 2^-f (one step per coordinate)."""
    _check_frac_bits(frac_bits)
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"sensitivity must be a finite positive number, got {sensitivity!r}")
    return sensitivity + math.sqrt(d) * math.ldexp(1.0, -frac_bits)


@dataclass(frozen=True)
class RingConfig:
    """A checked ring configuration: construction raises ``ValueError`` if it could wrap."""

    n_clients: int
    bound: float
    frac_bits: int = 32
    noise_bound: float = 0.0

    def __post_init__(self) -> None:
        check_capacity(self.n_clients, self.bound, self.frac_bits, self.noise_bound)

    @property
    def codec(self) -> FixedPoint:
        return FixedPoint(self.frac_bits)

    @property
    def headroom_bits(self) -> float:
        return check_capacity(self.n_clients, self.bound, self.frac_bits, self.noise_bound)

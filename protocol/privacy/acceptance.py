"""The discrete Gaussian sampler's acceptance test, decided exactly where float64 cannot.

:mod:`dgauss` accepts a candidate (Y in block V) when a uniform U in [0, 1) falls below
pi = 2^V exp(-a), a = Y^2 / (2 sigma^2) + s^2 / 2, s = sigma ln 2 / t, t = 2^k. Its vectorised
pass decides in float64 every candidate whose margin proves the decision and hands the rest
(about 2^-45 of them) to :func:`accept_exactly`, which decides U < pi with no rounding error:

* U is read lazily: m (52 bits of the candidate's third word) first, then as many further
  64-bit words as needed from the caller's source. After j further words, U 2^52 lies in
  [n / S, (n + 1) / S) with S = 2^(64 j) and n = m S + the words.
* pi is bracketed rigorously (:func:`pi_bracket`): Python's ``decimal`` with basic operations
  rounded toward -inf or +inf (the exact result rounded in that direction, as the General
  Decimal Arithmetic specification requires), so every quantity of a is bounded below and
  above; ``ln`` and ``exp`` are documented as correctly rounded, and the bracket relies only on
  their error being at most one unit in the last digit, which two steps of ``next_minus`` /
  ``next_plus`` cover even at a power of ten (where the step below is ten times smaller).
  ``sigma`` enters as ``Decimal.from_float`` (exact, and blind to the thread's context: the
  ``Decimal(float)`` constructor consults its FloatOperation trap). pi is decreasing in a,
  so 2^V exp(-a_high) <= pi <= 2^V exp(-a_low).
  The bracket's relative width is about (a + 2) 10^(1 - digits).
* Accept when (n + 1) / S <= pi_low 2^52 (then U < pi), reject when n / S >= pi_high 2^52 (then
  U >= pi). Otherwise U's interval overlaps pi's bracket: draw another word if U's interval is
  the wider, else double the digits and bracket again.

Every decision returned is therefore that of U < pi itself. The loop goes on only while U's
interval overlaps pi's bracket; both shrink to a point and U = pi has probability 0, so it ends
with probability 1 (one or two words and one bracket of 40 digits nearly always suffice). The
further words come from the sampler's own keystream in a fixed order, so the same generator
state gives the same decisions. Where a_low >= 10^6 the upper bound 2^V exp(-10^6) alone
decides (reject) once U has a nonzero bit among its first 1.4 million, so the bracket is not
refined there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from decimal import (
    ROUND_CEILING,
    ROUND_FLOOR,
    ROUND_HALF_EVEN,
    Context,
    Decimal,
    DivisionByZero,
    InvalidOperation,
    Overflow,
    Underflow,
)
from fractions import Fraction

__all__ = ["FIRST_BITS", "MAX_BLOCK", "accept_exactly", "pi_bracket", "pi_factor"]

FIRST_BITS = 52  # U's bits in a candidate's own word (m); further bits come 64 at a time
MAX_BLOCK = 62  # blocks V >= 63 (a V word of 2^63 or 0) are rejected: see dgauss's Guarantee
_FIRST_DIGITS = 40
_EXPONENT_CAP = Decimal(10**6)  # a >= this: pi < 2^62 exp(-10^6), the upper bound decides
_WORD = 1 << 64


def _context(digits: int, rounding: str) -> Context:
    """A fresh context (the thread's own context is never read or changed); anything but a
    rounding is an error, and the exponent range holds exp(-10^6) with room to spare."""
    traps = [InvalidOperation, DivisionByZero, Overflow, Underflow]
    return Context(prec=digits, rounding=rounding, Emin=-(10**9), Emax=10**9, traps=traps)


@functools.lru_cache(maxsize=8)
def _ln2_bounds(digits: int) -> tuple[Decimal, Decimal]:
    near = _context(digits, ROUND_HALF_EVEN)
    ln2 = near.ln(Decimal(2))
    return _below(near, ln2), _above(near, ln2)


def _below(near: Context, x: Decimal) -> Decimal:
    """Two steps down: below the exact value of a result that ``ln``/``exp`` rounded to within
    one unit in its last digit, also where that result is a power of ten (whose last-digit
    step just below it is ten times smaller)."""
    return near.next_minus(near.next_minus(x))


def _above(near: Context, x: Decimal) -> Decimal:
    """Two steps up (:func:`_below`'s mirror)."""
    return near.next_plus(near.next_plus(x))


def _exponent(
    sigma: Decimal, t: int, y: int, ln2: Decimal, toward: Context, away: Context
) -> Decimal:
    """a = y^2 / (2 sigma^2) + (sigma ln2 / t)^2 / 2 rounded in ``toward``'s direction (its
    denominator in ``away``'s), with ``ln2`` the matching bound of ln 2."""
    variance2 = away.multiply(2, away.multiply(sigma, sigma))
    z = toward.divide(Decimal(y * y), variance2)
    s = toward.divide(toward.multiply(sigma, ln2), t)
    return toward.add(z, toward.divide(toward.multiply(s, s), 2))


def pi_bracket(
    sigma: float, k: int, y: int, v: int, digits: int
) -> tuple[Fraction, Fraction, bool]:
    """(low, high, refinable) with low <= pi 2^52 <= high for pi = 2^v exp(-a); ``refinable`` is
    False where a >= 10^6 and only the upper bound is kept (low = 0)."""
    down, up = _context(digits, ROUND_FLOOR), _context(digits, ROUND_CEILING)
    near = _context(digits, ROUND_HALF_EVEN)
    ln2_low, ln2_high = _ln2_bounds(digits)
    exact_sigma, t, scale = Decimal.from_float(sigma), 1 << k, 1 << (v + FIRST_BITS)
    a_low = _exponent(exact_sigma, t, y, ln2_low, down, up)
    if a_low >= _EXPONENT_CAP:
        high = _above(near, near.exp(_EXPONENT_CAP.copy_negate()))
        return Fraction(0), Fraction(high) * scale, False
    a_high = _exponent(exact_sigma, t, y, ln2_high, up, down)
    high = _above(near, near.exp(a_low.copy_negate()))
    low = max(_below(near, near.exp(a_high.copy_negate())), Decimal(0))
    return Fraction(low) * scale, Fraction(high) * scale, True


def _check(sigma: float, k: int, m: int) -> None:
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    if not 0 <= k <= 60:
        raise ValueError(f"block bits k must be in [0, 60], got {k!r}")
    if not 0 <= m < 1 << FIRST_BITS:
        raise ValueError(f"m must be a {FIRST_BITS}-bit uniform, got {m!r}")


def accept_exactly(
    sigma: float, k: int, y: int, v: int, m: int, next_word: Callable[[], int]
) -> bool:
    """Whether U < pi = 2^v exp(-(y^2 / (2 sigma^2) + (sigma ln 2 / 2^k)^2 / 2)), U's first 52
    bits ``m`` and each further 64 from ``next_word()`` (called only as needed, in order).
    Blocks v > :data:`MAX_BLOCK` are rejected without drawing."""
    _check(sigma, k, m)
    if not 0 <= v <= MAX_BLOCK:
        return False
    digits = _FIRST_DIGITS
    low, high, refinable = pi_bracket(sigma, k, y, v, digits)
    numerator, scale = m, 1  # U 2^52 in [numerator / scale, (numerator + 1) / scale)
    while True:
        if numerator + 1 <= low * scale:
            return True
        if numerator >= high * scale:
            return False
        if not refinable or (high - low) * scale < 1:  # U's interval is the wider one
            word = next_word()
            if not 0 <= word < _WORD:
                raise ValueError(f"next_word() must give a 64-bit word, got {word!r}")
            numerator, scale = numerator * _WORD + word, scale * _WORD
        else:
            digits *= 2
            low, high, refinable = pi_bracket(sigma, k, y, v, digits)


def pi_factor(sigma: float, k: int) -> float:
    """The float64 nearest 2^52 exp(-s^2 / 2), s = sigma ln 2 / 2^k (40 digits, then one
    correct rounding: relative error <= 2^-53 (1 + 10^-20))."""
    near = _context(_FIRST_DIGITS, ROUND_HALF_EVEN)
    s = near.divide(near.multiply(Decimal.from_float(sigma), near.ln(Decimal(2))), 1 << k)
    half_s2 = near.divide(near.multiply(s, s), 2)
    return float(near.multiply(1 << FIRST_BITS, near.exp(half_s2.copy_negate())))

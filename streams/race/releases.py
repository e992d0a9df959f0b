"""Privacy of RACE releases: Gaussian calibration and the statement that travels with a release.

Adding or removing one record of weight ``|w| <= weight_bound`` changes exactly one counter per
row of a sketch by ``w``: the L1 sensitivity of the counters is ``R * weight_bound`` and the L2
sensitivity ``sqrt(R) * weight_bound`` (race-coleman2021, Theorem 3.2). A Laplace release adds
``Lap(L1 / eps)`` to every counter (eps-DP); a Gaussian release adds ``N(0, sigma^2)``, which is
``(eps, delta)``-DP for the ``eps`` that :func:`gaussian_epsilon` computes exactly (the analytic
Gaussian mechanism of Balle & Wang 2018); :func:`gaussian_sigma` inverts it.

A :class:`PrivacyStatement` describes what a release cost (dp_accounting style: it describes,
an accountant such as :class:`~dpmarket.protocol.privacy.ledger.PrivacyLedger` accounts). Streaming
refresh releases deltas of disjoint record sets: by parallel composition their sum is as private
as its least private part, while the noise variances of the parts add
(:meth:`PrivacyStatement.combine`, :attr:`PrivacyStatement.noise_variance`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing dp_accounting costs about a second; only the ledger needs it
    from dpmarket.protocol.privacy.ledger import PrivacyLedger

__all__ = [
    "ADD_REMOVE",
    "MECHANISMS",
    "PrivacyStatement",
    "check_positive",
    "gaussian_epsilon",
    "gaussian_sigma",
    "neighbouring_relation",
]

ADD_REMOVE = "add/remove one record"  # the neighbouring relation, as accounting.ADD_REMOVE
MECHANISMS = ("laplace", "gaussian")
_MAX_EPSILON = 512.0  # keeps exp(epsilon) finite in the Gaussian calibration


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _gaussian_delta(sigma: float, sensitivity: float, epsilon: float) -> float:
    """Exact delta of the Gaussian mechanism at epsilon (Balle & Wang 2018, Theorem 8)."""
    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    return _normal_cdf(a - b) - math.exp(epsilon) * _normal_cdf(-a - b)


def check_positive(value: float, name: str) -> float:
    """``value`` as a float if it is a finite positive number; ``ValueError`` naming it if not."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def _check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def gaussian_epsilon(sigma: float, sensitivity: float, delta: float) -> float:
    """Smallest epsilon for which ``N(0, sigma^2)`` noise on a query of L2 ``sensitivity`` is
    ``(epsilon, delta)``-DP (analytic Gaussian mechanism, exact up to 1e-9 relative)."""
    sigma = check_positive(sigma, "sigma")
    sensitivity = check_positive(sensitivity, "sensitivity")
    delta = _check_delta(delta)
    if _gaussian_delta(sigma, sensitivity, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while _gaussian_delta(sigma, sensitivity, hi) > delta:
        if hi >= _MAX_EPSILON:
            raise ValueError(f"sigma = {sigma} gives epsilon above {_MAX_EPSILON} at {delta=}")
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-9 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _gaussian_delta(sigma, sensitivity, mid) > delta else (lo, mid)
    return hi


def gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest sigma making the Gaussian mechanism ``(epsilon, delta)``-DP (analytic)."""
    epsilon = check_positive(epsilon, "epsilon")
    sensitivity = check_positive(sensitivity, "sensitivity")
    delta = _check_delta(delta)
    if epsilon > _MAX_EPSILON:
        raise ValueError(f"epsilon must be at most {_MAX_EPSILON}, got {epsilon!r}")
    lo, hi = 1e-6 * sensitivity, sensitivity
    while _gaussian_delta(hi, sensitivity, epsilon) > delta:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-9 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _gaussian_delta(mid, sensitivity, epsilon) > delta else (lo, mid)
    return hi


@dataclass(frozen=True)
class PrivacyStatement:
    """What a release cost, next to the release.

    ``mechanism`` "laplace" (``noise`` holds the scale b of each delta release, ``sensitivity``
    is L1) or "gaussian" (``noise`` holds each sigma, ``sensitivity`` is L2); one entry per
    accumulated delta release over disjoint record sets. ``epsilon``/``delta``: the guarantee
    against ``neighbouring`` (parallel composition: the least private part; ``epsilon`` None for
    a Gaussian release made without a delta: account it with a :class:`PrivacyLedger`).
    """

    mechanism: str
    noise: tuple[float, ...]
    sensitivity: float
    neighbouring: str
    epsilon: float | None
    delta: float

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        if not self.noise or not all(math.isfinite(v) and v > 0 for v in self.noise):
            raise ValueError(f"noise must hold positive noise scales, got {self.noise!r}")
        check_positive(self.sensitivity, "sensitivity")
        if self.epsilon is not None and not (math.isfinite(self.epsilon) and self.epsilon >= 0):
            raise ValueError(f"epsilon must be None or a finite number >= 0, got {self.epsilon!r}")
        if not 0.0 <= self.delta < 1.0:
            raise ValueError(f"delta must be in [0, 1), got {self.delta!r}")

    @property
    def noise_variance(self) -> float:
        """Variance of the noise on every counter: the parts' variances add (each part about
        ``2 b^2`` or ``sigma^2``, plus 1/12 for rounding to an integer)."""
        factor = 2.0 if self.mechanism == "laplace" else 1.0
        return float(sum(factor * s * s + 1.0 / 12.0 for s in self.noise))

    @property
    def releases(self) -> int:
        """Number of delta releases accumulated."""
        return len(self.noise)

    def combine(self, other: PrivacyStatement) -> PrivacyStatement:
        """Statement of the sum of two releases of disjoint record sets."""
        for name in ("mechanism", "sensitivity", "neighbouring"):
            if getattr(self, name) != getattr(other, name):
                raise ValueError(f"cannot accumulate releases: {name} differs")
        eps = (
            None
            if self.epsilon is None or other.epsilon is None
            else max(self.epsilon, other.epsilon)
        )
        return PrivacyStatement(
            self.mechanism, self.noise + other.noise, self.sensitivity, self.neighbouring, eps,
            max(self.delta, other.delta),
        )  # fmt: skip

    def record(self, ledger: PrivacyLedger, label: str = "RACE sketch release") -> None:
        """Charge every part to ``ledger`` (sequential composition: safe, possibly loose)."""
        for noise in self.noise:
            if self.mechanism == "laplace":
                ledger.laplace(noise, self.sensitivity, label=label, neighbouring=self.neighbouring)
            else:
                ledger.gaussian(
                    noise, self.sensitivity, label=label, neighbouring=self.neighbouring
                )


def neighbouring_relation(weight_bound: int) -> str:
    """The neighbouring relation of a sketch whose records carry ``|weight| <= weight_bound``."""
    if weight_bound == 1:
        return ADD_REMOVE
    return f"add/remove one record of |weight| <= {weight_bound}"

"""The noisy sums of DP Bayesian linear regression and their sensitivities (Heikkilä et al. 2017).

A :class:`NoisySum` releases the sum of per-client contribution rows with Gaussian noise
calibrated to (eps, delta) and an L2 sensitivity under add/remove of one client's record:
:class:`TrustedAggregatorSum` (TA: one Gaussian of ``sigma_std`` on the exact sum) or
:class:`DistributedSum` (DDP: each client adds ``N(0, sigma_std^2 / (N - T - 1))``, Theorem 1;
what the DCA secure sum releases). ``sigma_std`` comes from the classical or the analytic
Gaussian mechanism (:func:`gaussian_sigma`). The contribution builders and sensitivities of the
two rounds of Algorithm 2 live here too; protocol/regression/fits.py fits the model from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.protocol.privacy.ledger import ADD_REMOVE, MechanismEvent, PrivacyLedger

__all__ = [
    "DistributedSum",
    "NoisySum",
    "SumRelease",
    "TrustedAggregatorSum",
    "gaussian_sigma",
    "moment_contributions",
    "moment_sensitivity",
    "statistics_contributions",
    "statistics_sensitivity",
    "unpack_statistics",
]

F64 = NDArray[np.float64]
Rng = np.random.Generator
CALIBRATIONS = ("analytic", "classical")
LOCAL = "replace one client's record (local)"


def _check_budget(eps: float, delta: float) -> None:
    if not (isinstance(eps, int | float) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a finite positive number, got {eps!r}")
    if not (isinstance(delta, int | float) and 0.0 < delta < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def _positive(value: float, name: str) -> float:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")
    return float(value)


def _phi(t: float) -> float:
    return 0.5 * math.erfc(-t / math.sqrt(2.0))


def _analytic_delta(ratio: float, eps: float) -> float:
    """delta(eps) of a Gaussian with sigma/sensitivity = ``ratio`` (Balle & Wang 2018, Thm 8).

    The second term is computed in log space (it never exceeds the first); if ``Phi`` underflows
    the result only grows, so the search stays conservative.
    """
    a, b = 0.5 / ratio, eps * ratio
    tail = _phi(-a - b)
    return _phi(a - b) - (math.exp(eps + math.log(tail)) if tail > 0.0 else 0.0)


def gaussian_sigma(
    sensitivity: float, eps: float, delta: float, calibration: str = "analytic"
) -> float:
    """Noise std of the (central) Gaussian mechanism for L2 ``sensitivity`` at ``(eps, delta)``.

    ``"classical"``: ``sqrt(2 ln(1.25/delta)) sensitivity / eps`` (paper Eq. 1; a proven bound
    only for eps < 1, used beyond as the paper does). ``"analytic"``: the smallest sigma (to a
    relative 1e-9, rounded up) with ``Phi(s/2sigma - eps sigma/s) - e^eps Phi(-s/2sigma -
    eps sigma/s) <= delta`` (Balle & Wang 2018): exactly ``(eps, delta)``-DP at any eps.
    """
    sens = _positive(sensitivity, "sensitivity")
    _check_budget(eps, delta)
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
    classical = math.sqrt(2.0 * math.log(1.25 / delta)) / eps
    if calibration == "classical":
        return classical * sens
    lo, hi = classical * 1e-3, classical
    while _analytic_delta(hi, eps) > delta:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-9 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if _analytic_delta(mid, eps) <= delta else (mid, hi)
    return hi * sens


@dataclass(frozen=True)
class SumRelease:
    """One noisy sum and what the ledger needs about it.

    ``sigma`` is the noise std that protects any one client against the aggregator and up to
    ``colluders`` other clients (``sigma_std``); ``noise_std`` is the std of the total noise in
    ``value`` (equal to ``sigma`` for TA, ``sigma sqrt(N/(N-T-1))`` for DDP).
    """

    value: F64
    sigma: float
    sensitivity: float
    noise_std: float
    neighbouring: str = ADD_REMOVE

    def record(self, ledger: PrivacyLedger, label: str) -> MechanismEvent:
        """Record this release as one Gaussian event in ``ledger``."""
        return ledger.gaussian(
            self.sigma, self.sensitivity, label=label, neighbouring=self.neighbouring
        )


class NoisySum(Protocol):
    """A DP sum over clients: ``(contributions (N, k), L2 sensitivity, eps, delta, rng)``."""

    def __call__(
        self, contributions: F64, sensitivity: float, eps: float, delta: float, rng: Rng
    ) -> SumRelease: ...


def _check_contributions(contributions: ArrayLike) -> F64:
    z = np.asarray(contributions, dtype=np.float64)
    if z.ndim != 2 or z.shape[0] < 1 or z.shape[1] < 1:
        raise ValueError(f"contributions must be a non-empty (N, k) matrix, got shape {z.shape}")
    if not np.all(np.isfinite(z)):
        raise ValueError("contributions must be finite")
    return z


@dataclass(frozen=True)
class TrustedAggregatorSum:
    """TA: the exact sum plus one ``N(0, sigma_std^2 I)`` draw; ``(eps, delta)``-DP."""

    calibration: str = "analytic"

    def __call__(
        self, contributions: F64, sensitivity: float, eps: float, delta: float, rng: Rng
    ) -> SumRelease:
        z = _check_contributions(contributions)
        sigma = gaussian_sigma(sensitivity, eps, delta, self.calibration)
        value = z.sum(axis=0) + rng.normal(0.0, sigma, size=z.shape[1])
        return SumRelease(value, sigma, float(sensitivity), sigma)


@dataclass(frozen=True)
class DistributedSum:
    """DDP (Theorem 1): client i adds ``N(0, sigma_std^2/(N - T - 1) I)``, then all are summed.

    Against the aggregator plus any ``T = colluders`` clients that reveal (or skip) their noise
    and the observed client itself, at least ``N - T - 1`` honest noises remain, whose sum has
    variance >= sigma_std^2: ``(eps, delta)``-DP. Needs ``N >= T + 2``.
    """

    colluders: int = 0
    calibration: str = "analytic"

    def __post_init__(self) -> None:
        t = self.colluders
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"colluders must be an integer >= 0, got {t!r}")

    def __call__(
        self, contributions: F64, sensitivity: float, eps: float, delta: float, rng: Rng
    ) -> SumRelease:
        z = _check_contributions(contributions)
        n, honest = z.shape[0], z.shape[0] - self.colluders - 1
        if honest < 1:
            raise ValueError(f"need N >= colluders + 2, got N={n}, colluders={self.colluders}")
        sigma = gaussian_sigma(sensitivity, eps, delta, self.calibration)
        per_client = sigma / math.sqrt(honest)
        noisy = z + rng.normal(0.0, per_client, size=z.shape)
        return SumRelease(noisy.sum(axis=0), sigma, float(sensitivity), per_client * math.sqrt(n))


def _bounds(bound: float | ArrayLike, d: int, name: str) -> F64:
    b = np.broadcast_to(np.asarray(bound, dtype=np.float64), (d,))
    if not np.all(np.isfinite(b) & (b > 0)):
        raise ValueError(f"{name} must be finite and positive, got {bound!r}")
    return np.array(b)


def statistics_contributions(x: F64, y: F64) -> F64:
    """Per-client rows ``(upper triangle of x x^T row-major, x y)``: ``d(d+1)/2 + d`` columns."""
    iu, ju = np.triu_indices(x.shape[1])
    return np.concatenate([x[:, iu] * x[:, ju], x * y[:, None]], axis=1)


def statistics_sensitivity(feature_bounds: float | ArrayLike, target_bound: float, d: int) -> float:
    """Exact add/remove L2 sensitivity of :func:`statistics_contributions` on the box.

    ``sqrt(sum_{j<=k} b_j^2 b_k^2 + b_y^2 sum_j b_j^2)``: every entry grows with ``|x_j|, |y|``,
    so the largest row norm is at a corner (supplement Eq. 15-18 is the replace-one analogue).
    """
    b2 = _bounds(feature_bounds, d, "feature_bounds") ** 2
    by2 = _positive(target_bound, "target_bound") ** 2
    pairs = 0.5 * (b2.sum() ** 2 + (b2**2).sum())
    return math.sqrt(float(pairs + by2 * b2.sum()))


def unpack_statistics(vector: F64, d: int) -> tuple[F64, F64]:
    """Inverse of the column order of :func:`statistics_contributions`: ``(XX, Xy)``."""
    m = d * (d + 1) // 2
    if vector.shape != (m + d,):
        raise ValueError(f"vector must have shape ({m + d},) for d={d}, got {vector.shape}")
    xx = np.zeros((d, d))
    xx[np.triu_indices(d)] = vector[:m]
    return xx + np.triu(xx, 1).T, vector[m:].copy()


def moment_contributions(x: F64, y: F64, count_weight: float) -> F64:
    """Per-client rows ``(count_weight, x_1^2, ..., x_d^2, y^2)`` of the marginal-std round."""
    weight = np.full((x.shape[0], 1), count_weight)
    return np.concatenate([weight, x**2, (y**2)[:, None]], axis=1)


def moment_sensitivity(
    feature_bounds: float | ArrayLike, target_bound: float, d: int, count_weight: float
) -> float:
    """Exact add/remove L2 sensitivity of :func:`moment_contributions`:
    ``sqrt(w^2 + sum_j c_j^4 + c_y^4)``."""
    c4 = float((_bounds(feature_bounds, d, "feature_bounds") ** 4).sum())
    w = _positive(count_weight, "count_weight")
    return math.sqrt(w**2 + c4 + _positive(target_bound, "target_bound") ** 4)

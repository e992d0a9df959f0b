"""Which features h1 standardises by the normalise round's DP spreads, and the kernel width.

The normalise secure sum releases, per feature, the pool's sum and sum of squares, and the
record count, each with Gaussian noise of the same public sigma. The DP variance of feature i,
``v_i = S2_i / n - (S1_i / n)^2``, carries noise whose standard error is, by the delta method
(the partial derivatives ``1/n``, ``-2 mu_i / n`` and ``(2 mu_i^2 - m2_i) / n`` of v_i in S2_i,
S1_i and n, with ``m2_i = v_i + mu_i^2``),

    se_i = (sigma / n) sqrt(1 + 4 mu_i^2 + (v_i - mu_i^2)^2),

mu_i and v_i clipped to what a record bounded by ``bound`` allows. Which features are standardised
is decided from public numbers, so repeated runs of one config hash with the same kernel
(issue 40: deciding on the DP variance itself let its noise flip features near the threshold,
56, 60 or 64 of digits' pixels kept at the public scale from run to run): feature i is
standardised by its DP spread only when the public seed set's variance ``s_i`` clears
``STANDARDIZE_MIN_SNR`` standard errors of the release's noise at the seed set's moments
(``s_i >= STANDARDIZE_MIN_SNR * se_i(seed mean, s_i)``, with the public pool size the plan
read when one is given, else the release's DP count, which moves by about sigma from run to
run) and its seed spread is above ``SCALE_FLOOR * bound``; otherwise it
keeps the public scale, 1 in the data's own units (what h1 hashes with ``standardize =
false``). Before this rule, a spread whose DP variance came out
negative was floored at 1e-3 x bound: on digits in [0, 1] that blew 20 features up 100-fold
and the median-heuristic gamma fell to about 1e-6, so the kernel saw those features only.

The kernel width cannot collapse: no feature's scale is below ``1 / MAX_AMPLIFICATION`` of its
spread on the public seed set, so in standardised units no feature of the seed set spreads
more than MAX_AMPLIFICATION times its public spread, and the median heuristic on the
standardised seed set stays on the scale of the seed set's own distances.

Privacy: post-processing only. Everything read here is the normalise round's DP release (means,
spreads, count) with its public sigma, the public clip bound and the public seed set; no record
is read, so the decisions and the kernel width cost no budget and may be published.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.summary.snr import STANDARDIZE_MIN_SNR

__all__ = [
    "MAX_AMPLIFICATION",
    "SCALE_FLOOR",
    "Standardisation",
    "spread_standard_errors",
    "standardisation",
]

SCALE_FLOOR = 1e-3
"""A DP spread below SCALE_FLOOR x bound is never used (a noisy constant feature)."""

MAX_AMPLIFICATION = 10.0
"""No feature's scale is below its public seed-set spread / MAX_AMPLIFICATION."""

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Standardisation:
    """h1's public standardisation: ``center``, ``scale``, the kernel width ``gamma`` in
    standardised units, and per feature the ``decisions`` ("dp": its DP spread; "public": kept
    the public scale 1; "seed floor": raised to the seed set's spread / MAX_AMPLIFICATION) with
    the DP variance's ``standard_errors``."""

    center: tuple[float, ...]
    scale: tuple[float, ...]
    gamma: float
    decisions: tuple[str, ...]
    standard_errors: tuple[float, ...]

    def report(self) -> dict[str, Any]:
        """The public report's entry (all of it post-processing of DP releases)."""
        kept = [i for i, d in enumerate(self.decisions) if d != "dp"]
        return {
            "center": list(self.center),
            "scale": list(self.scale),
            "gamma": self.gamma,
            "features": list(self.decisions),
            "variance_standard_error": list(self.standard_errors),
            "kept_public_scale": kept,
        }


def spread_standard_errors(
    mean: npt.ArrayLike, variance: npt.ArrayLike, count: float, sigma: float, bound: float
) -> F64:
    """Standard error of each DP variance from the release's noise ``sigma`` (module docstring:
    the delta method on (S1, S2, n), each with independent noise sigma)."""
    if not (count > 0 and sigma >= 0 and bound > 0):
        raise ValueError(f"need count > 0, sigma >= 0, bound > 0; got {count}, {sigma}, {bound}")
    mu = np.clip(np.asarray(mean, dtype=np.float64), -bound, bound)
    v = np.clip(np.asarray(variance, dtype=np.float64), 0.0, bound**2)
    se: F64 = (sigma / count) * np.sqrt(1.0 + 4.0 * mu**2 + (v - mu**2) ** 2)
    return se


def standardisation(
    mean: npt.ArrayLike,
    spread: npt.ArrayLike,
    count: float,
    sigma: float,
    bound: float,
    seed_set: npt.ArrayLike,
    gamma: float | None = None,
    records: float | None = None,
) -> Standardisation:
    """Per-feature center and scale from the DP ``mean`` and ``spread`` (module docstring), and
    gamma by the median heuristic on the standardised ``seed_set`` unless ``gamma`` is given.

    ``spread`` may be floored already (``sqrt(max(v, tiny))``). ``records``: the pool's public
    size (a simulation's n_points, the files' record counts, public under replace-one), which
    the per-feature decision uses instead of the DP ``count`` so it is the same every run."""
    center = np.asarray(mean, dtype=np.float64)
    dp_spread = np.asarray(spread, dtype=np.float64)
    seed = np.asarray(seed_set, dtype=np.float64)
    if center.ndim != 1 or dp_spread.shape != center.shape:
        raise ValueError(
            f"mean and spread: equal 1-D shapes, got {center.shape}, {dp_spread.shape}"
        )
    if seed.ndim != 2 or seed.shape[1] != center.shape[0] or seed.shape[0] < 2:
        raise ValueError(f"seed_set must have shape (>= 2, {center.shape[0]}), got {seed.shape}")
    variance = dp_spread**2
    se = spread_standard_errors(center, variance, count, sigma, bound)
    # the decision: public numbers only (module docstring), the same kernel run after run
    seed_variance = seed.var(axis=0)
    public_count = count if records is None or records <= 0 else float(records)
    seed_se = spread_standard_errors(seed.mean(axis=0), seed_variance, public_count, sigma, bound)
    clear = (seed_variance >= STANDARDIZE_MIN_SNR * seed_se) & (
        np.sqrt(seed_variance) >= SCALE_FLOOR * bound
    )
    scale = np.where(clear, np.maximum(dp_spread, SCALE_FLOOR * bound), 1.0)
    decisions = np.where(clear, "dp", "public").astype(object)
    seed_floor = seed.std(axis=0) / MAX_AMPLIFICATION
    raised = scale < seed_floor
    scale = np.where(raised, seed_floor, scale)
    decisions[raised] = "seed floor"
    if gamma is None:
        gamma = _median_heuristic((seed - center) / scale)
    return Standardisation(
        tuple(float(c) for c in center),
        tuple(float(s) for s in scale),
        float(gamma),
        tuple(str(d) for d in decisions),
        tuple(float(e) for e in se),
    )


def _median_heuristic(points: F64) -> float:
    """``1 / median ||x - y||^2`` over distinct pairs (as streams/synthetic.py computes it)."""
    sq = (points * points).sum(axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * points @ points.T, 0.0)
    median = float(np.median(d2[np.triu_indices(points.shape[0], k=1)]))
    if not (median > 0 and math.isfinite(median)):
        raise ValueError("median squared distance of the standardised seed set is 0")
    return 1.0 / median

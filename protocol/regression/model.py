"""Bayesian linear regression with clipped features: the posterior and the public parameters.

The model (supplement Section 10): ``y | x ~ N(x^T beta, 1/lambda)``, ``beta ~ N(0, I/lambda_0)``;
posterior precision ``lambda_0 I + lambda XX``, mean ``precision^-1 lambda Xy``. A noisy ``XX`` has
its eigenvalues clipped below at ``psd_margin sigma sqrt(d)``, sigma the (public) ``sigma_std`` of
the release (post-processing, no privacy cost): the spectral norm of a symmetric d x d Gaussian
matrix is about ``2 sigma sqrt(d)``, and clipping at 0 instead lets noise-only directions reach the
prior precision alone, where the noisy ``Xy`` then blows the mean up (median MAE in the thousands
on the benchmark). Predictions clip x to the bounds the model was trained with (projection is part
of the released model).

The private fits that feed it noisy sufficient statistics (Algorithm 2) are in :mod:`.fits`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.protocol.regression.sums import (
    CALIBRATIONS,
    _bounds,
    _positive,
)

__all__ = ["BlrPosterior", "RegressionConfig", "blr_posterior"]

F64 = NDArray[np.float64]
Rng = np.random.Generator


@dataclass(frozen=True)
class BlrPosterior:
    """Posterior ``N(mean, covariance)`` of beta; features are clipped to ``feature_bounds``."""

    mean: F64
    covariance: F64
    feature_bounds: F64

    def predict(self, x: ArrayLike) -> F64:
        """Posterior-mean prediction ``clip(x) . mean`` for rows of ``x``."""
        xa = np.asarray(x, dtype=np.float64)
        if xa.ndim != 2 or xa.shape[1] != self.mean.shape[0]:
            raise ValueError(f"x must have shape (n, {self.mean.shape[0]}), got {xa.shape}")
        return np.clip(xa, -self.feature_bounds, self.feature_bounds) @ self.mean


def _posterior_batched(
    xx: F64, xy: F64, prior: float, noise: float, floor: float | F64
) -> tuple[F64, F64]:
    """Batched mean/covariance, ``XX``'s eigenvalues clipped below at ``floor`` (shape ``...``)."""
    w, v = np.linalg.eigh(0.5 * (xx + np.swapaxes(xx, -1, -2)))
    inv = 1.0 / (noise * np.maximum(w, np.asarray(floor)[..., None]) + prior)
    cov = (v * inv[..., None, :]) @ np.swapaxes(v, -1, -2)
    return np.einsum("...ij,...j->...i", cov, noise * xy), cov


def blr_posterior(
    xx: F64,
    xy: F64,
    feature_bounds: float | F64,
    prior_precision: float = 1.0,
    noise_precision: float = 1.0,
    eigen_floor: float = 0.0,
) -> BlrPosterior:
    """Posterior of supplement Eqs. 11-13 from (possibly noisy) ``XX`` (d, d) and ``Xy`` (d,).

    Precision ``prior_precision I + noise_precision XX'``, mean ``precision^-1 noise_precision
    Xy``, where ``XX'`` is ``XX`` with eigenvalues clipped below at ``eigen_floor`` (>= 0).
    """
    d = xy.shape[0]
    if xx.shape != (d, d) or xy.ndim != 1:
        raise ValueError(f"xx must be (d, d) and xy (d,), got {xx.shape}, {xy.shape}")
    if not (math.isfinite(eigen_floor) and eigen_floor >= 0):
        raise ValueError(f"eigen_floor must be finite and >= 0, got {eigen_floor!r}")
    prior = _positive(prior_precision, "prior_precision")
    noise = _positive(noise_precision, "noise_precision")
    mean, cov = _posterior_batched(xx, xy, prior, noise, eigen_floor)
    return BlrPosterior(mean, cov, _bounds(feature_bounds, d, "feature_bounds"))


@dataclass(frozen=True)
class RegressionConfig:
    """Public parameters: assumed bounds, priors, budget split and projection grid (Section 5)."""

    feature_bound: float = 7.5
    target_bound: float = 7.5
    prior_precision: float = 1.0
    noise_precision: float = 1.0
    std_share: float = 0.3
    std_floor: float = 0.5
    psd_margin: float = 2.0
    grid: tuple[float, ...] = field(default=tuple(np.linspace(0.1, 2.1, 20).tolist()))
    grid_repeats: int = 10
    calibration: str = "analytic"
    # The clients' roster (N) is public in the secure sum, so neighbouring data sets have the
    # same N and differ in one client's record: replace-one, every sum's L2 sensitivity twice
    # the add/remove bound. "add_remove" reproduces the paper's accounting (an under-count
    # when N is published).
    neighbouring: str = "replace"

    def __post_init__(self) -> None:
        if self.neighbouring not in ("replace", "add_remove"):
            raise ValueError(
                f"neighbouring must be replace or add_remove, got {self.neighbouring!r}"
            )
        for name in ("feature_bound", "target_bound", "prior_precision", "noise_precision"):
            _positive(getattr(self, name), name)
        _positive(self.std_floor, "std_floor")
        _positive(self.psd_margin, "psd_margin")
        if not (isinstance(self.std_share, int | float) and 0.0 < self.std_share < 1.0):
            raise ValueError(f"std_share must be in (0, 1), got {self.std_share!r}")
        if len(self.grid) < 1 or not all(math.isfinite(g) and g > 0 for g in self.grid):
            raise ValueError(f"grid must be non-empty and positive, got {self.grid!r}")
        repeats = self.grid_repeats
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise ValueError(f"grid_repeats must be an integer >= 1, got {self.grid_repeats!r}")
        if self.calibration not in CALIBRATIONS:
            raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {self.calibration!r}")


def _clipped_data(x: ArrayLike, y: ArrayLike, config: RegressionConfig) -> tuple[F64, F64]:
    """Validate and clip to the assumed bounds (Algorithm 2, step 1)."""
    xa, ya = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xa.ndim != 2 or xa.shape[0] < 1 or xa.shape[1] < 1 or ya.shape != (xa.shape[0],):
        raise ValueError(f"x must be (n, d) and y (n,), got {xa.shape}, {ya.shape}")
    if not (np.all(np.isfinite(xa)) and np.all(np.isfinite(ya))):
        raise ValueError("x and y must be finite")
    c_x, c_y = config.feature_bound, config.target_bound
    return np.clip(xa, -c_x, c_x), np.clip(ya, -c_y, c_y)


def _posterior_of(
    xx: F64, xy: F64, bounds: F64, config: RegressionConfig, noise_std: float
) -> BlrPosterior:
    """Posterior with the eigenvalue floor ``psd_margin noise_std sqrt(d)`` (module docstring)."""
    floor = config.psd_margin * noise_std * math.sqrt(xy.shape[0])
    return blr_posterior(xx, xy, bounds, config.prior_precision, config.noise_precision, floor)

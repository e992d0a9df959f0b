"""DP Bayesian linear regression on distributed data: the fits (Heikkilä et al. 2017).

The model and its posterior are in :mod:`.model`, the noisy sums over clients in
:mod:`.sums`; :mod:`.dca` runs the same fits through the DCA secure sum.

Theory of operation
-------------------
Every client holds one record (x_i, y_i). All releases are sums over clients computed by a
:class:`NoisySum`: a callable taking the ``(N, k)`` matrix of per-client contributions, their L2
sensitivity, the ``(eps, delta)`` of this release and a ``numpy.random.Generator``, and returning
a :class:`SumRelease` (noisy sum plus the Gaussian-event parameters for the ledger). Two are built
in: :class:`TrustedAggregatorSum` (TA: exact sum plus one Gaussian of ``sigma_std``) and
:class:`DistributedSum` (DDP: each client adds ``N(0, sigma_std^2 / (N - T - 1))``, Theorem 1,
and the sum is taken; this is exactly what the DCA secure sum, Algorithm 1, releases).

Neighbouring relation: one client (= one record) added or removed. The number of clients N is
not used as public: the marginal-moment round releases a noisy count alongside the moments.

Algorithm 2 (Section 4.2.1), :meth:`DistributedRegression.fit_projected`:

1. each client clips x_j to ``[-c_x, c_x]`` and y to ``[-c_y, c_y]`` (assumed bounds, public);
2. round 1 (:meth:`DistributedRegression.marginal_stds`), budget ``(std_share eps,
   std_share delta)``: noisy sums of ``(w, x_1^2 .. x_d^2, y^2)``, ``w = max(c_x, c_y)^2``, L2
   sensitivity ``sqrt(w^2 + d c_x^4 + c_y^4)``; marginal stds ``sqrt(S_j / (S_0 / w))`` (data
   assumed zero-centred, as in the paper), floored at ``std_floor`` (the paper's 0.5) and
   capped at the assumed bound;
3. thresholds ``(p_x, p_y)`` in units of std by grid search on auxiliary data drawn from the
   model of Eqs. 4-6 (:func:`projection_thresholds`; public, independent of the clients' data);
   clients clip to ``b_x = min(p_x sigma_j, c_x)``, ``b_y = min(p_y sigma_y, c_y)``;
4. round 2, the remaining ``((1 - std_share) eps, (1 - std_share) delta)``: noisy sums of the
   upper triangle of ``x x^T`` and of ``x y``; L2 sensitivity (add/remove, exact: attained at a
   corner of the box) ``sqrt(sum_{j<=k} b_j^2 b_k^2 + b_y^2 sum_j b_j^2)``.

By basic composition the two rounds are ``(eps, delta)``-DP; the ledger's PLD accounting of the
two Gaussian events is tighter. Without projection (TA, DDP) round 2 alone runs at the full budget
with the assumed bounds.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from dpmarket.protocol.privacy.ledger import ADD_REMOVE, REPLACE_ONE_RECORD, PrivacyLedger
from dpmarket.protocol.regression.model import (
    F64,
    BlrPosterior,
    RegressionConfig,
    Rng,
    _clipped_data,
    _posterior_batched,
    _posterior_of,
)
from dpmarket.protocol.regression.sums import (
    LOCAL,
    DistributedSum,
    NoisySum,
    SumRelease,
    TrustedAggregatorSum,
    _check_budget,
    gaussian_sigma,
    moment_contributions,
    moment_sensitivity,
    statistics_contributions,
    statistics_sensitivity,
    unpack_statistics,
)

__all__ = [
    "METHODS",
    "DistributedRegression",
    "fit",
    "fit_input_perturbation",
    "fit_nonprivate",
    "projection_thresholds",
]

METHODS = ("NP", "TA", "DDP", "TA-proj", "DDP-proj", "input")


def fit_nonprivate(x: ArrayLike, y: ArrayLike, config: RegressionConfig) -> BlrPosterior:
    """NP: exact posterior of the data clipped to the assumed bounds (no privacy)."""
    xc, yc = _clipped_data(x, y, config)
    bounds = np.full(xc.shape[1], config.feature_bound)
    return _posterior_of(xc.T @ xc, xc.T @ yc, bounds, config, 0.0)


@dataclass(frozen=True)
class DistributedRegression:
    """The releases of one fit: how sums over clients are taken and where they are recorded.

    ``noisy_sum`` is :class:`TrustedAggregatorSum` (TA), :class:`DistributedSum` (DDP) or any
    :class:`NoisySum` (e.g. the DCA secure sum); every release is one Gaussian ledger event.
    """

    noisy_sum: NoisySum
    config: RegressionConfig = field(default_factory=lambda: RegressionConfig())
    ledger: PrivacyLedger | None = None

    def _release(
        self, z: F64, sens: float, budget: tuple[float, float], rng: Rng, label: str
    ) -> SumRelease:
        # the builders' sensitivities are add/remove bounds; N is public: replace-one doubles them
        replace = self.config.neighbouring == "replace"
        release = self.noisy_sum(z, 2.0 * sens if replace else sens, budget[0], budget[1], rng)
        release = dataclasses.replace(
            release, neighbouring=REPLACE_ONE_RECORD if replace else ADD_REMOVE
        )
        if self.ledger is not None:
            release.record(self.ledger, label)
        return release

    def _statistics(
        self, xc: F64, yc: F64, bounds: F64, bound_y: float, budget: tuple[float, float], rng: Rng
    ) -> BlrPosterior:
        d = xc.shape[1]
        sens = statistics_sensitivity(bounds, bound_y, d)
        label = "regression: sufficient statistics (Algorithm 2, step 4)"
        release = self._release(statistics_contributions(xc, yc), sens, budget, rng, label)
        xx, xy = unpack_statistics(release.value, d)
        return _posterior_of(xx, xy, bounds, self.config, release.sigma)

    def fit_statistics(
        self, x: ArrayLike, y: ArrayLike, eps: float, delta: float, rng: Rng
    ) -> BlrPosterior:
        """TA / DDP without projection: one ``(eps, delta)`` round at the assumed bounds."""
        _check_budget(eps, delta)
        xc, yc = _clipped_data(x, y, self.config)
        bounds = np.full(xc.shape[1], self.config.feature_bound)
        return self._statistics(xc, yc, bounds, self.config.target_bound, (eps, delta), rng)

    def marginal_stds(
        self, xc: F64, yc: F64, eps: float, delta: float, rng: Rng
    ) -> tuple[F64, float, float]:
        """Algorithm 2, step 2, on clipped data: DP ``(std_x (d,), std_y, count)``.

        One ``(eps, delta)`` release of :func:`moment_contributions`; the noisy count replaces
        a public N. Stds are floored at ``std_floor`` and capped at the assumed bounds.
        """
        cfg, d = self.config, xc.shape[1]
        w = max(cfg.feature_bound, cfg.target_bound) ** 2
        sens = moment_sensitivity(cfg.feature_bound, cfg.target_bound, d, w)
        label = "regression: marginal second moments (Algorithm 2, step 2)"
        value = self._release(moment_contributions(xc, yc, w), sens, (eps, delta), rng, label).value
        count = value[0] / w
        var = value[1:] / count if count > 0 else np.zeros(d + 1)
        caps = np.append(np.full(d, cfg.feature_bound), cfg.target_bound)
        stds = np.where(var > 0, np.sqrt(np.maximum(var, 0.0)), cfg.std_floor)
        stds = np.minimum(np.maximum(stds, cfg.std_floor), caps)
        return stds[:d], float(stds[d]), float(count)

    def fit_projected(
        self,
        x: ArrayLike,
        y: ArrayLike,
        eps: float,
        delta: float,
        rng: Rng,
        thresholds: tuple[float, float] | None = None,
    ) -> BlrPosterior:
        """Algorithm 2 (TA-proj / DDP-proj): two rounds, ``(eps, delta)``-DP by composition.

        ``thresholds``: precomputed ``(p_x, p_y)`` from :func:`projection_thresholds` (a
        public function of ``(n, d, budget)``, so it may be cached); ``None`` searches here with
        n = the DP count of round 1 (the true N is not used).
        """
        _check_budget(eps, delta)
        if thresholds is not None and not all(math.isfinite(t) and t > 0 for t in thresholds):
            raise ValueError(f"thresholds must be finite and positive, got {thresholds!r}")
        cfg = self.config
        xc, yc = _clipped_data(x, y, cfg)
        share = cfg.std_share
        std_x, std_y, count = self.marginal_stds(xc, yc, share * eps, share * delta, rng)
        budget = ((1.0 - share) * eps, (1.0 - share) * delta)
        if thresholds is None:
            n_aux = max(1, round(count))
            thresholds = projection_thresholds(n_aux, xc.shape[1], *budget, rng, cfg)
        bounds = np.minimum(thresholds[0] * std_x, cfg.feature_bound)
        bound_y = min(thresholds[1] * std_y, cfg.target_bound)
        xp, yp = np.clip(xc, -bounds, bounds), np.clip(yc, -bound_y, bound_y)
        return self._statistics(xp, yp, bounds, bound_y, budget, rng)


def projection_thresholds(
    n: int, d: int, eps: float, delta: float, rng: Rng, config: RegressionConfig
) -> tuple[float, float]:
    """Algorithm 2, step 3: ``(p_x, p_y)`` in units of std, by grid search on auxiliary data.

    Each repeat draws n training and n test records from Eqs. 4-6 (``x ~ N(0, I)``, ``beta ~
    N(0, I/lambda_0)``, ``y ~ N(x^T beta, 1/lambda)``), then for every grid pair clips to
    ``(p_x, p_y std(y))``, adds TA noise for ``(eps, delta)`` at that pair's sensitivity (one
    standard-normal draw shared by all pairs) and scores the test MAE. Returns the pair with the
    lowest mean MAE. Uses no client data, so costs no privacy.
    """
    _check_budget(eps, delta)
    if n < 1 or d < 1:
        raise ValueError(f"n and d must be >= 1, got n={n}, d={d}")
    grid = np.asarray(config.grid, dtype=np.float64)
    unit = gaussian_sigma(1.0, eps, delta, config.calibration)
    total = np.zeros((grid.size, grid.size))
    for _ in range(config.grid_repeats):
        total += _grid_mae(n, d, grid, unit, rng, config)
    gx, gy = np.unravel_index(int(np.argmin(total)), total.shape)
    return float(grid[gx]), float(grid[gy])


def _grid_mae(
    n: int, d: int, grid: F64, unit_sigma: float, rng: Rng, config: RegressionConfig
) -> F64:
    """Test MAE of one auxiliary draw for every (p_x, p_y) pair, shape ``(G, G)``."""
    beta = rng.normal(0.0, 1.0 / math.sqrt(config.prior_precision), size=d)
    x = rng.normal(size=(2 * n, d))
    y = x @ beta + rng.normal(0.0, 1.0 / math.sqrt(config.noise_precision), size=2 * n)
    bx = grid[:, None, None]
    xc = np.clip(x[None, :n], -bx, bx)  # (G, n, d)
    by = grid * float(np.std(y[:n]))
    yc = np.clip(y[None, :n], -by[:, None], by[:, None])  # (G, n)
    xx = np.einsum("gni,gnj->gij", xc, xc)[:, None]  # (G, 1, d, d)
    xy = np.einsum("gni,hn->ghi", xc, yc)  # (G, G, d)
    b2 = grid[:, None] ** 2
    sigma = unit_sigma * np.sqrt(d * (d + 1) / 2 * b2**2 + d * b2 * by[None, :] ** 2)
    noise = rng.normal(size=(d, d))
    noise = np.triu(noise) + np.triu(noise, 1).T
    noisy_xx = xx + sigma[..., None, None] * noise
    noisy_xy = xy + sigma[..., None] * rng.normal(size=d)
    floor = config.psd_margin * math.sqrt(d) * sigma
    prior, lam = config.prior_precision, config.noise_precision
    mean, _ = _posterior_batched(noisy_xx, noisy_xy, prior, lam, floor)
    pred = np.einsum("gmi,ghi->ghm", np.clip(x[None, n:], -bx, bx), mean)
    return np.asarray(np.abs(pred - y[None, None, n:]).mean(axis=2))


def fit_input_perturbation(
    x: ArrayLike,
    y: ArrayLike,
    eps: float,
    delta: float,
    rng: Rng,
    config: RegressionConfig,
    ledger: PrivacyLedger | None = None,
) -> BlrPosterior:
    """Input perturbation: each client publishes its clipped record plus ``N(0, s^2 I_{d+1})``.

    Local ``(eps, delta)``-DP per client against replacing its record anywhere in the box: L2
    sensitivity = the box diameter ``2 sqrt(d c_x^2 + c_y^2)``. The analyst debiases ``XX`` by
    ``- N s^2 I`` (``E[(x+e)(x+e)^T] = x x^T + s^2 I``; ``Xy`` is unbiased), post-processing;
    the eigenvalue floor uses ``sqrt(N (s^4 + 2 s^2 c_x^2))``, a bound on an entry's noise std.
    """
    _check_budget(eps, delta)
    xc, yc = _clipped_data(x, y, config)
    n, d = xc.shape
    diameter = 2.0 * math.sqrt(d * config.feature_bound**2 + config.target_bound**2)
    s = gaussian_sigma(diameter, eps, delta, config.calibration)
    xn = xc + rng.normal(0.0, s, size=xc.shape)
    yn = yc + rng.normal(0.0, s, size=n)
    if ledger is not None:
        ledger.gaussian(s, diameter, label="regression: input perturbation", neighbouring=LOCAL)
    noise_std = math.sqrt(n * (s**4 + 2.0 * s**2 * config.feature_bound**2))
    xx = xn.T @ xn - n * s**2 * np.eye(d)
    return _posterior_of(xx, xn.T @ yn, np.full(d, config.feature_bound), config, noise_std)


def fit(
    method: str,
    x: ArrayLike,
    y: ArrayLike,
    eps: float,
    delta: float,
    rng: Rng,
    config: RegressionConfig | None = None,
    ledger: PrivacyLedger | None = None,
    thresholds: tuple[float, float] | None = None,
    colluders: int = 0,
) -> BlrPosterior:
    """Fit by one of :data:`METHODS` (NP ignores the budget and records nothing)."""
    cfg = RegressionConfig() if config is None else config
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "NP":
        return fit_nonprivate(x, y, cfg)
    if method == "input":
        return fit_input_perturbation(x, y, eps, delta, rng, cfg, ledger)
    noisy_sum: NoisySum = (
        TrustedAggregatorSum(cfg.calibration)
        if method.startswith("TA")
        else DistributedSum(colluders, cfg.calibration)
    )
    run = DistributedRegression(noisy_sum, cfg, ledger)
    if method.endswith("-proj"):
        return run.fit_projected(x, y, eps, delta, rng, thresholds)
    return run.fit_statistics(x, y, eps, delta, rng)

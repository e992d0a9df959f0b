"""DP Bayesian linear regression whose sums go through the real DCA secure sum.

:class:`DcaSum` is a :class:`~dpmarket.protocol.regression.sums.NoisySum` that runs one round
of the secure sum of :mod:`dpmarket.protocol.securesum` (its client, compute node and aggregator
parties; sealed shares over ``n_nodes`` compute nodes, discrete Gaussian noise per client of
variance sigma_std^2 / (N - T - 1), Theorem 1) instead of simulating the distributed noise.
Privacy per release: the Gaussian mechanism with sigma_std at the caller's L2 sensitivity (plus
the grid's rounding), neighbouring = add/remove one client's record, against the aggregator and
up to ``colluders`` clients; the regression records it in its ledger as one Gaussian event, as
for the simulated DDP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpmarket.protocol.privacy.ledger import ADD_REMOVE, PrivacyLedger
from dpmarket.protocol.regression.fits import DistributedRegression
from dpmarket.protocol.regression.model import F64, BlrPosterior, RegressionConfig, Rng
from dpmarket.protocol.regression.sums import SumRelease, _check_contributions
from dpmarket.protocol.securesum.driver import secure_sum

__all__ = ["DcaSum", "fit_dca"]


@dataclass(frozen=True)
class DcaSum:
    """One secure-sum round per release; refuses (ValueError) when the round releases nothing."""

    colluders: int = 0
    n_nodes: int = 3
    calibration: str = "analytic"

    def __call__(
        self, contributions: F64, sensitivity: float, eps: float, delta: float, rng: Rng
    ) -> SumRelease:
        z = _check_contributions(contributions)
        n = len(z)
        # every client row has L2 norm <= sensitivity (add/remove), so |entry| <= sensitivity:
        # a public bound, as the ring's capacity check requires
        outcome = secure_sum(
            z,
            epsilon=eps,
            delta=delta,
            sensitivity=sensitivity,
            bound=float(sensitivity),
            rng=rng,
            tolerance=self.colluders,
            n_nodes=self.n_nodes,
            method=self.calibration,
            neighbouring=ADD_REMOVE,
        )
        result = outcome.result
        if result.value is None:
            raise ValueError(f"secure sum released nothing (status {result.status})")
        honest = n - self.colluders - 1
        noise_std = result.sigma_std * math.sqrt(n / honest)
        return SumRelease(
            np.asarray(result.value, dtype=np.float64),
            result.sigma_std,
            result.sensitivity,
            noise_std,
        )


def fit_dca(
    x: F64,
    y: F64,
    eps: float,
    delta: float,
    rng: Rng,
    *,
    projected: bool = True,
    config: RegressionConfig | None = None,
    ledger: PrivacyLedger | None = None,
    colluders: int = 0,
    n_nodes: int = 3,
) -> BlrPosterior:
    """DDP or DDP-proj regression (the paper's Algorithm 2) over the real secure sum."""
    cfg = RegressionConfig() if config is None else config
    run = DistributedRegression(DcaSum(colluders, n_nodes, cfg.calibration), cfg, ledger)
    if projected:
        return run.fit_projected(x, y, eps, delta, rng)
    return run.fit_statistics(x, y, eps, delta, rng)

"""Regression over the real DCA secure sum agrees with the simulated distributed noise."""

from __future__ import annotations

import numpy as np
import pytest

from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.regression.dca import DcaSum, fit_dca
from dpmarket.protocol.regression.fits import fit_nonprivate
from dpmarket.protocol.regression.model import RegressionConfig
from dpmarket.protocol.regression.sums import DistributedSum


def _data(n: int = 120, d: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(n, d))
    y = x @ np.array([1.0, -0.5, 0.25])[:d] + 0.1 * rng.normal(size=n)
    return x, y


def test_without_noise_to_speak_of_the_fit_equals_the_nonprivate_one() -> None:
    x, y = _data()
    cfg = RegressionConfig(feature_bound=1.0, target_bound=2.0)
    ledger = PrivacyLedger("clients")
    post = fit_dca(
        x, y, 1e6, 1e-4, np.random.default_rng(1), projected=False, config=cfg, ledger=ledger
    )
    exact = fit_nonprivate(x, y, cfg)
    np.testing.assert_allclose(post.mean, exact.mean, atol=2e-3)
    assert [e.mechanism for e in ledger.events] == ["gaussian"]


def test_noise_std_matches_the_simulated_distributed_sum() -> None:
    rng = np.random.default_rng(2)
    z = rng.uniform(-1, 1, size=(12, 2))
    dca, sim = DcaSum(colluders=2), DistributedSum(colluders=2)
    draws = np.array([dca(z, 1.0, 1.0, 1e-5, rng).value for _ in range(300)])
    expected = sim(z, 1.0, 1.0, 1e-5, rng).noise_std
    assert draws.mean(axis=0) == pytest.approx(z.sum(axis=0), abs=5 * expected / np.sqrt(300))
    std = draws.std(axis=0, ddof=1)
    assert np.all(np.abs(std / expected - 1) < 0.25)  # 300 draws: ~4% s.e.; 2x would fail

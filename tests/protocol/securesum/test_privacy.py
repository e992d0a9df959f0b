"""DCA noise: Theorem 1 calibration, colluders and dropouts against T, and the ledger.

Every statistical check uses one round with d = 4000 coordinates (4000 independent noise draws
per client), so a variance ratio has standard error sqrt(2/4000) = 2.2%; windows are 5 standard
errors wide, far narrower than a factor-2 error in sigma (a factor 4 in variance).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from dpmarket.protocol.privacy.dgauss import analytic_sigma, classical_sigma
from dpmarket.protocol.securesum.driver import DcaSession, RoundOutcome
from dpmarket.protocol.securesum.fixedpoint import grid_sensitivity, to_signed
from dpmarket.protocol.securesum.spec import REPLACE_ONE, DcaConfig, RoundSpec

D = 4000
SE = math.sqrt(2.0 / D)


def config(n: int, t: int, f: int = 24) -> DcaConfig:
    clients = tuple(f"c{i}" for i in range(n))
    return DcaConfig("run-p", clients, ("n0", "n1", "n2"), tolerance=t, bound=1.0, frac_bits=f)


def residual(
    cfg: DcaConfig, out: RoundOutcome, x: npt.NDArray[np.float64]
) -> npt.NDArray[np.int64]:
    """Released total minus the exact sum of the included inputs, in grid units (exact)."""
    assert out.result.ring_total is not None
    included = [cfg.clients.index(c) for c in out.result.included]
    exact = cfg.codec.to_grid(x[included]).sum(axis=0)
    return np.asarray(to_signed(out.result.ring_total) - exact, dtype=np.int64)


def test_total_noise_matches_theorem_1() -> None:
    n, t, sigma_std = 12, 3, 1.0
    cfg = config(n, t)
    x = np.random.default_rng(0).uniform(-1, 1, (n, D))
    session = DcaSession(cfg, batch=5)
    first = session.run_round(RoundSpec(1, D, sigma_std), x, np.random.default_rng(1))
    noise = residual(cfg, first, x).astype(np.float64) * cfg.codec.resolution
    expected = n * sigma_std**2 / (n - t - 1)  # every client adds sigma_std^2 / (N - T - 1)
    ratio = float(np.mean(noise**2)) / expected
    assert abs(ratio - 1.0) < 5 * SE
    assert abs(float(noise.mean())) < 5 * math.sqrt(expected / D)
    second = session.run_round(RoundSpec(2, D, sigma_std), x, np.random.default_rng(1))
    # fresh shares, but the noise comes from the seeded generator: same seed, same noise
    assert np.array_equal(residual(cfg, first, x), residual(cfg, second, x))


@pytest.mark.parametrize(
    ("reveal", "withhold", "dropped"),
    [(2, 0, 1), (0, 3, 0), (1, 0, 0), (0, 0, 3), (3, 0, 1), (2, 2, 0), (0, 5, 0)],
)
def test_noise_left_to_a_coalition(reveal: int, withhold: int, dropped: int) -> None:
    """An observer client plus colluders who reveal or withhold their noise, with dropouts.

    The noise they cannot remove has variance (N - D - C - 1) sigma_std^2 / (N - T - 1): at
    least sigma_std^2 exactly when C + D <= T, short of it beyond."""
    n, t, sigma_std = 10, 3, 1.0
    cfg = config(n, t)
    names = list(cfg.clients)
    revealers, withholders = names[:reveal], names[reveal : reveal + withhold]
    observer, absent = names[-1], names[-1 - dropped : -1]
    behaviour = {c: "reveal" for c in [*revealers, observer]} | dict.fromkeys(
        withholders, "withhold"
    )
    x = np.random.default_rng(2).uniform(-1, 1, (n, D))
    session = DcaSession(cfg, batch=3, behaviour=behaviour)
    out = session.run_round(RoundSpec(1, D, sigma_std), x, np.random.default_rng(3), absent=absent)
    assert out.result.released and sorted(out.result.missing) == sorted(absent)
    assert set(out.revealed) == {*revealers, observer}
    left = residual(cfg, out, x) - sum(out.revealed.values())
    ratio = float(np.mean((left * cfg.codec.resolution) ** 2)) / sigma_std**2
    colluders = reveal + withhold
    expected = (n - dropped - colluders - 1) / (n - t - 1)
    assert abs(ratio - expected) < 5 * SE * expected
    if colluders + dropped <= t:
        assert ratio > 1.0 - 5 * SE  # the trusted-aggregator noise is still there
    else:
        assert ratio + 5 * SE * expected < 1.0  # and it is not, beyond T


def test_released_rounds_are_charged_to_the_ledger() -> None:
    cfg = config(20, 2, f=30)
    session = DcaSession(cfg, batch=7)
    x = np.random.default_rng(4).uniform(-1, 1, (20, 5))
    spec = cfg.spec(1, 5, epsilon=1.0, delta=1e-5, sensitivity=2.0, label="stats")
    assert spec.sigma_std == pytest.approx(analytic_sigma(1.0, 1e-5, grid_sensitivity(2.0, 5, 30)))
    session.run_round(spec, x, np.random.default_rng(5))
    (event,) = session.aggregator.ledger.events
    assert event.mechanism == "gaussian" and event.param("sigma") == spec.sigma_std
    assert event.sensitivity == grid_sensitivity(2.0, 5, 30)
    assert event.neighbouring == REPLACE_ONE and event.label == "stats"
    assert 0.97 < session.aggregator.ledger.epsilon(1e-5) <= 1.0 + 1e-3
    session.run_round(RoundSpec(2, 5, 0.0), x, np.random.default_rng(5))  # noise off: free
    session.run_round(RoundSpec(3, 5, 1.0), x, np.random.default_rng(5), absent=cfg.clients[:3])
    assert session.aggregator.result(3) is not None
    assert len(session.aggregator.ledger.events) == 1  # neither round was charged
    again = cfg.spec(4, 5, epsilon=1.0, delta=1e-5, sensitivity=2.0, label="stats")
    session.run_round(again, x, np.random.default_rng(6))
    (event,) = session.aggregator.ledger.events
    assert event.count == 2


def test_classical_calibration_is_selectable_and_conservative() -> None:
    cfg = config(20, 2, f=30)
    spec = cfg.spec(1, 3, epsilon=0.5, delta=1e-5, sensitivity=1.0, method="classical")
    assert spec.sigma_std == pytest.approx(classical_sigma(0.5, 1e-5, grid_sensitivity(1.0, 3, 30)))
    session = DcaSession(cfg)
    session.run_round(spec, np.zeros((20, 3)), np.random.default_rng(0))
    assert session.aggregator.ledger.epsilon(1e-5) < 0.5
    with pytest.raises(ValueError, match="analytic"):
        cfg.spec(1, 3, epsilon=2.0, delta=1e-5, sensitivity=1.0, method="classical")

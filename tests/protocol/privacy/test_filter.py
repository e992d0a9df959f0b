"""The Rényi privacy filter: curves against dp-accounting, the cap over adaptive sequences,
and a statistical check of the privacy-loss tail it promises."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from dpmarket.protocol.privacy.filter import ORDERS, NotAccountable, RenyiFilter, rdp_curve
from dpmarket.protocol.privacy.ledger import MechanismEvent, PrivacyLedger


def gauss(sigma: float, sens: float = 1.0, count: int = 1) -> MechanismEvent:
    return MechanismEvent("gaussian", (("sigma", sigma),), sens, count)


def _dp_accounting_rdp(event: dp_event.DpEvent) -> np.ndarray:
    acc = rdp_privacy_accountant.RdpAccountant(orders=list(ORDERS))
    acc.compose(event)
    return np.asarray(acc._rdp)  # the per-order values, to compare curves


@pytest.mark.parametrize("sigma,sens", [(2.0, 1.0), (5.0, 3.0), (0.7, 0.5)])
def test_gaussian_curve_matches_dp_accounting(sigma: float, sens: float) -> None:
    ours = rdp_curve(gauss(sigma, sens, count=3))
    theirs = 3 * _dp_accounting_rdp(dp_event.GaussianDpEvent(sigma / sens))
    np.testing.assert_allclose(ours, theirs, rtol=1e-9)


@pytest.mark.parametrize("scale,sens", [(2.0, 1.0), (10.0, 2.0), (0.5, 1.0)])
def test_laplace_curve_matches_dp_accounting(scale: float, sens: float) -> None:
    event = MechanismEvent("laplace", (("scale", scale),), sens)
    ours = rdp_curve(event)
    theirs = _dp_accounting_rdp(dp_event.LaplaceDpEvent(scale / sens))
    np.testing.assert_allclose(ours, np.minimum(theirs, sens / scale), rtol=1e-6)


def test_pure_events_bounded_by_epsilon_and_zcdp() -> None:
    event = MechanismEvent("exponential", (("eps_score", 0.05),), 1.0, count=2)
    curve = rdp_curve(event)
    a = np.asarray(ORDERS)
    np.testing.assert_allclose(curve, 2 * np.minimum(0.1, a * 0.1**2 / 2))


def test_events_with_delta_are_not_admitted() -> None:
    paper = MechanismEvent("auction", (("eps_auc", 0.1),), variant="paper")
    with pytest.raises(NotAccountable, match="delta > 0"):
        rdp_curve(paper)
    filt = RenyiFilter(10.0, 1e-5)
    assert not filt.admits([], paper)
    assert math.isinf(filt.spent([paper]))
    pure = MechanismEvent("auction", (("eps_auc", 0.1),), variant="pure")
    assert filt.admits([], pure)


def test_bad_caps_refused_by_name() -> None:
    with pytest.raises(ValueError, match="cap epsilon"):
        RenyiFilter(0.0, 1e-5)
    with pytest.raises(ValueError, match="cap delta"):
        RenyiFilter(1.0, 0.0)


def test_spent_is_an_upper_bound_on_the_pld_epsilon() -> None:
    """The filter charges at least what the (tighter, fixed-sequence) PLD ledger reports, and
    not absurdly more (within a factor 2 on a long Gaussian sequence)."""
    delta = 1e-5
    ledger = PrivacyLedger("owner-1")
    events = [gauss(8.0, 1.0, count=10), gauss(20.0, 2.0, count=5)]
    for e in events:
        ledger.record(e)
    pld = ledger.epsilon(delta)
    spent = RenyiFilter(100.0, delta).spent(events)
    assert pld <= spent <= 2 * pld


def test_admits_exactly_while_the_cap_holds() -> None:
    filt = RenyiFilter(1.0, 1e-5)
    admitted: list[MechanismEvent] = []
    declined = 0
    for _ in range(200):
        e = gauss(10.0)
        if filt.admits(admitted, e):
            admitted.append(e)
        else:
            declined += 1
    assert 0 < len(admitted) < 200 and declined == 200 - len(admitted)
    assert filt.spent(admitted) <= 1.0 < filt.spent([*admitted, gauss(10.0)])
    # the admitted count is the largest n with spent(n identical) <= cap, found independently
    n = max(k for k in range(1, 200) if filt.spent([gauss(10.0, count=k)]) <= 1.0)
    assert len(admitted) == n
    # a much smaller charge can still fit after a decline
    assert filt.admits(admitted, gauss(1e4))


def test_cap_never_exceeded_over_random_adaptive_sequences() -> None:
    rng = np.random.default_rng(19)
    delta = 1e-6
    for trial in range(40):
        cap = float(rng.uniform(0.3, 4.0))
        filt = RenyiFilter(cap, delta)
        ledger = PrivacyLedger(f"owner-{trial}")
        admitted: list[MechanismEvent] = []
        for _ in range(60):
            kind = rng.integers(3)
            if kind == 0:
                e = gauss(float(rng.uniform(1.0, 30.0)), float(rng.uniform(0.5, 2.0)))
            elif kind == 1:
                e = MechanismEvent("laplace", (("scale", float(rng.uniform(5, 50))),))
            else:
                e = MechanismEvent("exponential", (("eps_score", float(rng.uniform(0.001, 0.1))),))
            if filt.admits(admitted, e):
                admitted.append(e)
                ledger.record(e)
        assert filt.spent(admitted) <= cap
        assert ledger.epsilon(delta) <= cap  # and so is every valid accountant's bound


def _privacy_loss_tail(filtered: bool, cap: float, delta: float, paths: int) -> float:
    """Monte Carlo of an adaptive analyst on Gaussian releases of a sensitivity-1 value: the
    next noise scale depends on the last output (a large output -> less noise next time). On
    the neighbour with the value present, the privacy loss of output x = 1 + sigma Z is
    1/(2 sigma^2) + Z/sigma. Returns the fraction of paths whose total loss exceeds ``cap``."""
    rng = np.random.default_rng(7)
    filt = RenyiFilter(cap, delta)
    sigmas = (2.0, 4.0)
    # the filter's decision depends only on the sigmas so far: precompute curves
    curves = {s: rdp_curve(gauss(s), filt.orders) for s in sigmas}
    slack = np.log(len(filt.orders) / delta) / (np.asarray(filt.orders) - 1.0)
    rdp = np.zeros((paths, len(filt.orders)))
    loss = np.zeros(paths)
    sigma = np.full(paths, sigmas[1])
    active = np.ones(paths, dtype=bool)
    for _ in range(400):
        curve = np.where((sigma == sigmas[0])[:, None], curves[sigmas[0]], curves[sigmas[1]])
        fits = np.min(rdp + curve + slack, axis=1) <= cap
        step = active & fits if filtered else active
        if not step.any():
            break
        z = rng.standard_normal(paths)
        loss = np.where(step, loss + 1.0 / (2 * sigma**2) + z / sigma, loss)
        rdp = np.where(step[:, None], rdp + curve, rdp)
        active = step if filtered else active
        sigma = np.where(z > 0.5, sigmas[0], sigmas[1])  # the adaptive choice
    return float(np.mean(loss > cap))


def test_privacy_loss_tail_is_below_delta_under_adaptive_choice() -> None:
    """(cap, delta)-DP means P(loss > cap) <= delta; with delta 0.05 this is measurable. The
    same analyst without the filter (400 releases) blows through it, so the test can fail."""
    cap, delta, paths = 3.0, 0.05, 40_000
    tail = _privacy_loss_tail(True, cap, delta, paths)
    assert tail <= delta  # binomial sd at 0.05 and 40k paths is 0.001; the bound is loose
    assert _privacy_loss_tail(False, cap, delta, paths) > 10 * delta


def test_a_store_mixing_relations_composes_under_replace_one() -> None:
    """Issue 24 review: a store kept across the change to one relation per run holds add/remove
    secure sums beside replace-one ones. Composed together, each add/remove event counts as a
    removal and an addition (its sensitivity doubled): never less than the replace-one truth."""
    from dpmarket.protocol.privacy.ledger import ADD_REMOVE, REPLACE_ONE_RECORD

    def gauss(sens: float, relation: str) -> MechanismEvent:
        return MechanismEvent("gaussian", (("sigma", 4.0),), sens, neighbouring=relation)

    f = RenyiFilter(10.0, 1e-5)
    old, new = gauss(1.0, ADD_REMOVE), gauss(1.0, REPLACE_ONE_RECORD)
    assert f.spent([old, new]) == pytest.approx(f.spent([gauss(2.0, REPLACE_ONE_RECORD), new]))
    assert f.spent([old, new]) > f.spent([gauss(1.0, REPLACE_ONE_RECORD), new])
    assert f.spent([old, old]) == pytest.approx(f.spent([new, new]))  # one relation: as it is
    pure = MechanismEvent("approx_dp", (("epsilon", 0.3), ("delta", 0.0)), 1.0,
                          neighbouring=ADD_REMOVE)  # fmt: skip
    doubled = MechanismEvent("approx_dp", (("epsilon", 0.6), ("delta", 0.0)), 1.0,
                             neighbouring=REPLACE_ONE_RECORD)  # fmt: skip
    assert f.spent([pure, new]) == pytest.approx(f.spent([doubled, new]))

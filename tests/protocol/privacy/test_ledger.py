"""Tests for the privacy ledger (dpmarket.protocol.privacy.ledger).

Reference numbers: Sarpatwar et al. (2019) Section 4 and Appendix D/G; PAPER-NOTES item 3.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from dpmarket.protocol.privacy.composition import kairouz_theorem7, paper_composition
from dpmarket.protocol.privacy.ledger import (
    ADD_REMOVE,
    REPLACE_ONE_RECORD,
    MechanismEvent,
    PrivacyLedger,
    record_relation,
)

T_INIT = 1656  # Table 1: d^1.5 with d = 140
EPS_V = 0.01


def _validation_ledger() -> PrivacyLedger:
    """What one h2 call on D_v runs: T exponential draws + T Laplace steps at eps_v."""
    ledger = PrivacyLedger("validation")
    ledger.exponential(EPS_V, 1.0, count=T_INIT, label="h2(validation) coordinate draw")
    ledger.laplace(
        1.0 / EPS_V, 1.0, count=T_INIT, label="h2(validation) Laplace step", paper_epsilon=EPS_V
    )
    return ledger


# --- the paper's own count -------------------------------------------------------------------


def test_paper_count_reproduces_validation_figure() -> None:
    assert _validation_ledger().epsilon(0.01, "paper") == pytest.approx(1.40, abs=0.01)


@pytest.mark.parametrize("p", [50, 200])
def test_paper_count_reproduces_summary_figure(p: int) -> None:
    ledger = PrivacyLedger("owner-1")
    eps = 0.01 / math.sqrt(5 * p)
    ledger.exponential(eps, count=5 * p, label="h2(summary) coordinate draw")
    ledger.laplace(1.0 / eps, count=5 * p, label="h2(summary) Laplace step", paper_epsilon=eps)
    ledger.auction(0.04, "paper", count=p, label="auction")
    assert ledger.epsilon(1e-4, "paper") == pytest.approx(0.043, abs=0.001)


def test_paper_composition_formula() -> None:
    expected = (
        3 * 0.1 * math.expm1(0.1)
        + 2 * 0.2 * math.expm1(0.2)
        + math.sqrt(2 * math.log(1 / 0.05) * (3 * 0.01 + 2 * 0.04))
    )
    assert paper_composition([0.1, 0.2], [3, 2], 0.05) == pytest.approx(expected, rel=1e-12)


# --- the correct count -----------------------------------------------------------------------


def test_theorem7_validation_with_exponential_charged_twice() -> None:
    # exponential charged 2 eps_v = 0.02, Laplace eps_v = 0.01, 1656 of each
    assert _validation_ledger().epsilon(0.01, "theorem7") == pytest.approx(3.18, abs=0.02)


def test_theorem7_validation_k_equals_2t() -> None:
    # both mechanisms at eps_v: k = 2T homogeneous
    ledger = PrivacyLedger("validation")
    ledger.laplace(100.0, count=2 * T_INIT)
    assert ledger.epsilon(0.01, "theorem7") == pytest.approx(1.88, abs=0.02)
    assert kairouz_theorem7([0.01], [2 * T_INIT], 0.01) == pytest.approx(1.88, abs=0.02)


def test_theorem7_matches_hand_computation() -> None:
    eps, k, dt = 0.05, 40, 1e-3
    drift = k * eps * math.expm1(eps) / (math.exp(eps) + 1)
    s = k * eps**2
    expected = min(
        k * eps,
        drift + math.sqrt(2 * s * math.log(1 / dt)),
        drift + math.sqrt(2 * s * math.log(math.e + math.sqrt(2 * s) / dt)),
    )
    assert kairouz_theorem7([eps], [k], dt) == pytest.approx(expected, rel=1e-12)
    assert kairouz_theorem7([0.5, 0.5], [1, 1], dt) == pytest.approx(1.0)  # sum term wins


def test_pld_at_most_theorem7_and_laplace_reference() -> None:
    ledger = _validation_ledger()
    pld = ledger.epsilon(0.01, "pld")
    assert pld <= ledger.epsilon(0.01, "theorem7")
    assert pld > ledger.epsilon(0.01, "paper")  # the paper under-counts
    laplace_only = PrivacyLedger("validation")
    laplace_only.laplace(100.0, count=T_INIT)
    assert laplace_only.epsilon(0.01, "pld") == pytest.approx(0.70, abs=0.01)
    assert laplace_only.epsilon(0.01, "pld") <= laplace_only.epsilon(0.01, "theorem7")


def test_single_laplace_event() -> None:
    ledger = PrivacyLedger("owner-1")
    ledger.laplace(4.0, sensitivity=2.0)
    assert ledger.epsilon(1e-6, "theorem7") == 0.5
    assert ledger.epsilon(1e-6, "pld") == pytest.approx(0.5, abs=2e-3)
    assert ledger.events[0].dp_parameters() == (0.5, 0.0)
    assert ledger.epsilon(1e-6, "paper") == 0.0  # no paper_epsilon: the paper does not count it


def test_exponential_charged_twice_its_score_epsilon() -> None:
    event = MechanismEvent("exponential", (("eps_score", 0.3),), sensitivity=2.0)
    assert event.dp_parameters() == pytest.approx((1.2, 0.0))
    ledger = PrivacyLedger("validation", [event])
    assert ledger.epsilon(1e-9, "pld") == pytest.approx(1.2, abs=2e-3)


# --- grouping --------------------------------------------------------------------------------


def test_grouping_adds_counts() -> None:
    twice = PrivacyLedger("owner-1")
    twice.laplace(10.0, label="x")
    twice.laplace(10.0, label="x")
    once = PrivacyLedger("owner-1")
    once.laplace(10.0, count=2, label="x")
    assert twice.events == once.events
    assert twice.events[0].count == 2
    assert twice.epsilon(1e-5, "pld") == once.epsilon(1e-5, "pld")


def test_grouping_keeps_distinct_events_apart() -> None:
    ledger = PrivacyLedger("owner-1")
    ledger.laplace(10.0, label="x")
    ledger.laplace(10.0, label="y")
    ledger.laplace(20.0, label="x")
    ledger.laplace(10.0, sensitivity=2.0, label="x")
    ledger.auction(0.1, "paper", label="x")
    ledger.auction(0.1, "pure", label="x")
    assert len(ledger.events) == 6
    assert all(e.count == 1 for e in ledger.events)


# --- auction ---------------------------------------------------------------------------------


def test_paper_auction_delta_makes_epsilon_infinite() -> None:
    ledger = PrivacyLedger("owner-1")
    ledger.auction(0.04, "paper", count=200, label="auction")
    assert ledger.events[0].dp_parameters() == pytest.approx((0.04, 1 - math.exp(-0.04)))
    assert ledger.epsilon(1e-5, "pld") == math.inf
    assert ledger.epsilon(1e-5, "theorem7") == math.inf
    assert ledger.summary(1e-5)["epsilon"]["pld"] is None
    pure = PrivacyLedger("owner-1")
    pure.auction(0.04, "pure", count=200, label="auction")
    for method in ("pld", "theorem7"):
        assert math.isfinite(pure.epsilon(1e-5, method))
    assert pure.epsilon(1e-5, "pld") <= pure.epsilon(1e-5, "theorem7") <= 200 * 0.04


def _ask_probability(ranks: np.ndarray, eps: float, variant: str) -> np.ndarray:
    """PRIVAUCTION (Algorithm 3) ask probability by rank; "pure" scales by 1/(1 + e^-eps)."""
    scale = 1.0 if variant == "paper" else 1.0 / (1.0 + math.exp(-eps))
    return scale * np.exp(-eps * (ranks - 1))


@pytest.mark.parametrize("eps", [0.04, 0.3, 1.5])
def test_auction_charges_match_rank_shift_by_one(eps: float) -> None:
    """Adjacent ranks r, r+1: the ledger's per-step (eps, delta) is exactly the worst case."""
    ranks = np.arange(1, 60)
    for variant in ("paper", "pure"):
        asked = _ask_probability(ranks, eps, variant)
        charged_eps, charged_delta = MechanismEvent(
            "auction", (("eps_auc", eps),), variant=variant
        ).dp_parameters()
        assert charged_eps == eps
        assert np.allclose(np.log(asked[:-1] / asked[1:]), eps)
        # hockey-stick divergence at eps over outputs {asked, not asked}, both directions
        lo, hi = np.stack([asked[:-1], 1 - asked[:-1]]), np.stack([asked[1:], 1 - asked[1:]])
        delta = max(
            np.max(np.sum(np.maximum(hi - math.exp(eps) * lo, 0), axis=0)),
            np.max(np.sum(np.maximum(lo - math.exp(eps) * hi, 0), axis=0)),
        )
        assert delta == pytest.approx(charged_delta, abs=1e-12)
        if variant == "pure":
            assert np.max(np.abs(np.log(hi[1] / lo[1]))) == pytest.approx(eps)  # rank 1 vs 2
    assert _ask_probability(ranks, eps, "paper")[0] == 1.0


# --- Gaussian --------------------------------------------------------------------------------


def test_gaussian_classical_sigma_is_at_most_eps() -> None:
    eps, delta, sens = 0.5, 1e-5, 2.0
    sigma = sens * math.sqrt(2 * math.log(1.25 / delta)) / eps
    ledger = PrivacyLedger("validation")
    ledger.gaussian(sigma, sensitivity=sens, label="mean of h1")
    pld = ledger.epsilon(delta, "pld")
    assert 0.5 * eps < pld <= eps
    # theorem7 charges the analytic epsilon at delta/2 for a single Gaussian
    analytic, _ = ledger.events[0].dp_parameters(delta / 2)
    assert ledger.epsilon(delta, "theorem7") == pytest.approx(analytic)
    assert pld <= analytic <= eps


def test_gaussian_needs_a_delta_for_pure_parameters() -> None:
    event = MechanismEvent("gaussian", (("sigma", 3.0),))
    with pytest.raises(ValueError, match="gaussian_delta"):
        event.dp_parameters()


# --- serialisation ---------------------------------------------------------------------------


def test_round_trip_to_dict() -> None:
    ledger = _validation_ledger()
    ledger.auction(0.05, "pure", count=7, label="auction")
    ledger.gaussian(12.0, 1.5, count=3, label="g")
    ledger.approx_dp(0.2, 1e-7, count=2, label="other")
    data = json.loads(json.dumps(ledger.to_dict()))
    restored = PrivacyLedger.from_dict(data)
    assert restored == ledger
    assert restored.events == ledger.events
    summary = ledger.summary(1e-3)
    assert json.loads(json.dumps(summary)) == summary
    assert set(summary["epsilon"]) == {"pld", "theorem7", "paper"}
    assert summary["epsilon"]["paper"] == pytest.approx(ledger.epsilon(1e-3, "paper"))


def test_a_ledger_keeps_its_relation_through_a_round_trip() -> None:
    ledger = PrivacyLedger("owner-1")
    ledger.gaussian(12.0, 1.5, count=3, label="g", neighbouring=REPLACE_ONE_RECORD)
    ledger.auction(0.05, "pure", count=7, neighbouring=REPLACE_ONE_RECORD)
    restored = PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert restored == ledger and restored.relations() == (REPLACE_ONE_RECORD,)


# --- one relation per party (issue 24) -------------------------------------------------------


def test_a_ledger_refuses_an_event_under_a_second_relation_and_is_left_untouched() -> None:
    ledger = PrivacyLedger("owner-2")
    assert ledger.relations() == ()
    ledger.gaussian(3.0, 1.0, label="scan (secure sum)", neighbouring=ADD_REMOVE)
    before = ledger.to_dict()
    with pytest.raises(ValueError, match="owner-2") as err:
        ledger.gaussian(1.0, 1.0, label="histogram", neighbouring=REPLACE_ONE_RECORD)
    assert ADD_REMOVE in str(err.value) and REPLACE_ONE_RECORD in str(err.value)
    assert ledger.to_dict() == before and ledger.relations() == (ADD_REMOVE,)
    ledger.gaussian(3.0, 1.0, label="scan (secure sum)", neighbouring=ADD_REMOVE)  # same: fine
    assert ledger.events[0].count == 2


def test_a_stored_ledger_that_mixes_relations_is_refused_on_load() -> None:
    events = [
        MechanismEvent("gaussian", (("sigma", 2.0),), neighbouring=REPLACE_ONE_RECORD).to_dict(),
        MechanismEvent("auction", (("eps_auc", 0.1),), variant="pure").to_dict(),
    ]
    with pytest.raises(ValueError, match="one neighbouring relation"):
        PrivacyLedger.from_dict({"party": "owner-1", "events": events})


def test_record_relation_names_the_configured_relations() -> None:
    assert record_relation("replace") == REPLACE_ONE_RECORD
    assert record_relation("add_remove") == ADD_REMOVE
    with pytest.raises(ValueError, match="neighbouring"):
        record_relation("swap")


def test_from_dict_rejects_unknown_fields() -> None:
    with pytest.raises(ValueError, match="unknown"):
        PrivacyLedger.from_dict({"party": "x", "events": [], "extra": 1})
    with pytest.raises(ValueError, match="unknown"):
        MechanismEvent.from_dict({"mechanism": "laplace", "parameters": {"scale": 1.0}, "x": 1})


def test_empty_ledger_is_free() -> None:
    ledger = PrivacyLedger("owner-3")
    assert all(ledger.epsilon(1e-5, m) == 0.0 for m in ("pld", "theorem7", "paper"))


# --- bad arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda lg: lg.laplace(0.0),
        lambda lg: lg.laplace(-1.0),
        lambda lg: lg.laplace(1.0, sensitivity=0.0),
        lambda lg: lg.laplace(1.0, count=-1),
        lambda lg: lg.laplace(1.0, count=0),
        lambda lg: lg.gaussian(-2.0),
        lambda lg: lg.exponential(0.0),
        lambda lg: lg.auction(0.1, "bogus"),
        lambda lg: lg.approx_dp(1.0, 1.0),
        lambda lg: lg.epsilon(0.01, "bogus"),
        lambda lg: lg.epsilon(0.0),
        lambda lg: lg.epsilon(1.0),
        lambda lg: lg.epsilon(-0.5, "paper"),
    ],
)
def test_bad_arguments_raise(call: Callable[[PrivacyLedger], object]) -> None:
    ledger = PrivacyLedger("owner-1")
    ledger.laplace(10.0)
    before = ledger.to_dict()
    with pytest.raises(ValueError):
        call(ledger)
    assert ledger.to_dict() == before


def test_bad_event_and_function_arguments_raise() -> None:
    with pytest.raises(ValueError, match="mechanism"):
        MechanismEvent("bogus", (("scale", 1.0),))
    with pytest.raises(ValueError, match="parameters"):
        MechanismEvent("laplace", (("sigma", 1.0),))
    with pytest.raises(ValueError, match="variant"):
        MechanismEvent("laplace", (("scale", 1.0),), variant="pure")
    with pytest.raises(ValueError, match="delta_tilde"):
        kairouz_theorem7([0.1], [1], 0.5)
    with pytest.raises(ValueError, match="counts"):
        kairouz_theorem7([0.1], [-1], 0.01)
    with pytest.raises(ValueError, match="delta"):
        paper_composition([0.1], [1], 1.5)
    with pytest.raises(ValueError, match="party"):
        PrivacyLedger("")


def test_pld_epsilon_is_computed_once_for_equal_losses_and_counts_what_differs() -> None:
    """Ledgers with the same losses (labels and the paper's figure aside) share one PLD
    accounting (a run's owners hold equal ledgers); a different count, sigma or sensitivity
    is accounted afresh and changes the result."""
    from dpmarket.protocol.privacy import ledger as ledger_module

    def owner(name: str, label: str, sigma: float = 3.0, count: int = 4) -> PrivacyLedger:
        held = PrivacyLedger(name)
        held.gaussian(sigma, sensitivity=2.0, count=count, label=label)
        held.laplace(50.0, label=label, paper_epsilon=0.02)
        return held

    first = owner("owner-1", "scan")
    before = ledger_module._pld_epsilon.cache_info()
    eps = first.epsilon(1e-6, "pld")
    again = owner("owner-2", "scan (another label)").epsilon(1e-6, "pld")
    after = ledger_module._pld_epsilon.cache_info()
    assert again == eps and after.hits == before.hits + 1
    assert owner("owner-3", "scan", count=5).epsilon(1e-6, "pld") > eps
    assert owner("owner-4", "scan", sigma=6.0).epsilon(1e-6, "pld") < eps
    uncached = PrivacyLedger("owner-5", value_discretization_interval=2e-4)
    for event in first.events:
        uncached.record(event)
    assert uncached.epsilon(1e-6, "pld") == pytest.approx(eps, rel=1e-3)  # another grid


def test_an_event_in_two_different_ledgers_has_its_pld_computed_once_and_left_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A release in the preflight's planned ledger and in the run's (which differ by other
    events) is turned into a PLD once per process; composing the shared PLD into one ledger's
    total does not change another's: each epsilon equals the one computed with no sharing."""
    from dpmarket.protocol.privacy import ledger as ledger_module

    made: list[str] = []
    single = MechanismEvent.single_pld

    def counted(self: MechanismEvent, vdi: float = 1e-4) -> Any:
        made.append(self.mechanism)
        return single(self, vdi)

    def ledgers() -> tuple[PrivacyLedger, PrivacyLedger]:
        planned, ran = PrivacyLedger("owner-1"), PrivacyLedger("owner-1")
        for held in (planned, ran):
            held.gaussian(7.25, sensitivity=3.0, label="scan")  # the shared release
        planned.laplace(40.0, label="summary (planned)")
        ran.laplace(40.0, count=3, label="summary")
        ran.gaussian(11.5, sensitivity=3.0, label="refresh")
        return planned, ran

    ledger_module._event_pld.cache_clear()
    ledger_module._pld_epsilon.cache_clear()
    monkeypatch.setattr(MechanismEvent, "single_pld", counted)
    planned, ran = ledgers()
    shared = (planned.epsilon(1e-6, "pld"), ran.epsilon(1e-6, "pld"), planned.epsilon(1e-5, "pld"))
    assert made.count("gaussian") == 2 and made.count("laplace") == 2  # 7.25 once, 11.5 once
    fresh = []
    for delta, pick in ((1e-6, 0), (1e-6, 1), (1e-5, 0)):
        ledger_module._event_pld.cache_clear()
        ledger_module._pld_epsilon.cache_clear()
        fresh.append(ledgers()[pick].epsilon(delta, "pld"))
    assert shared == tuple(fresh)

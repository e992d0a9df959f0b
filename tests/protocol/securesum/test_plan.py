"""The operator's round plan against a relay that picks the rounds (protocol/securesum/plan.py).

The aggregator (the curator in a market) chooses every RoundSpec and the options owners
compute with. These tests play it: rounds without noise, below the calibrated sigma, with
another clip bound or contribution kind, or once more than the plan allows, are refused; and the
differencing attack of the security review (two sigma-0 rounds, one owner dropped from the
second) recovers nothing once the compute nodes hold the plan.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpmarket.protocol.privacy.ledger import ADD_REMOVE
from dpmarket.protocol.securesum.driver import DcaSession
from dpmarket.protocol.securesum.plan import PlannedRound, RoundAllowance, SecureSumPlan
from dpmarket.protocol.securesum.spec import DcaConfig, RoundSpec

OWNERS = tuple(f"owner-{i}" for i in range(5))
SKETCH = {"family": "l2", "rows": 4, "width": 8, "seed": 7, "bandwidth": 1.5}


def _config() -> DcaConfig:
    return DcaConfig("run", OWNERS, ("c1", "c2", "c3"), tolerance=1, bound=100.0, frac_bits=24)


def _plan(config: DcaConfig) -> SecureSumPlan:
    return SecureSumPlan.calibrated(
        config,
        1e-5,
        {
            "normalise": ("moments", 3, 1.0, 2.0, 1, {"bound": 10.0}),
            "scan": ("sketch", 32, 1.0, 2.0, 1, SKETCH),
            "refresh": ("sketch_delta", 32, 1.0, 2.0, 3, SKETCH),
        },
        neighbouring=ADD_REMOVE,
        per_round={"refresh": ("base_rounds",)},
    )


def test_the_floor_is_the_calibrated_sigma() -> None:
    config = _config()
    plan = _plan(config)
    calibrated = config.spec(1, 3, 1.0, 1e-5, 2.0, label="normalise", neighbouring=ADD_REMOVE)
    assert plan.spec("normalise", 1) == calibrated
    plan.admit(calibrated, "moments", {"bound": 10.0})
    louder = dataclasses.replace(calibrated, sigma_std=2 * calibrated.sigma_std)
    plan.admit(louder, "moments", {"bound": 10.0})  # more noise than planned is fine


@pytest.mark.parametrize("sigma", [0.0, "just below"])
def test_sigma_below_the_floor_is_refused(sigma: object) -> None:
    plan = _plan(_config())
    spec = plan.spec("normalise", 1)
    low = 0.0 if sigma == 0.0 else float(np.nextafter(spec.sigma_std, 0.0))
    with pytest.raises(ValueError, match=r"'normalise'.*sigma_std = .* below the plan's floor"):
        plan.admit(dataclasses.replace(spec, sigma_std=low), "moments", {"bound": 10.0})
    with pytest.raises(ValueError, match="below the plan's floor"):
        plan.admit_open(dataclasses.replace(spec, sigma_std=low))  # a compute node's check


def test_wrong_bound_what_options_shape_or_label_are_refused() -> None:
    plan = _plan(_config())
    spec = plan.spec("normalise", 1)
    with pytest.raises(ValueError, match=r"'normalise': options \['bound'\]"):
        plan.admit(spec, "moments", {"bound": 1e6})  # a wider clip: more sensitivity
    with pytest.raises(ValueError, match=r"'normalise': contribution 'sketch'"):
        plan.admit(spec, "sketch", SKETCH)
    with pytest.raises(ValueError, match=r"options \['extra'\]"):
        plan.admit(spec, "moments", {"bound": 10.0, "extra": 1})
    with pytest.raises(ValueError, match=r"'scan': options \['width'\]"):
        plan.admit(plan.spec("scan", 2), "sketch", SKETCH | {"width": 2})
    with pytest.raises(ValueError, match="d = 4"):
        plan.admit(dataclasses.replace(spec, d=4), "moments", {"bound": 10.0})
    with pytest.raises(ValueError, match="sensitivity"):
        plan.admit(dataclasses.replace(spec, sensitivity=0.5), "moments", {"bound": 10.0})
    with pytest.raises(ValueError, match="no round labelled 'again'"):
        plan.admit(dataclasses.replace(spec, label="again"), "moments", {"bound": 10.0})
    with pytest.raises(ValueError, match=r"options \['base_rounds'\]"):  # only refresh's
        plan.admit(plan.spec("scan", 2), "sketch", SKETCH | {"base_rounds": {}})
    plan.admit(plan.spec("refresh", 3), "sketch_delta", SKETCH | {"base_rounds": {"o": 2}})


def test_each_label_has_its_count() -> None:
    allowance = RoundAllowance(_plan(_config()))
    allowance.take(allowance.plan.spec("normalise", 1), "moments", {"bound": 10.0})
    with pytest.raises(ValueError, match=r"'normalise': the plan allows 1 such rounds"):
        allowance.take(allowance.plan.spec("normalise", 2), "moments", {"bound": 10.0})
    for r in (3, 4, 5):
        allowance.take(allowance.plan.spec("refresh", r))  # a node's open: no options
    with pytest.raises(ValueError, match=r"'refresh': the plan allows 3"):
        allowance.take(allowance.plan.spec("refresh", 6))
    assert allowance.used == {"normalise": 1, "refresh": 3}


def test_a_plan_never_admits_a_round_without_noise() -> None:
    with pytest.raises(ValueError, match="sigma_floor must be > 0"):
        PlannedRound("moments", 3, 0.0, 1.0, 1, {"bound": 10.0})


def test_the_differencing_attack_recovers_nothing_with_the_plan_at_the_nodes() -> None:
    """/tmp/rev/poc_sigma0.py: the relay opens two sigma-0 rounds, dropping owner-0 from the
    second (allowed: T = 1), and reads owner-0's exact vector from the difference. Without a
    plan it works (the control); with the plan at the nodes neither round releases."""
    config = _config()
    x = np.random.default_rng(0).uniform(-50, 50, (5, 3)).round(3)
    rng = np.random.default_rng(1)

    def attack(plan: SecureSumPlan | None) -> tuple[object, object]:
        session = DcaSession(config, batch=1, plan=plan)
        a = session.run_round(RoundSpec(1, 3, 0.0, 2.0, "normalise", ADD_REMOVE), x, rng)
        b = session.run_round(
            RoundSpec(2, 3, 0.0, 2.0, "normalise", ADD_REMOVE), x, rng, absent=["owner-0"]
        )
        return a.value, b.value

    a, b = attack(None)  # the review's finding: exact recovery
    assert a is not None and b is not None
    np.testing.assert_allclose(np.asarray(a) - np.asarray(b), x[0], atol=1e-4)
    a, b = attack(_plan(config))
    assert a is None and b is None

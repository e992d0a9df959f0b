"""A curious relay against an owner's persistent budget (actors/budgets/gate.py).

The curator relays every secure-sum frame and holds the owner actor's handle, so it can call
``dca_contribute`` with any round it likes. These tests play that relay with what it has (the
session's public config and plan, round specs it makes) against a real secure-sum client behind
the owner's gate, and check that it can neither drain the owner's budget with rounds the
operator's plan does not admit nor get a share out of a declined round, and that what it sees
of a decline does not depend on the owner's records.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dpmarket.actors.budgets.gate import BudgetDeclined, BudgetGate, OwnerBudget, OwnerGate
from dpmarket.actors.budgets.reading import read_store
from dpmarket.actors.parties.dcaowner import gated_contribute
from tests.actors.test_dcaowner import SKETCH, _records, _session, _set_up


def _gate(tmp_path: Path, owner: str, cap: float) -> OwnerGate:
    budget = OwnerBudget(str(tmp_path / f"{owner}.sqlite"), cap, 1e-5)
    return OwnerGate(owner, BudgetGate(budget, "run-1"))


def test_unplanned_rounds_charge_nothing(tmp_path: Path) -> None:
    config, nodes, owners = _session()
    _set_up(config, nodes, owners)
    owner, gate = owners["owner-0"], _gate(tmp_path, "owner-0", 50.0)
    plan = owner.trust.plan
    normalise = plan.spec("normalise", 1)
    frames = gated_contribute(owner, gate, _records(0), normalise, "moments", {"bound": 3.0})
    assert frames  # the planned round: charged, then sent
    attempts = [
        (plan.spec("normalise", 2), "moments", {"bound": 3.0}),  # a second normalise
        (
            dataclasses.replace(plan.spec("scan", 3), sigma_std=normalise.sigma_std / 10),
            "sketch",
            SKETCH,
        ),  # below the plan's floor
        (plan.spec("scan", 4), "moments", {"bound": 3.0}),  # the wrong contribution
    ]
    for spec, what, options in attempts:
        with pytest.raises(ValueError, match="plan"):
            gated_contribute(owner, gate, _records(0), spec, what, options)
    rows = read_store(tmp_path / "owner-0.sqlite")["rows"]
    assert [r["label"] for r in rows] == ["normalise (secure sum)"]


def test_a_declined_round_sends_nothing_and_does_not_depend_on_records(tmp_path: Path) -> None:
    config, nodes, owners = _session()
    _set_up(config, nodes, owners)
    outcomes = []
    for i, name in enumerate(("owner-1", "owner-2")):  # different records, the same cap
        owner, gate = owners[name], _gate(tmp_path, name, 0.05)
        spec = owner.trust.plan.spec("normalise", 1)
        records = _records(i) * (1 + 10 * i)  # far apart: a decline must not see them
        with pytest.raises(BudgetDeclined, match="does not fit the cap") as exc:
            gated_contribute(owner, gate, records, spec, "moments", {"bound": 3.0})
        outcomes.append((type(exc.value), str(exc.value).replace(name, "OWNER")))
        [row] = read_store(tmp_path / f"{name}.sqlite")["rows"]
        assert row["state"] == "declined"
    assert outcomes[0] == outcomes[1]

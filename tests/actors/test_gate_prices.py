"""A remote owner's gate charges its own price of a round (protocol/agents/policy.py
``RoundPrice``), never the sigma and sensitivity the round's spec declares."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpmarket.actors.budgets.gate import BudgetDeclined, BudgetGate, OwnerBudget, OwnerGate
from dpmarket.actors.budgets.reading import read_store
from dpmarket.protocol.agents.policy import RoundPrice
from dpmarket.protocol.privacy.ledger import record_relation
from dpmarket.protocol.securesum.spec import RoundSpec

RELATION = record_relation("replace")


def _gate(tmp_path: Path) -> OwnerGate:
    return OwnerGate(
        "owner-1", BudgetGate(OwnerBudget(str(tmp_path / "s.sqlite"), 8.0, 1e-5), "L1")
    )


def test_the_gate_charges_the_owners_price_not_the_spec(tmp_path: Path) -> None:
    gate = _gate(tmp_path)
    # the spec declares sensitivity 1 at sigma 10; the owner's own figures: sensitivity 3 on
    # the grid, and only half the declared noise is unknown to the market
    gate.prices = {"scan": RoundPrice("scan", 2.9, 3.0, 5.0, 0.5)}
    gate.secure_round(RoundSpec(1, 64, 10.0, 1.0, "scan", RELATION), "session")
    (row,) = [r for r in read_store(tmp_path / "s.sqlite")["rows"] if r["state"] == "charged"]
    (event,) = row["events"]
    assert event["parameters"] == {"sigma": 5.0} and event["sensitivity"] == 3.0
    # a round at twice the floor: the same ratio of what it declares
    gate.secure_round(RoundSpec(2, 64, 20.0, 1.0, "scan", RELATION), "session")
    rows = [r for r in read_store(tmp_path / "s.sqlite")["rows"] if r["state"] == "charged"]
    assert rows[-1]["events"][0]["parameters"] == {"sigma": 10.0}
    gate.store.close()


def test_a_round_the_owner_never_priced_is_declined_and_charged_nothing(tmp_path: Path) -> None:
    gate = _gate(tmp_path)
    gate.prices = {"scan": RoundPrice("scan", 2.9, 3.0, 5.0, 1.0)}
    with pytest.raises(BudgetDeclined, match="'normalise' was never priced"):
        gate.secure_round(RoundSpec(1, 7, 10.0, 1.0, "normalise", RELATION), "session")
    assert [r for r in read_store(tmp_path / "s.sqlite")["rows"] if r["state"] == "charged"] == []
    gate.store.close()

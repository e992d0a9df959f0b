"""An owner's budget gate: it charges its own durable ledger before it contributes, or declines.

The owner actor (actors/owner.py) holds one :class:`OwnerGate` per owner that has a store
(``[owners.NAME].ledger`` or ``[privacy].ledger_dir``). What the owner pays for, and when:

- **a secure-sum round** (normalise, scan, each refresh): one Gaussian event at the round's
  sigma and L2 sensitivity, under add/remove of one record, the event the curator's ledger
  records for a released round. It is charged after the owner's share frames are built and
  before they leave the actor (the hub sends what ``dca_contribute`` returns); release id
  ``RUN:SESSION:ROUND`` (the session named by the operator's pinned node-key fingerprints,
  fresh for every session). A round without noise (sigma 0) is declined.
- **the summary phase** (auction steps and summary releases of Algorithm 3): its whole planned
  upper bound (``planned_owner_ledger``: every steering epoch used), fixed by the operator
  before the run and handed over at construction, charged once before the owner answers its
  first summary frame; release id ``RUN:summary`` (a resumed run continues the same phase).

Because each charge's parameters are fixed before the release it pays for (the round's spec,
the operator's plan), the owner's :class:`~dpmarket.protocol.privacy.filter.RenyiFilter` is
valid over the adaptive sequence of runs (protocol/privacy/filter.py). A declined secure-sum
round makes ``dca_contribute`` fail, so the hub counts the owner absent from that round; a
declined summary phase makes the owner silent, so the curator counts it lost at the deadline:
both count against T, and a run with more than T refuses (exit 3). A decline depends only on
public parameters and the owner's own past charges, never on its records.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.actors.budget_config import OwnerBudget
from dpmarket.actors.dcaowner import OwnerSecureSum
from dpmarket.actors.ledger_store import LedgerStore
from dpmarket.protocol.privacy.filter import RenyiFilter
from dpmarket.protocol.privacy.ledger import MechanismEvent
from dpmarket.protocol.securesum.spec import RoundSpec
from dpmarket.protocol.wire.codec import Message

__all__ = ["BudgetDeclined", "BudgetGate", "OwnerGate", "gated_contribute", "session_id"]

# the plan's round labels -> the labels the curator's ledger gives the same releases
ROUND_LABELS = {
    "normalise": "normalise (secure sum)",
    "scan": "scan (secure sum)",
    "refresh": "scan refresh (secure sum)",
}


class BudgetDeclined(RuntimeError):
    """The owner's cap does not admit the release: it takes no part in it."""


@dataclass(frozen=True)
class BudgetGate:
    """What the operator hands an owner actor at construction: the owner's store and cap,
    the run's ledger id, and the summary phase's planned events (an upper bound)."""

    budget: OwnerBudget
    run: str
    summary: tuple[MechanismEvent, ...] = ()


def session_id(pins: dict[str, str]) -> str:
    """A secure-sum session's name from the node-key fingerprints the operator pinned (fresh
    keys per session, so fresh names)."""
    text = ",".join(f"{node}={fp}" for node, fp in sorted(pins.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class OwnerGate:
    """One owner's store and filter inside its actor (module docstring: what is charged)."""

    def __init__(self, owner: str, gate: BudgetGate) -> None:
        self.owner, self.gate = owner, gate
        self.store = LedgerStore(
            gate.budget.ledger, owner, RenyiFilter(gate.budget.epsilon, gate.budget.delta)
        )
        self.store.begin_run(gate.run)
        self._summary: bool | None = None
        self.declines: list[str] = []

    def secure_round(self, spec: RoundSpec, session: str) -> None:
        """Charge a secure-sum round before its frames are sent; BudgetDeclined otherwise."""
        release = f"{self.gate.run}:{session}:{spec.round}"
        if spec.sigma_std <= 0:
            self.declines.append(f"{release}: no noise")
            raise BudgetDeclined(f"{self.owner}: round {spec.round} has no noise; declined")
        label = ROUND_LABELS.get(spec.label, spec.label or f"secure sum round {spec.round}")
        event = MechanismEvent(
            "gaussian", (("sigma", spec.sigma_std),), spec.sensitivity,
            neighbouring=spec.neighbouring, label=label,
        )  # fmt: skip
        decision = self.store.charge(release, self.gate.run, event)
        if not decision.admitted:
            self.declines.append(release)
            raise BudgetDeclined(
                f"{self.owner}: round {spec.round} does not fit the cap "
                f"(spent {decision.spent:.4g} of {self.gate.budget.epsilon:g}); declined"
            )

    def summary_admitted(self) -> bool:
        """Charge the summary phase's planned events once (before the first answer)."""
        if self._summary is None:
            release = f"{self.gate.run}:summary"
            if not self.gate.summary:
                self._summary = True
            else:
                decision = self.store.charge(release, self.gate.run, self.gate.summary)
                self._summary = decision.admitted
                if not decision.admitted:
                    self.declines.append(release)
        return self._summary

    def view(self) -> dict[str, Any]:
        """This run's decisions and the store's totals, for the end-of-run comparison."""
        events = self.store.events()
        return {
            "run": self.gate.run,
            "cap": self.gate.budget.epsilon,
            "delta": self.gate.budget.delta,
            "spent": self.store.filter.spent(events),
            "rows": self.store.rows(self.gate.run),
            "declines": list(self.declines),
        }


def gated_contribute(
    dca: OwnerSecureSum,
    gate: OwnerGate | None,
    records: npt.NDArray[np.float64],
    spec: RoundSpec,
    what: str,
    options: dict[str, Any],
) -> list[Message]:
    """An owner's secure-sum contribution behind its cap: the operator's plan admits the round
    first (a round it refuses charges nothing, so a relay cannot drain the budget with rounds
    the plan does not allow), then the charge is committed, and only then are the frames
    returned to be sent; ``BudgetDeclined`` (no frames) when the cap does not admit it."""
    frames = dca.contribute(records, spec, what, options)
    if gate is not None:
        gate.secure_round(spec, session_id(dca.trust.pins))
    return frames

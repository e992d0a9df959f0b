"""A party's epsilon as reports write it: a number, "inf" with a note, or "n/a".

JSON has no infinity, and a ``null`` epsilon reads as "nothing charged". So an unbounded
epsilon is the string ``"inf"`` with a ``note`` naming the events that have no finite epsilon
on their own, and the paper's count is ``"n/a"`` for a party none of whose events the paper
counts (its mechanisms are not the paper's). Nothing here charges or releases anything.
"""

from __future__ import annotations

import math
from typing import Any

from dpmarket.protocol.privacy.ledger import PrivacyLedger

__all__ = ["NOT_COUNTED", "epsilon_value", "party_epsilons", "unbounded_note"]

NOT_COUNTED = "n/a"


def epsilon_value(x: float) -> float | str:
    """``x`` rounded to 6 places, or ``"inf"`` where no finite epsilon exists (never null)."""
    return round(x, 6) if math.isfinite(x) else "inf"


def unbounded_note(ledger: PrivacyLedger, delta: float) -> str:
    """Why ``ledger`` has no finite epsilon at ``delta``: the events that alone have none."""
    culprits, paper_auction = [], False
    for event in ledger.events:
        alone = PrivacyLedger(ledger.party)
        alone.record(event)
        if not math.isfinite(alone.epsilon(delta, "pld")):
            kind = f"{event.mechanism} ({event.variant})" if event.variant else event.mechanism
            culprits.append(f"{event.label or kind} x {event.count}")
            paper_auction |= event.mechanism == "auction" and event.variant == "paper"
    note = (
        f"unbounded: no finite epsilon at delta {delta:g} "
        f"({', '.join(culprits) or 'the composition of its events'})"
    )
    if paper_auction:
        note += (
            '; the paper\'s auction (auction_variant = "paper") always asks the top bidder, '
            "so each step is (eps_auc, 1 - exp(-eps_auc))-DP and its delta exceeds the target"
        )
    return note


def party_epsilons(ledger: PrivacyLedger, delta: float) -> dict[str, Any]:
    """``pld``, ``theorem7`` and ``paper`` of one party at ``delta``; ``note`` when unbounded."""
    counted = any(e.paper_epsilon is not None for e in ledger.events)
    out: dict[str, Any] = {
        "pld": epsilon_value(ledger.epsilon(delta, "pld")),
        "theorem7": epsilon_value(ledger.epsilon(delta, "theorem7")),
        "paper": epsilon_value(ledger.epsilon(delta, "paper")) if counted else NOT_COUNTED,
    }
    if out["pld"] == "inf":
        out["note"] = unbounded_note(ledger, delta)
    return out

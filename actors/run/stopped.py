"""report.json of a stopped run (exit 3): what happened, who was absent or declined, who paid.

A run refused by T-tolerance (at the joins, before or in a secure-sum round, in the epochs) or
by a curator lost too often writes ``OUT/report.json`` with ``outcome.state = "refused"``: the
phase and reason, the owners lost or declined and why (``faults``, with the remote parties'
record), and what the curator's ledgers charged each owner (``charged``: 0 where nothing was
released). Every field is public: participation and the stop are seen by every party, and the
charges are functions of the public release plan (actors/run/report.py's rules). A stopped
report never marks a finished run: ``run`` into that OUT starts again or ``resume`` continues
(:func:`finished_report`), and the journal stays the curator's private state.

What the report cannot say: a remote owner's own store is its own record (an owner that sent
its shares into a round that then failed holds that charge; the curator's ledgers do not),
so ``charged`` is the market's account, and each owner reads its store for its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpmarket.actors.parties.curator import write_json_atomic
from dpmarket.actors.run.report import PUBLIC_REPORT, REPORT_SCHEMA
from dpmarket.protocol.privacy.epsilons import party_epsilons
from dpmarket.protocol.privacy.ledger import PrivacyLedger

__all__ = ["finished_report", "stopped_report", "write_stopped_report"]


def stopped_report(
    run: dict[str, Any],
    payload: dict[str, Any],
    owners: list[str],
    delta: float,
    colluders: tuple[str, ...],
    after: str,
) -> dict[str, Any]:
    """The public report of a refused ``payload`` (module docstring); ``after``: what to do."""
    refusal = dict(payload.get("refusal") or {})
    ledgers = payload.get("ledgers") or {}
    # a curator lost too often hands back no ledgers: what it charged is in its journal, so the
    # report says it does not know rather than 0
    known = "ledgers" in payload or not refusal.get("curator_lost")
    charged: dict[str, Any] = {}
    for owner in owners:
        raw = ledgers.get(owner)
        ledger = PrivacyLedger.from_dict(raw) if raw is not None else None
        if not known:
            charged[owner] = {
                "pld": None,
                "releases": None,
                "unknown": "the curator was lost: its journal holds its ledgers",
            }
        elif ledger is None or not ledger.events:
            charged[owner] = {"pld": 0.0, "releases": 0}
        else:
            labels = sorted({e.label for e in ledger.events})
            charged[owner] = party_epsilons(ledger, delta) | {
                "releases": len(ledger.events),
                "labels": labels,
            }
    remote = payload.get("remote") or {}
    return {
        "schema": REPORT_SCHEMA,
        "run": run,
        "outcome": {
            "state": "refused",
            "exit_code": 3,
            "reason": str(payload.get("reason", "the market stopped")),
            "phase": refusal.get("phase"),
            "epoch": refusal.get("epoch"),
            "released_before": (
                bool(any(c["releases"] for c in charged.values())) if known else None
            ),
            "resumable": not refusal.get("before_start", False),
            "next": after,
        },
        "faults": {
            "lost": refusal.get("lost", []),
            "returned": payload.get("returned", {}),  # lost owners taken back, how often
            "kept_out": payload.get("kept_out", {}),  # not taken back again, and why
            "nodes": refusal.get("nodes", []),
            "colluders": list(colluders),
            "tolerance": refusal.get("tolerance"),
            "curator_lost": refusal.get("curator_lost"),
            "unready": payload.get("unready", {}),
            "remote": remote or None,
        },
        "charged": charged,
    }


def write_stopped_report(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / PUBLIC_REPORT, report)


def finished_report(out: Path) -> bool:
    """Whether ``out`` holds a finished run's report.json (a stopped run's does not count)."""
    try:
        report = json.loads((out / PUBLIC_REPORT).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True  # unreadable: never overwritten by a new run
    return not (isinstance(report, dict) and report.get("outcome", {}).get("state") == "refused")

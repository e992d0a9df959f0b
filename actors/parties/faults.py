"""Simulated faults (config ``[faults]``, ``dpmarket simulate``) and what the run made of them.

:class:`FaultPlan` is what the transports inject: an owner killed from an epoch on (under Ray:
``ray.kill`` of its actor when the first frame of that epoch is sent), a slow owner (seconds of
delay before every reply, so it misses deadlines), and per-frame drops (tests). The market adds
a killed compute node (before the secure sums), a killed curator (resumed from its journal) and
colluding owners (they withhold their secure-sum noise and pool what they observe; they count
against T from the start).

:func:`fault_verdicts` turns the run's outcome into the report's list: for every simulated fault,
whether it was tolerated (and how) or refused, next to the T budget it used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dpmarket.protocol.wire.codec import Message

__all__ = ["FaultPlan", "fault_verdicts"]


@dataclass
class FaultPlan:
    """Faults to inject. ``kill_at`` maps a party to the round from which it is dead (it neither
    receives nor sends; under Ray it is given an actor of its own, so it dies alone);
    ``kill_actor_at`` the same, except that under Ray the party keeps its place among co-located
    owners and the whole actor process dies with it (in one process, where there are no actor
    processes, only the party itself); ``delay`` adds seconds to every frame a party sends;
    ``drop`` decides per frame (decoded view) whether it is lost."""

    kill_at: dict[str, int] = field(default_factory=dict)
    delay: dict[str, float] = field(default_factory=dict)
    drop: Callable[[Message], bool] | None = None
    kill_actor_at: dict[str, int] = field(default_factory=dict)

    def is_dead(self, party: str, round_: int) -> bool:
        start = self.kill_at.get(party, self.kill_actor_at.get(party))
        return start is not None and round_ >= start


def _secure_outcome(secure: dict[str, Any]) -> str:
    statuses = {
        name: secure[name].get("status")
        for name in ("normalise", "scan")
        if isinstance(secure.get(name), dict)
    }
    if not statuses:
        return "no secure-sum rounds ran"
    return ", ".join(f"{name} {status}" for name, status in statuses.items())


def fault_verdicts(
    faults: Any,  # actors.config.FaultConfig
    payload: dict[str, Any],
    tolerance: int,
    hosts: dict[str, list[str]] | None = None,
) -> list[dict[str, Any]]:
    """One entry per simulated fault: ``fault``, ``party``, ``verdict`` (tolerated / refused /
    not triggered) and ``detail``. Only called for runs that completed: a refused run leaves no
    report (its refusal is the command's exit status 3 and message). ``hosts``: for an owner
    of ``kill_actor``, every owner its actor process hosted (itself included); T counts owners
    lost, never actors."""
    lost: dict[str, int] = payload.get("lost", {})
    secure = payload.get("secure_phases", {})
    out: list[dict[str, Any]] = []
    for owner in sorted(faults.colluders):
        out.append(
            {
                "fault": "colluding owner",
                "party": owner,
                "verdict": "tolerated",
                "detail": "counted against T from the start; withheld its secure-sum noise "
                f"({_secure_outcome(secure)}); honest owners' guarantee against the coalition "
                "is privacy.parties[owner].against_colluders",
            }
        )
    owner_faults = [
        (owner, f"owner killed at epoch {epoch}", "dropped at epoch {}; the run went on without it",
         "the run finished before that epoch")
        for owner, epoch in sorted(faults.kill.items())
    ] + [
        (owner, f"slow owner ({seconds:g} s per reply)",
         "missed its deadline at epoch {} and was dropped", "answered within every deadline")
        for owner, seconds in sorted(faults.slow.items())
    ]  # fmt: skip
    for owner, epoch in sorted(getattr(faults, "kill_actor", {}).items()):
        hosted = sorted((hosts or {}).get(owner, [owner]))
        gone = [o for o in hosted if o in lost]
        out.append(
            {
                "fault": f"owner actor killed at epoch {epoch}",
                "party": owner,
                "verdict": "tolerated" if gone else "not triggered",
                "owners_lost": gone,
                "detail": (
                    f"its process hosted {len(hosted)} owner(s) ({', '.join(hosted)}): "
                    f"{len(gone)} lost at epoch {lost[gone[0]]}, each counted against T; the "
                    "run went on without them"
                    if gone
                    else "the run finished before that epoch"
                ),
            }
        )
    for owner, fault, when_lost, otherwise in owner_faults:
        seen = owner in lost
        out.append(
            {
                "fault": fault,
                "party": owner,
                "verdict": "tolerated" if seen else "not triggered",
                "detail": when_lost.format(lost[owner]) if seen else otherwise,
            }
        )
    # a killed compute node (``kill_compute``) stops the purchase before any round opens: a
    # refused run (exit 3, its own report: actors/run/stopped.py), never a verdict here
    if faults.kill_curator_at is not None:
        restarts = int(payload.get("curator_restarts", 0))
        out.append(
            {
                "fault": f"curator killed at epoch {faults.kill_curator_at}",
                "party": "curator",
                "verdict": "tolerated" if restarts else "not triggered",
                "detail": f"resumed {restarts} time(s) from its journal; journaled releases "
                "re-sent, not redrawn",
            }
        )
    used = len(set(lost) | set(faults.colluders))
    for entry in out:
        entry["t_used"] = f"{used} of T = {tolerance}"
    return out

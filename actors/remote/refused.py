"""Connections the gateway refused, replaced or saw rejoin, counted by (fingerprint, reason).

The gateway (actors/remote/gateway.py) records every connection it refuses (no certificate, a
fingerprint not declared, a name claimed with another party's certificate, no valid hello,
another market), every stream a second concurrent stream with the same certificate replaced,
and every party that dialled in again after its stream ended (``rejoined``: a blink, not a
refusal). A kind is (the certificate's fingerprint, the reason): what a peer cannot choose
freely, since only certificates the agents' CA issued reach this code. The name a connection
claims is the peer's own word, so it is no part of the key: a flood of hellos claiming
distinct names under one certificate is one kind, whose entry keeps the first name claimed and
counts the claims of any other name.

Bounded, and the declared parties never crowded out: a declared certificate's kinds are always
kept apart (a declared fingerprint has at most one kind per reason the gateway gives, and those
reasons are the gateway's own few strings, so they are bounded by the declared parties); any
other certificate the agents' CA issued, and a connection without one, share a pool of at most
:data:`MAX_KINDS` kinds, and once it is full each later kind is counted per reason under one
entry with no fingerprint (reason ``"... (OTHER)"``). However many undeclared certificates dial
in first, an impersonation tried later with a declared party's certificate is still its own
kind with its fingerprint. The driver prints the kinds rate-limited (actors/run/refusals.py)
and report.json lists them (``faults.remote.refusals`` and ``faults.remote.rejoined``).

:class:`EventLog` is the gateway's log of joins, leaves, drops and first refusals, bounded the
same way: a count per (party, event) and the last :data:`LOG_KEPT` entries, so a declared party
that keeps dialling in grows neither.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from typing import Any

__all__ = [
    "LOG_KEPT",
    "MAX_KINDS",
    "OTHER",
    "REJOINED",
    "REPLACED",
    "EventLog",
    "RefusalCounts",
    "other_reason",
]

MAX_KINDS = 64  # undeclared (fingerprint, reason) kinds kept; later ones count under OTHER
OTHER = f"other undeclared kinds: more than {MAX_KINDS}, not told apart"
LOG_KEPT = 200  # the gateway log's last entries kept (every (party, event) is counted)
REPLACED = "stream replaced"  # a second concurrent stream with the party's certificate
REJOINED = "rejoined"  # the party dialled in again after its stream ended (a blink)

Kind = tuple[str | None, str]


def other_reason(reason: str) -> str:
    """The reason of the entry counting ``reason``'s undeclared kinds past the pool."""
    return f"{reason} ({OTHER})"


class RefusalCounts:
    """The gateway's bounded table of kinds (module docstring); ``declared``: the declared
    parties' certificate fingerprints, whose kinds are never pooled."""

    def __init__(self, declared: Iterable[str] = (), max_kinds: int = MAX_KINDS) -> None:
        if max_kinds < 1:
            raise ValueError(f"max_kinds: expected at least 1, got {max_kinds}")
        self.max_kinds = max_kinds
        self.declared = frozenset(declared)
        self._kinds: dict[Kind, dict[str, Any]] = {}
        self._pooled = 0  # undeclared kinds kept apart so far (at most max_kinds)

    def add(self, claimed: str | None, fp: str | None, reason: str, detail: str) -> bool:
        """Count one connection; True when it is the first of its kind (the gateway says the
        first of each kind in its own log, never every one)."""
        key: Kind = (fp, reason)
        if key not in self._kinds and fp not in self.declared:
            if self._pooled >= self.max_kinds:  # the pool is full: counted per reason
                key, claimed, detail = (None, other_reason(reason)), None, ""
            else:
                self._pooled += 1
        entry = self._kinds.get(key)
        first = entry is None
        if entry is None:
            entry = self._kinds[key] = {
                "claimed": claimed,
                "fingerprint": key[0],
                "reason": key[1],
                "count": 0,
                "other_names": 0,
                "detail": detail[:300],
            }
        entry["count"] += 1
        if claimed != entry["claimed"]:
            entry["other_names"] += 1  # a claim of another name than the first, counted
        return first

    def entries(self) -> list[dict[str, Any]]:
        """Every kind with its count so far (copies, in the order first seen)."""
        return [dict(e) for e in self._kinds.values()]


class EventLog:
    """The gateway's log (module docstring): each (party, event) counted, the last ``kept``
    entries kept in order."""

    def __init__(self, kept: int = LOG_KEPT) -> None:
        if kept < 1:
            raise ValueError(f"kept: expected at least 1, got {kept}")
        self._last: deque[dict[str, Any]] = deque(maxlen=kept)
        self._counts: Counter[tuple[str, str]] = Counter()

    def add(self, at: float, event: str, party: str | None, detail: str = "") -> None:
        """One entry; ``party`` None for a refusal (no party admitted). Refused connections
        come here only as the first of their kind (:class:`RefusalCounts`), so the counts are
        keyed by declared parties and the gateway's own few events: bounded."""
        self._last.append({"at": at, "event": event, "party": party, "detail": detail[:300]})
        self._counts[(party or "", event)] += 1

    def entries(self) -> list[dict[str, Any]]:
        """The last entries kept, oldest first (copies)."""
        return [dict(e) for e in self._last]

    def counts(self) -> dict[str, dict[str, int]]:
        """party -> event -> how many (``""``: refusals, no party admitted)."""
        out: dict[str, dict[str, int]] = {}
        for (party, event), count in self._counts.items():
            out.setdefault(party, {})[event] = count
        return out

    def summary(self) -> dict[str, Any]:
        """What the gateway reports: the counts, how many entries are no longer kept, and the
        last ones."""
        total = sum(self._counts.values())
        return {"counts": self.counts(), "dropped": total - len(self._last),
                "last": self.entries()}  # fmt: skip

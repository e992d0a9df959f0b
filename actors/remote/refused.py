"""Connections the gateway refused, replaced or saw rejoin, counted by (fingerprint, reason).

The gateway (actors/remote/gateway.py) records every connection it refuses (no certificate, a
fingerprint not declared, a name claimed with another party's certificate, no valid hello,
another market), every stream a second concurrent stream with the same certificate replaced,
and every party that dialled in again after its stream ended (``rejoined``: a blink, not a
refusal). A kind is (the certificate's fingerprint, the reason): what a peer cannot choose
freely, since only certificates the agents' CA issued reach this code. The name a connection
claims is the peer's own word, so it is no part of the key: a flood of hellos claiming
distinct names under one certificate is one kind, whose entry keeps the first name claimed and
counts the claims of any other name. At most :data:`MAX_KINDS` kinds are kept; any later kind
is counted under one entry (:data:`OTHER`), so no flood grows the gateway's memory or the
operator's output. The driver prints the kinds rate-limited (actors/run/refusals.py) and
report.json lists them (``faults.remote.refusals`` and ``faults.remote.rejoined``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_KINDS", "OTHER", "REJOINED", "REPLACED", "RefusalCounts"]

MAX_KINDS = 64  # distinct (fingerprint, reason) kinds kept; later ones count under OTHER
OTHER = f"other kinds (more than {MAX_KINDS}, not told apart)"
REPLACED = "stream replaced"  # a second concurrent stream with the party's certificate
REJOINED = "rejoined"  # the party dialled in again after its stream ended (a blink)

Kind = tuple[str | None, str]


class RefusalCounts:
    """The gateway's bounded table of kinds (module docstring)."""

    def __init__(self, max_kinds: int = MAX_KINDS) -> None:
        if max_kinds < 1:
            raise ValueError(f"max_kinds: expected at least 1, got {max_kinds}")
        self.max_kinds = max_kinds
        self._kinds: dict[Kind, dict[str, Any]] = {}

    def add(self, claimed: str | None, fp: str | None, reason: str, detail: str) -> bool:
        """Count one connection; True when it is the first of its kind (the gateway says the
        first of each kind in its own log, never every one)."""
        key: Kind = (fp, reason)
        if key not in self._kinds and len(self._kinds) >= self.max_kinds:
            key, claimed, detail = (None, OTHER), None, ""
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

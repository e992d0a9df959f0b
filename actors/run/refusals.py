"""Refused connections at the gateway as the operator sees them: a line each, rate-limited.

The gateway counts every connection it refuses or replaces, and every party that dials in again
after its stream ended, by kind: (the certificate's fingerprint, the reason), at most
``MAX_KINDS`` undeclared kinds besides the declared parties' own (actors/remote/refused.py).
:class:`RefusalWatch` asks it from a thread of the driver while the run goes on and prints, in
``dpmarket run``'s own output, the first of each kind at once and later ones of that kind at
most one line per ``every`` seconds with how many came meanwhile (:class:`RefusalLines`, which
is given the time): a flood of impostor hellos, whatever names they claim, is a few lines,
never a line each. report.json lists every kind with its count (``faults.remote.refusals``;
rejoins under ``faults.remote.rejoined``).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from dpmarket.actors.remote.refused import REJOINED

__all__ = ["RefusalLines", "RefusalWatch"]

Key = tuple[str | None, str]


def _line(entry: dict[str, Any], more: int = 0) -> str:
    claimed, fp, reason = entry.get("claimed"), entry.get("fingerprint"), str(entry["reason"])
    cert = f"certificate {fp}" if fp is not None else "no certificate"
    again = f" ({more} more since)" if more else ""
    if reason == REJOINED:
        return f"dpmarket: gateway: {claimed} rejoined (its earlier stream ended), {cert}{again}"
    who = f"claimed {claimed!r}" if claimed is not None else "no name read"
    if entry.get("other_names"):
        who += f" (and other names {entry['other_names']} times)"
    return f"dpmarket: gateway: {reason}: {who}, {cert}{again}"


class RefusalLines:
    """The lines to print for the gateway's kinds (module docstring); ``now`` is passed in."""

    def __init__(self, every: float = 10.0) -> None:
        if every < 0:
            raise ValueError(f"every: expected seconds >= 0, got {every}")
        self.every = every
        self._entries: dict[Key, dict[str, Any]] = {}
        self._said: dict[Key, int] = {}  # the count each kind's last line covered
        self._said_at: dict[Key, float] = {}

    def add(self, entries: list[dict[str, Any]], now: float) -> list[str]:
        """Take the gateway's kinds with their counts so far; the lines due now."""
        lines: list[str] = []
        for entry in entries:
            key = (entry.get("fingerprint"), str(entry.get("reason")))
            self._entries[key] = dict(entry)
            if key not in self._said_at:
                self._said_at[key], self._said[key] = now, 1
                lines.append(_line(entry))
        return lines + self.flush(now)

    def flush(self, now: float, force: bool = False) -> list[str]:
        """A line for each kind with connections not yet said, once ``every`` seconds passed
        since its last line (``force``: now)."""
        lines = []
        for key, entry in self._entries.items():
            more = int(entry["count"]) - self._said[key]
            if more > 0 and (force or now - self._said_at[key] >= self.every):
                lines.append(_line(entry, more))
                self._said_at[key], self._said[key] = now, int(entry["count"])
        return lines

    def entries(self, rejoined: bool = False) -> list[dict[str, Any]]:
        """Every kind seen with its count: the refused and replaced (report.json
        ``faults.remote.refusals``), or with ``rejoined`` the rejoins."""
        return [
            {
                "claimed": e.get("claimed"),
                "fingerprint": e.get("fingerprint"),
                "reason": e["reason"],
                "count": int(e["count"]),
                "other_names": int(e.get("other_names", 0)),
            }
            for e in self._entries.values()
            if (e["reason"] == REJOINED) == rejoined
        ]


class RefusalWatch:
    """Ask the gateway actor for new refusals every ``poll`` seconds on a thread of the driver
    and print their lines; :meth:`stop` asks once more and prints what is left."""

    def __init__(
        self,
        gateway: Any,
        every: float = 10.0,
        poll: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        out: TextIO | None = None,
    ) -> None:
        self.gateway, self.poll_seconds, self.clock = gateway, poll, clock
        self.lines = RefusalLines(every)
        self.out = out
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dpmarket-refusals", daemon=True)

    def start(self) -> RefusalWatch:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stopped.wait(self.poll_seconds):
            self.poll()

    def poll(self, force: bool = False) -> None:
        """Fetch the refusals since the last poll and print the lines due (never raises: a
        gateway gone is the run's concern, not this watch's)."""
        import ray

        with self._lock:
            try:
                entries = ray.get(self.gateway.refusals.remote(), timeout=30)
            except (ray.exceptions.RayError, TimeoutError):
                entries = []
            lines = self.lines.add(entries, self.clock())
            lines += self.lines.flush(self.clock(), force=force)
            for line in lines:
                print(line, file=self.out or sys.stderr, flush=True)

    def stop(self) -> list[dict[str, Any]]:
        """Stop the thread, print what is left; every kind with its count."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        self.poll(force=True)
        return self.lines.entries()

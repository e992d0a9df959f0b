"""Refused connections at the gateway as the operator sees them: a line each, rate-limited.

The gateway counts every connection it refuses or replaces (actors/remote/gateway.py
``Gateway.refusals``). :class:`RefusalWatch` asks it from a thread of the driver while the run
goes on and prints, in ``dpmarket run``'s own output, the first of each kind (the name claimed,
the certificate's fingerprint, the reason) at once and later ones of that kind at most one
line per ``every`` seconds with how many came meanwhile (:class:`RefusalLines`, which is given
the time): a flood of impostor hellos is a few lines, never a line each. report.json lists every
kind with its count (``faults.remote.refusals``).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["RefusalLines", "RefusalWatch"]

Key = tuple[str | None, str | None, str]


def _line(key: Key, more: int = 0) -> str:
    claimed, fp, reason = key
    who = f"claimed {claimed!r}" if claimed is not None else "no name claimed"
    cert = f"certificate {fp}" if fp is not None else "no certificate"
    again = f" ({more} more since)" if more else ""
    return f"dpmarket: gateway: {reason}: {who}, {cert}{again}"


class RefusalLines:
    """The lines to print for refused connections (module docstring); ``now`` is passed in."""

    def __init__(self, every: float = 10.0) -> None:
        if every < 0:
            raise ValueError(f"every: expected seconds >= 0, got {every}")
        self.every = every
        self._counts: dict[Key, int] = {}
        self._unsaid: dict[Key, int] = {}
        self._said_at: dict[Key, float] = {}

    def add(self, events: list[dict[str, Any]], now: float) -> list[str]:
        """Count ``events`` (the gateway's records); the lines due now."""
        lines: list[str] = []
        for event in events:
            key = (event.get("claimed"), event.get("fingerprint"), str(event.get("reason")))
            self._counts[key] = self._counts.get(key, 0) + 1
            if key not in self._said_at:
                self._said_at[key] = now
                lines.append(_line(key))
            else:
                self._unsaid[key] = self._unsaid.get(key, 0) + 1
        return lines + self.flush(now)

    def flush(self, now: float, force: bool = False) -> list[str]:
        """A line for each kind with refusals not yet said, once ``every`` seconds passed since
        its last line (``force``: now)."""
        lines = []
        for key, more in self._unsaid.items():
            if more and (force or now - self._said_at[key] >= self.every):
                lines.append(_line(key, more))
                self._said_at[key], self._unsaid[key] = now, 0
        return lines

    def entries(self) -> list[dict[str, Any]]:
        """Every kind seen, with its count (report.json ``faults.remote.refusals``)."""
        return [
            {"claimed": c, "fingerprint": fp, "reason": reason, "count": n}
            for (c, fp, reason), n in sorted(self._counts.items(), key=lambda kv: str(kv[0]))
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
        self._seen = 0
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
                total, events = ray.get(self.gateway.refusals.remote(self._seen), timeout=30)
            except (ray.exceptions.RayError, TimeoutError):
                events, total = [], self._seen
            self._seen = int(total)
            lines = self.lines.add(events, self.clock())
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

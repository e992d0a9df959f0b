"""The owner actor: hosts an owner's sans-I/O parties and only decodes, calls, encodes.

One Ray async actor per data owner. It holds the summarisation :class:`Owner` party (and, as the
runtime grows, the owner's secure-sum client, RACE sketch and file tailer). Only msgpack frames
cross the actor boundary: ``handle(frames)`` decodes each frame with the owner's replay guard,
hands it to the party and returns the encoded replies. A refused frame is logged and dropped;
the actor keeps serving.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import numpy.typing as npt
import ray

from dpmarket.protocol.errors import RemoteProtocolError
from dpmarket.protocol.messages import ReplayGuard, decode, encode
from dpmarket.protocol.summarize import Owner

__all__ = ["OwnerActor", "handle_frames"]


def handle_frames(
    party: Owner, guard: ReplayGuard, frames: list[bytes]
) -> tuple[list[bytes], list[str]]:
    """Decode, hand to the party, encode: the whole job of an actor. Returns (replies, errors)."""
    replies: list[bytes] = []
    errors: list[str] = []
    for frame in frames:
        try:
            msg = decode(frame, guard)
            replies.extend(encode(m) for m in party.receive(msg))
        except RemoteProtocolError as exc:
            errors.append(str(exc))
    return replies, errors


@ray.remote(num_cpus=0)
class OwnerActor:
    """Ray actor around one owner. ``delay`` simulates a slow owner (seconds before replying)."""

    def __init__(
        self,
        name: str,
        run: str,
        X: npt.NDArray[np.float64],
        y: npt.NDArray[np.float64] | None,
        delay: float = 0.0,
    ) -> None:
        self._party = Owner(name, run, X, y)
        self._guard = ReplayGuard()
        self._delay = delay
        self.errors: list[str] = []

    async def handle(self, frames: list[bytes]) -> list[bytes]:
        if self._delay:
            await asyncio.sleep(self._delay)
        replies, errors = handle_frames(self._party, self._guard, frames)
        self.errors.extend(errors)
        return replies

    async def add_records(
        self, X: npt.NDArray[np.float64], y: npt.NDArray[np.float64] | None = None
    ) -> int:
        """New records, biddable from the next epoch on; returns the owner's record count."""
        self._party.add_records(X, y)
        return self._party.n_records

    async def status(self) -> dict[str, Any]:
        return {
            "name": self._party.name,
            "state": self._party.state,
            "records": self._party.n_records,
            "epochs_seen": self._party.epochs_seen,
            "asks": self._party.asks,
            "errors": list(self.errors),
        }

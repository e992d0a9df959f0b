"""Blocks of arriving records by arrival-time window: which block each record position is in.

Sage (SOSP 2019) gives each block of newly arrived data its own privacy budget; blocks are
disjoint, so a release charged to the blocks it reads composes in parallel across them. Here
a block is a window of W seconds of arrival time: a batch of records that arrives at time t
(given by the caller, who reads its clock; nothing here does) belongs to window
``floor(t / W)``, which is the block's id. Records are numbered by arrival position; a block
is a run of consecutive positions, recorded as ``(block id, first position)``.

A record's block is fixed when it first arrives and never changes: a later run that reads the
same (append-only) inputs again re-delivers positions already assigned, and those keep their
blocks (``seen``); only positions beyond ``seen`` are assigned, to the window of their arrival.
Arrivals in a window no later than the last block's (the same window, or a clock that went
back) join the last block, so block ids and first positions both increase.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["WindowBlocks"]


@dataclass
class WindowBlocks:
    """Arrival windows of ``window`` seconds as blocks (module docstring)."""

    window: float
    starts: list[tuple[int, int]] = field(default_factory=list)  # (block id, first position)
    seen: int = 0  # positions assigned so far

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window) and self.window > 0):
            raise ValueError(f"window: expected a finite number of seconds > 0, {self.window!r}")

    def arrive(self, first: int, count: int, at: float) -> tuple[int, int] | None:
        """Positions ``first .. first + count - 1`` arrived at time ``at`` (seconds); returns
        the block start it opens, to be recorded, or None (already assigned, or the last
        block's window)."""
        if first < 0 or count < 0 or not math.isfinite(at):
            raise ValueError(f"arrival: first {first}, count {count}, at {at}")
        end = first + count
        if end <= self.seen:
            return None  # re-delivered: these positions keep the blocks they were given
        begin, self.seen = max(first, self.seen), end
        block = math.floor(at / self.window)
        if self.starts and block <= self.starts[-1][0]:
            return None
        self.starts.append((block, begin))
        return block, begin

    def of(self, n: int) -> npt.NDArray[np.int64]:
        """The block id of each of positions ``0 .. n - 1`` (all arrived: ``n <= seen``)."""
        if n > self.seen:
            raise ValueError(f"positions up to {n} asked, {self.seen} arrived")
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        firsts = np.array([f for _, f in self.starts], dtype=np.int64)
        ids = np.array([b for b, _ in self.starts], dtype=np.int64)
        where = np.searchsorted(firsts, np.arange(n), side="right") - 1
        return ids[np.maximum(where, 0)]

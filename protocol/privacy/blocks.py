"""Blocks of arriving records: which block each record position is in, fixed once.

Sage (SOSP 2019) gives each block of newly arrived data its own privacy budget; blocks are
disjoint, so a release charged to the blocks it reads composes in parallel across them, and a
record's privacy loss is the composition of the releases charged to its own block. That holds
only if a record belongs to one block for its whole life. So a record's block is assigned once,
when the record first arrives (before any release can read it), by the owner's store, and never
recomputed from a later configuration (issue 24: a new block size must not give spent records
a fresh budget).

A :class:`Grouping` is how records that arrive *now* are grouped:

* ``records`` of size N (``[privacy].block_records``): a new block every N arrivals;
* ``seconds`` of width W (``[privacy].block_seconds``, Sage's time windows): a batch arriving
  at time t (given by the caller, who reads its clock; nothing here does) belongs to window
  ``floor(t / W)``.

Block ids are the store's own: 0, 1, 2, ... in arrival order (not ``i // N`` nor the window
number, which a later grouping would reuse for other records). Records are numbered by arrival
position; a block is a run of consecutive positions, recorded as a :class:`BlockStart`. The last
block keeps taking arrivals only while they fit it under the *same* grouping (fewer than N
records; the same window, or a clock that went back); any other grouping opens a new block, so
changing N or W, or switching between the two, regroups nobody: records already assigned keep
their blocks and budgets, and only new arrivals are grouped the new way.

A later run that reads the same (append-only) inputs again re-delivers positions already
assigned (``seen``); those keep their blocks.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["BlockStart", "Blocks", "Grouping", "record_digests"]

GROUPING_KINDS = ("records", "seconds")


@dataclass(frozen=True)
class Grouping:
    """How arriving records are grouped into blocks: ``records`` of ``size`` N, or ``seconds``
    windows of width ``size`` W."""

    kind: str
    size: float

    def __post_init__(self) -> None:
        if self.kind not in GROUPING_KINDS:
            raise ValueError(f"grouping: expected one of {GROUPING_KINDS}, got {self.kind!r}")
        if not (math.isfinite(self.size) and self.size > 0):
            raise ValueError(f"grouping {self.kind}: expected a finite size > 0, {self.size!r}")
        if self.kind == "records" and self.size != int(self.size):
            raise ValueError(f"grouping records: expected a whole number, got {self.size!r}")

    @property
    def name(self) -> str:
        """How the store records it: ``records:N`` or ``seconds:W``."""
        size = int(self.size) if self.kind == "records" else self.size
        return f"{self.kind}:{size}"

    def window(self, at: float) -> int:
        return math.floor(at / self.size) if self.kind == "seconds" else 0


@dataclass(frozen=True)
class BlockStart:
    """Block ``block`` starts at record position ``first``; opened under ``grouping`` (a
    :attr:`Grouping.name`, or another text for a block no grouping continues) with ``key``
    its window (``seconds``) or 0."""

    block: int
    first: int
    grouping: str
    key: int = 0


@dataclass
class Blocks:
    """Every block assignment an owner's store holds (module docstring)."""

    starts: list[BlockStart] = field(default_factory=list)
    seen: int = 0  # positions assigned so far: 0 .. seen - 1

    def arrive(self, first: int, count: int, at: float, grouping: Grouping) -> list[BlockStart]:
        """Positions ``first .. first + count - 1`` arrived at time ``at`` (seconds): assign
        those not yet assigned; returns the blocks this opens, to be recorded."""
        if first < 0 or count < 0 or not math.isfinite(at):
            raise ValueError(f"arrival: first {first}, count {count}, at {at}")
        if first > self.seen:
            raise ValueError(f"arrival at position {first}: positions up to {self.seen} assigned")
        end = first + count
        position, opened = self.seen, []
        while position < end:
            last = self.starts[-1] if self.starts else None
            same = last is not None and last.grouping == grouping.name
            if grouping.kind == "records":
                room = last.first + int(grouping.size) - position if same and last else 0
                if room <= 0:
                    opened.append(self._open(position, grouping, 0))
                    room = int(grouping.size)
                position = min(end, position + room)
            else:
                window = grouping.window(at)
                if not (same and last and window <= last.key):
                    opened.append(self._open(position, grouping, window))
                position = end
        self.seen = max(self.seen, end)
        return opened

    def _open(self, first: int, grouping: Grouping, key: int) -> BlockStart:
        block = self.starts[-1].block + 1 if self.starts else 0
        start = BlockStart(block, first, grouping.name, key)
        self.starts.append(start)
        return start

    def of(self, n: int) -> npt.NDArray[np.int64]:
        """The block id of each of positions ``0 .. n - 1`` (all assigned: ``n <= seen``)."""
        if n > self.seen:
            raise ValueError(f"positions up to {n} asked, {self.seen} assigned to blocks")
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        firsts = np.array([s.first for s in self.starts], dtype=np.int64)
        ids = np.array([s.block for s in self.starts], dtype=np.int64)
        where = np.searchsorted(firsts, np.arange(n), side="right") - 1
        return ids[np.maximum(where, 0)]


def record_digests(features: npt.ArrayLike) -> list[bytes]:
    """One 8-byte BLAKE2b digest per record (row of ``features``, as float64): what ties an
    arrival position to the record that arrived there, so that a later run which re-reads
    different records at the same positions is refused instead of regrouping them."""
    rows = np.ascontiguousarray(np.asarray(features, dtype=np.float64))
    if rows.ndim != 2:
        raise ValueError(f"features: expected shape (n, k), got {rows.shape}")
    return [hashlib.blake2b(row.tobytes(), digest_size=8).digest() for row in rows]

"""The tailer's generations and the pure rules that tell them apart (no file access here).

A generation (:class:`Gen`) is the content of one file identity as
:class:`~dpmarket.streams.records.tail.FileTailer` reads it: device and inode, its first bytes
(``head``), the committed ``offset`` and the bytes just before it (``mark``). An *orphan* is a
generation replaced under its inode (truncated, or rewritten), kept for a few polls so that a
copy of it (copytruncate) is adopted at its offset.

Doubt. When a file is seen shorter than the read offset and its bytes are a prefix of the old
head, two histories fit: it was truncated in place to that length (read on from there), or it
was emptied and new content that so far equals the old head's first bytes was written (a torn
first line ``8`` of ``88,...`` after ``84,...``; a repeated CSV header). The tailer cannot tell
them apart from the bytes, so the generation after the cut is *doubtful* while its orphan lives:
it reads nothing, it is no evidence that a new file copying those bytes is "a copy in progress"
of it, and a copy of the orphan appearing (copytruncate, which empties the file) makes it start
over from 0. Once the orphan expired without a copy, the cut is taken as an in-place truncation.

Copies. A new file is a copy of a generation when it starts with the generation's head and
holds its mark just before its offset (or is shorter: a copy still being written). A file may
look like a copy of several: an orphan emptied by copytruncate, and a live generation that has
read only a torn first piece (``1`` of ``12,...``) that the orphan's head also begins with. It
is taken for the copy of the one whose bytes it may repeat furthest by what is checked
(:func:`copied`: the head in common, the offset once the mark matched, the file's size for a
copy still shorter than the offset), a live one on a tie: the torn
piece's ``1`` explains one byte of the copy, the orphan's head and mark all of it up to the
orphan's offset. The bytes cannot tell this from a new generation that repeats the orphan's
bytes up to its offset and is copied while the orphan lives (tail.py, "Limits").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from dpmarket.streams.records.position import FileState

__all__ = ["HEAD_BYTES", "MARK_BYTES", "ORPHAN", "Gen", "copied", "doubt_of", "prefix_match"]

HEAD_BYTES, MARK_BYTES = 256, 64
ORPHAN = -1  # the device of an orphan in the state file (a generation kept for its copy)
_PERSISTED = tuple(f.name for f in dataclasses.fields(FileState))  # Gen has each of these too


@dataclass
class Gen:
    """One generation being read: the persisted part plus the held partial record."""

    device: int
    inode: int
    head: bytes
    offset: int
    mark: bytes = b""
    mid_record: bool = False
    done: bool = False
    source: str = ""
    cut: bool = False  # began at a truncation's cut, its bytes before it never read
    buffer: bytes = b""
    size: int = 0
    idle_since: float | None = None
    orphaned: int = 0  # the poll at which it became an orphan
    missing: int = 0  # consecutive polls whose listing missed it

    @property
    def read_offset(self) -> int:
        return self.offset + len(self.buffer)

    def frozen(self, orphan: bool = False) -> FileState:
        """The persisted part (every field of :class:`FileState`, by name)."""
        state = FileState(**{name: getattr(self, name) for name in _PERSISTED})
        return dataclasses.replace(state, device=ORPHAN) if orphan else state

    @classmethod
    def of(cls, state: FileState) -> Gen:
        """A generation resumed from its persisted part."""
        return cls(**{name: getattr(state, name) for name in _PERSISTED})


def prefix_match(a: bytes, b: bytes) -> bool:
    """Whether one of ``a`` and ``b`` starts with the other."""
    return a[: len(b)] == b[: len(a)]


def copied(gen: Gen, head: bytes, size: int, mark: bytes) -> int:
    """How far a file may repeat ``gen``'s bytes by what is checked (its head, and the mark
    before ``gen``'s offset), 0 if it is no copy of ``gen`` (module docstring, "Copies"). The
    file has ``size`` bytes, its first bytes are ``head`` (never empty) and ``mark`` are its
    bytes just before ``gen.offset`` (unused if the file is shorter: a copy of ``gen`` still
    being written reaches as far as the file, so a live generation read past an orphan's
    offset keeps its copy in progress rather than losing it to that orphan)."""
    if not gen.head or not prefix_match(head, gen.head):
        return 0
    known = min(len(head), len(gen.head))
    if size < gen.offset:  # as far as it goes: a copy of ``gen`` still being written
        return max(known, size)
    return max(known, gen.offset) if mark == gen.mark else 0


def doubt_of(gen: Gen, orphans: Iterable[Gen]) -> Gen | None:
    """The orphan of ``gen``'s inode whose first bytes ``gen`` may merely repeat (module
    docstring, "Doubt"), or ``None``: every byte before ``gen``'s offset is known (it lies in
    its head) and is also the orphan's head's beginning, and it began at that cut."""
    if not gen.cut or not 0 < gen.offset <= len(gen.head) or gen.buffer:
        return None
    for orphan in orphans:
        same_file = orphan.inode == gen.inode and orphan.device in (gen.device, ORPHAN)
        if same_file and gen.head[: gen.offset] == orphan.head[: gen.offset]:
            return orphan
    return None

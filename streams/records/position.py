"""The tailer's state file: every known file's fingerprint -> offset, with the rejects' length.

One state file per :class:`~dpmarket.streams.records.tail.FileTailer`. It holds a
:class:`FileState` per known file generation (device, inode, the first bytes seen, the bytes just
before the committed offset, the offset itself) and how many rejects (count and bytes) the
tailer's rejects file held when the state was written. Offsets and rejects are committed
together: the tailer appends a batch's rejects, syncs them, then replaces the state file
atomically (temp file, fsync, ``os.replace``, fsync of the directory); a restarted tailer cuts
the rejects file back to the recorded length (:func:`cut_rejects`), so rejects written after the
last committed state are dropped and written again, never twice.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["STATE_VERSION", "FileState", "TailState", "cut_rejects", "load_state", "save_state"]

STATE_VERSION = 2


@dataclass(frozen=True, slots=True)
class FileState:
    """One generation of one file: identity (``device``, ``inode``, ``head``: its first bytes
    as seen, at most ``HEAD_BYTES``), ``offset`` (a record boundary), ``mark`` (the bytes just
    before ``offset``, to see a file rewritten under the same inode), the decoder's
    ``mid_record`` flag, whether the generation is ``done`` (rotated and finished), its last
    known name ``source`` and whether it began at a ``cut`` (a truncation seen, not read from 0;
    see :mod:`~dpmarket.streams.records.generation`)."""

    device: int
    inode: int
    head: bytes
    offset: int
    mark: bytes = b""
    mid_record: bool = False
    done: bool = False
    source: str = ""
    cut: bool = False


@dataclass(frozen=True, slots=True)
class TailState:
    """A tailer's committed state: its files, the rejects written (count and bytes of the
    rejects file) and the copytruncate gaps seen (bytes that were never readable)."""

    files: tuple[FileState, ...] = ()
    rejects_count: int = 0
    rejects_bytes: int = 0
    gaps: int = 0
    gap_bytes: int = 0


def _file_json(f: FileState) -> dict[str, object]:
    return {"device": f.device, "inode": f.inode, "head": f.head.hex(), "offset": f.offset,
            "mark": f.mark.hex(), "mid_record": f.mid_record, "done": f.done,
            "source": f.source, "cut": f.cut}  # fmt: skip


def _file_of(raw: dict[str, object]) -> FileState:
    return FileState(
        int(str(raw["device"])),
        int(str(raw["inode"])),
        bytes.fromhex(str(raw["head"])),
        int(str(raw["offset"])),
        bytes.fromhex(str(raw["mark"])),
        bool(raw["mid_record"]),
        bool(raw["done"]),
        str(raw["source"]),
        bool(raw.get("cut", False)),  # absent in states written before it existed
    )


def load_state(state_path: str | Path) -> TailState | None:
    """The committed state, or ``None`` if there is none; refuses a corrupt state file."""
    path = Path(state_path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        raw = json.loads(text)
        if raw["version"] != STATE_VERSION:
            raise ValueError(f"state version {raw['version']!r}, this reader knows 2")
        files = tuple(_file_of(f) for f in raw["files"])
        counts = [int(raw[k]) for k in ("rejects_count", "rejects_bytes", "gaps", "gap_bytes")]
        return TailState(files, *counts)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"state_path {str(path)!r}: not a tailer state ({exc})") from None


def save_state(state_path: str | Path, state: TailState, *, fsync: bool = True) -> None:
    """Persist ``state`` atomically: write a temp file, fsync it, ``os.replace`` it over
    ``state_path`` (and fsync the directory), so a crash leaves the old or the new state."""
    path = Path(state_path)
    temp = path.with_name(path.name + ".tmp")
    payload = {
        "version": STATE_VERSION,
        "files": [_file_json(f) for f in state.files],
        "rejects_count": state.rejects_count,
        "rejects_bytes": state.rejects_bytes,
        "gaps": state.gaps,
        "gap_bytes": state.gap_bytes,
    }
    with temp.open("w", encoding="utf-8") as handle:
        handle.write(json.dumps(payload))
        handle.flush()
        if fsync:
            os.fsync(handle.fileno())
    os.replace(temp, path)
    if fsync:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def cut_rejects(rejects_path: str | Path, length: int) -> int:
    """Cut the rejects file back to ``length`` bytes (rejects written after the last committed
    state); returns how many bytes were dropped. A missing or shorter file is left alone."""
    path = Path(rejects_path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size <= length:
        return 0
    os.truncate(path, length)
    return size - length

"""Follow a growing record file and hand on each complete record exactly once.

:class:`FileTailer` is the owner's ingest source (DESIGN "The run", step 2): an async iterator of
:class:`TailBatch` over one path, decoded by a
:class:`~dpmarket.streams.records.files.ChunkDecoder`.

Theory of operation. The tailer reads the open file with ``pread`` from ``read_offset`` and keeps
the undecoded tail (a partial last record) in memory; it never hands on a partial record. At EOF
it looks at the path: a different (device, inode) or a missing path means the file was rotated,
and the tailer keeps draining the old file until it has been idle for ``rotate_wait`` seconds,
then decodes its tail as final and opens the new path at offset 0. A file smaller than
``read_offset`` was truncated in place (truncate or copytruncate): reading restarts at 0 and the
held partial record is rejected as ``truncated``.

Delivery. Each batch carries the :class:`Position` just after its last consumed byte. Nothing is
persisted when a batch is yielded; :meth:`FileTailer.commit` (after the consumer has taken the
records in) writes the rejects of all batches up to it and then the position, atomically (temp
file, fsync, ``os.replace``). ``commit`` never suspends, so a task cancelled in ``await commit``
has either committed or not. A restarted tailer resumes at the committed position: records of
batches handed on but not committed are delivered again, committed ones never (every valid record
exactly once, provided the consumer commits after taking a batch in). A position also holds a
fingerprint of the file's first bytes, so a file replaced under the same inode, or truncated and
regrown while no tailer ran, is read from 0; a rotated file is found again by inode next to the
path. Records written to a copytruncated file after the last read and before the copy exist only
in the copy and are not seen (an inherent limit of copytruncate).

Wake-ups: with ``watch=True`` a watchfiles watcher of the parent directory wakes the tailer early;
``poll_interval`` always bounds the wait, so polling alone is correct and watchfiles is optional.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from dataclasses import dataclass, field
from hashlib import blake2b
from pathlib import Path

from dpmarket.streams.records.files import (
    RAW_LIMIT,
    TRUNCATED,
    ChunkDecoder,
    Float32Array,
    Position,
    RecordBatch,
    Reject,
    RejectsWriter,
    Schema,
    decoder_for,
    format_of,
    load_position,
    save_position,
)

__all__ = ["FileTailer", "TailBatch"]

FINGERPRINT_BYTES = 1024


@dataclass(frozen=True, eq=False)
class TailBatch:
    """Records (and rejects) of one read of ``source``; commit it to persist ``position``.

    A batch may hold no records: only rejects, or the marker of a truncation.
    """

    records: RecordBatch
    source: str
    position: Position
    seq: int
    token: object = field(repr=False)

    @property
    def features(self) -> Float32Array:
        """The records' features, float32 ``(n, k)`` within the schema bounds."""
        return self.records.features

    def __len__(self) -> int:
        return len(self.records)


def _fingerprint(fd: int, offset: int) -> str:
    """Hash of the first ``min(offset, FINGERPRINT_BYTES)`` bytes of an open file."""
    return blake2b(os.pread(fd, min(offset, FINGERPRINT_BYTES), 0), digest_size=16).hexdigest()


@dataclass
class _Open:
    """One open file being read."""

    fd: int
    device: int
    inode: int
    source: str
    read_offset: int
    buffer: bytes = b""
    mid_record: bool = False
    replaced_since: float | None = None
    fingerprint: tuple[int, str] = (-1, "")

    def position(self, offset: int, mid_record: bool) -> Position:
        known = min(offset, FINGERPRINT_BYTES)
        if self.fingerprint[0] != known:
            self.fingerprint = (known, _fingerprint(self.fd, offset))
        return Position(self.device, self.inode, offset, mid_record, self.fingerprint[1])


def _find_inode(directory: Path, device: int, inode: int) -> Path | None:
    """A regular file with this identity in ``directory`` (a rotated file), if any."""
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                same_inode = entry.inode() == inode and entry.is_file(follow_symlinks=False)
                if same_inode and entry.stat(follow_symlinks=False).st_dev == device:
                    return Path(entry.path)
    except OSError:
        return None
    return None


class FileTailer:
    """Async iterator of :class:`TailBatch` over a growing file (see the module docstring).

    ``decoder`` is a chunk decoder or a :class:`Schema` (format from the path's suffix: csv,
    jsonl or msgpack). ``state_path`` holds the committed :class:`Position`; ``rejects`` (if
    given) receives the rejects of each batch when it is committed. Use ``async for`` and
    ``await tailer.commit(batch)`` after taking each batch in; :meth:`aclose` (or ``async with``)
    releases the file and the watcher.
    """

    def __init__(
        self,
        path: str | Path,
        decoder: ChunkDecoder | Schema,
        state_path: str | Path,
        *,
        poll_interval: float = 0.25,
        rotate_wait: float = 1.0,
        chunk_size: int = 1 << 20,
        watch: bool = False,
        rejects: RejectsWriter | None = None,
        fsync: bool = True,
    ) -> None:
        for name, value in (("poll_interval", poll_interval), ("rotate_wait", rotate_wait)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        self.path, self.state_path = Path(path), Path(state_path)
        if isinstance(decoder, Schema):
            decoder = decoder_for(format_of(self.path), decoder)
        self.decoder, self.rejects, self.fsync, self.watch = decoder, rejects, fsync, watch
        self.poll_interval, self.rotate_wait = poll_interval, rotate_wait
        self.chunk_size = chunk_size
        self.committed: Position | None = load_position(self.state_path)
        self._file: _Open | None = None
        self._started = False
        self._seq = self._committed_seq = 0
        self._pending: deque[tuple[int, str, tuple[Reject, ...]]] = deque()
        self._token = object()
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None

    @property
    def read_offset(self) -> int:
        """Bytes read from the current file so far (a held partial record included)."""
        return self._file.read_offset if self._file is not None else 0

    # ------------------------------------------------------------------ iteration
    def __aiter__(self) -> FileTailer:
        return self

    async def __anext__(self) -> TailBatch:
        await asyncio.sleep(0)  # let other tasks run; a cancellation here changes nothing
        if not self._started:
            self._started = True
            self._resume()
            if self.watch:
                self._watcher = asyncio.get_running_loop().create_task(self._watch())
        while not self._stop.is_set():
            batch, progressed = self._step()
            if batch is not None:
                return batch
            if not progressed:
                await self._sleep()
        raise StopAsyncIteration

    async def _sleep(self) -> None:
        with contextlib.suppress(TimeoutError):  # the poll interval ran out: poll anyway
            async with asyncio.timeout(self.poll_interval):
                await self._wake.wait()
        self._wake.clear()

    async def _watch(self) -> None:
        """Set the wake-up event on every change in the parent directory (best effort)."""
        try:
            import watchfiles

            async for _ in watchfiles.awatch(
                self.path.parent,
                watch_filter=None,
                debounce=200,
                step=10,
                stop_event=self._stop,
                recursive=False,
            ):
                self._wake.set()
        except Exception:  # no watcher (import, OS limits): polling alone stays correct
            return

    # ------------------------------------------------------------------ reading
    def _resume(self) -> None:
        """Open the committed file at its offset: the path itself, or the rotated file found
        next to it by inode; otherwise the path is read from 0 once it exists."""
        state = self.committed
        if state is None:
            return
        try:
            st = os.stat(self.path)
            same = (st.st_dev, st.st_ino) == (state.device, state.inode)
        except FileNotFoundError:
            same = False
        found = self.path if same else _find_inode(self.path.parent, state.device, state.inode)
        if found is not None:
            self._open(found, state)

    def _open(self, path: Path, resume: Position | None) -> bool:
        """Open ``path`` at ``resume`` if it is that very file (identity, size, fingerprint);
        the watched path otherwise opens at 0, any other path is refused."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        st = os.fstat(fd)
        opened = _Open(fd, st.st_dev, st.st_ino, str(path), 0)
        same = (
            resume is not None
            and (st.st_dev, st.st_ino) == (resume.device, resume.inode)
            and st.st_size >= resume.offset
            and opened.position(resume.offset, False).fingerprint == resume.fingerprint
        )
        if resume is not None and same:
            opened.read_offset, opened.mid_record = resume.offset, resume.mid_record
        elif path != self.path:
            os.close(fd)
            return False
        self._file = opened
        return True

    def _step(self) -> tuple[TailBatch | None, bool]:
        """One read: ``(batch or None, whether anything changed)``."""
        f = self._file
        if f is None:
            self._open(self.path, None)
            f = self._file
            if f is None:
                return None, False
        size = os.fstat(f.fd).st_size
        if size < f.read_offset:
            return self._truncated(f), True
        if size > f.read_offset:
            f.replaced_since = None
            data = os.pread(f.fd, min(self.chunk_size, size - f.read_offset), f.read_offset)
            return self._decode(f, data, final=False), True
        if not self._replaced(f):
            f.replaced_since = None
            return None, False
        now = asyncio.get_running_loop().time()
        if f.replaced_since is None:
            f.replaced_since = now
        if now - f.replaced_since < self.rotate_wait:
            return None, False
        batch = self._decode(f, b"", final=True)
        os.close(f.fd)
        self._file = None
        return batch, True

    def _replaced(self, f: _Open) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return True
        return (st.st_dev, st.st_ino) != (f.device, f.inode)

    def _decode(self, f: _Open, data: bytes, *, final: bool) -> TailBatch | None:
        base = f.read_offset - len(f.buffer)
        out = self.decoder.decode(f.buffer + data, base, final=final, mid_record=f.mid_record)
        f.read_offset += len(data)
        f.buffer, f.mid_record = out.remainder, out.mid_record
        if not (len(out.batch) or out.batch.rejects):
            return None
        return self._batch(f, out.batch, f.position(out.batch.end, out.mid_record))

    def _truncated(self, f: _Open) -> TailBatch:
        """The file shrank below what was read: reject the held partial record, restart at 0."""
        start = f.read_offset - len(f.buffer)
        rejects = (
            (Reject(start, TRUNCATED, "file truncated", f.buffer[:RAW_LIMIT], len(f.buffer)),)
            if f.buffer
            else ()
        )
        f.read_offset, f.buffer, f.mid_record, f.fingerprint = 0, b"", False, (-1, "")
        records = RecordBatch.empty(self.decoder.schema, 0, 0, rejects)
        return self._batch(f, records, f.position(0, False))

    def _batch(self, f: _Open, records: RecordBatch, position: Position) -> TailBatch:
        self._seq += 1
        self._pending.append((self._seq, f.source, records.rejects))
        return TailBatch(records, f.source, position, self._seq, self._token)

    # ------------------------------------------------------------------ delivery
    async def commit(self, batch: TailBatch) -> None:
        """Persist delivery of ``batch`` and of every batch before it (rejects, then position).

        Committing an already committed batch does nothing; a batch of another tailer raises
        ``ValueError``. Does not suspend: it completes or raises before any other task runs.
        """
        if batch.token is not self._token:
            raise ValueError(f"batch {batch.seq} of {batch.source!r} is not from this tailer")
        if batch.seq <= self._committed_seq:
            return
        while self._pending and self._pending[0][0] <= batch.seq:
            _, source, rejects = self._pending.popleft()
            if self.rejects is not None and rejects:
                self.rejects.write(source, rejects)
        save_position(self.state_path, batch.position, fsync=self.fsync)
        self.committed, self._committed_seq = batch.position, batch.seq

    def close(self) -> None:
        """Stop iterating (a waiting ``__anext__`` ends) and close the file; idempotent."""
        self._stop.set()
        self._wake.set()
        if self._file is not None:
            os.close(self._file.fd)
            self._file = None

    async def aclose(self) -> None:
        """:meth:`close`, then wait for the directory watcher to stop."""
        self.close()
        if self._watcher is not None:
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None

    async def __aenter__(self) -> FileTailer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

"""Follow a growing, rotated record file and hand on each complete record exactly once.

:class:`FileTailer` is the owner's ingest source (DESIGN "The run", step 2): an async iterator of
:class:`TailBatch` over the files matching a glob next to one path (``x.log*``: the path and its
rotated names), decoded by a :class:`~dpmarket.streams.records.files.ChunkDecoder`.

Theory of operation (the approach of filebeat and fluent-bit). A *generation* is the content of
one file identity: device and inode plus its first bytes (``head``), and the bytes just before
the read offset (``mark``). Every poll lists the glob, and for each known inode re-checks head,
mark and the held partial record against the file, so a truncate-and-regrow is seen even when
the file grew past the read offset: a changed head is a new generation read from 0; a file
shorter than the read offset was truncated and is read on from its new length, once its orphan
expired with no copy (its bytes may be new content repeating the old head: a copy of the
orphan means it was emptied, and it is read from 0; see "Doubt" in
:mod:`~dpmarket.streams.records.generation`). The replaced
generation stays as an *orphan* for a while so that a copy of it (copytruncate: a new inode
whose head and mark match) is adopted at the orphan's offset; a new inode matching a generation
that is still live is a copy in progress and is left alone; one matching several is the copy of
the one whose bytes it may repeat furthest (a live generation that has read only a torn
first piece, ``1`` of ``12,...``, is no match for the orphan whose head begins with it; see
"Copies" in :mod:`~dpmarket.streams.records.generation`). A rename (``x.log -> x.log.1 ->
x.log.2``, any number of times between two polls, or while no tailer ran) keeps the inode, so
the file is found again under its new name and read to its end. A generation no longer at the
path and idle for ``rotate_wait`` is finished: its partial last record is a ``truncated`` reject
(never decoded as if it were complete); bytes appended later are read as new lines. A held
partial record is never glued onto bytes of another generation, and a line without its newline
is never a record. Head, mark and the last bytes read are checked again after each read, and
the new mark is taken from the bytes read, never from the file: a read of a file copytruncated
since the poll's checks (before its bytes were read or while they were decoded, even one left
empty) is dropped, never taken as the old generation's, so its orphan keeps the offset at which
the copy is adopted.

Limits. Bytes written to a copytruncated file after the copy and before the truncation exist
nowhere; a truncation to a non-zero length regrown past the read offset before a poll has an
unknown cut point (reading resumes at the next line); a file seen shorter than the read offset
but longer than its known head (``HEAD_BYTES``) may have been cut below its new length and
appended to before the poll: its bytes past the head cannot be told from the old ones, so it is
read on from its new length (a record is never delivered twice) and records appended after the
cut may be lost; a cut inside a line (a truncation there, or a file emptied and rewritten whose
first bytes, torn from their line, repeat the old head's) resumes at the next line, the rest of
that line never decoded as a record. Each of these counts as a gap (``gaps``; ``gap_bytes``:
unread bytes known lost, 0 where the amount is unknown), reported in the owner's ingest
status: a non-zero ``gaps`` says records may be missing, never that records were repeated.
Two cases may repeat records. A new generation whose bytes repeat an orphan's up to the
orphan's offset (its head and mark), copied while that orphan lives, is taken for the orphan's
copy: its records past that offset may be delivered from the file and from the copy. (Only
the head and the 64 bytes before the offset are compared, so records that differ, as with
unique ids, make this unlikely, not impossible.) A known file, or an
orphan's copy, that three consecutive listings missed (renamed, in each poll, between the
directory read and its ``lstat``) is taken as gone (the orphan expires), and read from 0 when
listed again.

Delivery. Each batch carries the tailer's whole state (every file's fingerprint -> offset, see
:mod:`~dpmarket.streams.records.position`). :meth:`FileTailer.commit` (after the consumer has
taken the records in) appends the rejects of all batches up to it, syncs them, then writes the
state with the rejects file's length; a restarted tailer cuts the rejects file back to that
length. Records and rejects of committed batches are never delivered again, those of batches
not committed are, once. ``commit`` never suspends, so it may be called from another thread's
loop while this tailer keeps reading (the owner does: actors/parties/owner.py).
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

from dpmarket.streams.records.files import (
    RAW_LIMIT,
    TRUNCATED,
    ChunkDecoder,
    Float32Array,
    RecordBatch,
    Reject,
    RejectsWriter,
    Schema,
    decoder_for,
    format_of,
)
from dpmarket.streams.records.generation import (
    HEAD_BYTES,
    MARK_BYTES,
    ORPHAN,
    Gen,
    copied,
    doubt_of,
    prefix_match,
)
from dpmarket.streams.records.position import (
    TailState,
    cut_rejects,
    load_state,
    save_state,
)

__all__ = ["FileTailer", "TailBatch"]


@dataclass(frozen=True, eq=False)
class TailBatch:
    """Records (and rejects) of one read of ``source`` (``device``, ``inode``); commit it to
    persist ``state``. A batch may hold no records, only rejects."""

    records: RecordBatch
    source: str
    device: int
    inode: int
    state: TailState
    seq: int
    token: object = field(repr=False)

    @property
    def features(self) -> Float32Array:
        return self.records.features  # float32 (n, k) within the schema bounds

    def __len__(self) -> int:
        return len(self.records)


def _escaped(name: str) -> str:
    """``name`` as a glob that matches only itself (``glob.escape``: each of ``*?[`` bracketed)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _mark(fd: int, offset: int) -> bytes:
    return os.pread(fd, min(offset, MARK_BYTES), max(0, offset - MARK_BYTES))


def _intact(gen: Gen, fd: int, tail: bytes, end: int) -> bool:
    """Whether ``fd`` still holds ``gen``'s head, its bytes before the read offset and ``tail``,
    the last bytes read (ending at ``end``; never empty). Checked after reading: a copytruncate
    between a poll's checks and the end of its read is caught, also one that left the file empty
    (an empty head is a prefix of any, but it lacks ``tail``)."""
    before = gen.mark + gen.buffer
    kept = os.pread(fd, len(before), gen.offset - len(gen.mark)) == before
    kept = kept and os.pread(fd, len(tail), end - len(tail)) == tail
    return kept and prefix_match(os.pread(fd, HEAD_BYTES, 0), gen.head)


class FileTailer:
    """Async iterator of :class:`TailBatch` over a growing, rotated file (module docstring).

    ``decoder`` is a chunk decoder or a :class:`Schema` (format from the path's suffix).
    ``pattern`` is the glob of rotated names in the path's directory (default ``NAME*``, the
    name's own ``*?[`` escaped).
    ``state_path`` holds the committed state; ``rejects`` (a path, one per tailer) receives the
    rejects of each batch when it is committed. Use ``async for`` and ``await
    tailer.commit(batch)`` after taking each batch in; :meth:`close` releases it.
    """

    def __init__(
        self,
        path: str | Path,
        decoder: ChunkDecoder | Schema,
        state_path: str | Path,
        *,
        pattern: str | None = None,
        poll_interval: float = 0.25,
        rotate_wait: float = 1.0,
        chunk_size: int = 1 << 20,
        rejects: str | Path | None = None,
        fsync: bool = True,
    ) -> None:
        for name, value in (("poll_interval", poll_interval), ("rotate_wait", rotate_wait)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        self.path, self.state_path = Path(path), Path(state_path)
        # the name is a name, not a pattern: ``own[1].csv`` matches itself and ``own[1].csv.1``
        self.pattern = pattern if pattern is not None else _escaped(self.path.name) + "*"
        if isinstance(decoder, Schema):
            decoder = decoder_for(format_of(self.path), decoder)
        self.decoder, self.fsync = decoder, fsync
        self.poll_interval, self.rotate_wait = poll_interval, rotate_wait
        self.chunk_size = chunk_size
        self.committed: TailState = load_state(self.state_path) or TailState()
        self._gens: dict[tuple[int, int], Gen] = {}
        self._orphans: list[Gen] = []
        for f in self.committed.files:
            gen = Gen.of(f)
            if f.device == ORPHAN:
                self._orphans.append(gen)
            else:
                self._gens[f.device, f.inode] = gen
        self.gaps, self.gap_bytes = self.committed.gaps, self.committed.gap_bytes
        self._writer: RejectsWriter | None = None
        if rejects is not None:
            cut_rejects(rejects, self.committed.rejects_bytes)
            self._writer = RejectsWriter(rejects, fsync=fsync)
        self._rejects_count = self.committed.rejects_count
        self.polls = 0
        self._seq = self._committed_seq = 0
        self._pending: deque[tuple[int, str, tuple[Reject, ...]]] = deque()
        self._ready: deque[TailBatch] = deque()
        self._token = object()
        self._closed = False

    @property
    def read_offset(self) -> int:
        """Bytes read from the file now at the path (a held partial record included)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return 0
        gen = self._gens.get((st.st_dev, st.st_ino))
        return gen.read_offset if gen is not None else 0

    def caught_up(self) -> bool:
        """Whether every known file was read to the size last seen and no batch waits."""
        return not self._ready and all(g.read_offset >= g.size for g in list(self._gens.values()))

    def __aiter__(self) -> FileTailer:
        return self

    async def __anext__(self) -> TailBatch:
        await asyncio.sleep(0)  # let other tasks run; a cancellation here changes nothing
        while not self._closed:
            if self._ready:
                return self._ready.popleft()
            if not self._scan(asyncio.get_running_loop().time()):
                await asyncio.sleep(self.poll_interval)
        raise StopAsyncIteration

    def _scan(self, now: float) -> bool:
        """One poll of every file under the glob; returns whether anything was read."""
        self.polls += 1
        seen: dict[tuple[int, int], Path] = {}
        for p in sorted(self.path.parent.glob(self.pattern), reverse=True):
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                seen[st.st_dev, st.st_ino] = p
        try:
            st = os.stat(self.path)
            at_path = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            at_path = None
        progressed = False
        for key, gen in list(self._gens.items()):  # a file renamed while listed can miss one
            gen.missing = 0 if key in seen else gen.missing + 1  # listing: gone (its partial
            if gen.missing >= 3:  # record lost) after 3, else it would be re-read from 0
                del self._gens[key]
                self._finish(gen, "file gone")
        known = set(self._gens)  # known inodes first: a copy is adopted once its original went
        for key, path in sorted(seen.items(), key=lambda kv: kv[0] not in known):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != key:  # renamed since listed: another file now
                    continue
                if key in known:
                    progressed |= self._known(self._gens[key], fd, path)
                else:
                    progressed |= self._new(key, fd, path)
            finally:
                os.close(fd)
        for key, gen in self._gens.items():  # a rotated generation, idle: finish it
            idle = key != at_path and gen.read_offset >= gen.size and not gen.done
            if not idle:
                gen.idle_since = None
            elif gen.idle_since is None:
                gen.idle_since = now
            elif now - gen.idle_since >= self.rotate_wait:
                self._finish(gen, "partial last record of a rotated file")
                gen.done = progressed = True
        for orphan in [o for o in self._orphans if self.polls - o.orphaned >= 3]:
            self._orphans.remove(orphan)  # no copy of it appeared
            if orphan.size > orphan.read_offset:
                self.gaps += 1
                self.gap_bytes += orphan.size - orphan.read_offset
            self._finish(orphan, "file truncated")
        return progressed

    def _known(self, gen: Gen, fd: int, path: Path) -> bool:
        """Re-check a known inode's generation against the file, then read on."""
        size = os.fstat(fd).st_size
        head = os.pread(fd, min(size, HEAD_BYTES), 0)
        gen.source = str(path)
        if not prefix_match(head, gen.head) or (size == 0 and gen.read_offset > 0):
            self._orphan(gen)  # new content under the same inode (or emptied): from 0
            self._gens[gen.device, gen.inode] = Gen(gen.device, gen.inode, b"", 0, source=str(path))
            return self._read(self._gens[gen.device, gen.inode], fd, size, head)
        if size < gen.read_offset:  # truncated in place: read on from the new length
            mark = _mark(fd, size)
            inside = not mark.endswith(b"\n")  # a cut inside a line: what follows it up to
            # the next newline is the rest of some line, never decoded as a record (Limits)
            if size > len(gen.head) or inside:  # bytes past the known head: the cut may lie
                self.gaps += 1  # below the new length, records appended after it unread
            self._orphan(gen)
            fresh = Gen(gen.device, gen.inode, head, size, mark, source=str(path), cut=True)
            fresh.mid_record = inside
            self._gens[gen.device, gen.inode] = fresh
            return True
        if (
            _mark(fd, gen.offset) != gen.mark
            or os.pread(fd, len(gen.buffer), gen.offset) != gen.buffer
        ):
            # cut below the read offset and regrown past it: the cut point is unknown
            self.gaps += 1
            self._finish(gen, "file rewritten")
            gen.mid_record = True  # resume at the next line: never glue, never repeat
            gen.mark = _mark(fd, gen.offset)
        if doubt_of(gen, self._orphans) is not None:  # maybe new content: wait for its orphan's
            gen.size = size  # copy (then from 0) or expiry (then on from the cut)
            return False
        return self._read(gen, fd, size, head)

    def _new(self, key: tuple[int, int], fd: int, path: Path) -> bool:
        """A new inode: the copy of an orphan (adopted at its offset), a copy in progress of a
        live generation (left alone), or a new file read from 0; a file looking like a copy
        of several is the copy of the one it repeats furthest (generation.py, "Copies")."""
        size = os.fstat(fd).st_size
        if size == 0:
            return False
        head = os.pread(fd, min(size, HEAD_BYTES), 0)

        def reach(g: Gen) -> int:
            return copied(g, head, size, _mark(fd, g.offset) if size >= g.offset else b"")

        live = [g for g in self._gens.values() if g.read_offset > 0]
        made = max((reach(g) for g in live if doubt_of(g, self._orphans) is None), default=0)
        reaches = [reach(o) for o in self._orphans]
        best = max(reaches, default=0)
        if made and made >= best:
            return False  # a copy of a live generation, being made
        if best:
            orphan = self._orphans[reaches.index(best)]
            if size < orphan.offset:
                return False  # the copy is still being written
            self._orphans.remove(orphan)
            if orphan.size > max(size, orphan.read_offset):  # written after the copy
                self.gaps += 1
                self.gap_bytes += orphan.size - max(size, orphan.read_offset)
            for k, g in list(self._gens.items()):  # its file was emptied (copytruncate):
                if doubt_of(g, (orphan,)) is orphan:  # all the doubtful cut holds is new
                    self._gens[k] = Gen(g.device, g.inode, b"", 0, source=g.source)
            for i, o in enumerate(self._orphans):  # so is that of a doubtful cut orphaned
                if doubt_of(o, (orphan,)) is orphan:  # since: no copy is a copy of its bytes
                    self._orphans[i] = Gen(o.device, o.inode, b"", 0, source=o.source)
                    self._orphans[i].orphaned = o.orphaned
            gen = replace(orphan, device=key[0], inode=key[1], source=str(path), size=size)
            self._gens[key] = gen  # before any batch: its state must hold the copy
            if size < gen.read_offset:  # the held partial is not in the copy
                self._finish(gen, "file truncated")
            return self._read(gen, fd, size, head)
        gen = Gen(key[0], key[1], b"", 0, source=str(path))
        self._gens[key] = gen
        return self._read(gen, fd, size, head)

    def _orphan(self, gen: Gen) -> None:
        gen.orphaned = self.polls
        self._orphans.append(gen)

    def _read(self, gen: Gen, fd: int, size: int, head: bytes) -> bool:
        """Read up to ``chunk_size`` new bytes of ``gen`` and decode its complete records."""
        if len(head) > len(gen.head):
            gen.head = head
        grew, gen.size = size > gen.size, size
        if size <= gen.read_offset:
            return grew
        data = os.pread(fd, min(self.chunk_size, size - gen.read_offset), gen.read_offset)
        out = self.decoder.decode(
            gen.buffer + data, gen.offset, final=False, mid_record=gen.mid_record
        )
        offset = gen.read_offset + len(data) - len(out.remainder)
        read = gen.mark + gen.buffer + data  # the bytes up to the end of this read
        mark = read[: len(read) - len(out.remainder)][-MARK_BYTES:]  # what was read, not the
        # file now: it may have been emptied since (a copy of it must match the mark)
        tail = mark + out.remainder
        if not _intact(gen, fd, tail, gen.read_offset + len(data)):  # replaced since this
            return True  # poll's checks: what was read may not be this generation's bytes, or
            # be them but gone from the file (into a copy); the next poll sees which
        gen.done, gen.idle_since = False, None
        gen.offset, gen.buffer, gen.mid_record, gen.mark = (
            offset,
            out.remainder,
            out.mid_record,
            mark,
        )
        if len(out.batch) or out.batch.rejects:
            self._emit(gen, out.batch)
        return True

    def _finish(self, gen: Gen, why: str) -> None:
        """End ``gen``'s held partial record: a ``truncated`` reject, never a record."""
        if gen.buffer:
            reject = Reject(gen.offset, TRUNCATED, why, gen.buffer[:RAW_LIMIT], len(gen.buffer))
            gen.mark = (gen.mark + gen.buffer)[-MARK_BYTES:]  # the bytes before the new offset
            gen.offset, gen.buffer = gen.read_offset, b""
            self._emit(
                gen, RecordBatch.empty(self.decoder.schema, gen.offset, gen.offset, (reject,))
            )
        gen.mid_record = False

    def _emit(self, gen: Gen, records: RecordBatch) -> None:
        self._seq += 1
        files = tuple(g.frozen() for g in self._gens.values())
        files += tuple(o.frozen(orphan=True) for o in self._orphans)
        state = TailState(files, 0, 0, self.gaps, self.gap_bytes)
        self._pending.append((self._seq, gen.source, records.rejects))
        batch = TailBatch(records, gen.source, gen.device, gen.inode, state, self._seq, self._token)
        self._ready.append(batch)

    async def commit(self, batch: TailBatch) -> None:
        """Persist delivery of ``batch`` and of every batch before it (rejects, then state).

        Committing an already committed batch does nothing; a batch of another tailer raises
        ``ValueError``. Does not suspend: it completes or raises before any other task runs.
        """
        if batch.token is not self._token:
            raise ValueError(f"batch {batch.seq} of {batch.source!r} is not from this tailer")
        if batch.seq <= self._committed_seq:
            return
        while self._pending and self._pending[0][0] <= batch.seq:
            _, source, rejects = self._pending.popleft()
            if self._writer is not None and rejects:
                self._rejects_count += self._writer.write(source, rejects, self._rejects_count)
        size = self._writer.size if self._writer is not None else 0
        state = replace(batch.state, rejects_count=self._rejects_count, rejects_bytes=size)
        save_state(self.state_path, state, fsync=self.fsync)
        self.committed, self._committed_seq = state, batch.seq

    def close(self) -> None:
        """Stop iterating (a waiting ``__anext__`` ends at its next poll); idempotent."""
        self._closed = True
        if self._writer is not None:
            self._writer.close()

    async def __aenter__(self) -> FileTailer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

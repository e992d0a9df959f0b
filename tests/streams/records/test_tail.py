"""File tailer: partial lines, garbage, rotation, truncation, copytruncate, kill and restart.

Records carry a unique id in their first feature; every test checks that each valid record is
delivered exactly once (sorted ids equal the written ids, no duplicates). Writers run
concurrently (a thread, or a coroutine interleaved with the tailer); every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import numpy as np
import pytest

from dpmarket.streams.records.files import (
    TRUNCATED,
    ChunkDecoder,
    MsgpackDecoder,
    Schema,
    read_rejects,
)
from dpmarket.streams.records.position import FileState, TailState, load_state, save_state
from dpmarket.streams.records.tail import FileTailer, TailBatch

SCHEMA = Schema.box(2, 0.0, 1e6)


def tail(
    path: Path,
    state: Path,
    *,
    decoder: ChunkDecoder | Schema = SCHEMA,
    poll_interval: float = 0.01,
    rotate_wait: float = 0.3,
    chunk_size: int = 1 << 20,
    rejects: Path | None = None,
    fsync: bool = False,
) -> FileTailer:
    """A tailer with test-friendly timings."""
    return FileTailer(
        path,
        decoder,
        state,
        poll_interval=poll_interval,
        rotate_wait=rotate_wait,
        chunk_size=chunk_size,
        rejects=rejects,
        fsync=fsync,
    )


def lines(first: int, stop: int) -> bytes:
    return b"".join(f"{i},{i % 97}.5\n".encode() for i in range(first, stop))


def ids(batch: TailBatch) -> list[int]:
    return [int(v) for v in batch.features[:, 0]]


async def take(tailer: FileTailer, want: int, sink: list[int], timeout: float = 15.0) -> None:
    """Consume (and commit) until ``sink`` holds ``want`` ids."""
    async with asyncio.timeout(timeout):
        while len(sink) < want:
            batch = await anext(tailer)
            sink.extend(ids(batch))
            await tailer.commit(batch)


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


def exactly_once(sink: list[int], expected: range) -> None:
    assert len(sink) == len(expected), (len(sink), len(expected))
    assert sorted(sink) == list(expected)


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data)


@pytest.mark.asyncio
async def test_partial_line_is_held_back_until_complete(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes(b"1,1\n2,")
    async with tail(path, tmp_path / "state") as tailer:
        first = await asyncio.wait_for(anext(tailer), 10)
        assert ids(first) == [1] and first.records.end == 4
        pending = asyncio.ensure_future(anext(tailer))
        await asyncio.sleep(0.1)
        assert not pending.done()  # "2," is not a record yet
        append(path, b"2\n")
        second = await asyncio.wait_for(pending, 10)
        assert ids(second) == [2] and second.records.offsets.tolist() == [4]


def write_in_pieces(path: Path, payload: bytes, seed: int, pause: float = 0.05) -> None:
    """A writer thread: appends ``payload`` in random pieces that split lines anywhere,
    sleeping a millisecond after a fraction ``pause`` of the pieces."""
    rng = np.random.default_rng(seed)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        at = 0
        while at < len(payload):
            size = int(rng.integers(1, 60))
            os.write(fd, payload[at : at + size])
            at += size
            if rng.random() < pause:
                time.sleep(0.001)
    finally:
        os.close(fd)


@pytest.mark.asyncio
async def test_concurrent_writer_with_garbage_lines_exactly_once(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    garbage = [b"x,1\n", b"1,2,3\n", b"nan,1\n", b"\xff\xfe\n", b"1e999,2\n", b",\n"]
    parts, n_bad = [], 0
    for i in range(2000):
        parts.append(lines(i, i + 1))
        if rng.random() < 0.05:
            parts.append(garbage[n_bad % len(garbage)])
            n_bad += 1
    path, rejects_path = tmp_path / "a.csv", tmp_path / "rejects.jsonl"
    sink: list[int] = []
    tailer = tail(path, tmp_path / "state", rejects=rejects_path)
    async with tailer:
        await asyncio.gather(
            asyncio.to_thread(write_in_pieces, path, b"".join(parts), 2),
            take(tailer, 2000, sink),
        )
        await wait_until(lambda: tailer.read_offset == path.stat().st_size)
        exactly_once(sink, range(2000))
    entries = read_rejects(rejects_path)
    assert len(entries) == n_bad > 50
    assert all(e["source"] == str(path) for e in entries)
    assert {e["reason"] for e in entries} == {"non_numeric", "arity", "non_finite"}


@pytest.mark.asyncio
async def test_rotation_mid_write_drains_the_old_file(tmp_path: Path) -> None:
    path, sink = tmp_path / "a.csv", list[int]()

    async def writer() -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.write(fd, lines(0, 100) + b"100,")
        await asyncio.sleep(0.05)
        os.rename(path, tmp_path / "a.csv.1")  # the writer still holds the old file
        await asyncio.sleep(0.05)
        os.write(fd, b"5\n" + lines(101, 150))
        os.close(fd)
        path.write_bytes(lines(150, 300))

    async with tail(path, tmp_path / "state", rotate_wait=1.0) as tailer:
        await asyncio.gather(writer(), take(tailer, 300, sink))
    exactly_once(sink, range(300))
    state = load_state(tmp_path / "state")
    assert state is not None and path.stat().st_ino in {f.inode for f in state.files}


@pytest.mark.asyncio
async def test_truncation_restarts_at_zero_and_rejects_the_held_partial(tmp_path: Path) -> None:
    path, sink, rejects_path = tmp_path / "a.csv", list[int](), tmp_path / "rejects.jsonl"
    path.write_bytes(lines(0, 50))
    tailer = tail(path, tmp_path / "state", rejects=rejects_path)
    async with tailer:
        await take(tailer, 50, sink)
        append(path, b"777,")
        await wait_until(lambda: (tailer._scan(0.0), tailer.read_offset)[1] == path.stat().st_size)
        os.truncate(path, 0)
        append(path, lines(50, 120))  # regrown past the old offset before the next poll
        await take(tailer, 120, sink)
        while tailer._ready or not tailer.committed.rejects_count:  # the truncated reject
            await tailer.commit(await anext(tailer))
    exactly_once(sink, range(120))
    (entry,) = read_rejects(rejects_path)
    assert entry["reason"] == TRUNCATED and entry["raw"] == "777,"
    assert entry["offset"] == len(lines(0, 50))


@pytest.mark.asyncio
async def test_truncation_to_a_nonzero_length_reads_on_without_duplicates(tmp_path: Path) -> None:
    path, sink = tmp_path / "a.csv", list[int]()
    path.write_bytes(lines(0, 50))
    tailer = tail(path, tmp_path / "state")
    async with tailer:
        await take(tailer, 50, sink)
        os.truncate(path, len(lines(0, 20)))
        tailer._scan(0.0)  # the tailer sees the file shorter than its offset
        append(path, lines(50, 80))
        await take(tailer, 80, sink)
    exactly_once(sink, range(80))
    assert tailer.gaps == 0  # the cut lies within the known head: every byte before it is old


@pytest.mark.asyncio
async def test_truncation_regrown_before_a_poll_is_counted_as_a_gap(tmp_path: Path) -> None:
    """Cut to a non-zero length past the known head, then appended to before the next poll:
    the cut point cannot be told from the bytes, the appended records are not read (never
    twice), and the ingest status says records may be missing."""
    path, sink = tmp_path / "a.csv", list[int]()
    path.write_bytes(lines(0, 100))
    tailer = tail(path, tmp_path / "state")
    async with tailer:
        await take(tailer, 100, sink)
        assert tailer.gaps == 0
        os.truncate(path, len(lines(0, 60)))  # 460 bytes, past the 256-byte head
        append(path, lines(100, 110))  # before the tailer looks again
        tailer._scan(0.0)
        append(path, lines(110, 130))
        await take(tailer, 120, sink)
        gaps = tailer.gaps
    assert len(sink) == len(set(sink)) == 120  # no record delivered twice
    assert set(sink) == set(range(100)) | set(range(110, 130))
    assert gaps == 1 and load_state(tmp_path / "state").gaps == 1  # committed: survives restart


@pytest.mark.asyncio
async def test_a_torn_first_piece_repeating_the_old_head_is_never_decoded(tmp_path: Path) -> None:
    """Emptied, then rewritten in pieces, polled between them: the first piece ("1" of record
    15's "15,15.5") repeats the old head's first byte, so the bytes cannot tell it from a
    truncation in place to one byte. The rest of that line ("5,15.5") is never decoded as a
    record (it was delivered as record 5 before), a gap is counted, and the lines after it are
    read once."""
    path, sink = tmp_path / "a.csv", list[int]()
    path.write_bytes(lines(1, 10))
    tailer = tail(path, tmp_path / "state")
    async with tailer:
        await take(tailer, 9, sink)
        os.truncate(path, 0)
        first = lines(15, 16)
        append(path, first[:1])
        tailer._scan(0.0)
        append(path, first[1:] + lines(16, 20))
        await take(tailer, 13, sink)
        gaps = tailer.gaps
    assert len(sink) == len(set(sink)) == 13
    assert set(sink) == set(range(1, 10)) | set(range(16, 20))  # 15 lost, 5 never fabricated
    assert gaps == 1


@pytest.mark.asyncio
async def test_a_cut_inside_a_line_resumes_at_the_next_line(tmp_path: Path) -> None:
    """Cut in place in the middle of a line within the known head, then appended to: the
    appended bytes up to the next newline complete no record of their own and are skipped (a
    gap), the records after them are read once."""
    path, sink = tmp_path / "a.csv", list[int]()
    path.write_bytes(lines(1, 10))
    tailer = tail(path, tmp_path / "state")
    async with tailer:
        await take(tailer, 9, sink)
        os.truncate(path, len(lines(1, 4)) + 2)  # inside record 4's line
        tailer._scan(0.0)
        append(path, lines(20, 25))
        await take(tailer, 13, sink)
        gaps = tailer.gaps
    assert len(sink) == len(set(sink)) == 13
    assert set(sink) == set(range(1, 10)) | set(range(21, 25))  # 20 glued onto the cut line
    assert gaps == 1


@pytest.mark.asyncio
async def test_copytruncate_keeps_reading_the_same_path(tmp_path: Path) -> None:
    path, sink = tmp_path / "a.csv", list[int]()
    path.write_bytes(lines(0, 80))
    async with tail(path, tmp_path / "state") as tailer:
        await take(tailer, 80, sink)
        shutil.copyfile(path, tmp_path / "a.csv.1")  # the copy is not read again
        os.truncate(path, 0)
        await asyncio.gather(
            asyncio.to_thread(write_in_pieces, path, lines(80, 200), 3), take(tailer, 200, sink)
        )
    exactly_once(sink, range(200))


async def consume(tailer: FileTailer, sink: list[int], drop_after: int | None) -> None:
    """Take and commit batches; with ``drop_after``, take one more batch and die before
    taking it in (it was handed on, never committed: it must come again after a restart)."""
    goal = None if drop_after is None else len(sink) + drop_after
    async for batch in tailer:
        if goal is not None and len(sink) >= goal:
            return
        sink.extend(ids(batch))
        await tailer.commit(batch)


@pytest.mark.asyncio
async def test_kill_and_restart_delivers_every_record_exactly_once(tmp_path: Path) -> None:
    path, state, sink = tmp_path / "a.csv", tmp_path / "state", list[int]()
    rng = np.random.default_rng(5)
    payload = lines(0, 3000)
    writer = asyncio.ensure_future(asyncio.to_thread(write_in_pieces, path, payload, 4, 0.7))
    for round_ in range(12):  # at most 12 * (150 + one batch) < 3000 records before the end
        tailer = tail(path, state, chunk_size=512, fsync=True)
        step = int(rng.integers(10, 150))
        if round_ % 2:
            await asyncio.wait_for(consume(tailer, sink, step), 15)
        else:
            goal = len(sink) + step
            task = asyncio.ensure_future(consume(tailer, sink, None))
            await wait_until(lambda: len(sink) >= goal, 15)  # noqa: B023 (awaited right here)
            task.cancel()  # killed wherever it is: inside __anext__ or between batches
            with pytest.raises(asyncio.CancelledError):
                await task
        tailer.close()
    await writer
    async with tail(path, state, chunk_size=512, fsync=True) as tailer:
        await take(tailer, 3000, sink)
    exactly_once(sink, range(3000))


@pytest.mark.asyncio
async def test_a_cancelled_next_loses_and_repeats_no_batch(tmp_path: Path) -> None:
    """The chaos consumer times out ``anext`` (``asyncio.wait_for``), which cancels
    ``__anext__`` where it waits. Cancelled after each number of its steps (before it ran,
    with a batch ready, after a poll, in the sleep between polls), it either returned a batch
    or took none: every record is taken exactly once."""
    path = tmp_path / "a.csv"
    (tmp_path / "a.csv.1").write_bytes(lines(0, 3))
    path.write_bytes(lines(3, 5))  # one poll reads both files: a batch waits after the first
    sink: list[int] = []
    async with tail(path, tmp_path / "state", poll_interval=3600.0) as tailer:
        for steps in range(6):
            if steps % 2:
                append(path, lines(5 + steps, 6 + steps))
            task = asyncio.ensure_future(anext(tailer))
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):  # or it returned a batch
                sink += ids(await task)
        while len(sink) < 8:  # 0..4, 6, 8, 10; a lost batch never comes (the wait fails)
            sink += ids(await asyncio.wait_for(anext(tailer), 10))
        assert not tailer._ready
    assert sorted(sink) == [0, 1, 2, 3, 4, 6, 8, 10]


@pytest.mark.asyncio
async def test_restart_after_rotation_finds_the_old_file_by_inode(tmp_path: Path) -> None:
    path, state, sink = tmp_path / "a.csv", tmp_path / "state", list[int]()
    path.write_bytes(lines(0, 50))
    async with tail(path, state) as tailer:
        await take(tailer, 50, sink)
    append(path, lines(50, 60))  # written while no tailer runs
    os.rename(path, tmp_path / "a.csv.1")
    path.write_bytes(lines(60, 100))
    async with tail(path, state) as tailer:
        await take(tailer, 100, sink)
    exactly_once(sink, range(100))


@pytest.mark.asyncio
async def test_file_replaced_in_place_while_down_is_read_from_zero(tmp_path: Path) -> None:
    path, state, sink = tmp_path / "a.csv", tmp_path / "state", list[int]()
    path.write_bytes(lines(0, 50))
    async with tail(path, state) as tailer:
        await take(tailer, 50, sink)
    inode = path.stat().st_ino
    with path.open("r+b") as handle:  # truncate and regrow past the old offset, same inode
        handle.truncate(0)
        handle.write(lines(1000, 1100))
    assert path.stat().st_ino == inode
    sink.clear()
    async with tail(path, state) as tailer:
        await take(tailer, 100, sink)
    exactly_once(sink, range(1000, 1100))


@pytest.mark.asyncio
async def test_msgpack_stream_in_random_pieces(tmp_path: Path) -> None:
    path, sink = tmp_path / "a.msgpack", list[int]()
    payload = b"".join(msgpack.packb([float(i), 0.25]) for i in range(1500))
    payload = payload[:9000] + b"\xc1" + payload[9000:]
    tailer = tail(path, tmp_path / "state", decoder=MsgpackDecoder(SCHEMA))
    async with tailer:
        await asyncio.gather(
            asyncio.to_thread(write_in_pieces, path, payload, 6), take(tailer, 1500, sink)
        )
    exactly_once(sink, range(1500))


@pytest.mark.asyncio
async def test_commit_is_monotonic_and_refuses_foreign_batches(tmp_path: Path) -> None:
    path, state = tmp_path / "a.csv", tmp_path / "state"
    path.write_bytes(lines(0, 3))
    other = tail(path, tmp_path / "other", chunk_size=8)
    async with tail(path, state, chunk_size=8) as tailer:
        first, second = await anext(tailer), await anext(tailer)
        assert (ids(first), ids(second)) == ([0], [1])
        await tailer.commit(second)
        saved = load_state(state)
        assert saved == tailer.committed and saved.files[0].offset == second.records.end
        await tailer.commit(first)  # older: nothing changes
        assert load_state(state) == saved
        with pytest.raises(ValueError, match="not from this tailer"):
            await other.commit(first)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "state"]


def test_state_file_round_trip_and_corruption(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert load_state(state) is None
    saved = TailState((FileState(1, 2, b"ab", 3, b"b", True, False, "x"),), 4, 5, 1, 7)
    save_state(state, saved)
    assert load_state(state) == saved
    state.write_text("{not json")
    with pytest.raises(ValueError, match="state_path"):
        load_state(state)


def test_tailer_arguments_are_checked(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with pytest.raises(ValueError, match="poll_interval"):
        FileTailer(tmp_path / "a.csv", SCHEMA, state, poll_interval=-1)
    with pytest.raises(ValueError, match="chunk_size"):
        FileTailer(tmp_path / "a.csv", SCHEMA, state, chunk_size=0)
    with pytest.raises(ValueError, match="fmt"):
        FileTailer(tmp_path / "a.npy", SCHEMA, state)


def rotate(path: Path) -> None:
    """A rename rotation: x.N -> x.N+1 for every rotated name, then x -> x.1."""
    rotated = sorted((int(p.name.rsplit(".", 1)[1]), p) for p in path.parent.glob(path.name + ".*"))
    for n, p in reversed(rotated):
        os.rename(p, path.with_name(f"{path.name}.{n + 1}"))
    if path.exists():
        os.rename(path, path.with_name(path.name + ".1"))


@pytest.mark.asyncio
async def test_two_rotations_between_polls_and_while_down_lose_no_file(tmp_path: Path) -> None:
    path, state, sink = tmp_path / "a.csv", tmp_path / "state", list[int]()
    path.write_bytes(lines(0, 10))
    async with tail(path, state) as tailer:
        await take(tailer, 10, sink)
        append(path, lines(10, 20))
        rotate(path)  # a.csv -> a.csv.1
        path.write_bytes(lines(20, 30))
        rotate(path)  # a.csv.1 -> a.csv.2, a.csv -> a.csv.1: both before the next poll
        path.write_bytes(lines(30, 40))
        await take(tailer, 40, sink)
    append(path, lines(40, 50))  # while no tailer runs
    rotate(path)
    path.write_bytes(lines(50, 60))
    rotate(path)
    async with tail(path, state) as tailer:
        await take(tailer, 60, sink)
    exactly_once(sink, range(60))


@pytest.mark.asyncio
async def test_half_written_last_record_of_a_rotated_file_is_a_reject(tmp_path: Path) -> None:
    path, sink, rejects_path = tmp_path / "a.csv", list[int](), tmp_path / "rejects.jsonl"
    path.write_bytes(lines(0, 5) + b"370.2")
    tailer = tail(path, tmp_path / "state", rotate_wait=0.05, rejects=rejects_path)
    async with tailer:
        await take(tailer, 5, sink)
        rotate(path)
        path.write_bytes(lines(5, 10))
        await take(tailer, 10, sink)
        while not tailer.committed.rejects_count:
            await tailer.commit(await asyncio.wait_for(anext(tailer), 10))
    exactly_once(sink, range(10))
    (entry,) = read_rejects(rejects_path)
    assert (entry["reason"], entry["raw"], entry["offset"]) == (TRUNCATED, "370.2", 30)


@pytest.mark.asyncio
async def test_copytruncate_regrow_and_rename_while_down(tmp_path: Path) -> None:
    path, state, sink = tmp_path / "a.csv", tmp_path / "state", list[int]()
    path.write_bytes(lines(0, 50))
    async with tail(path, state) as tailer:
        await take(tailer, 50, sink)
    append(path, lines(50, 70))  # not read before the copy
    shutil.copyfile(path, tmp_path / "a.csv.1")
    os.truncate(path, 0)
    append(path, lines(70, 150))  # regrown past the old offset
    rotate(path)  # a.csv.1 (the copy) -> a.csv.2, a.csv -> a.csv.1
    path.write_bytes(lines(150, 160))
    async with tail(path, state) as tailer:
        await take(tailer, 160, sink)
    exactly_once(sink, range(160))


@pytest.mark.asyncio
async def test_rejects_written_before_a_crash_are_cut_back_not_repeated(tmp_path: Path) -> None:
    path, state, rejects_path = tmp_path / "a.csv", tmp_path / "state", tmp_path / "r.jsonl"
    path.write_bytes(lines(0, 3) + b"bad,1\n" + lines(3, 6) + b"1,2,3\n")
    async with tail(path, state, rejects=rejects_path, chunk_size=24) as tailer:
        batches = [await anext(tailer) for _ in range(2)]
        await tailer.commit(batches[0])
        committed = rejects_path.stat().st_size
        # the crash: rejects of the next batch appended, the state not yet replaced
        tailer._writer.write(str(path), batches[1].records.rejects, 99)  # type: ignore[union-attr]
    assert rejects_path.stat().st_size > committed
    sink: list[int] = []
    async with tail(path, state, rejects=rejects_path) as tailer:
        assert rejects_path.stat().st_size == committed
        await take(tailer, 6 - sum(len(b) for b in batches[:1]), sink)
    entries = read_rejects(rejects_path)
    assert [(e["raw"], e["seq"]) for e in entries] == [("bad,1", 0), ("1,2,3", 1)]

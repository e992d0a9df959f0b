"""File tailer: partial lines, garbage, rotation, truncation, copytruncate, kill and restart.

Records carry a unique id in their first feature; every test checks that each valid record is
delivered exactly once (sorted ids equal the written ids, no duplicates). Writers run
concurrently (a thread, or a coroutine interleaved with the tailer); every wait is bounded.
"""

from __future__ import annotations

import asyncio
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
    Position,
    RejectsWriter,
    Schema,
    load_position,
    read_rejects,
    save_position,
)
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
    watch: bool = False,
    rejects: RejectsWriter | None = None,
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
        watch=watch,
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
        assert ids(first) == [1] and first.position.offset == 4
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
    with RejectsWriter(rejects_path) as rejects:
        tailer = tail(path, tmp_path / "state", rejects=rejects)
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
    position = load_position(tmp_path / "state")
    assert position is not None and position.inode == path.stat().st_ino


@pytest.mark.asyncio
async def test_truncation_restarts_at_zero_and_rejects_the_held_partial(tmp_path: Path) -> None:
    path, sink, rejects_path = tmp_path / "a.csv", list[int](), tmp_path / "rejects.jsonl"
    path.write_bytes(lines(0, 50))
    with RejectsWriter(rejects_path) as rejects:
        tailer = tail(path, tmp_path / "state", rejects=rejects)
        async with tailer:
            await take(tailer, 50, sink)
            append(path, b"777,")
            pending = asyncio.ensure_future(anext(tailer))
            await wait_until(lambda: tailer.read_offset == path.stat().st_size)
            os.truncate(path, 0)
            marker = await asyncio.wait_for(pending, 10)
            assert len(marker) == 0 and marker.position.offset == 0
            assert [r.reason for r in marker.records.rejects] == [TRUNCATED]
            await tailer.commit(marker)
            append(path, lines(50, 120))
            await take(tailer, 120, sink)
    exactly_once(sink, range(120))
    (entry,) = read_rejects(rejects_path)
    assert entry["reason"] == TRUNCATED and entry["raw"] == "777,"
    assert entry["offset"] == len(lines(0, 50))


@pytest.mark.asyncio
async def test_copytruncate_keeps_reading_the_same_path(tmp_path: Path) -> None:
    path, sink = tmp_path / "a.csv", list[int]()
    path.write_bytes(lines(0, 80))
    async with tail(path, tmp_path / "state") as tailer:
        await take(tailer, 80, sink)
        pending = asyncio.ensure_future(anext(tailer))
        shutil.copyfile(path, tmp_path / "a.csv.1")
        os.truncate(path, 0)
        marker = await asyncio.wait_for(pending, 10)
        assert len(marker) == 0 and not marker.records.rejects
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
async def test_missing_file_is_awaited_and_watch_wakes_the_tailer(tmp_path: Path) -> None:
    path, sink = tmp_path / "a.csv", list[int]()
    async with tail(path, tmp_path / "state", poll_interval=30.0, watch=True) as tailer:
        pending = asyncio.ensure_future(take(tailer, 1, sink, timeout=20))
        for i in range(15):  # keep appending until the watcher (once started) sees a change
            await asyncio.sleep(0.5)
            if pending.done():
                break
            append(path, lines(i, i + 1))
        await asyncio.wait_for(pending, 5)
    assert sink == [0]


@pytest.mark.asyncio
async def test_commit_is_monotonic_and_refuses_foreign_batches(tmp_path: Path) -> None:
    path, state = tmp_path / "a.csv", tmp_path / "state"
    path.write_bytes(lines(0, 3))
    other = tail(path, tmp_path / "other", chunk_size=8)
    async with tail(path, state, chunk_size=8) as tailer:
        first, second = await anext(tailer), await anext(tailer)
        assert (ids(first), ids(second)) == ([0], [1])
        await tailer.commit(second)
        saved = load_position(state)
        assert saved == second.position == tailer.committed
        await tailer.commit(first)  # older: nothing changes
        assert load_position(state) == saved
        with pytest.raises(ValueError, match="not from this tailer"):
            await other.commit(first)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "state"]


def test_position_file_round_trip_and_corruption(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert load_position(state) is None
    position = Position(1, 2, 3, True, "ab")
    save_position(state, position)
    assert load_position(state) == position
    state.write_text("{not json")
    with pytest.raises(ValueError, match="state_path"):
        load_position(state)


def test_tailer_arguments_are_checked(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with pytest.raises(ValueError, match="poll_interval"):
        FileTailer(tmp_path / "a.csv", SCHEMA, state, poll_interval=-1)
    with pytest.raises(ValueError, match="chunk_size"):
        FileTailer(tmp_path / "a.csv", SCHEMA, state, chunk_size=0)
    with pytest.raises(ValueError, match="fmt"):
        FileTailer(tmp_path / "a.npy", SCHEMA, state)

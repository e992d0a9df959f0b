"""Generation identity of the tailer under interleavings the chaos test hits only by timing.

Each test drives :meth:`FileTailer._scan` by hand between file operations, so the order in
which the tailer sees the operations is fixed (no sleeps, no threads). Records carry a unique
id in their first feature.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from dpmarket.streams.records.files import CsvDecoder, Decoded, Schema
from dpmarket.streams.records.position import FileState, TailState, load_state, save_state
from dpmarket.streams.records.tail import FileTailer

SCHEMA = Schema.box(2, 0.0, 1e6)


def lines(ids: range) -> bytes:
    return b"".join(f"{i},{i % 97}.5\n".encode() for i in ids)


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data)


def copytruncate_after_listing(
    monkeypatch: pytest.MonkeyPatch, path: Path, then: bytes = b""
) -> list[bool]:
    """At the next poll's look at ``path`` (``os.stat``, after it listed the directory):
    copy it to ``x.log.1``, empty it and write ``then``, so that poll sees the file emptied
    but not the copy. Returns a list that holds True once that happened."""
    real_stat, fired = os.stat, []

    def stat(name: str | Path | int, *, follow_symlinks: bool = True) -> os.stat_result:
        if name == path and not fired:
            fired.append(True)
            shutil.copyfile(path, path.with_name("x.log.1"))
            os.truncate(path, 0)
            append(path, then)
        return real_stat(name, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(os, "stat", stat)
    return fired


async def poll(tailer: FileTailer, polls: int = 1) -> list[tuple[int, int, str]]:
    """``polls`` scans; every batch is taken and committed; (id, offset, file name) each."""
    taken: list[tuple[int, int, str]] = []
    for _ in range(polls):
        tailer._scan(0.0)
        while tailer._ready:
            batch = tailer._ready.popleft()
            offsets = batch.records.offsets.tolist()
            for i, o in zip(batch.features[:, 0].tolist(), offsets, strict=True):
                taken.append((int(i), int(o), Path(batch.source).name))
            await tailer.commit(batch)
    return taken


@pytest.mark.asyncio
async def test_copytruncate_seen_with_a_torn_first_line_sharing_the_old_head(
    tmp_path: Path,
) -> None:
    """copytruncate, then the first line of the next generation written in two pieces, the
    first ("8") a prefix of the old generation's head ("84,..."), seen by a poll between the
    pieces. The copy must be adopted at the committed offset (84..87 never again) and the new
    generation read from 0 (88 at offset 0, no record invented from its torn line)."""
    path = tmp_path / "x.log"
    path.write_bytes(lines(range(84, 88)))
    state = tmp_path / "state"
    tailer = FileTailer(path, CsvDecoder(SCHEMA), state, pattern="x.log*", fsync=False)
    async with tailer:
        first = await poll(tailer)
        assert [i for i, _, _ in first] == [84, 85, 86, 87]
        shutil.copyfile(path, tmp_path / "x.log.1")
        os.truncate(path, 0)
        append(path, b"8")  # the torn first piece of "88,88.5\n"
        taken = await poll(tailer, 4)  # the second piece is slow to come
        append(path, b"8,88.5\n")
        taken += await poll(tailer, 6)
        append(path, lines(range(89, 91)))
        taken += await poll(tailer, 6)

    assert taken == [(88, 0, "x.log"), (89, 8, "x.log"), (90, 16, "x.log")]


@pytest.mark.asyncio
async def test_copy_adopted_without_the_held_partial_is_in_the_committed_state(
    tmp_path: Path,
) -> None:
    """A copy of an emptied file that lacks the tailer's held partial record: the batch with
    that partial's ``truncated`` reject is the first after the adoption; once it is committed,
    a restarted tailer must know the copy (84 is not read from it again)."""
    path, state = tmp_path / "x.log", tmp_path / "state"
    path.write_bytes(lines(range(84, 85)) + b"85,8")  # "85,8" not a record yet
    tailer = FileTailer(path, CsvDecoder(SCHEMA), state, pattern="x.log*", fsync=False)
    async with tailer:
        assert await poll(tailer) == [(84, 0, "x.log")]
        (tmp_path / "x.log.1").write_bytes(lines(range(84, 85)))  # copied before "85,8" came
        os.truncate(path, 0)
        assert await poll(tailer) == []  # adopted at 7; "85,8" a truncated reject, committed
    restarted = FileTailer(path, CsvDecoder(SCHEMA), state, pattern="x.log*", fsync=False)
    async with restarted:
        append(path, lines(range(86, 87)))
        assert await poll(restarted, 3) == [(86, 0, "x.log")]


def test_the_cut_flag_survives_a_restart_and_old_states_load(tmp_path: Path) -> None:
    """A doubtful generation is told apart after a restart too: its ``cut`` is persisted;
    a state written before the flag existed loads with ``cut`` false."""
    path = tmp_path / "state"
    files = (FileState(1, 2, b"8", 1, b"8", source="x.log", cut=True), FileState(1, 3, b"", 0))
    save_state(path, TailState(files), fsync=False)
    assert load_state(path) == TailState(files)
    raw = json.loads(path.read_text())
    del raw["files"][0]["cut"]
    path.write_text(json.dumps(raw))
    loaded = load_state(path)
    assert loaded is not None and [f.cut for f in loaded.files] == [False, False]


@pytest.mark.asyncio
async def test_copytruncate_between_the_checks_and_the_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer copytruncates (and writes the next generation's first line) after a poll
    checked the file and before it read the new bytes: the bytes read then are not the
    generation's, and the bytes before the offset must not be taken from the new content (the
    copy would no longer match and be read from 0: 84..87 again, already committed)."""
    path = tmp_path / "x.log"
    path.write_bytes(lines(range(84, 88)))
    cut = path.stat().st_size
    tailer = FileTailer(path, CsvDecoder(SCHEMA), tmp_path / "state", pattern="x.log*",
                        fsync=False)  # fmt: skip
    real_pread, fired = os.pread, []

    def pread(fd: int, n: int, offset: int) -> bytes:
        if offset == cut and n > 0 and not fired:  # the read of the bytes after 87
            fired.append(True)
            shutil.copyfile(path, tmp_path / "x.log.1")
            os.truncate(path, 0)
            append(path, lines(range(123, 124)))
        return real_pread(fd, n, offset)

    async with tailer:
        assert await poll(tailer) == [(84, 0, "x.log"), (85, 8, "x.log"), (86, 16, "x.log"),
                                      (87, 24, "x.log")]  # fmt: skip
        append(path, lines(range(88, 91)))
        monkeypatch.setattr(os, "pread", pread)
        taken = await poll(tailer, 5)
        monkeypatch.undo()
        assert fired
    assert sorted(taken) == [(88, 32, "x.log.1"), (89, 40, "x.log.1"), (90, 48, "x.log.1"),
                             (123, 0, "x.log")]  # fmt: skip


class CopytruncateWhileDecoding(CsvDecoder):
    """A CSV decoder during whose first decode the writer copytruncates ``path`` (and, if
    ``regrow``, writes the next generation's first line): the bytes being decoded were read
    before the copy, the tailer's checks after the read see the emptied file."""

    def __init__(self, path: Path, regrow: bool) -> None:
        super().__init__(SCHEMA)
        self.path, self.regrow, self.fired = path, regrow, False

    def decode(
        self, data: bytes, base_offset: int = 0, *, final: bool = False, mid_record: bool = False
    ) -> Decoded:
        if not self.fired:
            self.fired = True
            shutil.copyfile(self.path, self.path.with_name("x.log.1"))
            os.truncate(self.path, 0)
            if self.regrow:
                append(self.path, lines(range(123, 124)))
        return super().decode(data, base_offset, final=final, mid_record=mid_record)


@pytest.mark.asyncio
@pytest.mark.parametrize("polls_before_regrowth", [None, 0, 1])
async def test_copytruncate_between_the_read_and_the_checks_after_it(
    tmp_path: Path, polls_before_regrowth: int | None
) -> None:
    """The chaos test's duplicate: the writer copytruncates after a poll read the new bytes and
    before it checked the file again (here: while they are decoded). The emptied file passed
    every check (an empty head is a prefix of any) and the new mark was read from it, empty, so
    the copy no longer matched the orphan and was read from 0: 84..87 delivered twice. They must
    be delivered once, at their offsets, and the next generation's line from 0, whether that
    line was written during the decode (``None``: the head check always caught that), before the
    next poll (0), or after a poll that saw the emptied file beside its copy (1)."""
    path = tmp_path / "x.log"
    path.write_bytes(lines(range(84, 88)))
    decoder = CopytruncateWhileDecoding(path, regrow=polls_before_regrowth is None)
    tailer = FileTailer(path, decoder, tmp_path / "state", pattern="x.log*", fsync=False)
    async with tailer:
        taken = await poll(tailer)
        assert decoder.fired
        if polls_before_regrowth is not None:
            taken += await poll(tailer, polls_before_regrowth)
            append(path, lines(range(123, 124)))
        taken += await poll(tailer, 5)
    assert sorted(taken) == [(84, 0, "x.log.1"), (85, 8, "x.log.1"), (86, 16, "x.log.1"),
                             (87, 24, "x.log.1"), (123, 0, "x.log")]  # fmt: skip


@pytest.mark.asyncio
@pytest.mark.parametrize("name", ["own[1].csv", "own*.csv", "own?.csv"])
async def test_a_file_name_with_glob_characters_is_a_name(tmp_path: Path, name: str) -> None:
    """Issue 28: ``own[1].csv`` was taken as a glob (matching ``own1.csv``) and never read.
    With the default pattern the file and its rotated sibling are read, and a file that the
    name would match as a pattern (``own1.csv``, ``own-x.csv``) is not."""
    path = tmp_path / name
    path.write_bytes(lines(range(0, 3)))
    for other in ("own1.csv", "own-x.csv", "owna.csv"):
        (tmp_path / other).write_bytes(lines(range(100, 103)))
    tailer = FileTailer(path, CsvDecoder(SCHEMA), tmp_path / "state", fsync=False)
    async with tailer:
        first = await poll(tailer)
        os.rename(path, tmp_path / f"{name}.1")
        path.write_bytes(lines(range(3, 5)))
        append(tmp_path / f"{name}.1", lines(range(5, 6)))
        second = await poll(tailer)
    assert sorted(i for i, _, _ in first + second) == list(range(6))
    assert {n for _, _, n in first + second} == {name, f"{name}.1"}


@pytest.mark.asyncio
async def test_lines_appended_after_a_rotated_files_partial_was_rejected_are_read(
    tmp_path: Path,
) -> None:
    """A rotated file idle with a partial last record: the partial becomes a ``truncated``
    reject, and lines appended to that file afterwards are read as new lines (module
    docstring). Before, the reject moved the offset past the partial but left the mark before
    it: the next poll saw the file "rewritten", counted a gap and skipped the next line (7)."""
    path, state = tmp_path / "x.log", tmp_path / "state"
    path.write_bytes(lines(range(5)) + b"370.2")  # "370.2": no newline, not a record yet
    tailer = FileTailer(
        path, CsvDecoder(SCHEMA), state, pattern="x.log*", fsync=False, rotate_wait=0.0
    )
    async with tailer:
        assert [i for i, _, _ in await poll(tailer)] == [0, 1, 2, 3, 4]
        rotated = tmp_path / "x.log.1"
        os.rename(path, rotated)
        assert await poll(tailer, 3) == []  # idle, rotated: the partial is a reject
        append(rotated, lines(range(7, 9)))
        taken = await poll(tailer, 3)
        assert [i for i, _, _ in taken] == [7, 8]
        assert tailer.gaps == 0


@pytest.mark.asyncio
async def test_copy_of_an_orphan_is_not_taken_for_a_copy_of_a_torn_first_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A way to the chaos test's duplicate (seed 7: record 1 taken twice, both committed). The
    writer copytruncates after a poll listed the directory and before it looked at x.log: that poll
    sees x.log emptied (its generation, 1..11, an orphan) but not the copy. The next record,
    12, is written in two pieces; the next polls see x.log holding "1" beside the copy of
    1..11, which also starts with "1". A live generation that holds nothing but that torn
    piece is no evidence that the copy is a copy of it being made (the orphan's head and mark
    are much more): the copy is adopted at the orphan's offset, 1..11 never again."""
    path = tmp_path / "x.log"
    path.write_bytes(lines(range(1, 12)))
    tailer = FileTailer(path, CsvDecoder(SCHEMA), tmp_path / "state", pattern="x.log*",
                        fsync=False)  # fmt: skip
    async with tailer:
        assert [i for i, _, _ in await poll(tailer)] == list(range(1, 12))
        fired = copytruncate_after_listing(monkeypatch, path)
        taken = await poll(tailer)
        monkeypatch.undo()
        assert fired
        append(path, b"1")  # the torn first piece of "12,12.5\n", slow to be completed
        taken += await poll(tailer, 4)
        append(path, b"2,12.5\n")
        taken += await poll(tailer, 4)
    assert taken == [(12, 0, "x.log")]


@pytest.mark.asyncio
async def test_a_copy_is_taken_for_the_generation_it_repeats_furthest(tmp_path: Path) -> None:
    """A file emptied while its first line was torn ("1" of 15) leaves an orphan that only
    knows "1"; the next generation (17, 18) starts with "1" too and is copytruncated while
    that orphan lives. The copy, also starting with "1", is a copy of the live generation
    being made (left alone), then of its orphan (adopted at 16), never of the torn orphan
    (adopted at 0: 17 and 18 again)."""
    path = tmp_path / "x.log"
    path.write_bytes(b"1")
    tailer = FileTailer(path, CsvDecoder(SCHEMA), tmp_path / "state", pattern="x.log*",
                        fsync=False)  # fmt: skip
    async with tailer:
        taken = await poll(tailer)  # "1" held
        os.truncate(path, 0)
        taken += await poll(tailer)  # emptied: the generation holding "1" is an orphan
        append(path, lines(range(17, 19)))
        taken += await poll(tailer)
        shutil.copyfile(path, tmp_path / "x.log.1")
        taken += await poll(tailer)  # the copy is being made: x.log not yet emptied
        os.truncate(path, 0)
        taken += await poll(tailer, 4)
    assert taken == [(17, 0, "x.log"), (18, 8, "x.log")]


@pytest.mark.asyncio
async def test_a_copy_in_progress_of_a_generation_read_past_an_orphans_offset_is_left_alone(
    tmp_path: Path,
) -> None:
    """A file cut in place at its read offset (past the 256 bytes of its head) while a partial
    line past it was held: the generation before the cut is an orphan at the cut (its mark
    still matches), the one after it reads on from there. Records appended, then a
    copytruncate seen while the copy holds only part of the file (more than the orphan's
    offset, less than the live generation's): the copy is the live generation's, being made,
    not the orphan's (adopting it at the cut would deliver the records past it again); once
    the file is emptied it is adopted at the live generation's offset. Every record is taken
    once."""
    path = tmp_path / "x.log"
    head = lines(range(100, 160)) + lines(range(1000, 1013))
    cut = len(head)
    assert cut > 256
    path.write_bytes(head + b"1013,4")  # a partial line past the read offset
    tailer = FileTailer(path, CsvDecoder(SCHEMA), tmp_path / "state", pattern="x.log*",
                        fsync=False)  # fmt: skip
    async with tailer:
        taken = await poll(tailer)
        os.truncate(path, cut)  # the held partial "1013,4" cut off
        taken += await poll(tailer)
        append(path, lines(range(2000, 2140)))
        taken += await poll(tailer, 2)
        size = path.stat().st_size
        (tmp_path / "x.log.1").write_bytes(path.read_bytes()[: cut + 400])  # the copy, partly
        taken += await poll(tailer)
        shutil.copyfile(path, tmp_path / "x.log.1")  # the copy done, the file emptied
        os.truncate(path, 0)
        taken += await poll(tailer, 5)
    ids = [i for i, _, _ in taken]
    assert size > cut + 400 and len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]
    assert ids == [*range(100, 160), *range(1000, 1013), *range(2000, 2140)]


@pytest.mark.asyncio
async def test_a_doubtful_cut_orphaned_before_its_copy_is_not_taken_for_the_next_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """copytruncate after a poll's listing, and the torn first piece ("1") of the next record
    written before the poll looks at x.log: it sees a cut in place at 1 byte (the generation of
    1..11 an orphan, a doubtful one after the cut). Then record 12 is completed and the file
    copytruncated again before the next poll: the doubtful generation is an orphan too when
    the first copy is adopted, and must not then claim the second copy (adopted at 1 byte,
    it skipped record 12's rest: record 12 lost). Every record is taken once."""
    path = tmp_path / "x.log"
    path.write_bytes(lines(range(1, 12)))
    tailer = FileTailer(path, CsvDecoder(SCHEMA), tmp_path / "state", pattern="x.log*",
                        fsync=False)  # fmt: skip
    async with tailer:
        taken = await poll(tailer)
        # then the torn first piece of "12,12.5\n"
        fired = copytruncate_after_listing(monkeypatch, path, b"1")
        taken += await poll(tailer)
        monkeypatch.undo()
        assert fired
        append(path, b"2,12.5\n")
        os.rename(tmp_path / "x.log.1", tmp_path / "x.log.2")
        shutil.copyfile(path, tmp_path / "x.log.1")
        os.truncate(path, 0)
        taken += await poll(tailer, 6)
    assert sorted(i for i, _, _ in taken) == list(range(1, 13))

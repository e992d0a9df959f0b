"""Chaos test of the tailer (issue 14, item 4): randomised rotations, copytruncate, truncation
to zero, regrowth, torn writes and SIGKILL restarts, with fixed seeds.

The test is the writer: it appends ``id,value`` CSV lines (unique ids; some lines bad, with
unique ids too) to ``x.log`` and between records randomly renames the rotation chain (``x.log
-> x.log.1 -> x.log.2 ...``, sometimes twice in a row, faster than the poll), copytruncates,
truncates to zero (that generation's unread records may be lost), writes a record in two pieces,
and SIGKILLs the tailer process (tests/streams/records/chaos_tailer.py, a fork server) by its
PID, restarting it from its state at once or after some more writes. Sleeps only drive the
scenario. At the end, with the writer done and the tailer caught up and exited:

* every valid record of every generation not truncated is taken exactly once, with the byte
  offset it was written at, and one of a truncated generation at most once;
* a record taken again was, the first time, after its incarnation's last commit (the consumer
  writes records, commits, then writes a commit marker, so a kill may redeliver only those);
* every bad line of a generation not truncated is in the rejects file exactly once, at its
  offset; a ``truncated`` reject is a prefix of a line of a truncated generation at its offset;
* no record or reject that was never written appears.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpmarket.streams.records.files import TRUNCATED, read_rejects

HELPER = Path(__file__).with_name("chaos_tailer.py")
SEEDS = range(22)


@dataclass
class Line:
    gen: int
    offset: int
    data: bytes
    valid: bool


class ForkServer:
    """The helper process that forks tailers on request (imports paid once)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HELPER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def spawn(self, directory: Path, incarnation: int, seed: int) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{directory} {incarnation} {seed}\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def forkserver() -> Iterator[ForkServer]:
    server = ForkServer()
    yield server
    server.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def kill(pid: int) -> None:
    """SIGKILL one tailer by its PID and wait (bounded) until it is gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while alive(pid):
        assert time.monotonic() < deadline, f"tailer {pid} survived SIGKILL"
        time.sleep(0.002)


class Writer:
    """Appends lines to ``x.log``, rotates, copytruncates and truncates; knows every line."""

    def __init__(self, directory: Path, rng: random.Random) -> None:
        self.dir, self.rng = directory, rng
        self.path = directory / "x.log"
        self.lines: dict[int, Line] = {}
        self.gen, self.size, self.next_id = 0, 0, 1
        self.truncated: set[int] = set()
        self.ops: dict[str, int] = {}
        # lines whose loss the bytes cannot avoid: the first line written after a truncation
        # to zero, torn, its first piece repeating the emptied file's first bytes (a poll
        # between the pieces sees a truncation in place; tail.py "Limits")
        self.ambiguous: set[int] = set()
        self.emptied: bytes | None = None

    def count(self, op: str) -> None:
        self.ops[op] = self.ops.get(op, 0) + 1

    def append(self) -> None:
        i, self.next_id = self.next_id, self.next_id + 1
        roll = self.rng.random()
        valid = roll >= 0.12
        data = (
            f"{i},{self.rng.randrange(10**5)}.{self.rng.randrange(100)}\n"
            if valid
            else f"{i},bad{i}\n"
            if roll < 0.06
            else f"{i}\n"
        ).encode()
        self.lines[i] = Line(self.gen, self.size, data, valid)
        emptied, self.emptied = self.emptied, None
        if self.rng.random() < 0.12:  # a torn write: two pieces, the tailer may poll between
            cut = self.rng.randrange(1, len(data))
            if emptied is not None and emptied.startswith(data[:cut]):
                self.ambiguous.add(i)
            self._write(data[:cut])
            time.sleep(self.rng.random() * 0.03)
            self._write(data[cut:])
            self.count("torn")
        else:
            self._write(data)
        self.size += len(data)

    def _write(self, data: bytes) -> None:
        with self.path.open("ab") as f:
            f.write(data)

    def _shift(self) -> None:
        names = sorted(
            (int(p.name.rsplit(".", 1)[1]) for p in self.dir.glob("x.log.*")), reverse=True
        )
        for n in names:
            os.rename(self.dir / f"x.log.{n}", self.dir / f"x.log.{n + 1}")

    def rotate(self) -> None:
        if not self.path.exists():
            return
        self._shift()
        os.rename(self.path, self.dir / "x.log.1")
        self.gen, self.size, self.emptied = self.gen + 1, 0, None
        self.count("rotate")

    def copytruncate(self) -> None:
        if self.size == 0:
            return
        self._shift()
        shutil.copyfile(self.path, self.dir / "x.log.1")
        os.truncate(self.path, 0)
        self.gen, self.size, self.emptied = self.gen + 1, 0, None
        self.count("copytruncate")

    def truncate(self) -> None:
        if self.size == 0:
            return
        self.emptied = self.path.read_bytes()
        os.truncate(self.path, 0)
        self.truncated.add(self.gen)
        self.gen, self.size = self.gen + 1, 0
        self.count("truncate")


def taken(directory: Path, incarnations: int) -> dict[int, list[tuple[int, bool]]]:
    """id -> [(offset, committed for sure)] in delivery order over all incarnations."""
    seen: dict[int, list[tuple[int, bool]]] = {}
    for n in range(incarnations):
        path = directory / f"out.{n}"
        if not path.exists():
            continue
        entries = [
            json.loads(t) for t in path.read_text().splitlines(keepends=True) if t[-1:] == "\n"
        ]
        last = max((k for k, e in enumerate(entries) if "c" in e), default=-1)
        for k, e in enumerate(entries):
            if "i" in e:
                assert Path(e["s"]).name.startswith("x.log"), e
                seen.setdefault(e["i"], []).append((e["o"], k < last))
    return seen


@pytest.mark.parametrize("seed", SEEDS)
def test_tailer_chaos(seed: int, tmp_path: Path, forkserver: ForkServer) -> None:
    rng = random.Random(seed)
    writer = Writer(tmp_path, rng)
    incarnation, pid, kills = 0, forkserver.spawn(tmp_path, 0, seed), 0
    n_records = rng.randrange(100, 300)
    down_for = 0
    while writer.next_id <= n_records:
        roll = rng.random()
        if roll < 0.04:
            writer.rotate()
            if rng.random() < 0.5:  # renamed twice before the tailer looked
                writer.append()
                writer.rotate()
        elif roll < 0.065:
            writer.copytruncate()
        elif roll < 0.085:
            writer.truncate()
        elif roll < 0.11 and pid:
            kill(pid)
            kills += 1
            incarnation += 1
            pid = 0
            down_for = rng.choice([0, 0, rng.randrange(1, 15)])
        else:
            writer.append()
        if not pid:
            if down_for <= 0:
                pid = forkserver.spawn(tmp_path, incarnation, seed * 1000 + incarnation)
            down_for -= 1
        if rng.random() < 0.3:
            time.sleep(rng.random() * 0.02)
    if not pid:
        pid = forkserver.spawn(tmp_path, incarnation, seed * 1000 + incarnation)
    (tmp_path / "done").write_text("")
    deadline = time.monotonic() + 30
    while alive(pid):
        assert time.monotonic() < deadline, "the tailer did not catch up and exit"
        time.sleep(0.02)
    errors = [p.read_text() for p in tmp_path.glob("error.*")]
    assert not errors, errors[0]
    assert (tmp_path / f"exit.{incarnation}").exists(), "the last tailer failed"

    lines = writer.lines
    lost_ok = writer.truncated
    seen = taken(tmp_path, incarnation + 1)
    for i, deliveries in seen.items():
        assert i in lines and lines[i].valid, f"record {i} was never written as valid"
        offsets = {o for o, _ in deliveries}
        assert offsets == {lines[i].offset}, f"record {i} at {offsets}, written at {lines[i]}"
        assert not any(c for _, c in deliveries[:-1]), f"record {i} taken twice: {deliveries}"
    for i, line in lines.items():
        if line.valid and line.gen not in lost_ok and i not in writer.ambiguous:
            assert i in seen, f"record {i} of generation {line.gen} was lost ({writer.ops})"

    rejects = (
        read_rejects(tmp_path / "rejects.jsonl") if (tmp_path / "rejects.jsonl").exists() else []
    )
    bad_seen: dict[int, int] = {}
    for r in rejects:
        raw = str(r["raw"]).encode()
        if r["reason"] == TRUNCATED:
            assert any(
                line.gen in lost_ok and line.offset == r["offset"] and line.data.startswith(raw)
                for line in lines.values()
            ), f"truncated reject {r} of no truncated generation"
            continue
        i = int(raw.split(b",")[0])
        assert i in lines and not lines[i].valid, f"reject {r} of no bad line"
        assert r["offset"] == lines[i].offset and lines[i].data.startswith(raw), r
        bad_seen[i] = bad_seen.get(i, 0) + 1
    for i, line in lines.items():
        if not line.valid:
            want = {1} if line.gen not in lost_ok and i not in writer.ambiguous else {0, 1}
            assert bad_seen.get(i, 0) in want, f"bad line {i} rejected {bad_seen.get(i, 0)} times"

"""Running a study: its trials as Ray tasks (or serially), kept in an append-only results file.

``OUT/trials.jsonl`` holds one JSON line per finished trial (its cell's key, trial index,
public seed and what :func:`~dpmarket.actors.studies.trial.run_trial` returned), appended and
flushed as each batch of trials comes back. A rerun reads it first and skips every trial it
holds, so an interrupted study resumes where it stopped and an extended one (more trials,
more axis values) runs only what is new; a line cut short by a crash was never accepted and is
cut off before anything is appended. ``OUT/study.lock.json`` records the study's fingerprint
(its cells' market configs, timing, seed, data switch): results of a different study in the
same directory are refused (exit 2) rather than mixed into one table.

Trials run as Ray tasks (``ray.remote``, one CPU each) in batches, so every core of the local
machine, or of a cluster given by ``--address``, runs trials; ``serial`` runs them in this
process (tests, or machines without Ray). Progress goes to stderr: a tqdm bar when tqdm is
installed, a counter line otherwise.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dpmarket.actors.config.market import ConfigError
from dpmarket.actors.studies.config import Cell, StudyConfig
from dpmarket.actors.studies.trial import run_trial, trial_seed

__all__ = ["RESULTS_FILE", "fingerprint", "read_results", "run_study", "todo"]

RESULTS_FILE = "trials.jsonl"
LOCK_FILE = "study.lock.json"

Work = tuple[str, int, int]  # (cell key, trial index, seed)


def fingerprint(study: StudyConfig) -> str:
    """SHA-256 of what decides the trials' outcomes (not ``trials``: more trials extend a study)."""
    record = {
        "seed": study.seed,
        "vary_data": study.vary_data,
        "timing": study.timing,
        "epoch_range": list(study.epoch_range),
        "configs": {k: c.public_record() | {"path": ""} for k, c in study.configs.items()},
    }
    text = json.dumps(record, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _check_lock(study: StudyConfig, out: Path) -> None:
    """Refuse results of another study in ``out``; record this one's fingerprint. A study with
    more axis values or trials than the recorded one extends it (its cells' keys are new)."""
    lock, mine = out / LOCK_FILE, fingerprint(study)
    cells = {c.key: fingerprint_cell(study, c) for c in study.cells}
    if lock.exists():
        held = json.loads(lock.read_text(encoding="utf-8"))
        clash = sorted(k for k, f in cells.items() if held.get("cells", {}).get(k, f) != f)
        if clash:
            raise ConfigError(
                f"{out}: holds results of a different study for cells {clash[:3]} (base config, "
                "seed, timing or data changed); choose another --out"
            )
        cells = held.get("cells", {}) | cells
    lock.write_text(json.dumps({"study": mine, "cells": cells}, indent=1), encoding="utf-8")


def fingerprint_cell(study: StudyConfig, cell: Cell) -> str:
    config = study.configs[cell.key].public_record() | {"path": ""}
    record = [study.seed, study.vary_data, study.timing, list(study.epoch_range), config]
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def read_results(out: Path, repair: bool = False) -> list[dict[str, Any]]:
    """Every complete line of ``out/trials.jsonl``; with ``repair`` a trailing partial line (a
    crash mid-write) is cut off so that appends start on a line of their own."""
    path = out / RESULTS_FILE
    if not path.exists():
        return []
    raw = path.read_bytes()
    end = raw.rfind(b"\n") + 1
    if repair and end < len(raw):
        with path.open("r+b") as fh:
            fh.truncate(end)
    rows = []
    for number, line in enumerate(raw[:end].splitlines(), 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{number}: not a results line ({exc})") from None
    return rows


def todo(study: StudyConfig, done: list[dict[str, Any]]) -> list[Work]:
    """The trials of ``study`` not in ``done``, cell by cell."""
    have = {(r["cell"], int(r["trial"])) for r in done}
    return [
        (cell.key, t, trial_seed(study.seed, cell.key, t))
        for cell in study.cells
        for t in range(study.trials)
        if (cell.key, t) not in have
    ]


def _run_batch(study: StudyConfig, batch: list[Work]) -> list[dict[str, Any]]:
    cells = {c.key: c for c in study.cells}
    out = []
    for key, trial, seed in batch:
        result = run_trial(
            study.configs[key], cells[key], seed, study.timing, study.epoch_range, study.vary_data
        )
        out.append({"cell": key, "trial": trial, "seed": seed} | result)
    return out


def _task_batch(study: StudyConfig, batch: list[Work]) -> list[dict[str, Any]]:
    """:func:`_run_batch` as a Ray task of one CPU: the trial's numba kernels (RACE sketches)
    run on one thread, since every core already runs a trial (an owner's sketch with both cores
    busy: 7 ms on numba's default two threads, 0.2 ms on one)."""
    if importlib.util.find_spec("numba") is not None:  # a dependency; numpy kernels otherwise
        import numba

        numba.set_num_threads(1)
    return _run_batch(study, batch)


def _batches(work: list[Work], size: int) -> Iterator[list[Work]]:
    for i in range(0, len(work), size):
        yield work[i : i + size]


class Progress:
    """A bar over trials on stderr: tqdm when installed, else a counter line."""

    def __init__(self, total: int, done: int) -> None:
        self.total, self.done, self.start = total, done, time.perf_counter()
        self._bar: Any = None
        try:
            from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

            self._bar = tqdm(total=total, initial=done, unit="trial", file=sys.stderr)
        except ImportError:
            self._line()

    def update(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        else:
            self._line()

    def _line(self) -> None:
        rate = self.done / max(time.perf_counter() - self.start, 1e-9)
        print(f"\rtrials {self.done}/{self.total}  ({rate:.2f}/s)", end="", file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        else:
            print(file=sys.stderr)


def run_study(
    study: StudyConfig,
    out: Path,
    address: str | None = None,
    serial: bool = False,
    batch: int = 2,
    limit: int | None = None,
    connected: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every trial of ``study`` not yet in ``out``; return all results (old and new).
    ``limit`` stops after that many new trials (an interrupted study, for tests)."""
    out.mkdir(parents=True, exist_ok=True)
    _check_lock(study, out)
    done = read_results(out, repair=True)
    work = todo(study, done)[:limit]
    total = len(done) + len(work) if limit is not None else len(study.cells) * study.trials
    progress = Progress(total, total - len(work))
    try:
        with (out / RESULTS_FILE).open("a", encoding="utf-8") as fh:
            for rows in _execute(study, work, address, serial, batch, connected):
                for row in rows:
                    fh.write(json.dumps(row, allow_nan=True) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
                done.extend(rows)
                progress.update(len(rows))
    finally:
        progress.close()
    return done


def _execute(
    study: StudyConfig,
    work: list[Work],
    address: str | None,
    serial: bool,
    batch: int,
    connected: Callable[[dict[str, Any]], None] | None,
) -> Iterator[list[dict[str, Any]]]:
    """Batches of results as they finish: serially here, or as Ray tasks on every core."""
    if not work:
        return
    if serial:
        for chunk in _batches(work, batch):
            yield _run_batch(study, chunk)
        return
    import ray

    from dpmarket.actors.cluster.connect import connect

    info = connect(address)
    if connected is not None:
        connected(info)
    task = ray.remote(num_cpus=1, max_retries=1)(_task_batch)
    ref = ray.put(study)
    cpus = max(1, int(float(ray.cluster_resources().get("CPU", 1))))  # type: ignore[no-untyped-call]
    size = max(1, min(batch, math.ceil(len(work) / cpus)))
    pending = [task.remote(ref, chunk) for chunk in _batches(work, size)]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for r in ready:
            yield ray.get(r)

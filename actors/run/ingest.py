"""Ingest: owners follow their input files; a simulation can write those files while it runs.

For ``[data] source = "files"`` every owner actor tails its own files (paths relative to the
configuration file) and the curator reads the validation and seed files once. For a simulated
source with ``[data.stream]``, the harness writes each owner's records to ``OUT/data`` as CSV
(features, then the label): ``initial_fraction`` of them before the run, the rest appended in
``batches`` every ``interval`` seconds while the run goes on. Owners take new records in between
epochs; they become biddable at the next epoch.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from dpmarket.actors.config.market import ConfigError, MarketConfig
from dpmarket.actors.run.spawn import OwnerInputs
from dpmarket.streams.records.files import (
    CsvDecoder,
    RecordBatch,
    RejectsWriter,
    Schema,
    SchemaError,
    format_of,
    iter_records,
)
from dpmarket.streams.synthetic import Scenario, median_heuristic_gamma

__all__ = [
    "FileInputs",
    "StreamWriter",
    "file_inputs",
    "follow_ingest",
    "schema_of",
    "stream_files",
    "wait_for_ingest",
    "write_csv",
]

F64 = npt.NDArray[np.float64]


def schema_of(config: MarketConfig, n_features: int | None = None) -> Schema:
    """The public record schema: feature count, label column, bounds, policy."""
    d = config.data
    k = int(d.get("features", n_features or 0))
    lower, upper = d.get("lower", -1e6), d.get("upper", 1e6)
    try:
        return Schema(
            k,
            tuple(lower) if isinstance(lower, list) else (float(lower),) * k,
            tuple(upper) if isinstance(upper, list) else (float(upper),) * k,
            d.get("label_column", k if n_features is not None else None),
            d.get("policy", "clip"),
        )
    except SchemaError as exc:
        raise ConfigError(f"{config.path}: [data]: {exc}") from None


def csv_decoder(path: str | Path, schema: Schema, header: bool) -> CsvDecoder | None:
    """The decoder of a CSV file whose first line is a header (``None``: by the suffix)."""
    return CsvDecoder(schema, header=True) if header and format_of(path) == "csv" else None


def _read_all(
    path: Path, schema: Schema, header: bool, rejects_dir: Path
) -> tuple[F64, F64 | None, int]:
    """All records of a consumer's file; its rejects go to ``rejects_dir/rejects.jsonl``."""
    rejects_dir.mkdir(parents=True, exist_ok=True)
    with RejectsWriter(rejects_dir / "rejects.jsonl") as writer:
        decoder = csv_decoder(path, schema, header)
        batches = list(iter_records(path, schema, decoder=decoder, rejects=writer))
    batch = RecordBatch.concat(batches, schema) if batches else RecordBatch.empty(schema)
    if len(batch) == 0:
        raise ConfigError(f"{path}: no valid records")
    labels = None if batch.labels is None else np.asarray(batch.labels, dtype=np.float64)
    return np.asarray(batch.features, dtype=np.float64), labels, len(batch.rejects)


class FileInputs(NamedTuple):
    """A files market's start: owners (empty until they ingest), schema, each owner's paths,
    the kernel width, which files have a header line, and the consumer's files' reject counts."""

    owners: OwnerInputs
    schema: Schema
    files: dict[str, list[str]]
    gamma: float
    headers: dict[str, bool]
    rejects: dict[str, int]


def file_inputs(config: MarketConfig, headers: dict[str, bool], rejects_dir: Path) -> FileInputs:
    """Owners start empty and ingest their files; the curator's sets are read here, their bad
    lines written to ``rejects_dir/validation`` and ``rejects_dir/seed_set``."""
    schema = config.schema if config.schema is not None else schema_of(config)  # parsed once
    sets: dict[str, F64] = {}
    rejects: dict[str, int] = {}
    for key in ("validation", "seed_set"):
        path = Path(config.data[key])  # absolute since the config was parsed
        sets[key], _, rejects[key] = _read_all(
            path, schema, headers.get(str(path), False), rejects_dir / key
        )
    files = {o: [str(p) for p in ps] for o, ps in config.data.get("files", {}).items()}
    # a placed owner's files are on its node, not probed here: a header only if declared
    declared = config.data.get("header") is True
    headers = headers | {p: declared for o in config.placement for p in files.get(o, [])}
    gamma = float(config.data.get("gamma", median_heuristic_gamma(sets["seed_set"])))
    owners: dict[str, tuple[F64 | int, F64 | None]] = {
        o: (schema.n_features, None) for o in config.owner_names
    }
    inputs = OwnerInputs(owners, sets["validation"], sets["seed_set"])
    return FileInputs(inputs, schema, files, gamma, headers, rejects)


def write_csv(path: Path, X: F64, y: F64, mode: str = "w") -> None:
    """Append records as CSV lines (features, then the label), written whole-file at once."""
    rows = np.column_stack([X, y])
    with path.open(mode, encoding="utf-8") as fh:
        np.savetxt(fh, rows, delimiter=",", fmt="%.9g")


def stream_files(
    config: MarketConfig, scenario: Scenario, data_dir: Path
) -> tuple[OwnerInputs, Schema, dict[str, list[str]], StreamWriter]:
    """Write the initial part of every owner's records and prepare the writer of the rest."""
    stream = config.data["stream"]
    fraction = float(stream.get("initial_fraction", 0.5))
    data_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, list[str]] = {}
    rest: dict[Path, tuple[F64, F64]] = {}
    for name, (X, y) in zip(scenario.owner_names, scenario.owners, strict=True):
        path = data_dir / f"{name}.csv"
        cut = round(fraction * len(X))
        write_csv(path, X[:cut], y[:cut].astype(np.float64))
        files[name] = [str(path)]
        rest[path] = (X[cut:], y[cut:].astype(np.float64))
    schema = Schema.box(scenario.dim, -1e6, 1e6, label_column=scenario.dim)
    owners: dict[str, tuple[F64 | int, F64 | None]] = {
        o: (scenario.dim, None) for o in scenario.owner_names
    }
    writer = StreamWriter(rest, int(stream.get("batches", 5)), float(stream.get("interval", 0.5)))
    return OwnerInputs(owners, scenario.validation, scenario.seed_set), schema, files, writer


class StreamWriter(threading.Thread):
    """Appends the remaining records to the owners' files in batches, as a live source would."""

    def __init__(self, rest: dict[Path, tuple[F64, F64]], batches: int, interval: float):
        super().__init__(daemon=True, name="dpmarket-stream-writer")
        self.rest, self.batches, self.interval = rest, batches, interval
        self.written = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        for b in range(self.batches):
            if self._stop_event.wait(self.interval):
                return
            for path, (X, y) in self.rest.items():
                part = np.array_split(np.arange(len(X)), self.batches)[b]
                if len(part):
                    write_csv(path, X[part], y[part], mode="a")
                    self.written += len(part)

    def stop(self) -> None:
        self._stop_event.set()


def wait_for_ingest(owners: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    """Block until every owner has read its files to their current end; show progress."""
    import ray

    def poll() -> dict[str, Any]:
        replies = ray.get([h.ingest_status.remote(o) for o, h in owners.items()])
        return dict(zip(owners, replies, strict=True))

    return follow_ingest(poll, timeout)


def follow_ingest(
    poll: Callable[[], dict[str, Any]],
    timeout: float = 600.0,
    grace: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Poll owners' ingest status until all caught up. Gives up with a :class:`ConfigError`
    naming the owner when one of its tailers failed (an unreadable file) or one of its files has
    been missing for ``grace`` seconds (longer than a rotation leaves the path empty)."""
    start = clock()
    missing_since: dict[tuple[str, str], float] = {}
    while True:
        status = poll()
        for owner, s in status.items():
            if s["failed"]:
                raise ConfigError(f"ingest: {owner}: reading its input failed: {s['failed'][0]}")
            now = clock()
            for path in s.get("missing", []):
                since = missing_since.setdefault((owner, path), now)
                if now - since >= grace:
                    raise ConfigError(
                        f"ingest: {owner}: input file {path} is missing (gone for "
                        f"{now - since:.1f} s); nothing more can be read from it"
                    )
            for key in [k for k in missing_since if k[0] == owner]:
                if key[1] not in s.get("missing", []):
                    del missing_since[key]
        total = sum(s["records"] for s in status.values())
        rejected = sum(s["rejected"] for s in status.values())
        print(
            f"\ringest: {total:>10} records, {rejected} rejected",
            end="",
            file=sys.stderr,
            flush=True,
        )
        if all(s["caught_up"] for s in status.values()):
            print(file=sys.stderr)
            return status
        if clock() - start > timeout:
            behind = sorted(o for o, s in status.items() if not s["caught_up"])
            raise ConfigError(f"ingest did not catch up within {timeout} s: {', '.join(behind)}")
        pause(0.1)

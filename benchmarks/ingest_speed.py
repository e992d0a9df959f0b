"""Ingestion speed: file -> decoder -> RACE sketch, for CSV and msgpack with 10 features.

Writes N records (10 standard-normal features, clipped to [-4, 4]) as CSV (``%.6g``) and as a
msgpack stream of float64 arrays, then measures, best of ``--repeat`` runs:

* ``cat FILE > /dev/null`` (the file is in the page cache: the I/O baseline, MB/s);
* decode only: ``iter_records`` (4 MiB chunks) -> float32 batches, records/s and MB/s;
* decode + sketch: each batch inserted into a ``RaceSketch`` (L2 LSH, ``--rows`` x ``--width``);
  this is the headline ``csv_records_per_s`` / ``msgpack_records_per_s`` (issue 4 goals:
  >= 300k/s CSV, >= 1M/s msgpack on the 2-core machine);
* the async ``FileTailer`` over the finished CSV file, committing (with fsync) every batch.

    python benchmarks/ingest_speed.py             # 1M records
    python benchmarks/ingest_speed.py --quick     # 200k records, under 60 s

Last line: one JSON object ``{"benchmark": "ingest_speed", "csv_records_per_s",
"msgpack_records_per_s", "cat_mb_per_s", ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import numpy as np

from dpmarket.streams.race.lsh import L2Lsh
from dpmarket.streams.race.sketch import RaceSketch
from dpmarket.streams.records.files import Schema, iter_records
from dpmarket.streams.records.tail import FileTailer

FEATURES = 10
CHUNK = 1 << 22


def write_files(directory: Path, n: int, seed: int) -> tuple[Path, Path]:
    """The same records as CSV and as a msgpack stream (one array of 10 floats each)."""
    X = np.random.default_rng(seed).standard_normal((n, FEATURES))
    csv, packed = directory / "records.csv", directory / "records.msgpack"
    np.savetxt(csv, X, fmt="%.6g", delimiter=",")
    header = len(msgpack.Packer().pack_array_header(n))
    packed.write_bytes(msgpack.packb(X.tolist())[header:])  # a stream: drop the outer header
    return csv, packed


def best_of(repeat: int, run: Callable[[], int]) -> tuple[float, int]:
    """Fastest wall time of ``run`` over ``repeat`` runs, and what it returned."""
    best, result = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return best, result


def cat_seconds(path: Path, repeat: int) -> float:
    def run() -> int:
        with Path("/dev/null").open("wb") as sink:
            subprocess.run(["cat", str(path)], stdout=sink, check=True)
        return 0

    return best_of(repeat, run)[0]


def ingest(path: Path, schema: Schema, sketch: RaceSketch | None) -> int:
    """One pass over ``path``; returns the number of records decoded."""
    count = 0
    for batch in iter_records(path, schema, chunk_size=CHUNK):
        if sketch is not None:
            sketch.update(batch.features)
        count += len(batch)
    return count


def tail_records(path: Path, schema: Schema, state: Path, n: int) -> int:
    """Follow the finished file with a fresh tailer until ``n`` records are committed."""

    async def run() -> int:
        state.unlink(missing_ok=True)
        count = 0
        async with FileTailer(path, schema, state, chunk_size=CHUNK, poll_interval=0.01) as tail:
            async for batch in tail:
                count += len(batch)
                await tail.commit(batch)
                if count >= n:
                    break
        return count

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="200k records")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rows", type=int, default=100, help="sketch rows R")
    parser.add_argument("--width", type=int, default=1024, help="sketch width W")
    args = parser.parse_args()
    n = 200_000 if args.quick else args.records
    schema = Schema.box(FEATURES, -4.0, 4.0)
    family = L2Lsh(FEATURES, args.rows, bandwidth=2.0, seed=1)
    warm = np.zeros((64, FEATURES), dtype=np.float32)
    RaceSketch(family, args.width).update(warm)  # compile the insert kernel before timing
    with tempfile.TemporaryDirectory() as tmp:
        csv, packed = write_files(Path(tmp), n, seed=0)
        results: dict[str, float] = {}
        cat_mb = [p.stat().st_size / 1e6 / cat_seconds(p, args.repeat) for p in (csv, packed)]
        print(f"{n} records x {FEATURES} features; sketch L2 LSH R={args.rows} W={args.width}")
        print(f"cat: csv {cat_mb[0]:.0f} MB/s, msgpack {cat_mb[1]:.0f} MB/s")
        for name, path in (("csv", csv), ("msgpack", packed)):
            size_mb = path.stat().st_size / 1e6
            ingest(path, schema, None)  # warm the page cache and the compiled scanner
            seconds, count = best_of(args.repeat, lambda p=path: ingest(p, schema, None))  # type: ignore[misc]
            if count != n:
                raise RuntimeError(f"{name}: decoded {count} records, expected {n}")
            full, _ = best_of(
                args.repeat,
                lambda p=path: ingest(p, schema, RaceSketch(family, args.width)),  # type: ignore[misc]
            )
            results[f"{name}_decode_records_per_s"] = n / seconds
            results[f"{name}_records_per_s"] = n / full
            print(
                f"{name:8s} {size_mb:7.1f} MB  decode {n / seconds / 1e6:6.2f} M rec/s "
                f"({size_mb / seconds:6.0f} MB/s)   decode+sketch {n / full / 1e6:6.2f} M rec/s"
            )
        tail_s, tailed = best_of(1, lambda: tail_records(csv, schema, Path(tmp) / "state", n))
        results["tail_csv_records_per_s"] = tailed / tail_s
        print(f"tailer   csv decode + commit (fsync) {tailed / tail_s / 1e6:.2f} M rec/s")
    print(
        json.dumps(
            {
                "benchmark": "ingest_speed",
                "csv_records_per_s": round(results["csv_records_per_s"]),
                "msgpack_records_per_s": round(results["msgpack_records_per_s"]),
                "cat_mb_per_s": round(cat_mb[0], 1),
                "cat_msgpack_mb_per_s": round(cat_mb[1], 1),
                "csv_decode_records_per_s": round(results["csv_decode_records_per_s"]),
                "msgpack_decode_records_per_s": round(results["msgpack_decode_records_per_s"]),
                "tail_csv_records_per_s": round(results["tail_csv_records_per_s"]),
                "records": n,
                "features": FEATURES,
                "sketch": {"family": "l2", "rows": args.rows, "width": args.width},
            }
        )
    )


if __name__ == "__main__":
    main()

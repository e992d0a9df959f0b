"""Insert throughput and query latency of the RACE sketch (issue 4, item 5).

A skin-sized set (241k x 3, RGB-like values in [0, 255], the paper's "skin" KDE data, Table 2)
and a 1M x 20 set are inserted into sketches with R = 1000 rows and W = 1000 columns under
p-stable L2 hashing. A row-update is one (record, row) pair: the fused kernel hashes the record
for that row (3 or 20 multiply-adds, floor, mod W) and increments one counter, so the rate
*includes hashing*. Also reported: W = 1024 (power of two, masked), the numpy fallback on a
subset (checked to give identical counts), kernel compile time, and query latency for one query
per call and for a batch of 10,000 queries.

Reference points (PAPER-NOTES, RACE): the paper's skin sketch took 15 s; the authors' public
Python code runs at about 2M row-updates/s and 750 us per query at R = 1000 on this machine.

    python benchmarks/race_speed.py            # best of 7 inserts, 1M x 20 set
    python benchmarks/race_speed.py --quick    # best of 3, 250k x 20: under 60 s

Last line: one JSON object with the keys listed in the issue (plus context).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numba
import numpy as np
from numpy.typing import NDArray

from dpmarket.streams.race.lsh import L2Lsh
from dpmarket.streams.race.sketch import RaceSketch

ROWS, WIDTH, SKIN_N = 1000, 1000, 241_000


def skin_like(n: int, rng: np.random.Generator) -> NDArray[np.float32]:
    """RGB-like records: a shuffled mixture of 8 colour clusters, clipped to [0, 255]."""
    centres = rng.uniform(30, 225, size=(8, 3))
    points = centres[rng.integers(0, 8, n)] + rng.normal(0, 20, size=(n, 3))
    return np.clip(points, 0, 255).astype(np.float32)


def best_of(repeats: int, run: Callable[[], None]) -> tuple[float, float]:
    """(best, median) wall time of ``repeats`` runs."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def insert_rate(sketch: RaceSketch, X: NDArray[np.float32], repeats: int) -> tuple[float, float]:
    """(best seconds, row-updates per second at the best time) of inserting X into ``sketch``."""

    def run() -> None:
        sketch.clear()
        sketch.update(X)

    best, _ = best_of(repeats, run)
    return best, X.shape[0] * sketch.rows / best


def query_latency(sketch: RaceSketch, Q: NDArray[np.float32], repeats: int) -> tuple[float, float]:
    """(single-query microseconds, batched microseconds per query), best of ``repeats``."""
    singles = [Q[i] for i in range(2000)]

    def one_at_a_time() -> None:
        for q in singles:
            sketch.query(q)

    def batch() -> None:
        sketch.query(Q)

    single, _ = best_of(repeats, one_at_a_time)
    batched, _ = best_of(repeats, batch)
    return single / len(singles) * 1e6, batched / Q.shape[0] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 3 if args.quick else 7
    wide_n = 250_000 if args.quick else 1_000_000
    rng = np.random.default_rng(0)
    skin = skin_like(SKIN_N, rng)
    family = L2Lsh(3, ROWS, bandwidth=5.0, seed=1)

    start = time.perf_counter()
    sketch = RaceSketch(family, WIDTH)
    sketch.update(skin[:1000])
    sketch.query(skin[0])
    sketch.query(skin[:100])
    compile_seconds = time.perf_counter() - start

    skin_seconds, skin_rate = insert_rate(sketch, skin, repeats)
    _, pow2_rate = insert_rate(RaceSketch(family, 1024), skin, repeats)
    subset = skin[:20_000]
    slow = RaceSketch(family, WIDTH, backend="numpy")
    numpy_seconds, _ = best_of(1, lambda: slow.update(subset))
    check = RaceSketch(family, WIDTH)
    check.update(subset)
    if check != slow:
        raise SystemExit("numba and numpy counts differ")
    queries = skin_like(10_000, np.random.default_rng(1))
    single_us, batched_us = query_latency(sketch, queries, repeats)

    wide = rng.standard_normal((wide_n, 20)).astype(np.float32)
    wide_sketch = RaceSketch(L2Lsh(20, ROWS, bandwidth=4.0, seed=2), WIDTH)
    wide_sketch.update(wide[:100])
    wide_seconds, wide_rate = insert_rate(wide_sketch, wide, max(1, repeats // 3))

    result = {
        "benchmark": "race_speed",
        "insert_row_updates_per_s": round(skin_rate),
        "skin_insert_seconds": round(skin_seconds, 4),
        "query_us_single": round(single_us, 2),
        "query_us_batched": round(batched_us, 3),
        "rate_includes": "hashing (3 multiply-adds, floor, mod W) and counting, fused",
        "insert_row_updates_per_s_w1024": round(pow2_rate),
        "numpy_fallback_row_updates_per_s": round(subset.shape[0] * ROWS / numpy_seconds),
        "wide_set": f"{wide_n} x 20",
        "wide_insert_seconds": round(wide_seconds, 3),
        "wide_row_updates_per_s": round(wide_rate),
        "compile_seconds": round(compile_seconds, 2),
        "rows": ROWS,
        "width": WIDTH,
        "threads": numba.get_num_threads(),
        "quick": args.quick,
    }
    print(
        f"skin {SKIN_N} x 3, R={ROWS}, W={WIDTH}: insert {skin_seconds:.3f} s "
        f"({skin_rate / 1e6:.0f}M row-updates/s incl. hashing; W=1024: {pow2_rate / 1e6:.0f}M/s; "
        f"numpy fallback {result['numpy_fallback_row_updates_per_s'] / 1e6:.1f}M/s); "
        f"query {single_us:.2f} us single, {batched_us:.3f} us batched; "
        f"{wide_n} x 20: {wide_seconds:.2f} s ({wide_rate / 1e6:.0f}M/s); "
        f"compile {compile_seconds:.1f} s"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""What journaling the purchased pool costs per checkpoint: inline snapshot vs append-only rows.

A curator with the final selection (protocol/summary/selection.py) keeps every point it bought; the
journal must keep them too. Inline, every checkpoint rewrites the whole pool; with
``snapshot_curator(c, pool_inline=False)`` plus :func:`pool_rows` appended to a file (what
actors/parties/curator.py does) each point is serialised once. The run is simulated: a pool growing
by
K = 16 points of 20 features per epoch (market_scale's shape with every owner asked), two
checkpoints per epoch, JSON encoding timed (the disk write is left out; its bytes are counted).

    python benchmarks/journal_cost.py            # 1,000 epochs (16,000 points)
    python benchmarks/journal_cost.py --quick    # 200 epochs

Last line: ``{"benchmark": "journal_cost", "epochs", "points", "inline_seconds",
"append_seconds", "inline_bytes", "append_bytes", "speedup"}``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from dpmarket.protocol.summary.curator import Curator, CuratorParams
from dpmarket.protocol.summary.journal import pool_rows, snapshot_curator
from dpmarket.protocol.summary.selection import PoolEntry

OWNERS, FEATURES = 16, 20


def simulate(epochs: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    owners = [f"owner-{k}" for k in range(OWNERS)]
    params = CuratorParams(p=epochs, d=140, gamma=0.1, final_selection="exact", explore_share=1.0)
    curator = Curator("bench", owners, rng.normal(size=(50, FEATURES)),
                      rng.normal(size=(20, FEATURES)), params, rng)  # fmt: skip
    inline_s = append_s = 0.0
    inline_b = append_b = written = 0
    for epoch in range(1, epochs + 1):
        for k, owner in enumerate(owners):
            point = rng.normal(size=FEATURES)
            hashed = curator.h1(point)
            curator.pool.add(PoolEntry(owner, epoch, epoch, 0.1, point, hashed, float(k % 10)))
        for _ in range(2):  # two checkpoints per epoch (epoch opened, auction decided)
            start = time.perf_counter()
            inline_b += len(json.dumps(snapshot_curator(curator)))
            inline_s += time.perf_counter() - start
            start = time.perf_counter()
            rows = pool_rows(curator, written)
            append_b += sum(len(json.dumps(r)) + 1 for r in rows)
            written += len(rows)
            append_b += len(json.dumps(snapshot_curator(curator, pool_inline=False)))
            append_s += time.perf_counter() - start
    return {
        "inline_seconds": inline_s,
        "append_seconds": append_s,
        "inline_bytes": float(inline_b),
        "append_bytes": float(append_b),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    epochs = 200 if args.quick else 1000
    out = simulate(epochs)
    print(f"journal_cost: {epochs} epochs, {epochs * OWNERS} pool points, 2 checkpoints per epoch")
    print(f"{'journal':<22} {'encode s (total)':>17} {'MB written':>11}")
    print(
        f"{'inline snapshot':<22} {out['inline_seconds']:>17.2f} {out['inline_bytes'] / 1e6:>11.1f}"
    )
    appended = out["append_bytes"] / 1e6
    print(f"{'append-only pool rows':<22} {out['append_seconds']:>17.2f} {appended:>11.1f}")
    speedup = out["inline_seconds"] / out["append_seconds"]
    print(f"append-only is {speedup:.1f}x less encoding time")
    summary = {"benchmark": "journal_cost", "epochs": epochs, "points": epochs * OWNERS}
    summary.update({k: round(v, 3) for k, v in out.items()})
    summary["speedup"] = round(speedup, 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

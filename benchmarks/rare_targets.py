"""How many of the consumer's target records each purchase holds (issue 30, part 2 diagnostic).

Why the hedged allocate-select only ties random-select in benchmarks/utility_vs_random.py's
"rare" scenario at max_points = 3 p: this counts, per seed, the target records (the classes the
consumer wants) in the purchased pool and in the p selected, for random-select and for
allocate-select with random_share auto (the plan's rule), 0 (unhedged) and 0.5, at the same
points. Same scenarios, parties and reproducible noise as utility_vs_random.py.

    python benchmarks/rare_targets.py --scenario rare --factor 3

Prints a table and, last, one JSON object {"benchmark": "rare_targets", "rows": [...]}.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from utility_vs_random import SCENARIOS, TARGETS, params_of

from dpmarket.actors.parties.transport import LoopbackTransport
from dpmarket.actors.randomness import NoiseSource, public_generator
from dpmarket.protocol.summary.curator import Curator
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.summary.snr import validation_check

MECHANISMS = ("random-select", "hedge-select@auto", "hedge-select@0", "hedge-select@0.5")


def run(args: argparse.Namespace) -> list[dict[str, object]]:
    noise = NoiseSource.reproducible(0)
    opts = argparse.Namespace(candidates=2000, floor=0.0)
    rows = []
    for p in args.p:
        for mech in MECHANISMS:
            pool, kept, snr = [], [], 0.0
            for seed in args.seeds:
                sc = SCENARIOS[args.scenario](public_generator([seed, 30]))
                params = params_of(mech, sc, p, math.ceil(args.factor * p), seed, opts)
                snr = validation_check(
                    params_of("hedge-select@auto", sc, p, math.ceil(args.factor * p), seed, opts),
                    len(sc.validation), 1e-5,
                ).snr or 0.0  # fmt: skip
                label = f"rare-targets:{args.scenario}:{mech}:{seed}:{p}"
                owners = [
                    Owner(n, "r", X, y, rng=noise.generator(f"summary:{label}:{n}"),
                          profile_floor=params.profile_floor)
                    for n, (X, y) in zip(sc.owner_names, sc.owners, strict=True)
                ]  # fmt: skip
                curator = Curator("r", list(sc.owner_names), sc.validation, sc.seed_set, params,
                                  noise.generator(label))  # fmt: skip
                transport = LoopbackTransport([curator, *owners])
                transport.send(curator.start())
                transport.run_until(lambda c=curator: c.done)
                wanted = sorted(TARGETS[args.scenario])
                labels = np.array([e.label for e in curator.pool.entries])
                pool.append(int(np.isin(labels, wanted).sum()))
                kept.append(int(np.isin(np.asarray(curator.result().labels), wanted).sum()))
            rows.append({
                "scenario": args.scenario, "p": p, "max_points": math.ceil(args.factor * p),
                "mechanism": mech, "targets_in_pool": pool, "targets_kept": kept,
                "mean_in_pool": round(float(np.mean(pool)), 2),
                "mean_kept": round(float(np.mean(kept)), 2), "g_tilde_snr": round(snr, 3),
            })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=list(SCENARIOS), default="rare")
    parser.add_argument("--factor", type=float, default=3.0)
    parser.add_argument("--p", nargs="+", type=int, default=[10, 20])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    args = parser.parse_args(argv)
    if not (math.isfinite(args.factor) and args.factor >= 1) or min(args.p) < 1:
        parser.error(f"--factor must be >= 1 and --p >= 1, got {args.factor}, {args.p}")
    start = time.perf_counter()
    rows = run(args)
    took = time.perf_counter() - start
    print(f"target records bought and kept, {args.scenario} at {args.factor:g} p, seeds "
          f"{args.seeds}; {took:.0f} s")  # fmt: skip
    print(f"{'p':>3} {'max_pts':>7} {'mechanism':<20} {'in pool (per seed)':<28} "
          f"{'mean':>5} {'kept (per seed)':<22} {'mean':>5}")  # fmt: skip
    for r in rows:
        print(f"{r['p']:>3} {r['max_points']:>7} {r['mechanism']:<20} "
              f"{r['targets_in_pool']!s:<28} {r['mean_in_pool']:>5} "
              f"{r['targets_kept']!s:<22} {r['mean_kept']:>5}")  # fmt: skip
    print(json.dumps({"benchmark": "rare_targets", "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

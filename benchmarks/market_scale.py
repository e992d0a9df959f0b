"""Scale of the market run on local Ray: K = 16 owners, 1e6 records x 20 features, d = 140,
p = 1000 epochs; the same epochs on the in-process LoopbackTransport as the baseline.

    python benchmarks/market_scale.py            # the issue's size
    python benchmarks/market_scale.py --quick    # 1e5 records, p = 100

``ms_per_epoch`` is the Ray run's summarise phase divided by its epochs; ``ms_per_epoch_loopback``
the same protocol, same seeds, in one process. Their difference is what messaging and actor
scheduling cost per epoch (owners compute their bids in parallel under Ray, serially in-process).
``seconds`` is end to end: connecting to Ray, spawning the actors, shipping the data, the run.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from dpmarket.actors.cluster import connect
from dpmarket.actors.runner import run_inprocess, run_ray
from dpmarket.protocol.curator import CuratorParams
from dpmarket.streams.synthetic import gaussian_mixture_shift


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--owners", type=int, default=16)
    args = parser.parse_args()
    records, p = (100_000, 100) if args.quick else (1_000_000, 1000)
    scenario = gaussian_mixture_shift(
        np.random.default_rng(0),
        n_points=records,
        n_owners=args.owners,
        n_components=8,
        dim=20,
        n_validation=500,
        n_test=1000,
        n_seed=50,
    )
    params = CuratorParams(
        p=p,
        d=140,
        gamma=scenario.gamma,
        h1_seed=0,
        eps_validation=0.05,
        validation_iterations=1656,
        seed_iterations=1656,
        eps_summary=0.05,
        summary_iterations=5,
        eps_auction=0.05,
        auction_variant="pure",
        tau=3,
        phase_timeout=30.0,
    )
    start = time.perf_counter()
    connect()
    tick = time.perf_counter()
    payload = run_ray(scenario, params, seed=1, run_id="scale")
    ray_run = time.perf_counter() - tick
    seconds = time.perf_counter() - start
    tick = time.perf_counter()
    loop = run_inprocess(scenario, params, np.random.default_rng(1), run_id="scale").result
    loop_seconds = time.perf_counter() - tick
    same = [(d["owner"], d["token"]) for d in payload["provenance"]] == [
        (q.owner, q.token) for q in loop.provenance
    ]
    epochs = int(payload["epochs"])
    ms_ray = 1000 * ray_run / epochs
    ms_loop = 1000 * loop_seconds / loop.epochs
    rows = [
        ("owners", args.owners),
        ("records", records),
        ("summary size p", p),
        ("epochs", epochs),
        ("end to end (s)", f"{seconds:.1f}"),
        ("Ray spawn + run (s)", f"{ray_run:.1f}"),
        ("loopback run (s)", f"{loop_seconds:.1f}"),
        ("ms per epoch, Ray", f"{ms_ray:.2f}"),
        ("ms per epoch, loopback", f"{ms_loop:.2f}"),
        ("same summary under both", same),
    ]
    for name, value in rows:
        print(f"{name:<28} {value}")
    print(
        json.dumps(
            {
                "benchmark": "market_scale",
                "seconds": round(seconds, 2),
                "epochs": epochs,
                "owners": args.owners,
                "records": records,
                "ms_per_epoch": round(ms_ray, 3),
                "ms_per_epoch_loopback": round(ms_loop, 3),
                "same_summary": same,
            }
        )
    )


if __name__ == "__main__":
    main()

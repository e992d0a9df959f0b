"""Scale of the market run on local Ray: K = 16 owners, 1e6 records x 20 features, d = 140,
p = 1000 epochs; the same epochs on the in-process LoopbackTransport as the baseline.

    python benchmarks/market_scale.py            # the issue's size
    python benchmarks/market_scale.py --quick    # 1e5 records, p = 100

Two Ray layouts run: owners co-located in as many actor processes as there are cores
(``owners_per_actor = ceil(K / cores)``, the headline) and one actor process per owner.
``ms_per_epoch`` is the curator's ``run`` (start, every epoch, finish; timed inside the curator
actor, so without spawning and shipping data) divided by its epochs; ``ms_per_epoch_loopback``
is the same protocol with the same seeds in one process, timed the same way. Their difference
is what messaging and actor scheduling cost per epoch, less what running owners in parallel
saves. ``seconds`` is end to end: connecting to Ray, spawning the actors, shipping the data,
the run. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from typing import Any

import numpy as np

from dpmarket.actors.cluster.connect import connect
from dpmarket.actors.harness.inprocess import run_inprocess
from dpmarket.actors.randomness import NoiseSource
from dpmarket.actors.run.spawn import run_ray
from dpmarket.protocol.summary.curator import CuratorParams
from dpmarket.streams.synthetic import Scenario, gaussian_mixture_shift

# a simulation: the same (public) noise under Ray and in-process, so the summaries can be compared
NOISE = NoiseSource.reproducible(1)


def _ray_run(
    scenario: Scenario, params: CuratorParams, per_actor: int
) -> tuple[float, dict[str, Any]]:
    tick = time.perf_counter()
    payload = run_ray(scenario, params, NOISE, run_id="scale", owners_per_actor=per_actor)
    return time.perf_counter() - tick, payload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--owners", type=int, default=16)
    parser.add_argument("--skip-one-per-actor", action="store_true")
    args = parser.parse_args()
    records, p = (100_000, 100) if args.quick else (1_000_000, 1000)
    start = time.perf_counter()
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
    cores = os.cpu_count() or 1
    per_actor = math.ceil(args.owners / cores)
    connect()
    spawn_and_run, payload = _ray_run(scenario, params, per_actor)
    seconds = time.perf_counter() - start
    single: tuple[float, dict[str, Any]] | None = None
    if not args.skip_one_per_actor:
        single = _ray_run(scenario, params, 1)
    tick = time.perf_counter()
    loop = run_inprocess(scenario, params, NOISE.generator("curator"), run_id="scale").result
    loop_seconds = time.perf_counter() - tick
    tokens = [(q.owner, q.token) for q in loop.provenance]
    same = [(d["owner"], d["token"]) for d in payload["provenance"]] == tokens
    epochs = int(payload["epochs"])
    ms_ray = 1000 * payload["run_seconds"] / epochs
    ms_loop = 1000 * loop_seconds / loop.epochs
    rows: list[tuple[str, object]] = [
        ("owners / records / p", f"{args.owners} / {records} / {p}"),
        ("epochs", epochs),
        (f"end to end, {per_actor} owners per actor (s)", f"{seconds:.1f}"),
        ("  of which spawn + ship + run (s)", f"{spawn_and_run:.1f}"),
        ("  of which the curator's run (s)", f"{payload['run_seconds']:.1f}"),
        ("loopback run (s)", f"{loop_seconds:.1f}"),
        ("ms per epoch, Ray", f"{ms_ray:.2f}"),
        ("ms per epoch, loopback", f"{ms_loop:.2f}"),
        ("messaging per epoch (Ray - loopback)", f"{ms_ray - ms_loop:.2f}"),
        ("same summary under both", same),
    ]
    extra: dict[str, Any] = {}
    if single is not None:
        single_seconds, single_payload = single
        ms_single = 1000 * single_payload["run_seconds"] / int(single_payload["epochs"])
        same_single = [(d["owner"], d["token"]) for d in single_payload["provenance"]] == tokens
        rows += [
            ("one actor per owner: spawn + ship + run (s)", f"{single_seconds:.1f}"),
            ("one actor per owner: ms per epoch", f"{ms_single:.2f}"),
            ("one actor per owner: same summary", same_single),
        ]
        extra = {
            "seconds_one_per_actor": round(single_seconds, 2),
            "ms_per_epoch_one_per_actor": round(ms_single, 3),
        }
    for name, value in rows:
        print(f"{name:<46} {value}")
    print(
        json.dumps(
            {
                "benchmark": "market_scale",
                "seconds": round(seconds, 2),
                "epochs": epochs,
                "owners": args.owners,
                "records": records,
                "owners_per_actor": per_actor,
                "ms_per_epoch": round(ms_ray, 3),
                "ms_per_epoch_loopback": round(ms_loop, 3),
                "same_summary": same,
                **extra,
            }
        )
    )


if __name__ == "__main__":
    main()

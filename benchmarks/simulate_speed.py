"""Speed of ``dpmarket simulate STUDY``: trials of a K = 20, p = 50 market (issue 17 item 5).

    python benchmarks/simulate_speed.py                 # 1,000 trials, 2 actor markets
    python benchmarks/simulate_speed.py --trials 100    # a quicker run

The study (written to a temporary directory): configs/dropout.toml with K = 20 owners,
p = 50, 4,000 simulated records, T in {2, 4}, dropout probability 0.05 or 0.1 per owner (drops
before normalise 20%, before scan 10%, at an epoch in 1..40 70%), 5% slow owners at 4 s per
reply against 2 s deadlines, no colluders: 4 cells, trials split evenly. Every trial is the
whole market in-process (secure sums, standardisation, summary, selection) plus the harness's
utility (exact greedy and uniform baselines) and epsilons.

``seconds`` is the study's wall time on Ray (local, every core; Ray's start-up included),
``trials_per_second`` = trials / seconds. The baseline: ``--actor-samples`` of the same trials
(same faults, data and simulated noise) run as real markets on Ray actors, one after another
(each market already uses every core: its owners, curator and compute nodes are actors),
timed end to end; ``speedup_vs_actors`` = (mean seconds per actor market x trials) / seconds,
i.e. against running the study's trials as actor markets, extrapolated from the samples.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STUDY = """[study]
name = "speed"
base = "{base}"
set = ["data.n_points=4000", "market.summary_size=50", "data.n_test=500"]
trials = {trials}
seed = 17

[axes]
owners = [20]
tolerance = [2, 4]
dropout = [0.05, 0.1]
slow_fraction = [0.05]
slow_delay = [4.0]

[timing]
normalise = 0.2
scan = 0.1
epochs = 0.7
epoch_range = [1, 40]
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000, help="trials in all (4 cells)")
    parser.add_argument("--actor-samples", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()

    from dpmarket.actors.cluster.connect import connect
    from dpmarket.actors.studies.actors import actor_faults, actor_run
    from dpmarket.actors.studies.config import load_study
    from dpmarket.actors.studies.report import summarise
    from dpmarket.actors.studies.run import run_study

    work = Path(tempfile.mkdtemp(prefix="simulate-speed-"))
    path = work / "speed.toml"
    per_cell = max(1, args.trials // 4)
    path.write_text(STUDY.format(base=ROOT / "configs" / "dropout.toml", trials=per_cell))
    study = load_study(path)
    trials = per_cell * len(study.cells)
    start = time.perf_counter()
    info = connect()
    results = run_study(study, work / "out", batch=args.batch)
    seconds = time.perf_counter() - start
    table = summarise(study, results)

    actor_seconds, agree = [], 0
    for i in range(args.actor_samples):
        row = results[(i * len(results)) // max(1, args.actor_samples)]
        draw = actor_faults(row["faults"])
        tick = time.perf_counter()
        verdict = actor_run(study, row["cell"], row["seed"], draw, work / f"actor-{i}")
        actor_seconds.append(time.perf_counter() - tick)
        from dpmarket.actors.studies.trial import run_trial

        cell = next(c for c in study.cells if c.key == row["cell"])
        replay = run_trial(
            study.configs[cell.key], cell, row["seed"], study.timing, study.epoch_range,
            study.vary_data, draw=draw,
        )  # fmt: skip
        agree += replay["verdict"] == verdict
        print(f"actor market {i}: {verdict} in {actor_seconds[-1]:.1f} s", file=sys.stderr)
    per_actor = sum(actor_seconds) / max(1, len(actor_seconds))
    speedup = per_actor * trials / seconds if actor_seconds else None
    cpus = int(float(info.get("resources", {}).get("CPU", 0)))
    trial_cpu = sum(r["seconds"] for r in results) / len(results)
    rows = [
        ("cores (Ray CPUs) / os.cpu_count()", f"{cpus} / {os.cpu_count()}"),
        ("trials (cells x trials)", f"{trials} ({len(study.cells)} x {per_cell})"),
        ("study wall time (s)", f"{seconds:.1f}"),
        ("trials per second", f"{trials / seconds:.2f}"),
        ("mean seconds inside one trial", f"{trial_cpu:.2f}"),
        ("actor markets timed", len(actor_seconds)),
        ("mean seconds per actor market", f"{per_actor:.1f}"),
        ("speedup vs actor markets", f"{speedup:.1f}" if speedup else "-"),
        ("actor verdicts agreeing", f"{agree} of {len(actor_seconds)}"),
    ]
    for name, value in rows:
        print(f"{name:<40} {value}")
    for r in table:
        print(
            f"  {r['cell']:<44} P(done) {r['p_complete']:.3f} [{r['p_low']:.3f}, {r['p_high']:.3f}]"
        )
    print(
        json.dumps(
            {
                "benchmark": "simulate_speed",
                "trials": trials,
                "seconds": round(seconds, 2),
                "trials_per_second": round(trials / seconds, 3),
                "speedup_vs_actors": round(speedup, 2) if speedup else None,
                "seconds_per_actor_market": round(per_actor, 2),
                "seconds_per_trial_inside": round(trial_cpu, 3),
                "actor_samples": len(actor_seconds),
                "actor_verdicts_agree": agree,
                "cpus": cpus,
                "under_5_minutes": seconds < 300,
            }
        )
    )


if __name__ == "__main__":
    main()

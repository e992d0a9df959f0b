"""A study with a thousand owners (issue 29 part 4): trials per second at K = 16 .. 1024, and the
completion frequency at K = 1024 against the closed form.

    python benchmarks/study_scale.py                          # 4 trials per K, 100 at K = 1024
    python benchmarks/study_scale.py --trials 2 --closed-trials 20   # a quicker run
    python benchmarks/study_scale.py --closed-trials 0        # part 1 only

The study is configs/studies/thousand.toml (20,480 simulated records split over K owners,
p = 20, a 20 x 64 scan sketch; drops before normalise, before scan or at epoch 1). Part 1,
speed: for each K its cell T = 10, q = 0.005 runs ``--trials`` trials through ``run_study`` on
Ray (local, every core; one Ray instance for the whole script, started and warmed up by two
trials before the clock), timed per K: ``trials_per_second`` = trials / wall seconds, with
the seconds inside one trial (wall and CPU of its worker) and those per owner (flat when a
trial's work grows linearly in K). Part 2, the closed form: the cell K = 1024, T = 4,
q = 0.005 runs ``--closed-trials`` trials; its completion frequency with the exact 95%
Clopper-Pearson and Wilson intervals beside P(Binomial(1024, 0.005) <= 4)
(actors/studies/closedform.py). The machine is shared: wall times are noisy, CPU times less.
Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dpmarket.actors.studies.config import StudyConfig

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "configs" / "studies" / "thousand.toml"


def _only(
    study: StudyConfig, owners: int, tolerance: int, dropout: float, trials: int
) -> StudyConfig:
    """``study`` narrowed to its cell (owners, tolerance, dropout) and ``trials`` trials."""
    cells = tuple(
        c for c in study.cells if (c.owners, c.tolerance, c.dropout) == (owners, tolerance, dropout)
    )
    if len(cells) != 1:
        raise SystemExit(f"{STUDY}: no single cell K={owners} T={tolerance} q={dropout}")
    return dataclasses.replace(study, cells=cells, trials=trials)


def _speed(study: StudyConfig, k: int, trials: int, work: Path, batch: int) -> dict[str, Any]:
    """Part 1 for one K: ``trials`` trials of (K, T = 10, q = 0.005), timed."""
    from dpmarket.actors.studies.run import run_study

    tick = time.perf_counter()
    results = run_study(_only(study, k, 10, 0.005, trials), work / f"speed-{k}", batch=batch)
    seconds = time.perf_counter() - tick
    inside = sum(r["seconds"] for r in results) / len(results)
    cpu = sum(r["cpu_seconds"] for r in results) / len(results)
    print(f"K = {k}: {len(results)} trials in {seconds:.1f} s", file=sys.stderr)
    return {
        "owners": k,
        "trials": len(results),
        "seconds": seconds,
        "trials_per_second": len(results) / seconds,
        "seconds_inside_trial": inside,
        "ms_inside_per_owner": 1000 * inside / k,
        "cpu_seconds_inside_trial": cpu,
        "cpu_ms_per_owner": 1000 * cpu / k,
        "epochs_mean": sum(r["epochs"] for r in results) / len(results),
    }


def _closed_form_part(study: StudyConfig, trials: int, work: Path, batch: int) -> dict[str, Any]:
    """Part 2: ``trials`` trials of K = 1024, T = 4, q = 0.005 against the closed form."""
    from dpmarket.actors.studies.closedform import completion_form
    from dpmarket.actors.studies.report import summarise
    from dpmarket.actors.studies.run import run_study

    closed = _only(study, 1024, 4, 0.005, trials)
    tick = time.perf_counter()
    results = run_study(closed, work / "closed", batch=batch)
    seconds = time.perf_counter() - tick
    row = summarise(closed, results)[0]
    cell = closed.cells[0]
    deadline = closed.configs[cell.key].deadline_seconds
    form = completion_form(cell, closed.timing, closed.epoch_range, deadline)
    print(
        f"\ncompletion at {cell.key}: {row['completed']} of {row['trials']} = "
        f"{row['p_complete']:.3f}, Clopper-Pearson [{row['p_low']:.3f}, {row['p_high']:.3f}], "
        f"Wilson [{row['wilson_low']:.3f}, {row['wilson_high']:.3f}]; closed form "
        f"P(Binomial(1024, 0.005) <= 4) = {form.high:.4f} ({seconds:.0f} s)"
    )
    return {
        "closed_form_cell": cell.key,
        "closed_form": round(form.high, 5),
        "completed": row["completed"],
        "closed_trials": row["trials"],
        "p_complete": row["p_complete"],
        "clopper_pearson": [round(row["p_low"], 4), round(row["p_high"], 4)],
        "wilson": [round(row["wilson_low"], 4), round(row["wilson_high"], 4)],
        "closed_form_inside_interval": row["p_low"] <= form.high <= row["p_high"],
        # the verdict is the count's: completed iff at most T owners dropped
        "verdict_is_the_drop_count": all(
            (r["verdict"] == "completed") == (len(r["faults"]["drops"]) <= 4) for r in results
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", default="16,64,256,1024", help="K values (speed part)")
    parser.add_argument("--trials", type=int, default=4, help="trials per K (speed part)")
    parser.add_argument(
        "--closed-trials", type=int, default=100, help="K = 1024 trials (0: skip part 2)"
    )
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()

    from dpmarket.actors.cluster.connect import connect
    from dpmarket.actors.studies.config import load_study
    from dpmarket.actors.studies.run import run_study

    work = Path(tempfile.mkdtemp(prefix="study-scale-"))
    study = load_study(STUDY)
    info = connect()
    cpus = int(float(info.get("resources", {}).get("CPU", 0)))
    run_study(_only(study, 16, 10, 0.005, 2), work / "warm-up")  # workers started, kernels built
    speed = [_speed(study, int(k), args.trials, work, args.batch) for k in args.owners.split(",")]
    print(f"cores (Ray CPUs): {cpus}; study {STUDY.relative_to(ROOT)}; machine shared (noisy)")
    print(
        f"{'K':>5} {'trials':>6} {'wall s':>8} {'trials/s':>9} {'s inside':>9} "
        f"{'ms/owner':>9} {'CPU s':>7} {'CPU ms/owner':>13} {'epochs':>7}"
    )
    for s in speed:
        print(
            f"{s['owners']:>5} {s['trials']:>6} {s['seconds']:>8.1f} "
            f"{s['trials_per_second']:>9.3f} {s['seconds_inside_trial']:>9.2f} "
            f"{s['ms_inside_per_owner']:>9.2f} {s['cpu_seconds_inside_trial']:>7.2f} "
            f"{s['cpu_ms_per_owner']:>13.2f} {s['epochs_mean']:>7.1f}"
        )
    closed: dict[str, Any] = {}
    if args.closed_trials > 0:
        closed = _closed_form_part(study, args.closed_trials, work, args.batch)

    def column(key: str, digits: int) -> list[float]:
        return [round(s[key], digits) for s in speed]

    record = {
        "benchmark": "study_scale",
        "owners": [s["owners"] for s in speed],
        "trials_per_second": column("trials_per_second", 4),
        "seconds_inside_trial": column("seconds_inside_trial", 3),
        "ms_inside_per_owner": column("ms_inside_per_owner", 3),
        "cpu_seconds_inside_trial": column("cpu_seconds_inside_trial", 3),
        "cpu_ms_per_owner": column("cpu_ms_per_owner", 3),
        "trials": [s["trials"] for s in speed],
        "cpus": cpus,
    }
    print(json.dumps(record | closed))


if __name__ == "__main__":
    main()

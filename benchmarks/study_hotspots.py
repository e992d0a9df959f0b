"""The two K^2 terms removed from a study trial (issue 29 part 4), measured against themselves.

    python benchmarks/study_hotspots.py                 # K = 64 and 256
    python benchmarks/study_hotspots.py --owners 16,64

One trial of configs/studies/thousand.toml's cell (K, T = 10, q = 0.005) per K, run twice in
this process with the same seed: the baseline rebinds, in actors/studies/trial.py, the
transport to a LoopbackTransport ticking every party after every frame, as before (K + 1
calls per frame) and the curator to a subclass whose epoch-answer check is the old one (the waiting
set built on every answer, O(K)); the current run uses trial.py as it is (only the curator
ticked; answers counted first). Both must return the same trial (every field but the wall
time), so the ratio is of the same work. Times are CPU seconds of this process
(``time.process_time``; the machine is shared, wall time is noisier). Last line: one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numba

from dpmarket.actors.parties.faults import FaultPlan
from dpmarket.actors.parties.transport import LoopbackTransport
from dpmarket.actors.studies import trial
from dpmarket.actors.studies.config import load_study
from dpmarket.protocol.summary.curator import Curator

ROOT = Path(__file__).resolve().parents[1]


class OldCurator(Curator):
    """The curator with the epoch-answer check it had before: the waiting set on every answer."""

    def _all_answered(self) -> bool:
        return not self._waiting()


class OldTransport(LoopbackTransport):
    """The loopback transport as a trial used it before: every party ticked after every frame."""

    def __init__(self, parties: list[Any], faults: FaultPlan | None = None) -> None:
        super().__init__(parties, faults)
        self._timed = list(self.parties.values())


def _run(cell: Any, study: Any, seed: int, old: bool) -> tuple[dict[str, Any], float]:
    saved = trial.LoopbackTransport, trial.Curator
    if old:
        trial.LoopbackTransport, trial.Curator = OldTransport, OldCurator  # type: ignore[misc]
    try:
        tick = time.process_time()
        out = trial.run_trial(
            study.configs[cell.key], cell, seed, study.timing, study.epoch_range, study.vary_data
        )
        return out, time.process_time() - tick
    finally:
        trial.LoopbackTransport, trial.Curator = saved  # type: ignore[misc]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", default="64,256")
    args = parser.parse_args()
    numba.set_num_threads(1)  # as in a study's Ray task
    study = load_study(ROOT / "configs" / "studies" / "thousand.toml")
    rows = []
    for k in (int(v) for v in args.owners.split(",")):
        if k not in {c.owners for c in study.cells}:
            raise SystemExit(f"K = {k} is not a cell of the study (16, 64, 256, 1024)")
        cell = next(c for c in study.cells if (c.owners, c.tolerance, c.dropout) == (k, 10, 0.005))
        seed = trial.trial_seed(study.seed, cell.key, 0)
        _run(cell, study, seed, old=False)  # warm-up: numba kernels, imports
        new, new_s = _run(cell, study, seed, old=False)
        old, old_s = _run(cell, study, seed, old=True)
        clocks = ("seconds", "cpu_seconds")
        same = {k: v for k, v in new.items() if k not in clocks} == {
            k: v for k, v in old.items() if k not in clocks
        }
        rows.append({"owners": k, "old_cpu_s": old_s, "new_cpu_s": new_s, "same_trial": same,
                     "epochs": new["epochs"]})  # fmt: skip
    print(f"{'K':>5} {'epochs':>7} {'baseline CPU s':>15} {'current CPU s':>14} {'ratio':>6} same")
    for r in rows:
        print(
            f"{r['owners']:>5} {r['epochs']:>7} {r['old_cpu_s']:>15.2f} {r['new_cpu_s']:>14.2f} "
            f"{r['old_cpu_s'] / r['new_cpu_s']:>6.2f} {'yes' if r['same_trial'] else 'NO'}"
        )
    print(
        json.dumps(
            {
                "benchmark": "study_hotspots",
                "owners": [r["owners"] for r in rows],
                "baseline_cpu_seconds": [round(r["old_cpu_s"], 3) for r in rows],
                "cpu_seconds": [round(r["new_cpu_s"], 3) for r in rows],
                "speedup": [round(r["old_cpu_s"] / r["new_cpu_s"], 3) for r in rows],
                "same_trial": [r["same_trial"] for r in rows],
            }
        )
    )


if __name__ == "__main__":
    main()

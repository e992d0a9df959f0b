"""``dpmarket simulate STUDY --actors N``: replay a sample of a study's trials as real markets on
Ray actors and check that the in-process verdicts agree with theirs.

The sample is N cells spread evenly over the study's grid (first, last and between), trial 0
of each (``--actors-trials`` more). Each sampled trial's drawn faults become a market config's
``[faults]`` (kill at an epoch, slow owners' delay, colluders) with the trial's data seed and
reproducible (simulated) noise, and ``run_market`` runs it: owner, curator and compute-node
actors, real deadlines, real sleeping. A market config cannot kill an owner before the secure
sums, so a drop drawn in the normalise or scan phase is replayed as a kill at epoch 1 on
actors, and the in-process trial is replayed with the same mapped faults: the two verdicts
(completed: exit 0; refused: exit 3) are compared for the same faults. Both counts stay
against T the same way (an owner lost once, in whichever phase), so the original trial's
verdict is recorded beside them.

Results are appended to ``OUT/actors.jsonl`` (a rerun skips sampled trials already there);
each market's outputs stay in ``OUT/actors/CELL-tTRIAL/``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

from dpmarket.actors.config.market import FaultConfig
from dpmarket.actors.studies.config import StudyConfig
from dpmarket.actors.studies.trial import FaultDraw, run_trial, trial_seed

__all__ = ["actor_faults", "compare_with_actors", "sample_cells"]


def sample_cells(study: StudyConfig, n: int) -> list[int]:
    """Indices of ``n`` cells spread evenly over the grid (all of them if n >= cells)."""
    cells = len(study.cells)
    if n >= cells:
        return list(range(cells))
    if n == 1:
        return [0]
    return sorted({round(i * (cells - 1) / (n - 1)) for i in range(n)})


def actor_faults(faults: dict[str, Any]) -> FaultDraw:
    """A trial's recorded faults as a market config can express them (module docstring)."""
    drops = {
        o: ("epochs", max(1, int(epoch)) if phase == "epochs" else 1)
        for o, (phase, epoch) in faults["drops"].items()
    }
    return FaultDraw(drops, dict(faults["slow"]), tuple(faults["colluders"]))


def actor_run(study: StudyConfig, key: str, seed: int, draw: FaultDraw, out: Path) -> str:
    """Run the trial's market on Ray actors; its verdict (or "error: ..." on another exit)."""
    from dpmarket.actors.run.market import run_market

    config = study.configs[key]
    config = dataclasses.replace(
        config,
        name=f"{study.name}-{abs(hash((key, seed))) % 10**8}",
        seed=seed % (2**31) if study.vary_data else config.seed,
        reproducible_noise=True,
        noise_seed=seed % (2**31),
        faults=FaultConfig(
            kill={o: e for o, (_, e) in draw.drops.items()},
            slow=dict(draw.slow),
            colluders=draw.colluders,
        ),
    )
    with contextlib.redirect_stdout(io.StringIO()):
        outcome = run_market(config, out)
    return {0: "completed", 3: "refused"}.get(outcome.exit_code, f"error: {outcome.message}")


def compare_with_actors(
    study: StudyConfig,
    results: list[dict[str, Any]],
    out: Path,
    cells: int,
    trials: int = 1,
) -> dict[str, Any]:
    """Replay sampled trials on actors and in-process with the same faults; the comparison."""
    by_key = {(r["cell"], int(r["trial"])): r for r in results}
    log = out / "actors.jsonl"
    rows = []
    if log.exists():
        rows = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line]
    have = {(r["cell"], r["trial"]) for r in rows}
    for index in sample_cells(study, cells):
        cell = study.cells[index]
        for t in range(min(trials, study.trials)):
            if (cell.key, t) in have:
                continue
            seed = trial_seed(study.seed, cell.key, t)
            original = by_key.get((cell.key, t))
            if original is None:
                continue  # not run in-process (a --limit study): nothing to compare
            draw = actor_faults(original["faults"])
            replay = run_trial(
                study.configs[cell.key], cell, seed, study.timing, study.epoch_range,
                study.vary_data, draw=draw,
            )  # fmt: skip
            actors = actor_run(study, cell.key, seed, draw, out / "actors" / f"{cell.key}-t{t}")
            row = {
                "cell": cell.key,
                "trial": t,
                "faults_on_actors": draw.record(),
                "in_process": replay["verdict"],
                "actors": actors,
                "original_in_process": original["verdict"],
                "agree": replay["verdict"] == actors,
            }
            with log.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")
            rows.append(row)
    agree = sum(1 for r in rows if r["agree"])
    return {"compared": len(rows), "agree": agree, "rows": rows}

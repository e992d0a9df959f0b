"""A study's table: per cell, what its trials say, with intervals; written as CSV, JSON, plots.

Per cell (one row of ``study.csv``): the axes; ``trials``; ``completed``; ``p_complete`` with
its exact 95% Clopper-Pearson interval (``p_low``, ``p_high``: the binomial proportion's
interval, valid at any count, conservative) and the Wilson score interval beside it;
refusals by phase (normalise, scan, epochs) and the refusal epochs' median; epochs to
completion (mean, median, 90th percentile); ``gap_closed`` (0 = uniform, 1 = exact greedy, mean
over completed trials) and MMD^2; points accessed (mean); the honest owners' epsilon from the
ledger and against the coalition (max over trials of the per-trial max, and the median); the
T used (mean, max) against T; the completion probability in closed form where the trial's
model has one (``p_closed_form``; ``actors/studies/closedform.py``), else None with the bounds
``p_bound_low`` .. ``p_bound_high`` and why (``closed_form_note``). ``study.json`` holds
the rows, the study's settings, each cell's refusals by epoch and, per combination of the
other axes, the smallest T whose interval's lower end reaches 0.99 (and the
smallest whose estimate does). ``study.parquet`` holds the same table as ``study.csv``, typed
(pyarrow).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from dpmarket.actors.studies.closedform import completion_form
from dpmarket.actors.studies.config import Cell, StudyConfig
from dpmarket.actors.studies.intervals import clopper_pearson, wilson
from dpmarket.actors.studies.plots import write_plots

__all__ = ["summarise", "write_study"]


def _stat(values: list[float | None], fn: str) -> float | None:
    finite = [v for v in values if v is not None]
    if not finite:
        return None
    arr = np.asarray(finite, dtype=np.float64)
    return {
        "mean": lambda: float(arr.mean()),
        "median": lambda: float(np.median(arr)),
        "p90": lambda: float(np.quantile(arr, 0.9)),
        "max": lambda: float(arr.max()),
    }[fn]()


def _row(cell: Cell, rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    ok = [r for r in rows if r["verdict"] == "completed"]
    refused = [r for r in rows if r["verdict"] != "completed"]
    k = len(ok)
    low, high = clopper_pearson(k, n)
    w_low, w_high = wilson(k, n)
    out: dict[str, Any] = cell.axes() | {
        "cell": cell.key,
        "trials": n,
        "completed": k,
        "p_complete": k / n if n else None,
        "p_low": low,
        "p_high": high,
        "wilson_low": w_low,
        "wilson_high": w_high,
    }
    for phase in ("normalise", "scan", "epochs"):
        out[f"refused_{phase}"] = sum(1 for r in refused if r["refused_phase"] == phase)
    out["refusal_epoch_median"] = _stat([r["refused_epoch"] for r in refused], "median")
    epochs = [r["epochs"] for r in ok]
    out |= {f"epochs_{f}": _stat(epochs, f) for f in ("mean", "median", "p90")}
    out["gap_closed_mean"] = _stat([r["gap_closed"] for r in ok], "mean")
    out["mmd2_mean"] = _stat([r["mmd2"] for r in ok], "mean")
    out["points_accessed_mean"] = _stat([r["points_accessed"] for r in rows], "mean")
    for key in ("eps", "eps_coalition"):
        out[f"{key}_max"] = _stat([r[f"{key}_max"] for r in rows], "max")
        out[f"{key}_median"] = _stat([r[f"{key}_median"] for r in rows], "median")
    out["t_used_mean"] = _stat([r["t_used"] for r in rows], "mean")
    out["t_used_max"] = _stat([r["t_used"] for r in rows], "max")
    return out


def summarise(study: StudyConfig, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell, in the study's cell order, over the trials the study asks for (the
    first ``study.trials`` indices of each cell; others in the results file are kept but not
    counted, so a table never depends on how far an earlier, larger run got)."""
    by_cell: dict[str, dict[int, dict[str, Any]]] = {}
    for r in results:
        by_cell.setdefault(r["cell"], {})[int(r["trial"])] = r
    table = []
    for cell in study.cells:
        trials = by_cell.get(cell.key, {})
        rows = [trials[t] for t in sorted(trials) if t < study.trials]
        row = _row(cell, rows)
        deadline = study.configs[cell.key].deadline_seconds
        form = completion_form(cell, study.timing, study.epoch_range, deadline)
        row |= {
            "p_closed_form": form.high if form.exact else None,
            "p_bound_low": form.low,
            "p_bound_high": form.high,
            "closed_form_note": form.why,
        }
        table.append(row)
    return table


def _smallest_t(table: list[dict[str, Any]], target: float = 0.99) -> list[dict[str, Any]]:
    """Per combination of the axes other than T: the smallest T whose completion interval's
    lower end reaches ``target``, and the smallest whose estimate does (None: no T studied)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    others = ("owners", "compute_nodes", "dropout", "slow_fraction", "slow_delay", "colluders",
              "who_fails")  # fmt: skip
    for row in table:
        groups.setdefault(tuple(row[a] for a in others), []).append(row)
    out = []
    for key, rows in groups.items():
        rows = sorted(rows, key=lambda r: r["tolerance"])
        sure = [r["tolerance"] for r in rows if r["trials"] and r["p_low"] >= target]
        likely = [r["tolerance"] for r in rows if r["trials"] and r["p_complete"] >= target]
        out.append(
            dict(zip(others, key, strict=True))
            | {
                "target": target,
                "t_interval": min(sure, default=None),
                "t_estimate": min(likely, default=None),
            }
        )
    return out


def _refusal_epochs(study: StudyConfig, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per cell: how many of its counted trials refused at each epoch (0: a secure sum)."""
    keys = {c.key for c in study.cells}
    out: dict[str, dict[str, int]] = {}
    for r in results:
        if r["cell"] in keys and int(r["trial"]) < study.trials and r["verdict"] != "completed":
            counts = out.setdefault(r["cell"], {})
            counts[str(r["refused_epoch"])] = counts.get(str(r["refused_epoch"]), 0) + 1
    return {cell: dict(sorted(c.items(), key=lambda kv: int(kv[0]))) for cell, c in out.items()}


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def write_study(study: StudyConfig, results: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    """study.csv, study.json, study.parquet and the plots; returns the JSON."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = summarise(study, results)
    with (out / "study.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    pq.write_table(pa.Table.from_pylist(table), out / "study.parquet")
    files = ["study.csv", "study.parquet", "study.json"]
    files += write_plots(table, out)
    doc = {
        "study": study.record(),
        "noise": "simulated (reproducible per trial from its public seed); data simulated",
        "interval": "exact 95% Clopper-Pearson (p_low, p_high); Wilson score beside it",
        "cells": table,
        "smallest_t": _smallest_t(table),
        "refusal_epochs": _refusal_epochs(study, results),
        "trial_seconds": {  # wall time per trial (not in the table: it varies between runs)
            "mean": _stat([r["seconds"] for r in results], "mean"),
            "max": _stat([r["seconds"] for r in results], "max"),
            "cpu_mean": _stat([r.get("cpu_seconds") for r in results], "mean"),  # older: none
        },
        "files": files,
    }
    (out / "study.json").write_text(json.dumps(_json_safe(doc), indent=1), encoding="utf-8")
    return doc

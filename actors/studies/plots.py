"""A study's plots (matplotlib, Agg): completion probability vs dropout rate per T (with the
95% intervals), honest owners' epsilon vs coalition size, and utility vs dropout rate.

Each plot groups the table's rows by the plotted axes and pools the other axes' cells (the
completion plot sums their trials and recomputes the interval; the others average the cells'
values), so a study with one value per other axis plots exactly its cells.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dpmarket.actors.studies.intervals import clopper_pearson

__all__ = ["write_plots"]


def _series(
    table: list[dict[str, Any]], x: str, group: str, y: str
) -> dict[Any, tuple[list[float], list[float]]]:
    """group value -> (x values, mean of y over the cells at each x), None ys skipped."""
    acc: dict[Any, dict[float, list[float]]] = {}
    for row in table:
        if row.get(y) is None:
            continue
        acc.setdefault(row[group], {}).setdefault(float(row[x]), []).append(float(row[y]))
    return {
        g: (sorted(pts), [float(np.mean(pts[v])) for v in sorted(pts)])
        for g, pts in sorted(acc.items())
    }


def _pooled(table: list[dict[str, Any]]) -> dict[Any, dict[float, tuple[int, int]]]:
    """T -> dropout -> (completed, trials) pooled over the other axes' cells (an interval
    is recomputed from the pooled counts, never averaged)."""
    acc: dict[Any, dict[float, tuple[int, int]]] = {}
    for row in table:
        if not row["trials"]:
            continue
        k, n = acc.setdefault(row["tolerance"], {}).get(float(row["dropout"]), (0, 0))
        acc[row["tolerance"]][float(row["dropout"])] = (k + row["completed"], n + row["trials"])
    return dict(sorted(acc.items()))


def write_plots(table: list[dict[str, Any]], out: Path) -> list[str]:
    """Write the three plots into ``out``; return their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for t, points in _pooled(table).items():
        xs = sorted(points)
        ys = [points[x][0] / points[x][1] for x in xs]
        bounds = [clopper_pearson(*points[x]) for x in xs]
        err = [[y - lo for y, (lo, _) in zip(ys, bounds, strict=True)],
               [hi - y for y, (_, hi) in zip(ys, bounds, strict=True)]]  # fmt: skip
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=f"T = {t}")
    ax.set(xlabel="dropout probability per owner", ylabel="P(run completes)", ylim=(-0.02, 1.02))
    ax.set_title("completion vs dropout (95% Clopper-Pearson)")
    ax.legend()
    names.append(_save(fig, out / "completion_vs_dropout.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for t, (xs, ys) in _series(table, "colluders", "tolerance", "eps_coalition_max").items():
        ax.plot(xs, ys, marker="o", label=f"vs coalition, T = {t}")
    for t, (xs, ys) in _series(table, "colluders", "tolerance", "eps_max").items():
        ax.plot(xs, ys, marker="x", linestyle=":", label=f"ledger, T = {t}")
    ax.set(xlabel="colluding owners", ylabel="honest owner's epsilon (max in a cell)")
    ax.set_title("epsilon vs coalition size")
    ax.legend(fontsize="small")
    names.append(_save(fig, out / "epsilon_vs_coalition.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for who, (xs, ys) in _series(table, "dropout", "who_fails", "gap_closed_mean").items():
        ax.plot(xs, ys, marker="o", label=f"{who} owners fail")
    ax.set(xlabel="dropout probability per owner", ylabel="gap closed (uniform 0, greedy 1)")
    ax.set_title("utility of completed runs vs dropout")
    if ax.lines:
        ax.legend()
    names.append(_save(fig, out / "utility_vs_dropout.png"))
    return names


def _save(fig: Any, path: Path) -> str:
    """Lay out, write and close one figure; its file name."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path.name

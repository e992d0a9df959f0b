"""Parsimony (issue 18): gap closed and LinearSVC against the points the curator accessed.

For every mechanism (actors/harness/parsimony.py: allocate-select, herding-select,
herding-pure-select)
and the baseline "random-select" (max_points points bought uniformly at random, then the same
exact final selection against D_v), on the synthetic covariate shift of benchmarks/utility.py
and the appendix G digits split, at ``[summary].max_points`` = p, 1.5 p, 2 p, 3 p and (K + 1) p.
Budgets: eps_owner <= 1, eps_validation <= 3 at delta 1e-5 (PLD ledger, replace-one). Noise is
reproducible (a simulation; actors/randomness.py).

    python benchmarks/parsimony.py                 # seeds 0-4, p in {50, 100, 200}, every factor
    python benchmarks/parsimony.py --quick         # seed 0, p in {50, 100}, max_points 1.5 p
    python benchmarks/parsimony.py --seeds 15 --factors 1.5 \
        --mechanisms allocate-select random-select
    python benchmarks/parsimony.py --datasets digits --first-seed 100 --seeds 40 \
        --factors 1.5 --mechanisms allocate-select --allocation-ridge 0   # tuning seeds
    python benchmarks/parsimony.py ... --override validation_sigma=0.05   # an ablation

Prints a table, writes the Pareto-front PNG (--png), and as last line one JSON object
{"benchmark": "parsimony", "rows": [{"dataset", "mechanism", "p", "max_points",
"points_accessed", "gap_closed", "gap_closed_sd", "gap_closed_seeds", "svm_private",
"svm_uniform", "svm_greedy", "eps_owner", "eps_validation", "delta", "seeds"}, ...]} (an
unbounded epsilon is null). Before it, each mechanism's margin over random-select at the same
budget, seed by seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from dpmarket.actors.harness.parsimony import FACTORS, PARSIMONY_MECHANISMS, evaluate_parsimony
from dpmarket.actors.harness.utility import DATASETS
from dpmarket.actors.randomness import NoiseSource


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({r["dataset"] for r in rows})
    mechanisms = sorted({r["mechanism"] for r in rows})
    colours = {m: f"C{i}" for i, m in enumerate(mechanisms)}  # one colour per mechanism
    markers = dict(zip(sorted({r["p"] for r in rows}), "os^vDP*X", strict=False))  # one per p
    fig, axes = plt.subplots(2, len(datasets), figsize=(6 * len(datasets), 8), squeeze=False)
    for col, dataset in enumerate(datasets):
        for mech in mechanisms:
            for p in sorted({r["p"] for r in rows}):
                sel = sorted(
                    (
                        r
                        for r in rows
                        if (r["dataset"], r["mechanism"], r["p"]) == (dataset, mech, p)
                    ),
                    key=lambda r: r["points_accessed"],
                )
                if not sel:
                    continue
                x = [r["points_accessed"] / p for r in sel]
                style = "--" if mech == "random-select" else "-"
                for row, key in ((0, "gap_closed"), (1, "svm_private")):
                    axes[row][col].plot(
                        x, [r[key] for r in sel], style, marker=markers.get(p, "o"),
                        color=colours[mech], label=f"{mech} p={p}",
                    )  # fmt: skip
        axes[0][col].set_title(f"{dataset}: gap closed")
        axes[1][col].set_title(f"{dataset}: LinearSVC accuracy")
        for row in (0, 1):
            axes[row][col].set_xlabel("points accessed / p")
            axes[row][col].grid(True, alpha=0.3)
        axes[0][col].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _print_margins(rows: list[dict[str, Any]]) -> None:
    """Each mechanism against random-select at the same budget, seed by seed (paired): the mean
    margin in gap closed, the spread (sd) of the per-seed margins, and on how many seeds the
    mechanism closed more of that seed's gap."""
    random = {
        (r["dataset"], r["p"], r["max_points"]): r
        for r in rows
        if r["mechanism"] == "random-select"
    }
    lines = []
    for r in rows:
        base = random.get((r["dataset"], r["p"], r["max_points"]))
        if r["mechanism"] == "random-select" or base is None:
            continue
        diff = np.asarray(r["gap_closed_seeds"]) - np.asarray(base["gap_closed_seeds"])
        lines.append(
            f"{r['dataset']:<10} {r['mechanism']:<24} {r['p']:>4} {r['max_points']:>7} "
            f"{diff.mean():>7.2f} {diff.std():>6.2f} {int((diff > 0).sum()):>3}/{len(diff):<3} "
            f"{'-' if len(diff) < 2 else 'yes' if diff.mean() > diff.std() else 'no'}"
        )
    if lines:
        print("\nmargin over random-select, seed by seed (gap closed of each seed's own gap)")
        print(f"{'dataset':<10} {'mechanism':<24} {'p':>4} {'max_pts':>7} {'margin':>7} "
              f"{'sd':>6} {'wins':>7} margin > sd")  # fmt: skip
        print("\n".join(lines))


def _overrides(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, float]:
    """``FIELD=NUMBER`` items as a dict; an unknown field or a non-number is a usage error."""
    from dpmarket.protocol.summary.params import CuratorParams

    fields = {f.name for f in dataclasses.fields(CuratorParams)}
    out: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in fields:
            parser.error(f"--override {item!r}: {name!r} is not a CuratorParams field")
        try:
            out[name] = float(value)
        except ValueError:
            parser.error(f"--override {item!r}: expected FIELD=NUMBER")
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--p", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--factors", nargs="+", default=list(FACTORS))
    parser.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    parser.add_argument(
        "--mechanisms", nargs="+", choices=PARSIMONY_MECHANISMS, default=list(PARSIMONY_MECHANISMS)
    )
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first..first+seeds-1")
    parser.add_argument(
        "--allocation-ridge", type=float, default=None,
        help="the histogram rule's score ridge (default: CuratorParams'; 0: the raw direction)",
    )  # fmt: skip
    parser.add_argument(
        "--override", action="append", default=[], metavar="FIELD=NUMBER",
        help="replace a CuratorParams field of the allocate mechanisms (an ablation, e.g. "
        "validation_sigma=0.05: g_tilde almost without noise; the ledger reports its epsilon)",
    )  # fmt: skip
    parser.add_argument("--noise-seed", type=int, default=0)
    parser.add_argument("--png", type=Path, default=Path("benchmarks/parsimony.png"))
    parser.add_argument(
        "--plot-from", type=Path, nargs="+", help="plot the JSON lines of earlier runs' output"
    )
    args = parser.parse_args(argv)
    if args.plot_from:
        rows = []
        for path in args.plot_from:
            last = [line for line in path.read_text().splitlines() if line.startswith("{")][-1]
            rows += json.loads(last)["rows"]
        _plot(rows, args.png)
        print(json.dumps({"benchmark": "parsimony", "rows": rows}))
        return 0
    if args.quick:
        args.seeds, args.p, args.factors = 1, [50, 100], ["1.5"]
        args.mechanisms = ["allocate-select", "herding-select", "random-select"]
    started = time.perf_counter()
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    overrides = _overrides(parser, args.override)
    if args.allocation_ridge is not None:
        overrides["allocation_ridge"] = args.allocation_ridge
    rows = evaluate_parsimony(
        args.datasets, args.mechanisms, args.p, seeds, args.factors,
        noise=NoiseSource.reproducible(args.noise_seed), overrides=overrides,
    )  # fmt: skip
    header = (
        f"{'dataset':<10} {'mechanism':<20} {'p':>4} {'max_pts':>7} {'accessed':>8} "
        f"{'gap':>6} {'sd':>5} {'svm':>6} {'svm_u':>6} {'eps_own':>7} {'eps_val':>7}"
    )
    print(header)
    for r in rows:
        eps = [("inf" if r[k] is None else f"{r[k]:.3f}") for k in ("eps_owner", "eps_validation")]
        print(
            f"{r['dataset']:<10} {r['mechanism']:<20} {r['p']:>4} {r['max_points']:>7} "
            f"{r['points_accessed']:>8.1f} {r['gap_closed']:>6.2f} {r['gap_closed_sd']:>5.2f} "
            f"{r['svm_private']:>6.3f} {r['svm_uniform']:>6.3f} {eps[0]:>7} {eps[1]:>7}"
        )
    _print_margins(rows)
    _plot(rows, args.png)
    elapsed = time.perf_counter() - started
    print(
        f"{len(rows)} rows, seeds {seeds[0]}-{seeds[-1]}, overrides {overrides or 'none'}, "
        f"{elapsed:.1f} s; plot: {args.png}"
    )
    print(json.dumps({"benchmark": "parsimony", "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

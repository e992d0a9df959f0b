"""``dpmarket evaluate`` (and benchmarks/utility.py): the utility table of every release
mechanism at given budgets, in-process, then one JSON line."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from dpmarket.actors.harness.utility import DATASETS, MECHANISMS, ROW_KEYS, evaluate_utility
from dpmarket.actors.randomness import NOISE_WARNING, NoiseSource
from dpmarket.protocol.summary.plan import EXPLORE_SHARE

__all__ = [
    "add_evaluate_parser",
    "build_utility_parser",
    "utility_json",
    "utility_main",
    "utility_table",
]


def utility_table(rows: list[dict[str, Any]]) -> list[str]:
    """Human-readable lines for :func:`evaluate_utility` rows."""
    head = (
        f"{'dataset':<10} {'mechanism':<13} {'p':>4} {'greedy':>8} {'uniform':>8} {'private':>8} "
        f"{'gap':>6} {'SVM g/u/priv':>17} {'eps own':>8} {'eps val':>8} {'accessed':>9} "
        f"{'random-buy select (gap, SVM)':>28}"
    )
    lines = [head]
    for r in rows:
        eps = ["inf" if r[k] is None else f"{r[k]:.3f}" for k in ("eps_owner", "eps_validation")]
        svm = f"{r['svm_greedy']:.3f}/{r['svm_uniform']:.3f}/{r['svm_private']:.3f}"
        lines.append(
            f"{r['dataset']:<10} {r['mechanism']:<13} {r['p']:>4} {r['mmd2_greedy']:>8.5f} "
            f"{r['mmd2_uniform']:>8.5f} {r['mmd2_private']:>8.5f} {r['gap_closed']:>6.2f} "
            f"{svm:>17} {eps[0]:>8} {eps[1]:>8} {r['points_accessed']:>9.1f} "
            f"{_random_buy(r):>28}"
        )
    return lines


def _random_buy(row: dict[str, Any]) -> str:
    if row["mmd2_uniform_select"] is None:
        return "-"
    u, g = row["mmd2_uniform"], row["mmd2_greedy"]
    gap = (u - row["mmd2_uniform_select"]) / (u - g)
    return f"{gap:.2f}, {row['svm_uniform_select']:.3f}"


def utility_json(rows: list[dict[str, Any]]) -> str:
    """The benchmark's last line: ``{"benchmark": "utility", "rows": [...]}`` (issue 6 keys)."""
    return json.dumps({"benchmark": "utility", "rows": [{k: r[k] for k in ROW_KEYS} for r in rows]})


def build_utility_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of ``benchmarks/utility.py`` (and of a ``dpmarket evaluate``-style command)."""
    parser.add_argument("--quick", action="store_true", help="one seed, p in {50, 100}")
    parser.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    parser.add_argument("--mechanisms", nargs="+", choices=MECHANISMS, default=list(MECHANISMS))
    parser.add_argument("--p", nargs="+", type=int, default=[50, 100, 200])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0 .. N-1")
    parser.add_argument("--eps-owner", type=float, default=1.0)
    parser.add_argument("--eps-validation", type=float, default=3.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument(
        "--reproducible-noise", action="store_true",
        help="simulation switch: noise from a public seed, so the numbers repeat (not private)",
    )  # fmt: skip
    parser.add_argument(
        "--explore-share", type=_share, default=EXPLORE_SHARE,
        help="exploration points per summary point of the -select mechanisms (default "
        f"{EXPLORE_SHARE})",
    )  # fmt: skip
    return parser


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def utility_main(argv: list[str] | None = None) -> int:
    """Run :func:`evaluate_utility`, print the table, then the JSON line; returns 0."""
    parser = build_utility_parser(argparse.ArgumentParser(description="issue 6 utility"))
    args = parser.parse_args(argv)
    p_values, seeds = (args.p, list(range(args.seeds)))
    mechanisms = args.mechanisms
    if args.quick:
        p_values, seeds = [50, 100], [0]
        mechanisms = [m for m in mechanisms if m in ("paper", "tree", "herding", "herding-select")]
    budget = (args.eps_owner, args.eps_validation, args.delta)
    start = time.perf_counter()
    noise = NoiseSource.reproducible(0) if args.reproducible_noise else NoiseSource.secure()
    if args.reproducible_noise:
        print(f"dpmarket: WARNING: {NOISE_WARNING}", file=sys.stderr)
    rows = evaluate_utility(
        args.datasets, mechanisms, p_values, seeds, budget, args.explore_share, noise
    )
    print(
        f"utility: seeds {seeds}, budgets eps_owner <= {budget[0]}, eps_validation <= "
        f"{budget[1]} at delta {budget[2]:g} (PLD), explore share {args.explore_share:g}; "
        f"{time.perf_counter() - start:.1f} s"
    )
    for line in utility_table(rows):
        print(line)
    print(utility_json(rows))
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    argv = [
        "--datasets",
        *args.datasets,
        "--mechanisms",
        *args.mechanisms,
        "--p",
        *map(str, args.p),
        "--seeds",
        str(args.seeds),
        "--eps-owner",
        str(args.eps_owner),
        "--eps-validation",
        str(args.eps_validation),
        "--delta",
        str(args.delta),
        "--explore-share",
        str(args.explore_share),
        *(["--reproducible-noise"] if args.reproducible_noise else []),
    ]
    return utility_main([*argv, "--quick"] if args.quick else argv)


def add_evaluate_parser(sub: Any) -> None:
    evaluate = sub.add_parser(
        "evaluate", help="utility of every release mechanism at given budgets (in-process)"
    )
    build_utility_parser(evaluate)
    evaluate.set_defaults(func=_evaluate)

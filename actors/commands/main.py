"""The ``dpmarket`` command line.

Exit codes: 0 success; 2 bad configuration or input (the message names the file and key);
3 refused by T-tolerance (more owners lost or colluding than T; resume when they are back);
1 or other non-zero: internal error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from dpmarket.actors.commands.account import add_account_parser
from dpmarket.actors.commands.audit import build_audit_parser
from dpmarket.actors.commands.regress import add_regress_parser
from dpmarket.actors.commands.sketch import add_sketch_parser
from dpmarket.actors.config import ConfigError, DemoConfig, load_demo_config, load_market_config
from dpmarket.actors.evaluate import (
    EvaluationTable,
    build_utility_parser,
    evaluate,
    utility_main,
)
from dpmarket.actors.randomness import NOISE_WARNING, NoiseSource
from dpmarket.actors.scenarios import digits_split
from dpmarket.streams.synthetic import Scenario, gaussian_mixture_shift

__all__ = ["main", "make_scenario"]


def _version() -> str:
    try:
        return version("dpmarket")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def make_scenario(name: str, rng: np.random.Generator) -> Scenario:
    """Build a named scenario: "digits" (Appendix G) or "synthetic" (Gaussian mixture shift)."""
    if name == "digits":
        return digits_split(rng)
    if name == "synthetic":
        return gaussian_mixture_shift(rng, n_points=20_000)
    raise ConfigError(f"scenario: unknown name {name!r}")


def print_table(table: EvaluationTable, title: str) -> None:
    print(title)
    for line in table.rows():
        print(line)
    print("privacy (epsilon per protected party):")
    print(json.dumps(table.epsilon, indent=2))


def _demo(args: argparse.Namespace) -> int:
    config = load_demo_config(args.config) if args.config else DemoConfig()
    if args.quick:
        config = DemoConfig(
            config.scenario, config.seeds[:1], config.p[:2], config.delta, config.overrides
        )
    print(
        f"dpmarket {_version()} digits: scenario {config.scenario}, seeds {list(config.seeds)}, "
        f"p {list(config.p)}, in-process (LoopbackTransport)"
    )
    noise = NoiseSource.reproducible(0) if args.reproducible_noise else NoiseSource.secure()
    if args.reproducible_noise:
        print(f"dpmarket: WARNING: {NOISE_WARNING}", file=sys.stderr)
    table = evaluate(
        lambda rng: make_scenario(config.scenario, rng),
        list(config.p),
        list(config.seeds),
        config.delta,
        configure=config.apply,
        noise=noise,
    )
    print_table(
        table, "MMD^2 to the test set (lower is better), LinearSVC accuracy, points accessed"
    )
    return 0


def _market(args: argparse.Namespace) -> int:
    from dpmarket.actors.market import resume_market, run_market

    if args.command == "resume":
        outcome = resume_market(Path(args.out), args.address)
    else:
        config = load_market_config(args.config, args.set)
        if config.reproducible_noise:
            print(f"dpmarket: WARNING: {NOISE_WARNING}", file=sys.stderr)
        if args.command == "validate":
            print(json.dumps(config.public_record(), indent=2, default=str))
            print(f"{args.config}: valid", file=sys.stderr)
            return 0
        outcome = run_market(config, Path(args.out) if args.out else None, args.address)
    if outcome.report is not None:
        _print_report(outcome.report, outcome.consumer_report)
    print(outcome.message, file=sys.stderr if outcome.exit_code else sys.stdout)
    return outcome.exit_code


def _print_report(report: dict[str, Any], consumer: dict[str, Any] | None = None) -> None:
    """Print the public ``report`` and, when given, the consumer's utility (actors/report.py)."""
    outcome, parsimony = report["outcome"], report["parsimony"]
    print(f"state {outcome['state']} after {outcome['epochs']} epochs: {outcome['reason']}")
    print(
        f"summary {parsimony['summary_size']} points; curator saw {parsimony['distinct_points']} "
        f"distinct points in {parsimony['total_transfers']} transfers (rho {parsimony['rho']:.2f})"
    )
    delta = report["privacy"]["delta"]
    print(f"{'protected party':<16} {'eps (PLD)':>10} {'Theorem 7':>10} {'paper count':>12}")
    for party, entry in report["privacy"]["parties"].items():
        cells = [entry[k] for k in ("pld", "theorem7", "paper")]
        text = ["inf" if v is None else f"{v:.3f}" for v in cells]
        line = f"{party:<16} {text[0]:>10} {text[1]:>10} {text[2]:>12}   (delta {delta:g})"
        if "against_colluders" in entry:
            pooled = entry["against_colluders"]
            line += f"; vs colluders {'inf' if pooled is None else f'{pooled:.3f}'}"
        print(line)
    for name, row in (consumer or {}).get("utility", {}).items():
        print(f"utility {name:<8} MMD^2 {row['mmd2']:.5f}  LinearSVC {row['svm_accuracy']:.3f}")
    lost = report["faults"]["lost"]
    if lost:
        print(f"tolerated: owners lost {lost}")


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
        *(["--reproducible-noise"] if args.reproducible_noise else []),
    ]
    return utility_main([*argv, "--quick"] if args.quick else argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpmarket", description=__doc__)
    parser.add_argument("--version", action="version", version=f"dpmarket {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "digits",
        help="private protocol vs baselines on digits, in-process (configs/evaluate.toml)",
    )
    demo.add_argument("--config", help="TOML file (see configs/evaluate.toml)")
    demo.add_argument("--quick", action="store_true", help="one seed, the first two sizes")
    demo.add_argument(
        "--reproducible-noise",
        action="store_true",
        help="simulation switch: noise from a public seed, so the table repeats (not private)",
    )
    demo.set_defaults(func=_demo)
    for name, text in (
        ("run", "run a market on Ray (embedded local instance unless --address)"),
        ("simulate", "run a simulated market with the faults its config declares"),
        ("validate", "check a configuration file and print what it records"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("config", help="TOML market configuration (see configs/)")
        cmd.add_argument("--out", help="output directory (default: [run].out)")
        cmd.add_argument("--address", help="Ray address, or 'auto' (default: RAY_ADDRESS/local)")
        cmd.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="SECTION.KEY=VALUE",
            help="override a configuration value (TOML syntax), repeatable",
        )
        cmd.set_defaults(func=_market)
    resume = sub.add_parser("resume", help="continue a refused or crashed run from OUT/.journal")
    resume.add_argument("out", help="the output directory of the run")
    resume.add_argument("--address", help="Ray address, or 'auto'")
    resume.set_defaults(func=_market)
    add_account_parser(sub)
    add_regress_parser(sub)
    add_sketch_parser(sub)
    build_audit_parser(sub)
    evaluate = sub.add_parser(
        "evaluate", help="utility of every release mechanism at given budgets (in-process)"
    )
    build_utility_parser(evaluate)
    evaluate.set_defaults(func=_evaluate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"dpmarket: configuration error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"dpmarket: bad input: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

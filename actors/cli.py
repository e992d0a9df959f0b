"""The ``dpmarket`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

import numpy as np

from dpmarket.actors.config import ConfigError, DemoConfig, load_demo_config
from dpmarket.actors.evaluate import EvaluationTable, evaluate
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
        f"dpmarket {_version()} demo: scenario {config.scenario}, seeds {list(config.seeds)}, "
        f"p {list(config.p)}, in-process (LoopbackTransport)"
    )
    table = evaluate(
        lambda rng: make_scenario(config.scenario, rng),
        list(config.p),
        list(config.seeds),
        config.delta,
        configure=config.apply,
    )
    print_table(
        table, "MMD^2 to the test set (lower is better), LinearSVC accuracy, points accessed"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpmarket", description=__doc__)
    parser.add_argument("--version", action="version", version=f"dpmarket {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run private summarisation on the digits split in-process")
    demo.add_argument("--config", help="TOML file (see configs/demo.toml)")
    demo.add_argument("--quick", action="store_true", help="one seed, the first two sizes")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"dpmarket: configuration error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

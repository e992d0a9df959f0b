"""``dpmarket digits``: the private protocol against its baselines on the appendix G digits
split (or the synthetic scenario), in-process (actors/harness/evaluation.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from dpmarket.actors.config.digits import digits_split
from dpmarket.actors.config.market import ConfigError
from dpmarket.actors.harness.evaluation import (
    DemoConfig,
    EvaluationTable,
    evaluate,
    load_demo_config,
)
from dpmarket.actors.randomness import NOISE_WARNING, NoiseSource
from dpmarket.streams.synthetic import Scenario, gaussian_mixture_shift

__all__ = ["add_digits_parser", "make_scenario", "print_table"]


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
        f"dpmarket digits: scenario {config.scenario}, seeds {list(config.seeds)}, "
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


def add_digits_parser(sub: Any) -> None:
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

"""Utility of private summarisation on the appendix G digits split (scikit-learn's load_digits).

For p in {20, 50, 100, 200} and 5 seeds: MMD^2 (exact RBF) to the test set of exact greedy,
hashed greedy (h1, exact means), the private protocol (Algorithm 3, in-process) and uniform
sampling; the percentage over greedy; LinearSVC accuracy on the test set; points accessed by the
curator; epsilon per protected party (ledger via dp-accounting PLD, and as the paper counts it).

    python benchmarks/utility_digits.py            # full grid
    python benchmarks/utility_digits.py --quick    # 2 seeds, p in {20, 50}: under 60 s

Last line: one JSON object (keys as in issue 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from dpmarket.actors.commands.digits import make_scenario, print_table
from dpmarket.actors.harness.evaluation import METHODS, evaluate
from dpmarket.actors.randomness import NoiseSource


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--auction-variant", choices=("paper", "pure"), default="paper")
    parser.add_argument("--delta", type=float, default=1e-5)
    args = parser.parse_args()
    p_values = [20, 50] if args.quick else [20, 50, 100, 200]
    seeds = [0, 1] if args.quick else [0, 1, 2, 3, 4]
    start = time.perf_counter()
    table = evaluate(
        lambda rng: make_scenario("digits", rng),
        p_values,
        seeds,
        args.delta,
        configure=lambda params: dataclasses.replace(params, auction_variant=args.auction_variant),
        noise=NoiseSource.reproducible(0),  # a simulation: the table repeats (not private)
    )
    elapsed = time.perf_counter() - start
    print_table(
        table,
        f"digits split, seeds {seeds}, auction variant {args.auction_variant}, "
        f"{elapsed:.1f} s: MMD^2 to the test set, LinearSVC accuracy, points accessed",
    )
    print(
        json.dumps(
            {
                "benchmark": "utility_digits",
                "p": p_values,
                "mmd2": {m: [round(v, 6) for v in table.mmd2[m]] for m in METHODS},
                "svm_accuracy": {m: [round(v, 4) for v in table.svm_accuracy[m]] for m in METHODS},
                "points_accessed": table.points_accessed,
                "transfers": table.transfers,
                "epsilon": table.epsilon,
                "auction_variant": args.auction_variant,
                "seeds": seeds,
                "seconds": round(elapsed, 1),
            }
        )
    )


if __name__ == "__main__":
    main()

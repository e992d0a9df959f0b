"""The DP standardisation on 64-pixel digits (issue 30, part 1): gap closed with and without it.

Each trial is a study trial without faults (actors/study_trial.py: the normalise and scan
secure sums through the real DCA parties, the standardisation h1 uses, then the summary), on
configs/digits.toml (bound 1, eps_normalise 0.5, p = 100, no ``[summary]``: the default
mechanism) and one of two splits of scikit-learn's bundled ``load_digits`` scaled to [0, 1]:

- ``appendix``: the appendix G split (owners by digit pairs, the consumer wants 3s and 4s);
- ``ink``: owners by quintile of ink (the sum of a digit's pixels), the consumer wants 2s and
  8s at 0.7 : 0.3 (held-out rows; a quarter of them is the validation set, the rest the test
  set), the public seed set 30 held-out rows of the other digits.

``standardize`` on (the default) and off, over the seeds given. Prints per split and mode the
mean gap closed (0 = uniform, 1 = exact greedy, on the test set's exact MMD^2 at p) and its
spread over seeds; last line one JSON object.

    python benchmarks/standardise_digits.py                  # seeds 0-9, both splits
    python benchmarks/standardise_digits.py --seeds 2 --splits ink
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.datasets import load_digits

from dpmarket.actors.config.digits import digits_split
from dpmarket.actors.config.market import MarketConfig, load_market_config
from dpmarket.actors.randomness import public_generator
from dpmarket.actors.studies.config import Cell
from dpmarket.actors.studies.trial import FaultDraw, run_trial
from dpmarket.streams.synthetic import Scenario, median_heuristic_gamma

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "digits.toml"
TARGET, RATIO = (2, 8), (0.7, 0.3)


def ink_split(seed: int) -> Scenario:
    """Owners by ink quintile; the consumer's target digits held out (module docstring)."""
    rng = public_generator([seed, 30])
    bunch = load_digits()
    X = np.asarray(bunch.data, dtype=np.float64) / 16.0
    y = np.asarray(bunch.target, dtype=np.int64)
    rows = rng.permutation(len(y))
    held: list[int] = []
    for digit, share in zip(TARGET, RATIO, strict=True):
        mine = rows[y[rows] == digit]
        held += mine[: round(share * 130)].tolist()
    held_rows = rng.permutation(np.asarray(held))
    n_validation = len(held_rows) // 4
    validation, test = held_rows[:n_validation], held_rows[n_validation:]
    rest = np.setdiff1d(rows, held_rows)
    others = rest[~np.isin(y[rest], TARGET)]
    seed_rows = rng.choice(others, size=30, replace=False)
    pool = np.setdiff1d(rest, seed_rows)
    ink = X[pool].sum(axis=1)
    edges = np.quantile(ink, [0.2, 0.4, 0.6, 0.8])
    group = np.searchsorted(edges, ink)
    owners = tuple((X[pool[group == g]], y[pool[group == g]]) for g in range(5))
    return Scenario(
        owners=owners,
        owner_names=tuple(f"owner-{g + 1}" for g in range(5)),
        validation=X[validation],
        test_X=X[test],
        test_y=y[test],
        seed_set=X[seed_rows],
        gamma=median_heuristic_gamma(X[seed_rows]),
        name="digits-ink",
    )


def trial(config: MarketConfig, split: str, seed: int) -> dict[str, Any]:
    scenario = digits_split(public_generator(seed)) if split == "appendix" else ink_split(seed)
    cell = Cell(0, 5, config.tolerance, config.compute_nodes, 0.0, 0.0, 0.0, 0, "random")
    result = run_trial(
        config, cell, seed, {}, (1, 1), vary_data=False, draw=FaultDraw({}, {}, ()),
        scenario=scenario,
    )  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--splits", nargs="+", default=["appendix", "ink"])
    args = parser.parse_args()
    base = load_market_config(CONFIG)
    rows = []
    for split in args.splits:
        for standardize in (True, False):
            secure = base.secure | {"standardize": standardize}
            config = dataclasses.replace(base, secure=secure)
            start = time.perf_counter()
            gaps = []
            for seed in range(args.seeds):
                gaps.append(float(trial(config, split, seed)["gap_closed"]))
            row = {
                "split": split,
                "standardize": standardize,
                "gap_closed": round(float(np.mean(gaps)), 4),
                "gap_closed_sd": round(float(np.std(gaps)), 4),
                "gap_closed_seeds": [round(g, 4) for g in gaps],
                "seconds": round(time.perf_counter() - start, 1),
            }
            rows.append(row)
            print(
                f"{split:<9} standardize {standardize!s:<5}  gap closed "
                f"{row['gap_closed']:.3f} (sd {row['gap_closed_sd']:.3f})  "
                f"seeds {row['gap_closed_seeds']}"
            )
    print(json.dumps({"benchmark": "standardise_digits", "seeds": args.seeds, "rows": rows}))


if __name__ == "__main__":
    main()

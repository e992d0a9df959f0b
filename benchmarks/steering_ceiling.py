"""How far can steering by the released validation mean go? (issue 6, digits split)

A non-private diagnostic behind the "oversample, then select" design
(protocol/summary/selection.py).
For each seed of the appendix G digits split and each p it computes the MMD^2 to the test set of

* ``greedy``: exact greedy over every owner point against the exact validation set;
* ``uniform``: p points, about p/K per owner (the issue's baseline);
* ``oracle_noisy``: greedy over *every* owner point on h1 toward the Gaussian release g_tilde
  the plan makes (eps_validation 3 at delta 1e-5, the plan's d and clip): the best any steering
  by g_tilde alone could do, even if the curator saw every owner point;
* ``oracle_exact_h1``: the same toward the exact mean of h1 (the hashing error alone);
* ``random_buy_c``: c p points bought uniformly at random, then exact greedy against the exact
  validation set among them (what the curator's final selection does with no steering at all).

It prints one row per (p, summary) with the gap closed ``(uniform - x) / (uniform - greedy)``
on the seed means, then one JSON line ``{"benchmark": "steering_ceiling", "rows": [...]}``.

    python benchmarks/steering_ceiling.py            # p in {50, 100}, 15 seeds
    python benchmarks/steering_ceiling.py --quick    # p = 50, 3 seeds
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from dpmarket.actors.config.digits import digits_split
from dpmarket.protocol.summary.h1 import RandomFourierFeatures
from dpmarket.protocol.summary.objective import greedy_exact, greedy_hashed, mmd2, uniform_sample
from dpmarket.protocol.summary.plan import plan_releases
from dpmarket.protocol.summary.releases import clip_rows

BUY_FACTORS = (2, 3, 5)


def seed_scores(seed: int, p: int) -> dict[str, float]:
    scenario = digits_split(np.random.default_rng(seed))
    X, _, owner_of = scenario.pooled()
    V, m, gamma = scenario.validation, len(scenario.validation), scenario.gamma
    plan = plan_releases(p, m, len(scenario.owners))
    h1 = RandomFourierFeatures(X.shape[1], plan.d, gamma, seed)
    HX, HV = h1(X), h1(V)
    noise = np.random.default_rng([seed, p, 99]).normal(
        0.0, plan.validation_sigma * plan.clip_norm, plan.d
    )
    g_tilde = (clip_rows(HV, plan.clip_norm).sum(axis=0) + noise) / m

    def score(idx: np.ndarray) -> float:
        return mmd2(X[idx], scenario.test_X, gamma)

    out = {
        "greedy": score(greedy_exact(X, V, p, gamma)),
        "uniform": score(uniform_sample(owner_of, p, np.random.default_rng([seed, p, 1]))),
        "oracle_noisy": score(greedy_hashed(HX, g_tilde[None, :], p)),
        "oracle_exact_h1": score(greedy_hashed(HX, HV, p)),
    }
    for c in BUY_FACTORS:
        bought = uniform_sample(owner_of, min(c * p, len(X)), np.random.default_rng([seed, p, 7]))
        out[f"random_buy_{c}"] = score(bought[greedy_exact(X[bought], V, p, gamma)])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    p_values, seeds = ([50], range(3)) if args.quick else ([50, 100], range(15))
    start = time.perf_counter()
    rows = []
    for p in p_values:
        per_seed = [seed_scores(seed, p) for seed in seeds]
        mean = {k: float(np.mean([s[k] for s in per_seed])) for k in per_seed[0]}
        span = mean["uniform"] - mean["greedy"]
        for name, value in mean.items():
            gap = (mean["uniform"] - value) / span
            rows.append(
                {"p": p, "summary": name, "mmd2": round(value, 6), "gap_closed": round(gap, 4)}
            )
    print(
        f"steering_ceiling: digits split, seeds 0-{max(seeds)}; {time.perf_counter() - start:.1f} s"
    )
    print(f"{'p':>4} {'summary':<16} {'MMD^2':>9} {'gap closed':>11}")
    for r in rows:
        print(f"{r['p']:>4} {r['summary']:<16} {r['mmd2']:>9.5f} {r['gap_closed']:>11.2f}")
    print(json.dumps({"benchmark": "steering_ceiling", "rows": rows}))


if __name__ == "__main__":
    main()

"""Steered purchases against random-select at equal points accessed (issue 30, part 2).

Scenarios built here from scikit-learn's bundled data, split in ways the rest of the project
never tuned on. Every scenario: features standardised by the dataset's own mean and spread
(a public map), a public seed set of 30 points drawn uniformly from the pool, a consumer whose
validation set (m) and test set are drawn from a shifted class mix, and K owners split by a
rule on a covariate. The target share of the pool is printed per scenario.

    breast    load_breast_cancer; 4 owners by quartiles of "mean texture"; consumer 80% malignant
    wine      load_wine; 3 owners by terciles of "alcohol"; consumer 80% cultivar 3
    diabetes  load_diabetes, target binned in terciles; 4 owners by quartiles of "bmi";
              consumer 80% top tercile
    digits    load_digits; 4 owners by the ink in the image's left half (quartiles);
              consumer: digits 4 and 7 (80%)
    rare      load_breast_cancer with malignant records thinned to 8% of the pool; 4 owners by
              quartiles of "mean radius" (so the malignant records sit with one owner);
              consumer 90% malignant
    rare-digits  load_digits with 9s thinned to 5% of the pool; owners by ink; consumer 90% 9s

Mechanisms (in-process parties, actors/harness/inprocess.py; every coin from a party's own
generator, reproducible noise as in every benchmark): random-select, allocate-select
(histograms, unhedged: ``random_share`` 0, ``allocation_floor`` 0), allocate-floor-select
(``--floor``), hedge-select@S (allocate-select with ``random_share`` S for each S of
``--shares``; "auto" is the plan's rule, the budget beyond p), herding-select held to the same
``max_points`` (``--candidates`` herding candidates), at max_points = ``--factors`` x p; and
"default": herding-select unbounded, the market's default before issue 30 (the market without
``[summary]`` now buys by random-select at (K + 1) p, the points this row accesses; this row is
the measurement behind that change), with random-select and the hedges buying exactly the
points it accessed on that seed (max_points 0 in the rows).
eps_owner <= 1, eps_validation <= 3 at delta 1e-5 (PLD). Gap closed = (uniform - mechanism) /
(uniform - greedy), MMD^2 to the consumer's test set, per seed. random-select runs ``--draws``
times per seed and cell (its own coins each time) and counts as the mean of its draws; its
spread is given over seeds (sd of its per-seed gap) and over its draws (root mean over seeds
of the variance of its draws on one seed), and every other mechanism is "above", "below" or a
"tie" against each.

    python benchmarks/utility_vs_random.py --seeds 0 1 2 --mechanisms random-select \
        hedge-select --shares auto --factors 1.5 3                       # tuning seeds
    python benchmarks/utility_vs_random.py --seeds 200 201 202 203 204 --mechanisms \
        random-select hedge-select --shares auto 0.75 --factors 1.5 3    # held out
    python benchmarks/utility_vs_random.py --seeds 0 1 2 3 4 --mechanisms default \
        hedge-select --factors 1.5                                       # the default

Prints a table and, last, one JSON object {"benchmark": "utility_vs_random", "rows": [...]}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from sklearn import datasets as skd

from dpmarket.actors.harness.inprocess import run_inprocess
from dpmarket.actors.harness.utility import recommended_params
from dpmarket.actors.randomness import NoiseSource, public_generator
from dpmarket.protocol.summary.allocate import ALLOCATION_FLOOR, RANDOM_SHARE, plan_allocation
from dpmarket.protocol.summary.objective import greedy_exact, mmd2, uniform_sample
from dpmarket.protocol.summary.random_select import plan_random_select
from dpmarket.streams.synthetic import Scenario, median_heuristic_gamma

F64 = np.ndarray
SEED_SET = 30


def _quantile_owners(values: F64, k: int) -> F64:
    edges = np.quantile(values, np.linspace(0, 1, k + 1)[1:-1])
    return np.searchsorted(edges, values, side="right")


def _split(
    name: str,
    X: F64,
    y: F64,
    owner_of: F64,
    target: set[int],
    share: float,
    m: int,
    n_test: int,
    rng: np.random.Generator,
) -> Scenario:
    """Consumer's validation and test sets drawn with ``share`` of target classes (without
    replacement), a public seed set, and the rest to the owners by ``owner_of``."""
    X = (X - X.mean(axis=0)) / np.maximum(X.std(axis=0), 1e-9)
    is_target = np.isin(y, sorted(target))
    idx = rng.permutation(len(X))
    t, o = idx[is_target[idx]], idx[~is_target[idx]]
    n_t = round(share * (m + n_test))
    consumer_t, consumer_o = t[: min(n_t, len(t) // 2)], o[: m + n_test - min(n_t, len(t) // 2)]
    consumer = rng.permutation(np.concatenate([consumer_t, consumer_o]))
    validation, test = consumer[:m], consumer[m:]
    rest = np.setdiff1d(idx, consumer)
    rest = rng.permutation(rest)
    seed, pool = rest[:SEED_SET], rest[SEED_SET:]
    k = int(owner_of.max()) + 1
    owners = tuple((X[pool[owner_of[pool] == i]], y[pool[owner_of[pool] == i]]) for i in range(k))
    return Scenario(
        owners=owners,
        owner_names=tuple(f"owner-{i + 1}" for i in range(k)),
        validation=X[validation],
        test_X=X[test],
        test_y=y[test].astype(np.int64),
        seed_set=X[seed],
        gamma=median_heuristic_gamma(X[seed]),
        name=name,
    )


def _thin(X: F64, y: F64, cls: int, share: float, rng: np.random.Generator) -> tuple[F64, F64]:
    """Keep enough records of class ``cls`` that they are ``share`` of the data set."""
    is_c = y == cls
    keep_c = round(share / (1 - share) * (~is_c).sum())
    keep = np.concatenate([np.flatnonzero(~is_c), rng.permutation(np.flatnonzero(is_c))[:keep_c]])
    keep.sort()
    return X[keep], y[keep]


def _ink_left(X: F64) -> F64:
    return np.asarray(X.reshape(-1, 8, 8)[:, :, :4].sum(axis=(1, 2)), dtype=np.float64)


def breast(rng: np.random.Generator) -> Scenario:
    d = skd.load_breast_cancer()
    owner_of = _quantile_owners(d.data[:, 1], 4)  # mean texture
    return _split("breast", d.data, d.target, owner_of, {0}, 0.8, 60, 120, rng)


def wine(rng: np.random.Generator) -> Scenario:
    d = skd.load_wine()
    owner_of = _quantile_owners(d.data[:, 0], 3)  # alcohol
    return _split("wine", d.data, d.target, owner_of, {2}, 0.8, 20, 20, rng)


def diabetes(rng: np.random.Generator) -> Scenario:
    d = skd.load_diabetes()
    y = np.searchsorted(np.quantile(d.target, [1 / 3, 2 / 3]), d.target, side="right")
    owner_of = _quantile_owners(d.data[:, 2], 4)  # bmi
    return _split("diabetes", d.data, y, owner_of, {2}, 0.8, 40, 80, rng)


def digits(rng: np.random.Generator) -> Scenario:
    d = skd.load_digits()
    owner_of = _quantile_owners(_ink_left(d.data), 4)
    return _split("digits", d.data, d.target, owner_of, {4, 7}, 0.8, 60, 200, rng)


def rare(rng: np.random.Generator) -> Scenario:
    d = skd.load_breast_cancer()
    X, y = _thin(d.data, d.target, 0, 0.12, rng)  # ~8% of the pool after the consumer's share
    owner_of = _quantile_owners(X[:, 0], 4)  # mean radius: malignant records are large
    return _split("rare", X, y, owner_of, {0}, 0.9, 20, 20, rng)


def rare_digits(rng: np.random.Generator) -> Scenario:
    d = skd.load_digits()
    X, y = _thin(d.data, d.target, 9, 0.07, rng)
    owner_of = _quantile_owners(_ink_left(X), 4)
    return _split("rare-digits", X, y, owner_of, {9}, 0.9, 30, 40, rng)


SCENARIOS: dict[str, Callable[[np.random.Generator], Scenario]] = {
    "breast": breast, "wine": wine, "diabetes": diabetes, "digits": digits, "rare": rare,
    "rare-digits": rare_digits,
}  # fmt: skip
TARGETS = {"breast": {0}, "wine": {2}, "diabetes": {2}, "digits": {4, 7}, "rare": {0},
           "rare-digits": {9}}  # fmt: skip
MECHANISMS = (
    "random-select", "allocate-select", "allocate-floor-select", "hedge-select", "herding-select",
    "default",
)  # fmt: skip
"""hedge-select: allocate-select with ``random_share`` (each share of ``--shares``, labelled
"hedge-select@SHARE"); default: herding-select unbounded (the market's default before issue
30; ``--candidates`` herding candidates), against random-select at the points it accessed."""


def params_of(
    mech: str, scenario: Scenario, p: int, cap: int, seed: int, args: argparse.Namespace
) -> Any:
    budget = (1.0, 3.0, 1e-5)
    base = recommended_params(p, scenario, seed, *budget)  # herding-select, candidates N(0, 1)
    if mech == "random-select":
        return dataclasses.replace(base, **plan_random_select(p, cap))
    if mech.startswith("hedge-select@"):
        text = mech.split("@")[1]
        share = None if text == "auto" else float(text)  # auto: the budget beyond p
        plan = plan_allocation(1.0, 1e-5, p, cap, floor=0.0, random_share=share)
        return dataclasses.replace(base, **plan)
    if mech.startswith("allocate"):
        f = args.floor if mech == "allocate-floor-select" else 0.0
        plan = plan_allocation(1.0, 1e-5, p, cap, floor=f, random_share=0.0)
        return dataclasses.replace(base, **plan)
    if mech == "default":  # the earlier default: the plan's herding-select, no max_points
        return dataclasses.replace(base, n_candidates=args.candidates)
    return dataclasses.replace(base, max_points=cap, n_candidates=args.candidates)


def _share(text: str) -> float | None:
    if text == "auto":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a share is a number in [0, 1] or 'auto', got {text!r}"
        ) from None


def expand(mechanisms: list[str], shares: list[float | None]) -> list[str]:
    """The mechanisms to run, each hedge share its own label."""
    out: list[str] = []
    for mech in mechanisms:
        if mech != "hedge-select":
            out.append(mech)
            continue
        out += [f"hedge-select@{'auto' if s is None else f'{s:g}'}" for s in shares]
    return out


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    noise = NoiseSource.reproducible(0)
    mechanisms = expand(args.mechanisms, args.shares)
    gaps: dict[tuple[str, int, int, str], list[float]] = {}
    meta: dict[tuple[str, int, int, str], dict[str, list[float]]] = {}
    shares: dict[str, list[float]] = {}
    for name in args.scenarios:
        for seed in args.seeds:
            sc = SCENARIOS[name](public_generator([seed, 30]))
            X, y, owner_of = sc.pooled()
            shares.setdefault(name, []).append(float(np.isin(y, sorted(TARGETS[name])).mean()))
            for p in args.p:
                greedy = mmd2(X[greedy_exact(X, sc.validation, p, sc.gamma)], sc.test_X, sc.gamma)
                uni = mmd2(
                    X[uniform_sample(owner_of, p, public_generator([seed, p, 1]))],
                    sc.test_X, sc.gamma,
                )  # fmt: skip
                cells = [(min(math.ceil(f * p), len(X)), m) for f in args.factors
                         for m in mechanisms if m != "default"]  # fmt: skip
                if "default" in mechanisms:  # cap 0: unbounded; the others at its points
                    hedges = [m for m in mechanisms if m.startswith("hedge-select@")]
                    cells += [(0, m) for m in ("default", "random-select", *hedges)]
                accessed = 0
                for cap, mech in cells:
                    bought = accessed if cap == 0 and mech != "default" else cap
                    params = params_of(mech, sc, p, bought, seed, args)
                    draws = args.draws if mech == "random-select" else 1
                    got = []  # random-select: its own coins drawn afresh, --draws times
                    for r in range(draws):
                        label = f"uvr:{name}:{mech}:{seed}:{p}:{bought}" + (
                            f":draw{r}" if r else ""
                        )
                        res = run_inprocess(
                            sc, params, noise.generator(label), owner_noise=noise,
                            noise_label=label,
                        ).result  # fmt: skip
                        got.append((uni - mmd2(res.points, sc.test_X, sc.gamma)) / (uni - greedy))
                    key = (name, p, cap, mech)
                    gaps.setdefault(key, []).append(float(np.mean(got)))
                    info = meta.setdefault(key, {"accessed": [], "eps": [], "draw_var": []})
                    info["accessed"].append(res.transfers.distinct_points)
                    if mech == "default":  # what the others buy at cap 0
                        accessed = res.transfers.distinct_points
                    info["eps"].append(max(res.ledgers[o].epsilon(1e-5) for o in sc.owner_names))
                    info["draw_var"].append(float(np.var(got)))
    rows = []
    for (name, p, cap, mech), g in gaps.items():
        info = meta[(name, p, cap, mech)]
        rows.append({
            "scenario": name, "p": p, "max_points": cap, "mechanism": mech,
            "gap_closed": round(float(np.mean(g)), 4), "gap_sd": round(float(np.std(g)), 4),
            "draw_sd": round(math.sqrt(float(np.mean(info["draw_var"]))), 4),
            "gap_seeds": [round(float(v), 4) for v in g],
            "points_accessed": float(np.mean(info["accessed"])),
            "eps_owner": round(max(info["eps"]), 4),
            "target_share": round(float(np.mean(shares[name])), 4),
            "seeds": len(g),
        })  # fmt: skip
    return rows


def _verdict(margin: float, spread: float) -> str:
    return "above" if margin > spread else "below" if margin < -spread else "tie"


def verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each steered mechanism against random-select in the same cell: below by more than
    random-select's spread ("below"), above by more ("above"), else "tie". Two spreads: over
    seeds (the sd of random-select's per-seed gap, each the mean of its draws) and of its
    draws (the root mean over seeds of the variance of its --draws runs on one seed)."""
    base = {(r["scenario"], r["p"], r["max_points"]): r for r in rows
            if r["mechanism"] == "random-select"}  # fmt: skip
    out = []
    for r in rows:
        b = base.get((r["scenario"], r["p"], r["max_points"]))
        if b is None or r["mechanism"] == "random-select":
            continue
        margin = r["gap_closed"] - b["gap_closed"]
        out.append({"scenario": r["scenario"], "p": r["p"], "max_points": r["max_points"],
                    "mechanism": r["mechanism"], "margin": round(margin, 4),
                    "random_sd": b["gap_sd"], "verdict": _verdict(margin, b["gap_sd"]),
                    "random_draw_sd": b["draw_sd"],
                    "verdict_draws": _verdict(margin, b["draw_sd"])})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--mechanisms", nargs="+", choices=MECHANISMS, default=list(MECHANISMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--p", nargs="+", type=int, default=[10, 20])
    parser.add_argument("--factors", nargs="+", type=float, default=[1.5, 3.0])
    parser.add_argument("--floor", type=float, default=ALLOCATION_FLOOR or 0.3,
                        help="allocation_floor of allocate-floor-select")  # fmt: skip
    parser.add_argument("--shares", nargs="+", type=_share, default=[RANDOM_SHARE],
                        help="random_share of hedge-select (one row each); 'auto': the budget "
                        "beyond p, (max_points - p) / max_points")  # fmt: skip
    parser.add_argument(
        "--draws",
        type=int,
        default=5,
        help="random-select runs per seed and cell (its own coins each time)",
    )
    parser.add_argument("--candidates", type=int, default=2000,
                        help="herding candidates of herding-select and default (the plan: "
                        "20,000; fewer to finish on a shared machine)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.draws < 1 or args.candidates < 1:
        parser.error(f"--draws and --candidates must be >= 1, got {args.draws}, {args.candidates}")
    if not all(s is None or 0 <= s <= 1 for s in args.shares):
        parser.error(f"--shares must lie in [0, 1], got {args.shares}")
    start = time.perf_counter()
    rows = run(args)
    print(f"utility vs random: seeds {args.seeds}, eps_owner <= 1, eps_validation <= 3 at delta "
          f"1e-5; {time.perf_counter() - start:.0f} s")  # fmt: skip
    print(f"{'scenario':<12} {'target':>6} {'p':>3} {'max_pts':>7} {'mechanism':<22} "
          f"{'gap':>6} {'sd':>5} {'accessed':>8} {'eps own':>7}")  # fmt: skip
    for r in sorted(rows, key=lambda r: (r["scenario"], r["p"], r["max_points"], r["mechanism"])):
        print(f"{r['scenario']:<12} {r['target_share']:>6.3f} {r['p']:>3} {r['max_points']:>7} "
              f"{r['mechanism']:<22} {r['gap_closed']:>6.2f} {r['gap_sd']:>5.2f} "
              f"{r['points_accessed']:>8.1f} {r['eps_owner']:>7.3f}")  # fmt: skip
    checks = verdicts(rows)
    print("\nagainst random-select in the same cell (margin in gap closed; its spread over "
          "seeds, then over its draws)")  # fmt: skip
    for c in checks:
        print(f"{c['scenario']:<12} {c['p']:>3} {c['max_points']:>7} {c['mechanism']:<22} "
              f"{c['margin']:>+6.2f} {c['random_sd']:>5.2f} {c['verdict']:<5} "
              f"{c['random_draw_sd']:>5.2f} {c['verdict_draws']}")  # fmt: skip
    print(json.dumps({"benchmark": "utility_vs_random", "seeds": args.seeds,
                      "rows": rows, "verdicts": checks}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Utility evaluation of private summarisation against its baselines (Section 4 / Appendix G).

For each seed and summary size p: the private protocol (in-process, LoopbackTransport), exact
greedy on the RBF kernel, greedy on h1 with exact means, and uniform sampling p/K per owner.
Each summary is scored by MMD^2 (exact RBF, Eq. 1) against the held-out *test* set (the target
distribution the consumer cares about; the validation set is what greedy optimised) and by the
accuracy of a LinearSVC trained on it. Privacy is reported per protected party, by the ledger
(dp-accounting PLD: what actually runs) and as the paper counts it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.svm import LinearSVC

from dpmarket.actors.randomness import NOISE_WARNING, NoiseSource, public_generator
from dpmarket.actors.runner import baselines, run_inprocess
from dpmarket.actors.scenarios import digits_split
from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.summary.curator import CuratorParams, SummaryResult
from dpmarket.protocol.summary.objective import greedy_exact, mmd2, uniform_sample
from dpmarket.protocol.summary.plan import EXPLORE_SHARE, ReleasePlan, plan_releases
from dpmarket.streams.synthetic import Scenario, gaussian_mixture_shift

__all__ = [
    "CANDIDATE_DOMAINS",
    "DATASETS",
    "MECHANISMS",
    "METHODS",
    "EvaluationTable",
    "build_utility_parser",
    "evaluate",
    "evaluate_utility",
    "mechanism_params",
    "paper_params",
    "recommended_params",
    "svm_accuracy",
    "utility_json",
    "utility_main",
    "utility_scenario",
    "utility_table",
]

METHODS = ("greedy", "hashed_greedy", "private", "uniform", "protocol_noiseless")
NOISELESS_EPS = 1e6  # h2 with this eps is the protocol without DP noise (a diagnostic, not private)
F64 = npt.NDArray[np.float64]


def paper_params(p: int, gamma: float, h1_seed: int, n_owners: int, delta: float) -> CuratorParams:
    """Table 1 of the paper (d=140, T_init=d^1.5, T_subs=5, eps_v=0.01, eps_l=0.01/sqrt(5p)) and
    the auction of Theorem 6 at eps=1 (eps_auc = eps/(3 sqrt(2 ln 1/delta)) K^(-1/3),
    tau = ceil(K^(2/3)))."""
    d = 140
    eps_auc = 1.0 / (3 * math.sqrt(2 * math.log(1 / delta))) * n_owners ** (-1 / 3)
    return CuratorParams(
        p=p,
        d=d,
        gamma=gamma,
        h1_seed=h1_seed,
        eps_validation=0.01,
        validation_iterations=round(d**1.5),
        seed_iterations=round(d**1.5),
        eps_seed=0.05,
        eps_summary=0.01 / math.sqrt(5 * p),
        summary_iterations=5,
        eps_auction=eps_auc,
        tau=math.ceil(n_owners ** (2 / 3)),
    )


def svm_accuracy(train_X: F64, train_y: F64, test_X: F64, test_y: F64) -> float:
    """Accuracy of a LinearSVC trained on a summary; a one-class summary predicts its class."""
    classes = np.unique(train_y)
    if len(classes) < 2:
        return float(np.mean(test_y == classes[0])) if len(classes) else 0.0
    model = LinearSVC(C=1.0, max_iter=5000, random_state=0)
    model.fit(train_X, train_y)
    return float(np.mean(model.predict(test_X) == test_y))


@dataclass
class EvaluationTable:
    """Per-p means over seeds of every metric, plus privacy and parsimony of the private runs."""

    p: list[int]
    mmd2: dict[str, list[float]] = field(default_factory=dict)
    svm_accuracy: dict[str, list[float]] = field(default_factory=dict)
    points_accessed: list[float] = field(default_factory=list)
    transfers: list[float] = field(default_factory=list)
    epsilon: dict[str, Any] = field(default_factory=dict)

    def rows(self) -> list[str]:
        """One line per (p, method): MMD^2, percentage over greedy, LinearSVC accuracy."""
        lines = [f"{'p':>5}  {'method':<20} {'MMD^2':>10} {'vs greedy':>10} {'LinearSVC':>10}"]
        for i, p in enumerate(self.p):
            greedy = self.mmd2["greedy"][i]
            for m in METHODS:
                over = 100 * (self.mmd2[m][i] / greedy - 1)
                lines.append(
                    f"{p:>5}  {m:<20} {self.mmd2[m][i]:>10.5f} {over:>9.1f}% "
                    f"{self.svm_accuracy[m][i]:>10.3f}"
                )
            lines.append(
                f"{'':>5}  private run: {self.points_accessed[i]:.1f} distinct points accessed, "
                f"{self.transfers[i]:.1f} transfers (p + m = {p} + validation)"
            )
        return lines


def evaluate(
    make_scenario: Callable[[np.random.Generator], Scenario],
    p_values: list[int],
    seeds: list[int],
    delta: float,
    configure: Callable[[CuratorParams], CuratorParams] | None = None,
    noise: NoiseSource | None = None,
) -> EvaluationTable:
    """Run every method for every (seed, p); average over seeds. ``noise``: where the private
    runs' noise comes from (OS entropy unless a reproducible simulation source is given)."""
    noise = noise or NoiseSource.secure()
    scores: dict[str, dict[int, list[float]]] = {}
    accuracy: dict[str, dict[int, list[float]]] = {}
    accessed: dict[int, list[float]] = {p: [] for p in p_values}
    moved: dict[int, list[float]] = {p: [] for p in p_values}
    eps: dict[str, Any] = {}
    for seed in seeds:
        scenario = make_scenario(public_generator(seed))
        for p in p_values:
            params = paper_params(p, scenario.gamma, seed, len(scenario.owners), delta)
            params = configure(params) if configure else params
            summaries, result = _summaries(scenario, params, seed, noise)
            for method, (X, y) in summaries.items():
                score = mmd2(X, scenario.test_X, scenario.gamma)
                acc = svm_accuracy(X, y, scenario.test_X, scenario.test_y.astype(np.float64))
                scores.setdefault(method, {}).setdefault(p, []).append(score)
                accuracy.setdefault(method, {}).setdefault(p, []).append(acc)
            accessed[p].append(result.transfers.distinct_points)
            moved[p].append(result.transfers.total_transfers)
            eps = _privacy(result.ledgers, scenario.owner_names[0], delta)
    table = EvaluationTable(p=list(p_values))
    for m in METHODS:
        table.mmd2[m] = [float(np.mean(scores[m][p])) for p in p_values]
        table.svm_accuracy[m] = [float(np.mean(accuracy[m][p])) for p in p_values]
    table.points_accessed = [float(np.mean(accessed[p])) for p in p_values]
    table.transfers = [float(np.mean(moved[p])) for p in p_values]
    table.epsilon = eps
    return table


def _summaries(
    scenario: Scenario, params: CuratorParams, seed: int, noise: NoiseSource
) -> tuple[dict[str, tuple[F64, F64]], SummaryResult]:
    res = run_inprocess(scenario, params, noise.generator(f"digits:{seed}:{params.p}")).result
    if res.points is None:
        raise ValueError("evaluation needs the trusted mode (points), not the less-trusted mode")
    base_rng = public_generator([seed, params.p, 1])  # the harness's public draws
    base = baselines(scenario, params.p, params.d, params.gamma, params.h1_seed, base_rng)
    noiseless = dataclasses.replace(
        params, eps_validation=NOISELESS_EPS, eps_summary=NOISELESS_EPS, eps_seed=NOISELESS_EPS,
        validation_sigma=1.0 / NOISELESS_EPS, summary_sigma=1.0 / NOISELESS_EPS,
    )  # fmt: skip
    clean_rng = noise.generator(f"digits-noiseless:{seed}:{params.p}")
    clean = run_inprocess(scenario, noiseless, clean_rng).result
    assert clean.points is not None
    methods = {
        "protocol_noiseless": (clean.points, clean.labels),
        "greedy": base.greedy,
        "hashed_greedy": base.hashed_greedy,
        "private": (res.points, res.labels),
        "uniform": base.uniform,
    }
    return methods, res


def _privacy(ledgers: dict[str, PrivacyLedger], owner: str, delta: float) -> dict[str, Any]:
    def clean(x: float) -> float | None:
        return round(x, 4) if math.isfinite(x) else None

    own, val = ledgers[owner], ledgers["validation"]
    without_auction = PrivacyLedger(owner)
    for event in own.events:
        if event.mechanism != "auction":
            without_auction.record(event)
    return {
        "owner": clean(own.epsilon(delta, "pld")),
        "owner_without_auction": clean(without_auction.epsilon(delta, "pld")),
        "validation": clean(val.epsilon(delta, "pld")),
        "validation_theorem7": clean(val.epsilon(delta, "theorem7")),
        "delta": delta,
        "paper_count": {
            "owner": clean(own.epsilon(1e-4, "paper")),
            "owner_delta": 1e-4,
            "validation": clean(val.epsilon(0.01, "paper")),
            "validation_delta": 0.01,
        },
    }


# --------------------------------------------------------------------------------------------
# Issue 6: release mechanisms at correctly counted budgets (benchmarks/utility.py)
# --------------------------------------------------------------------------------------------

DATASETS = ("synthetic", "digits")
MECHANISMS = (
    "paper", "gaussian", "tree", "herding", "herding-pure", "herding-select",
    "herding-pure-select",
)  # fmt: skip
"""Private mechanisms compared: the paper's Table 1 (MWEM h2, paper auction) and, planned to the
budgets by :func:`~dpmarket.protocol.summary.plan.plan_releases`, the Gaussian validation release
with per-epoch Gaussian / tree-aggregated / herding summary releases (auction: every bidder asked,
tau = 1), herding with the calibrated pure auction (parsimonious), and "-select": exploration
epochs plus the curator's exact final selection over every purchased point
(protocol/summary/selection.py)."""

CANDIDATE_DOMAINS: dict[str, tuple[str, float, float]] = {
    "synthetic": ("gaussian", 0.0, 1.0),  # features standardised by a public map
    "digits": ("uniform", 0.5, 0.5),  # pixels / 16 in [0, 1]
}
"""Public feature domain per dataset: (distribution, center, scale) of herding candidates."""

_ROW_KEYS = (
    "dataset", "mechanism", "p", "gap_closed", "mmd2_private", "mmd2_greedy", "mmd2_uniform",
    "svm_private", "svm_uniform", "svm_greedy", "eps_owner", "eps_validation", "delta",
    "points_accessed", "mmd2_uniform_select", "svm_uniform_select",
)  # fmt: skip


def utility_scenario(dataset: str, rng: np.random.Generator) -> Scenario:
    """Issue 6's scenarios: synthetic covariate shift (K = 6 owners, Dirichlet(0.5) over 8
    Gaussian components in 20 dims, 100k points, target components 0/1 at 0.7/0.3, m = 500,
    5,000 test points) or the appendix G digits split."""
    if dataset == "synthetic":
        return gaussian_mixture_shift(rng, n_points=100_000, n_validation=500, n_test=5000)
    if dataset == "digits":
        return digits_split(rng)
    raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")


@functools.lru_cache(maxsize=256)
def _plan(
    p: int,
    m: int,
    owners: int,
    eps: tuple[float, float, float],
    summary: str,
    auction: str,
    select: bool,
    explore_share: float = EXPLORE_SHARE,
) -> ReleasePlan:
    return plan_releases(
        p, m, owners, eps[0], eps[1], eps[2], summary=summary, auction=auction, select=select,
        explore_share=explore_share,
    )  # fmt: skip


def recommended_params(
    p: int,
    scenario: Scenario,
    h1_seed: int,
    eps_owner: float = 1.0,
    eps_validation: float = 3.0,
    delta: float = 1e-5,
    summary: str = "herding",
    auction: str = "all",
    candidates: tuple[str, float, float] = ("gaussian", 0.0, 1.0),
    select: bool = True,
    explore_share: float = EXPLORE_SHARE,
) -> CuratorParams:
    """The recommended configuration: Gaussian g_tilde, herding g_l, every bidder asked,
    exploration epochs and the exact final selection (``select``, protocol/summary/selection.py).

    Meets eps_owner and eps_validation at delta (PLD, every event of the run counted) by
    :func:`~dpmarket.protocol.summary.plan.plan_releases`; ``candidates`` describes the public
    feature domain the herding candidates are drawn from (see :data:`CANDIDATE_DOMAINS`).
    """
    budget = (eps_owner, eps_validation, delta)
    owners = len(scenario.owners)
    m = len(scenario.validation)
    plan = _plan(p, m, owners, budget, summary, auction, select, explore_share)
    distribution, center, scale = candidates
    return CuratorParams(
        p=p,
        gamma=scenario.gamma,
        h1_seed=h1_seed,
        candidate_distribution=distribution,
        candidate_center=center,
        candidate_scale=scale,
        **plan.overrides(),
    )


def mechanism_params(
    mechanism: str,
    dataset: str,
    p: int,
    scenario: Scenario,
    seed: int,
    budget: tuple[float, ...],
    explore_share: float = EXPLORE_SHARE,
) -> CuratorParams:
    """CuratorParams of one compared mechanism (:data:`MECHANISMS`); budget = (eps_owner,
    eps_validation, delta); ``explore_share`` applies to the "-select" mechanisms."""
    eps_owner, eps_validation, delta = budget
    if mechanism == "paper":
        return paper_params(p, scenario.gamma, seed, len(scenario.owners), delta)
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
    summary, *options = mechanism.split("-")
    return recommended_params(
        p, scenario, seed, eps_owner, eps_validation, delta, summary,
        "pure" if "pure" in options else "all", CANDIDATE_DOMAINS[dataset], "select" in options,
        explore_share,
    )  # fmt: skip


@dataclass
class _Scores:
    mmd2: list[float] = field(default_factory=list)
    svm: list[float] = field(default_factory=list)
    eps_owner: list[float] = field(default_factory=list)
    eps_validation: list[float] = field(default_factory=list)
    accessed: list[float] = field(default_factory=list)
    transfers: list[float] = field(default_factory=list)


def _score(scores: _Scores, X: F64, y: F64, scenario: Scenario) -> None:
    scores.mmd2.append(mmd2(X, scenario.test_X, scenario.gamma))
    scores.svm.append(svm_accuracy(X, y, scenario.test_X, scenario.test_y.astype(np.float64)))


def _run_mechanism(
    scores: _Scores,
    scenario: Scenario,
    params: CuratorParams,
    delta: float,
    rng: np.random.Generator,
) -> None:
    res = run_inprocess(scenario, params, rng).result
    if res.points is None or len(res.points) == 0:
        raise ValueError(f"the private run returned no points ({res.reason})")
    _score(scores, res.points, res.labels, scenario)
    owners = [res.ledgers[o].epsilon(delta) for o in scenario.owner_names]
    scores.eps_owner.append(max(owners))
    scores.eps_validation.append(res.ledgers["validation"].epsilon(delta))
    scores.accessed.append(res.transfers.distinct_points)
    scores.transfers.append(res.transfers.total_transfers)


def _finite(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None


def evaluate_utility(
    datasets: list[str],
    mechanisms: list[str],
    p_values: list[int],
    seeds: list[int],
    budget: tuple[float, float, float] = (1.0, 3.0, 1e-5),
    explore_share: float = EXPLORE_SHARE,
    noise: NoiseSource | None = None,
) -> list[dict[str, Any]]:
    """One row per (dataset, mechanism, p): means over seeds (issue 6, Deliver 2).

    ``gap_closed = (uniform - private) / (uniform - greedy)`` on the seed-mean MMD^2 (exact RBF,
    to the test set); epsilons are the worst over seeds (and, for owners, over owners), PLD at
    delta; ``points_accessed`` counts distinct owner points the curator received. ``noise``:
    where the private runs' noise comes from (OS entropy unless a simulation source is given).
    """
    noise = noise or NoiseSource.secure()
    rows = []
    for dataset in datasets:
        cells: dict[tuple[str, int], _Scores] = {}
        for seed in seeds:
            scenario = utility_scenario(dataset, public_generator(seed))
            X, labels, owner_of = scenario.pooled()
            y = labels.astype(np.float64)
            for p in p_values:
                exact = greedy_exact(X, scenario.validation, p, scenario.gamma)
                uniform = uniform_sample(owner_of, p, public_generator([seed, p, 1]))
                for name, idx in (("greedy", exact), ("uniform", uniform)):
                    _score(cells.setdefault((name, p), _Scores()), X[idx], y[idx], scenario)
                for mech in mechanisms:
                    params = mechanism_params(
                        mech, dataset, p, scenario, seed, budget, explore_share
                    )
                    scores = cells.setdefault((mech, p), _Scores())
                    rng = noise.generator(f"utility:{dataset}:{mech}:{seed}:{p}")
                    _run_mechanism(scores, scenario, params, budget[2], rng)
                    if params.final_selection == "exact":  # same purchase, bought at random
                        size = min(int(scores.accessed[-1]), len(X))
                        bought = uniform_sample(owner_of, size, public_generator([seed, p, 3]))
                        kept = bought[
                            greedy_exact(X[bought], scenario.validation, p, scenario.gamma)
                        ]
                        baseline = cells.setdefault((f"{mech}|uniform-select", p), _Scores())
                        _score(baseline, X[kept], y[kept], scenario)
        rows += [_row(dataset, mech, p, cells, budget[2]) for mech in mechanisms for p in p_values]
    return rows


def _row(
    dataset: str, mech: str, p: int, cells: dict[tuple[str, int], _Scores], delta: float
) -> dict[str, Any]:
    private, greedy, uniform = cells[(mech, p)], cells[("greedy", p)], cells[("uniform", p)]
    mean = {k: float(np.mean(v.mmd2)) for k, v in (("p", private), ("g", greedy), ("u", uniform))}
    bought = cells.get((f"{mech}|uniform-select", p))
    return {
        "dataset": dataset,
        "mechanism": mech,
        "p": p,
        "gap_closed": round((mean["u"] - mean["p"]) / (mean["u"] - mean["g"]), 4),
        "mmd2_private": round(mean["p"], 6),
        "mmd2_greedy": round(mean["g"], 6),
        "mmd2_uniform": round(mean["u"], 6),
        "svm_private": round(float(np.mean(private.svm)), 4),
        "svm_uniform": round(float(np.mean(uniform.svm)), 4),
        "svm_greedy": round(float(np.mean(greedy.svm)), 4),
        "eps_owner": _finite(max(private.eps_owner)),
        "eps_validation": _finite(max(private.eps_validation)),
        "delta": delta,
        "points_accessed": float(np.mean(private.accessed)),
        "transfers": float(np.mean(private.transfers)),
        # "-select" only: as many points bought uniformly at random, then the same selection
        "mmd2_uniform_select": None if bought is None else round(float(np.mean(bought.mmd2)), 6),
        "svm_uniform_select": None if bought is None else round(float(np.mean(bought.svm)), 4),
    }


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
    return json.dumps(
        {"benchmark": "utility", "rows": [{k: r[k] for k in _ROW_KEYS} for r in rows]}
    )


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

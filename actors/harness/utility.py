"""Release mechanisms at correctly counted budgets (issue 6; benchmarks/utility.py).

One row per (dataset, mechanism, p): the gap closed between uniform sampling and exact greedy
(MMD^2 to the test set), LinearSVC accuracy, the worst epsilon of owners and validation set
(PLD, every event counted), and the points the curator accessed. ``dpmarket evaluate`` prints
it (actors/commands/evaluate.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpmarket.actors.config.digits import digits_split
from dpmarket.actors.harness.evaluation import F64, paper_params, svm_accuracy
from dpmarket.actors.harness.inprocess import run_inprocess
from dpmarket.actors.randomness import NoiseSource, public_generator
from dpmarket.protocol.summary.allocate import plan_allocation
from dpmarket.protocol.summary.curator import CuratorParams
from dpmarket.protocol.summary.objective import greedy_exact, mmd2, uniform_sample
from dpmarket.protocol.summary.plan import EXPLORE_SHARE, ReleasePlan, plan_releases
from dpmarket.protocol.summary.random_select import plan_random_select
from dpmarket.streams.synthetic import Scenario, gaussian_mixture_shift

__all__ = [
    "CANDIDATE_DOMAINS",
    "DATASETS",
    "MECHANISMS",
    "ROW_KEYS",
    "evaluate_utility",
    "mechanism_params",
    "recommended_params",
    "utility_scenario",
]


# --------------------------------------------------------------------------------------------
# Issue 6: release mechanisms at correctly counted budgets (benchmarks/utility.py)
# --------------------------------------------------------------------------------------------

DATASETS = ("synthetic", "digits")
MECHANISMS = (
    "paper", "gaussian", "tree", "herding", "herding-pure", "herding-select",
    "herding-pure-select", "allocate-select", "random-select",
)  # fmt: skip
"""Private mechanisms compared: the paper's Table 1 (MWEM h2, paper auction) and, planned to the
budgets by :func:`~dpmarket.protocol.summary.plan.plan_releases`, the Gaussian validation release
with per-epoch Gaussian / tree-aggregated / herding summary releases (auction: every bidder asked,
tau = 1), herding with the calibrated pure auction (parsimonious), "-select": exploration
epochs plus the curator's exact final selection over every purchased point
(protocol/summary/selection.py), allocate-select: ceil(1.5 p) points split by the owners' DP
score histograms, a share of them bought at random (the hedge; protocol/summary/allocate.py),
and random-select: ceil(1.5 p) points bought uniformly at random, then the same selection
(protocol/summary/random_select.py; no release). Every row also carries random-select at the
points that row's mechanism accessed (``mmd2_uniform_select``)."""

CANDIDATE_DOMAINS: dict[str, tuple[str, float, float]] = {
    "synthetic": ("gaussian", 0.0, 1.0),  # features standardised by a public map
    "digits": ("uniform", 0.5, 0.5),  # pixels / 16 in [0, 1]
}
"""Public feature domain per dataset: (distribution, center, scale) of herding candidates."""

ROW_KEYS = (
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
    if mechanism == "random-select":
        base = mechanism_params("herding-select", dataset, p, scenario, seed, budget)
        return dataclasses.replace(base, **plan_random_select(p))
    if mechanism == "allocate-select":
        base = mechanism_params("herding-select", dataset, p, scenario, seed, budget)
        return dataclasses.replace(base, **plan_allocation(eps_owner, delta, p))
    summary, *options = mechanism.split("-")
    return recommended_params(
        p, scenario, seed, eps_owner, eps_validation, delta, summary,
        "pure" if "pure" in options else "all", CANDIDATE_DOMAINS[dataset], "select" in options,
        explore_share,
    )  # fmt: skip


@dataclass
class MechanismScores:
    mmd2: list[float] = field(default_factory=list)
    svm: list[float] = field(default_factory=list)
    eps_owner: list[float] = field(default_factory=list)
    eps_validation: list[float] = field(default_factory=list)
    accessed: list[float] = field(default_factory=list)
    transfers: list[float] = field(default_factory=list)


def score_mechanism(scores: MechanismScores, X: F64, y: F64, scenario: Scenario) -> None:
    scores.mmd2.append(mmd2(X, scenario.test_X, scenario.gamma))
    scores.svm.append(svm_accuracy(X, y, scenario.test_X, scenario.test_y.astype(np.float64)))


def _run_mechanism(
    scores: MechanismScores,
    scenario: Scenario,
    params: CuratorParams,
    delta: float,
    noise: NoiseSource,
    label: str,
) -> None:
    """One in-process run of ``params``; the curator's and the owners' generators from
    ``noise`` under ``label`` (every coin of the mechanism is a party's own)."""
    run = run_inprocess(
        scenario, params, noise.generator(label), owner_noise=noise, noise_label=label
    )
    res = run.result
    if res.points is None or len(res.points) == 0:
        raise ValueError(f"the private run returned no points ({res.reason})")
    score_mechanism(scores, res.points, res.labels, scenario)
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
        cells: dict[tuple[str, int], MechanismScores] = {}
        for seed in seeds:
            scenario = utility_scenario(dataset, public_generator(seed))
            X, labels, owner_of = scenario.pooled()
            y = labels.astype(np.float64)
            for p in p_values:
                exact = greedy_exact(X, scenario.validation, p, scenario.gamma)
                uniform = uniform_sample(owner_of, p, public_generator([seed, p, 1]))
                for name, idx in (("greedy", exact), ("uniform", uniform)):
                    score_mechanism(
                        cells.setdefault((name, p), MechanismScores()), X[idx], y[idx], scenario
                    )
                for mech in mechanisms:
                    params = mechanism_params(
                        mech, dataset, p, scenario, seed, budget, explore_share
                    )
                    scores = cells.setdefault((mech, p), MechanismScores())
                    label = f"utility:{dataset}:{mech}:{seed}:{p}"
                    _run_mechanism(scores, scenario, params, budget[2], noise, label)
                    if not params.random_purchase:
                        # every mechanism beside random-select at the points it accessed
                        size = max(p, min(int(scores.accessed[-1]), len(X)))
                        same = dataclasses.replace(
                            mechanism_params("random-select", dataset, p, scenario, seed, budget),
                            **plan_random_select(p, size),
                        )
                        baseline = cells.setdefault(
                            (f"{mech}|uniform-select", p), MechanismScores()
                        )
                        _run_mechanism(
                            baseline, scenario, same, budget[2], noise, f"{label}:random"
                        )
        rows += [_row(dataset, mech, p, cells, budget[2]) for mech in mechanisms for p in p_values]
    return rows


def _row(
    dataset: str, mech: str, p: int, cells: dict[tuple[str, int], MechanismScores], delta: float
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
        # as many points as the mechanism accessed, bought uniformly at random, then the exact
        # selection (random-select beside every mechanism)
        "mmd2_uniform_select": None if bought is None else round(float(np.mean(bought.mmd2)), 6),
        "svm_uniform_select": None if bought is None else round(float(np.mean(bought.svm)), 4),
    }

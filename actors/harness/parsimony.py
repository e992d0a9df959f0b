"""Parsimony: utility against points accessed under ``[summary].max_points`` (issue 18).

One row per (dataset, mechanism, p, max_points): gap closed between uniform sampling and exact
greedy (MMD^2 to the test set, seed means), LinearSVC accuracy, the worst epsilon of the owners
and of the validation set (PLD at delta, every event counted), and the distinct points the
curator received. ``random-select`` is the baseline: ``max_points`` points bought uniformly at
random (owners in proportion to their size, through the market's own parties:
protocol/summary/random_select.py), then the same exact final selection of p against D_v.
``gap_closed`` is on the seed-mean MMD^2; ``gap_closed_sd`` is the spread over seeds of each
seed's own gap (against that seed's uniform and greedy).
benchmarks/parsimony.py prints and plots the rows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dpmarket.actors.harness.inprocess import run_inprocess
from dpmarket.actors.harness.utility import (
    MechanismScores,
    mechanism_params,
    score_mechanism,
    utility_scenario,
)
from dpmarket.actors.randomness import NoiseSource, public_generator
from dpmarket.protocol.summary.allocate import plan_allocation
from dpmarket.protocol.summary.curator import CuratorParams
from dpmarket.protocol.summary.objective import greedy_exact, uniform_sample
from dpmarket.protocol.summary.random_select import plan_random_select
from dpmarket.streams.synthetic import Scenario

__all__ = [
    "FACTORS",
    "PARSIMONY_MECHANISMS",
    "budget_of",
    "evaluate_parsimony",
    "parsimony_params",
]

PARSIMONY_MECHANISMS = (
    "allocate-select", "allocate-steered-select", "allocate-mixture-select", "herding-select",
    "herding-pure-select", "random-select",
)  # fmt: skip
"""allocate-select: score histograms (protocol/summary/allocate_rank.py) with the plan's hedge
(``random_share``, protocol/summary/random_select.py); allocate-steered-select: the same without
the hedge (every point steered); allocate-mixture-select: the earlier rule, DP means in a public
frame (allocate_mixture.py), unhedged. random-select runs beside every mechanism (added when not
asked)."""
FACTORS = ("1", "1.5", "2", "3", "K+1")
"""max_points as a multiple of p; "K+1": (K + 1) p, what herding-select accesses unbounded."""


def budget_of(factor: str, p: int, n_owners: int) -> int:
    """``max_points`` for a factor of :data:`FACTORS` (or any number >= 1)."""
    if factor == "K+1":
        return (n_owners + 1) * p
    value = float(factor)
    if not (math.isfinite(value) and value >= 1):
        raise ValueError(f"a budget factor is a number >= 1 or 'K+1', got {factor!r}")
    return math.ceil(value * p)


def parsimony_params(
    mechanism: str,
    dataset: str,
    p: int,
    scenario: Scenario,
    seed: int,
    budget: tuple[float, float, float],
    max_points: int,
    overrides: Mapping[str, float] | None = None,
) -> CuratorParams:
    """CuratorParams of ``mechanism`` capped at ``max_points`` distinct points; allocate-select
    splits exactly that budget (protocol/summary/allocate.py). ``overrides`` replace fields of
    the allocate mechanisms' parameters (an ablation: e.g. ``allocation_ridge``, or a noise
    multiplier near 0 to see what a release's noise costs; the ledger then reports the
    epsilon that noise really spends)."""
    if mechanism.startswith("allocate-"):
        base = mechanism_params("herding-select", dataset, p, scenario, seed, budget)
        rule = "mixture" if mechanism == "allocate-mixture-select" else "histogram"
        plan = plan_allocation(budget[0], budget[2], p, max_points, rule)
        if mechanism != "allocate-select":  # unhedged: every point steered
            plan["random_share"] = 0.0
        return dataclasses.replace(base, **(plan | dict(overrides or {})))
    if mechanism == "random-select":
        base = mechanism_params("herding-select", dataset, p, scenario, seed, budget)
        return dataclasses.replace(base, **plan_random_select(p, max_points))
    base = mechanism_params(mechanism, dataset, p, scenario, seed, budget)
    return dataclasses.replace(base, max_points=max_points)


def evaluate_parsimony(
    datasets: list[str],
    mechanisms: list[str],
    p_values: list[int],
    seeds: list[int],
    factors: list[str],
    budget: tuple[float, float, float] = (1.0, 3.0, 1e-5),
    noise: NoiseSource | None = None,
    overrides: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Rows of the Pareto front (module docstring); means over ``seeds``; random-select is
    added to ``mechanisms`` when missing (the baseline beside every mechanism)."""
    noise = noise or NoiseSource.secure()
    if "random-select" not in mechanisms:
        mechanisms = [*mechanisms, "random-select"]
    rows = []
    for dataset in datasets:
        cells: dict[tuple[str, int, int], MechanismScores] = {}
        budgets: dict[tuple[str, int], int] = {}
        for seed in seeds:
            scenario = utility_scenario(dataset, public_generator(seed))
            X, labels, owner_of = scenario.pooled()
            y = labels.astype(np.float64)
            for p in p_values:
                exact = greedy_exact(X, scenario.validation, p, scenario.gamma)
                uniform = uniform_sample(owner_of, p, public_generator([seed, p, 1]))
                for name, idx in (("greedy", exact), ("uniform", uniform)):
                    score_mechanism(
                        cells.setdefault((name, p, 0), MechanismScores()), X[idx], y[idx], scenario
                    )
                for factor in factors:
                    cap = min(budget_of(factor, p, len(scenario.owners)), len(X))
                    budgets[(factor, p)] = cap
                    for mech in mechanisms:
                        scores = cells.setdefault((mech, p, cap), MechanismScores())
                        params = parsimony_params(
                            mech, dataset, p, scenario, seed, budget, cap, overrides
                        )
                        label = f"parsimony:{dataset}:{mech}:{seed}:{p}:{cap}"
                        run = run_inprocess(
                            scenario, params, noise.generator(label), owner_noise=noise,
                            noise_label=label,
                        )  # fmt: skip
                        res = run.result
                        if res.points is None or len(res.points) == 0:
                            raise ValueError(f"{mech} returned no points ({res.reason})")
                        score_mechanism(scores, res.points, res.labels, scenario)
                        eps = [res.ledgers[o].epsilon(budget[2]) for o in scenario.owner_names]
                        scores.eps_owner.append(max(eps))
                        scores.eps_validation.append(res.ledgers["validation"].epsilon(budget[2]))
                        scores.accessed.append(res.transfers.distinct_points)
        for (mech, p, cap), scores in sorted(cells.items()):
            if cap:
                rows.append(_row(dataset, mech, p, cap, scores, cells, budget[2]))
    return rows


def _finite(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None


def _row(
    dataset: str,
    mech: str,
    p: int,
    cap: int,
    scores: MechanismScores,
    cells: dict[tuple[str, int, int], MechanismScores],
    delta: float,
) -> dict[str, Any]:
    greedy, uniform = cells[("greedy", p, 0)], cells[("uniform", p, 0)]
    m_p, m_g, m_u = (float(np.mean(s.mmd2)) for s in (scores, greedy, uniform))
    # the seed's own gap: each list holds one value per seed, in seed order
    per_seed = [
        (u - v) / (u - g) for u, v, g in zip(uniform.mmd2, scores.mmd2, greedy.mmd2, strict=True)
    ]
    return {
        "dataset": dataset,
        "mechanism": mech,
        "p": p,
        "max_points": cap,
        "points_accessed": float(np.mean(scores.accessed)),
        "gap_closed": round((m_u - m_p) / (m_u - m_g), 4),
        "gap_closed_sd": round(float(np.std(per_seed)), 4),
        "gap_closed_seeds": [round(float(g), 4) for g in per_seed],
        "svm_private": round(float(np.mean(scores.svm)), 4),
        "svm_uniform": round(float(np.mean(uniform.svm)), 4),
        "svm_greedy": round(float(np.mean(greedy.svm)), 4),
        "eps_owner": _finite(max(scores.eps_owner)),
        "eps_validation": _finite(max(scores.eps_validation)),
        "delta": delta,
        "seeds": len(scores.mmd2),
    }

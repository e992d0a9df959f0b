"""A run's outputs besides the two reports: the purchased summary's files and the plots.

``summary.csv`` and ``summary.npz`` are the consumer's (the points it bought and kept, with
their provenance); ``mmd_by_epoch.png`` is the consumer's (MMD^2 against the harness's test
set); ``privacy.png`` is public (each party's epsilon, from the ledgers). Which report each
value goes to is actors/run/report.py.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.actors.harness.evaluation import svm_accuracy
from dpmarket.actors.randomness import public_generator
from dpmarket.protocol.summary.objective import greedy_exact, mmd2, rbf_gram
from dpmarket.streams.synthetic import Scenario

__all__ = ["mmd2_by_prefix", "simulation_utility", "write_plots", "write_summary"]

F64 = npt.NDArray[np.float64]


def mmd2_by_prefix(S: F64, target: F64, gamma: float) -> F64:
    """MMD^2(S[:k], target) for k = 1..len(S), in O(|S| (|S| + |target|)) kernel evaluations."""
    if len(S) == 0:
        return np.zeros(0)
    K_ss = rbf_gram(S, S, gamma)
    cross = rbf_gram(S, target, gamma).sum(axis=1)
    tt = float(rbf_gram(target, target, gamma).mean())
    k = np.arange(1, len(S) + 1, dtype=np.float64)
    lower = np.tril(K_ss)
    within = np.cumsum(2 * lower.sum(axis=1) - np.diag(K_ss))
    return np.asarray(within / k**2 - 2 * np.cumsum(cross) / (k * len(target)) + tt)


def write_summary(out: Path, payload: dict[str, Any]) -> None:
    """``summary.csv`` and ``summary.npz``: the purchase, a row per kept point (the consumer's)."""
    points = payload["points"]
    features = points if points is not None else payload["hashed"]
    prov = payload["provenance"]
    with (out / "summary.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        kind = "x" if points is not None else "h"
        writer.writerow(
            ["owner", "token", "epoch", "bid", "gain", "label"]
            + [f"{kind}{i}" for i in range(features.shape[1] if len(features) else 0)]
        )
        for row, p, label in zip(features, prov, payload["labels"], strict=True):
            writer.writerow(
                [p["owner"], p["token"], p["epoch"], p["bid"], p["gain"], label, *row.tolist()]
            )
    np.savez(
        out / "summary.npz",
        features=features,
        labels=payload["labels"],
        owners=np.array([p["owner"] for p in prov]),
        tokens=np.array([p["token"] for p in prov], dtype=np.int64),
        epochs=np.array([p["epoch"] for p in prov], dtype=np.int64),
        hashed=payload["points"] is None,
    )


def write_plots(out: Path, privacy: dict[str, Any], curves: dict[str, F64]) -> None:
    """``mmd_by_epoch.png`` (the consumer's, from ``curves``) and ``privacy.png`` (public)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if curves:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, curve in curves.items():
            ax.plot(np.arange(1, len(curve) + 1), curve, label=name)
        ax.set_xlabel("summary size (epoch)")
        ax.set_ylabel("MMD$^2$ to the test set")
        ax.set_yscale("log")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "mmd_by_epoch.png", dpi=100)
        plt.close(fig)
    parties = sorted(privacy["parties"])
    values = [privacy["parties"][p]["pld"] for p in parties]
    fig, ax = plt.subplots(figsize=(6, 3))
    heights = [v if isinstance(v, float | int) else 0.0 for v in values]
    ax.bar(parties, heights)
    for i, (v, h) in enumerate(zip(values, heights, strict=True)):
        ax.text(i, h, f"{v:.2f}" if isinstance(v, float | int) else "inf", ha="center")
    ax.set_ylabel(f"epsilon at delta={privacy['delta']:g}")
    ax.set_title("privacy ledger (PLD) per protected party")
    fig.tight_layout()
    fig.savefig(out / "privacy.png", dpi=100)
    plt.close(fig)


def simulation_utility(
    scenario: Scenario, payload: dict[str, Any], seed: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Harness-side utility of the summary (simulation only), in the order the CLI prints it:
    the private summary; ``random``, a random purchase of as many points as the curator
    accessed (owners in proportion to their size, as random-select buys) followed by the same
    exact selection against D_v in the curator's kernel (standardised when the run was); p
    points sampled uniformly; exact greedy over the whole pool."""
    from dpmarket.actors.harness.inprocess import baselines

    p, gamma = len(payload["provenance"]), scenario.gamma
    if payload["points"] is None or p == 0:
        return {}, {}
    base = baselines(scenario, p, 140, gamma, seed, public_generator(seed + 1))
    test_y = scenario.test_y.astype(np.float64)
    methods: dict[str, tuple[Any, Any]] = {"private": (payload["points"], payload["labels"])}
    size = int(payload.get("distinct_points") or 0)
    if size >= p:
        methods["random"] = random_purchase(scenario, payload, size, p, public_generator(seed + 2))
    methods |= {"uniform": base.uniform, "greedy": base.greedy}
    utility = {
        name: {
            "mmd2": mmd2(X, scenario.test_X, gamma),
            "svm_accuracy": svm_accuracy(X, y, scenario.test_X, test_y),
        }
        for name, (X, y) in methods.items()
    }
    if "random" in utility:
        utility["random"]["points"] = size
    curves = {name: mmd2_by_prefix(X, scenario.test_X, gamma) for name, (X, _) in methods.items()}
    return utility, curves


def random_purchase(
    scenario: Scenario, payload: dict[str, Any], size: int, p: int, rng: np.random.Generator
) -> tuple[F64, F64]:
    """``size`` pooled records drawn uniformly at random (each owner in proportion to its
    size), then the curator's exact selection of ``p`` of them against the validation set: on
    the features the run's kernel saw (the DP standardisation when it was applied) with its
    gamma. What random-select buys at the private purchase's size (harness only)."""
    X = np.concatenate([X for X, _ in scenario.owners])
    y = np.concatenate([y for _, y in scenario.owners]).astype(np.float64)
    bought = np.sort(rng.choice(len(X), size=min(size, len(X)), replace=False))
    standard = (payload.get("secure_phases") or {}).get("standardize") or {}
    center, scale, gamma = np.zeros(X.shape[1]), np.ones(X.shape[1]), scenario.gamma
    if standard.get("applied"):
        center = np.asarray(standard["center"], dtype=np.float64)
        scale = np.asarray(standard["scale"], dtype=np.float64)
        gamma = float(standard["gamma"])
    pool = (X[bought] - center) / scale
    chosen = bought[greedy_exact(pool, (scenario.validation - center) / scale, p, gamma)]
    return X[chosen], y[chosen]

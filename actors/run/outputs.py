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
from dpmarket.protocol.summary.objective import mmd2, rbf_gram
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
    """Harness-side utility of the summary against exact greedy and uniform (simulation only)."""
    from dpmarket.actors.harness.inprocess import baselines

    p, gamma = len(payload["provenance"]), scenario.gamma
    if payload["points"] is None or p == 0:
        return {}, {}
    base = baselines(scenario, p, 140, gamma, seed, public_generator(seed + 1))
    test_y = scenario.test_y.astype(np.float64)
    methods = {
        "private": (payload["points"], payload["labels"]),
        "greedy": base.greedy,
        "uniform": base.uniform,
    }
    utility = {
        name: {
            "mmd2": mmd2(X, scenario.test_X, gamma),
            "svm_accuracy": svm_accuracy(X, y, scenario.test_X, test_y),
        }
        for name, (X, y) in methods.items()
    }
    curves = {name: mmd2_by_prefix(X, scenario.test_X, gamma) for name, (X, _) in methods.items()}
    return utility, curves

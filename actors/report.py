"""What a run leaves in ``--out``: the summary, ``report.json`` and plots.

``report.json`` schema (version 1; fields are only ever added):

- ``schema``: 1; ``run``: the public configuration (K, M, T, p, budgets, kernel, data, faults).
- ``outcome``: ``state`` ("done"), ``reason``, ``epochs``, ``exploration_epochs`` (the first
  epochs, in which every owner delivered a uniform draw and no auction ran).
- ``privacy``: per protected party, epsilon at ``delta`` by the ledger (``pld``, ``theorem7``)
  and ``paper`` (as the paper counts it), the events, and for each honest owner the guarantee
  against the simulated coalition of colluders (their auction observations pooled).
- ``parsimony``: distinct points accessed, total transfers, rho = (distinct + m) / (p + m),
  ``final_selection`` ("exact": the summary is the exact-greedy choice among the
  ``purchased_pool`` verified deliveries, protocol/selection.py; "none": the epoch winners).
- ``value``: sum of winning marginal gains per owner (value attribution). Under
  ``final_selection = "exact"`` these are exact gains against D_v: for the consumer only; paying
  owners by them would release a function of D_v to the owners (pay per delivery instead).
- ``faults``: owners lost (epoch), frames late, deliveries rejected; ``verdicts``: per simulated
  fault whether it was tolerated (and how), not triggered, with the T budget used.
- ``timings``: seconds per phase.
- ``secure_phases``: the normalise round (DP pool count, per-feature means and spreads) and
  the scan round (coverage of the validation set by the DP pool sketch), with their noise;
  ``standardize``: the center, scale and kernel width h1 used (post-processing of normalise).
- ``owners``: per live owner at the end: records held, records ingested from files, rejects,
  epochs seen, times asked.
- ``utility`` (simulation only, computed by the harness from data it generated, never by the
  curator): MMD^2 to the test set and LinearSVC accuracy of the private summary, exact greedy and
  uniform sampling.

Files: ``summary.csv`` (one row per summary point: owner, token, epoch, bid, gain, label,
features), ``summary.npz`` (points or hashes, labels, provenance), ``report.json``,
``mmd_by_epoch.png`` (simulation), ``privacy.png``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.actors.curator import write_json_atomic
from dpmarket.protocol.accounting import PrivacyLedger
from dpmarket.protocol.objective import rbf_gram

__all__ = ["REPORT_SCHEMA", "mmd2_by_prefix", "privacy_section", "write_outputs"]

REPORT_SCHEMA = 1
F64 = npt.NDArray[np.float64]


def _finite(x: float) -> float | None:
    return round(x, 6) if math.isfinite(x) else None


def privacy_section(
    ledgers: dict[str, dict[str, Any]], delta: float, colluders: tuple[str, ...]
) -> dict[str, Any]:
    """Epsilon per protected party by each method; for honest owners also against the coalition
    of ``colluders`` (each colluder observes its own auction bit, so a coalition of c sees c
    auction steps per epoch; the broadcast releases are the same for all and count once)."""
    out: dict[str, Any] = {"delta": delta, "parties": {}}
    for party, raw in sorted(ledgers.items()):
        ledger = PrivacyLedger.from_dict(raw)
        entry: dict[str, Any] = {
            "pld": _finite(ledger.epsilon(delta, "pld")),
            "theorem7": _finite(ledger.epsilon(delta, "theorem7")),
            "paper": _finite(ledger.epsilon(delta, "paper")),
            "events": raw,
        }
        if colluders and party not in colluders and party != "validation":
            pooled = PrivacyLedger(party)
            for event in ledger.events:
                times = len(colluders) if event.mechanism == "auction" else 1
                for _ in range(times):
                    pooled.record(event)
            entry["against_colluders"] = _finite(pooled.epsilon(delta, "pld"))
        out["parties"][party] = entry
    return out


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


def _write_summary(out: Path, payload: dict[str, Any]) -> None:
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


def _plots(out: Path, privacy: dict[str, Any], curves: dict[str, F64]) -> None:
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
    ax.bar(parties, [v if v is not None else 0.0 for v in values])
    for i, v in enumerate(values):
        ax.text(i, v or 0.0, "inf" if v is None else f"{v:.2f}", ha="center", va="bottom")
    ax.set_ylabel(f"epsilon at delta={privacy['delta']:g}")
    ax.set_title("privacy ledger (PLD) per protected party")
    fig.tight_layout()
    fig.savefig(out / "privacy.png", dpi=100)
    plt.close(fig)


def write_outputs(
    out: Path,
    run: dict[str, Any],
    payload: dict[str, Any],
    delta: float,
    colluders: tuple[str, ...],
    timings: dict[str, float],
    utility: dict[str, Any] | None = None,
    curves: dict[str, F64] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write summary files, report.json and plots into ``out``; return the report."""
    out.mkdir(parents=True, exist_ok=True)
    _write_summary(out, payload)
    privacy = privacy_section(payload["ledgers"], delta, colluders)
    m = int(run.get("validation_size", 0))
    p = len(payload["provenance"])
    report: dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "run": run,
        "outcome": {
            "state": payload["state"],
            "reason": payload["reason"],
            "epochs": payload["epochs"],
            "exploration_epochs": payload.get("exploration_epochs", 0),
        },
        "privacy": privacy,
        "parsimony": {
            "summary_size": p,
            "validation_size": m,
            "distinct_points": payload["distinct_points"],
            "total_transfers": payload["total_transfers"],
            "rho": (payload["distinct_points"] + m) / max(p + m, 1),
            "final_selection": payload.get("final_selection", "none"),
            "purchased_pool": payload.get("purchased", 0),
        },
        "value": payload["value"],
        "faults": {
            "lost": payload["lost"],
            "dropped": payload["dropped"],
            "late_frames": payload["late_frames"],
            "rejected": payload["rejected"],
            "colluders": list(colluders),
            "verdicts": payload.get("fault_verdicts", []),
            "transport": payload["transport"],
        },
        "timings": timings,
        "owners": payload.get("owners", {}),
        "secure_phases": payload.get("secure_phases", {}),
    }
    if utility is not None:
        report["utility"] = utility
    if extra:
        report.update(extra)
    write_json_atomic(out / "report.json", report)
    _plots(out, privacy, curves or {})
    return report

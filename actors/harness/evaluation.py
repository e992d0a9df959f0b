"""Utility evaluation of private summarisation against its baselines (Section 4 / Appendix G).

For each seed and summary size p: the private protocol (in-process, LoopbackTransport), exact
greedy on the RBF kernel, greedy on h1 with exact means, and uniform sampling p/K per owner.
Each summary is scored by MMD^2 (exact RBF, Eq. 1) against the held-out *test* set (the target
distribution the consumer cares about; the validation set is what greedy optimised) and by the
accuracy of a LinearSVC trained on it. Privacy is reported per protected party, by the ledger
(dp-accounting PLD: what actually runs) and as the paper counts it. ``dpmarket digits`` runs it
(actors/commands/digits.py); actors/harness/utility.py compares the release mechanisms.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.actors.config.market import ConfigError, check_keys
from dpmarket.actors.harness.inprocess import baselines, run_inprocess
from dpmarket.actors.randomness import NoiseSource, public_generator
from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.summary.curator import CuratorParams, SummaryResult
from dpmarket.protocol.summary.objective import mmd2
from dpmarket.streams.synthetic import Scenario

__all__ = [
    "METHODS",
    "DemoConfig",
    "EvaluationTable",
    "evaluate",
    "load_demo_config",
    "paper_params",
    "svm_accuracy",
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
    from sklearn.svm import LinearSVC  # on use: the market's extra, not an agent's install

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


# ------------------------------------------------- the evaluation config (configs/evaluate.toml)
_SCENARIOS = ("digits", "synthetic")


@dataclass(frozen=True)
class DemoConfig:
    scenario: str = "digits"
    seeds: tuple[int, ...] = (0, 1)
    p: tuple[int, ...] = (20, 50, 100)
    delta: float = 1e-5
    overrides: dict[str, Any] = field(default_factory=dict)

    def apply(self, params: CuratorParams) -> CuratorParams:
        return dataclasses.replace(params, **self.overrides)


def load_demo_config(path: str | Path) -> DemoConfig:
    """Parse a demo/evaluation TOML file (see configs/demo.toml)."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read configuration ({exc})") from None
    check_keys("top level", data, {"scenario", "summary"})
    scen = data.get("scenario", {})
    check_keys("scenario", scen, {"name", "seeds", "p", "delta"})
    summary = data.get("summary", {})
    tunable = {f.name for f in dataclasses.fields(CuratorParams)} - {
        "p",
        "gamma",
        "h1_seed",
        "center",
        "scale",
    }
    check_keys("summary", summary, tunable)
    name = scen.get("name", "digits")
    if name not in _SCENARIOS:
        raise ConfigError(f"[scenario].name: {name!r} is not one of {list(_SCENARIOS)}")
    seeds, p = scen.get("seeds", [0, 1]), scen.get("p", [20, 50, 100])
    for key, values in (("seeds", seeds), ("p", p)):
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, int) and v >= 0 for v in values)
        ):
            raise ConfigError(f"[scenario].{key}: expected a non-empty list of integers >= 0")
    if any(v < 1 for v in p):
        raise ConfigError("[scenario].p: summary sizes must be >= 1")
    delta = scen.get("delta", 1e-5)
    if not isinstance(delta, float) or not 0 < delta < 1:
        raise ConfigError(f"[scenario].delta: expected a number in (0, 1), got {delta!r}")
    config = DemoConfig(name, tuple(seeds), tuple(p), delta, dict(summary))
    try:  # validate the overrides now, with CuratorParams' own checks
        config.apply(CuratorParams(p=1))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[summary]: {exc}") from None
    return config

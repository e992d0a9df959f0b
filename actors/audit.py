"""``dpmarket audit``: empirical privacy audits of the project's releases (issue 6, Deliver 5).

Each audit runs one mechanism many times on a pair of neighbouring inputs, fits the best
threshold test and reports a Clopper-Pearson lower bound on epsilon next to what the ledger
charges (:mod:`dpmarket.protocol.audit`). An audit PASSES when the bound stays at or below the
ledger's epsilon; a mechanism whose noise is N times too small must FAIL (``--broken`` adds
such a mechanism: the RACE release with the authors' ``R/(N eps)`` scale). Exit status 1 when
any audited claim is refuted.

Mechanisms: the Gaussian validation release and the tree / per-epoch Gaussian summary channels
(:mod:`dpmarket.protocol.releases`), the private auction (pure and paper variants), the RACE
sketch's Laplace release (Algorithm 1 of race-coleman2021) and the DCA secure sum's Gaussian
release (through the real parties and codec).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.accounting import PrivacyLedger
from dpmarket.protocol.audit import (
    AuditScenario,
    auction_scenario,
    gaussian_validation_scenario,
    laplace_count_scenario,
    run_audit,
    summary_channel_scenario,
)
from dpmarket.protocol.release_plan import gaussian_noise_multiplier
from dpmarket.protocol.securesum_driver import secure_sum
from dpmarket.streams.lsh import make_family
from dpmarket.streams.race import RaceSketch

__all__ = [
    "AUDITS",
    "audit_main",
    "build_audit_parser",
    "race_laplace_scenario",
    "securesum_gaussian_scenario",
]

F64 = npt.NDArray[np.float64]


def race_laplace_scenario(
    epsilon: float, rows: int = 16, width: int = 64, n: int = 200, noise_factor: float = 1.0,
    delta: float = 1e-5,
) -> AuditScenario:  # fmt: skip
    """RACE Algorithm 1 on n records and on n + 1; the score is the likelihood-ratio statistic
    of Laplace noise on the R counters the extra record touches, ``sum_r clip(c_r - a_r, 0, 1)``
    (a_r the exact counts without it). ``noise_factor = n`` releases with the RACE authors'
    scale ``R / (N eps)`` while the ledger still charges eps."""
    family = make_family("l2", 4, rows, 3, bandwidth=2.0)
    points = np.random.default_rng(5).normal(size=(n + 1, 4)).astype(np.float32)
    base = RaceSketch(family, width)
    base.update(points[:n])
    plus = base.copy()
    plus.update(points[n:])
    cells = (np.arange(rows), base.columns(points[n:])[0])
    exact = base.counts[cells].astype(np.float64)
    ledger = PrivacyLedger("record")
    base.release_laplace(epsilon, np.random.default_rng(0)).statement.record(ledger)

    def sample(neighbour: bool, trials: int, rng: np.random.Generator) -> F64:
        sketch = plus if neighbour else base
        released = [sketch.release_laplace(epsilon * noise_factor, rng) for _ in range(trials)]
        shifts = np.array([r.counts[cells] for r in released], dtype=np.float64) - exact
        return np.asarray(np.clip(shifts, 0.0, 1.0).sum(axis=1), dtype=np.float64)

    name = "race-laplace" if noise_factor == 1.0 else "race-laplace-authors-scale"
    return AuditScenario(
        name, sample, ledger.epsilon(delta), delta,
        f"RACE Laplace, eps {epsilon:g}, R {rows}, W {width}, noise scale / {noise_factor:g}",
    )  # fmt: skip


def securesum_gaussian_scenario(
    epsilon: float, clients: int = 4, delta: float = 1e-5
) -> AuditScenario:
    """One DCA secure-sum round (real parties, sealing and codec) of one coordinate in [-1, 1];
    D' replaces client 0's value -1 by +1 (replace-one, L2 sensitivity 2). Score: the sum."""
    values = np.zeros((clients, 1))
    ledger = PrivacyLedger("client")

    def run(value: float, rng: np.random.Generator, book: PrivacyLedger | None) -> float:
        values[0, 0] = value
        out = secure_sum(
            values, epsilon=epsilon, delta=delta, sensitivity=2.0, bound=1.0, rng=rng,
            ledger=book,
        )  # fmt: skip
        if out.value is None:
            raise ValueError(f"the secure sum released nothing: {out.result.reason}")
        return float(out.value[0])

    run(-1.0, np.random.default_rng(0), ledger)

    def sample(neighbour: bool, trials: int, rng: np.random.Generator) -> F64:
        value = 1.0 if neighbour else -1.0
        return np.array([run(value, rng, None) for _ in range(trials)], dtype=np.float64)

    return AuditScenario(
        "securesum-gaussian", sample, ledger.epsilon(delta), delta,
        f"DCA secure sum, {clients} clients, eps {epsilon:g}, replace-one",
    )  # fmt: skip


def _z(eps: float, delta: float) -> float:
    return gaussian_noise_multiplier(eps, delta)


AUDITS: dict[str, tuple[Callable[[float, float], AuditScenario], int]] = {
    "validation-gaussian": (lambda e, d: gaussian_validation_scenario(_z(e, d), delta=d), 20000),
    "summary-tree": (lambda e, d: summary_channel_scenario("tree", _z(e, d) * 2, delta=d), 4000),
    "summary-gaussian": (
        lambda e, d: summary_channel_scenario("gaussian", _z(e, d) * math.sqrt(8), delta=d),
        4000,
    ),
    "auction-pure": (lambda e, d: auction_scenario(e, "pure", delta=d), 50000),
    "auction-paper": (lambda e, d: auction_scenario(e, "paper", delta=d), 50000),
    "race-laplace": (lambda e, d: race_laplace_scenario(e, delta=d), 20000),
    "securesum-gaussian": (lambda e, d: securesum_gaussian_scenario(e, delta=d), 400),
    "laplace": (lambda e, d: laplace_count_scenario(e, delta=d), 100000),
}
"""Audit name -> (scenario at target (eps, delta), default trials per input)."""

BROKEN: dict[str, tuple[Callable[[float, float], AuditScenario], int]] = {
    "race-laplace-authors-scale": (
        lambda e, d: race_laplace_scenario(e, noise_factor=200.0, delta=d),
        2000,
    ),
    "laplace-noise/10": (lambda e, d: laplace_count_scenario(e, 10.0, delta=d), 5000),
}
"""Deliberately mis-calibrated mechanisms (noise N times too small): their audits must fail."""


def build_audit_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None,
) -> argparse.ArgumentParser:
    """The ``audit`` sub-command's parser (a stand-alone parser when ``subparsers`` is None)."""
    description = __doc__.splitlines()[0] if __doc__ else "privacy audit"
    parser = (
        argparse.ArgumentParser(prog="dpmarket audit", description=description)
        if subparsers is None
        else subparsers.add_parser("audit", help="empirical privacy audits of the releases")
    )
    names = [*AUDITS, *BROKEN]
    parser.add_argument("--mechanism", nargs="+", choices=names, default=list(AUDITS))
    parser.add_argument("--broken", action="store_true", help="also audit mis-calibrated ones")
    parser.add_argument("--epsilon", type=float, default=1.0, help="target eps of each release")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--trials", type=int, help="runs per input (default: per mechanism)")
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    parser.set_defaults(func=lambda args: _run(args))
    return parser


def _finite(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None


def _run(args: argparse.Namespace) -> int:
    chosen = list(args.mechanism) + (list(BROKEN) if args.broken else [])
    table = {**AUDITS, **BROKEN}
    rows: list[dict[str, Any]] = []
    print(f"{'mechanism':<28} {'ledger eps':>10} {'empirical >=':>12} {'estimate':>9} "
          f"{'trials':>7} {'seconds':>8}  verdict")  # fmt: skip
    for index, name in enumerate(dict.fromkeys(chosen)):
        build, default_trials = table[name]
        scenario = build(args.epsilon, args.delta)
        start = time.perf_counter()
        rng = np.random.default_rng([args.seed, index])
        result = run_audit(scenario, args.trials or default_trials, rng, args.confidence)
        passed = result.epsilon_lower <= scenario.claimed_epsilon
        seconds = time.perf_counter() - start
        claimed = "inf" if not math.isfinite(scenario.claimed_epsilon) else (
            f"{scenario.claimed_epsilon:.3f}"
        )  # fmt: skip
        print(
            f"{name:<28} {claimed:>10} {result.epsilon_lower:>12.3f} "
            f"{result.epsilon_estimate:>9.3f} {args.trials or default_trials:>7} {seconds:>8.1f}"
            f"  {'pass' if passed else 'FAIL: claim refuted'}"
        )
        rows.append(
            {
                "mechanism": name,
                "description": scenario.description,
                "ledger_epsilon": _finite(scenario.claimed_epsilon),
                "epsilon_lower": round(result.epsilon_lower, 4),
                "epsilon_estimate": _finite(result.epsilon_estimate),
                "delta": args.delta,
                "confidence": args.confidence,
                "trials": args.trials or default_trials,
                "passed": passed,
            }
        )
    if args.json:
        print(json.dumps({"benchmark": "audit", "rows": rows}))
    return 0 if all(r["passed"] for r in rows) else 1


def audit_main(argv: list[str] | None = None) -> int:
    """Entry point of ``dpmarket audit`` (returns the exit status)."""
    args = build_audit_parser().parse_args(argv)
    return int(args.func(args))

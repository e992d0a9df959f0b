"""``dpmarket audit``: empirical privacy audits of the project's releases (issue 6, Deliver 5;
issue 12, part 6).

Each audit runs one mechanism many times on a worst-case pair of neighbouring inputs, scores
every output by the pair's likelihood-ratio statistic, and reports a Clopper-Pearson lower
bound on epsilon next to what the ledger charges (:mod:`dpmarket.protocol.privacy.audit`). An audit
PASSES when the bound stays at or below the ledger's epsilon. Beside each verdict stands the
audit's POWER: the bound the same audit (same score, same number of runs) reaches on the
correct mechanism of that family; a pass means something only when the power is close to the
claim. ``--broken`` adds mis-calibrated mechanisms that must FAIL: half the noise (RACE, the
Gaussian validation release, a Laplace count), the RACE authors' ``R/(N eps)`` scale, a secure
sum run at eps 3 but charged as eps 1, a secure sum whose colluders withhold their noise while
the round's tolerance does not count them, and noise drawn from a generator seeded by a
published seed (the adversary regenerates it). Exit status 1 when any audited claim is refuted.

Randomness: every audited mechanism draws its noise from :class:`NoiseSource` (secure by
default: ChaCha20 keyed from the OS; ``--seed`` makes the audit reproducible, for tests and
benchmarks). The seeded-noise variant's noise comes from :func:`public_generator` with the
published :data:`PUBLISHED_SEED`, which is exactly the bug it demonstrates.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.actors.randomness import NoiseSource, public_generator
from dpmarket.protocol.privacy.audit import AuditResult, AuditScenario, run_audit
from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.securesum.audit import securesum_scenario
from dpmarket.protocol.summary.audit import (
    auction_scenario,
    gaussian_validation_scenario,
    laplace_count_scenario,
    seeded_noise_scenario,
    summary_channel_scenario,
)
from dpmarket.protocol.summary.plan import gaussian_noise_multiplier
from dpmarket.streams.race.lsh import make_family
from dpmarket.streams.race.sketch import RaceSketch

__all__ = [
    "AUDITS",
    "BROKEN",
    "PUBLISHED_SEED",
    "Audit",
    "audit_main",
    "build_audit_parser",
    "race_laplace_llr",
    "race_laplace_scenario",
]

F64 = npt.NDArray[np.float64]
PUBLISHED_SEED = 20240612  # the seeded-noise variant's seed, as if printed in a config file


def race_laplace_llr(shift: npt.ArrayLike, scale: float) -> F64:
    """Per-counter log-likelihood ratio of a released RACE counter under D' (exact count
    a + 1) against D (exact count a), ``shift = released - a``: the release is
    ``rint(count + Lap(scale))``, so ``P(shift = k) = G(k)`` under D and ``G(k - 1)`` under D',
    with ``G(0) = 1 - e^{-1/(2 scale)}`` and ``G(k) = e^{-|k|/scale} sinh(1/(2 scale))``."""
    k = np.asarray(shift, dtype=np.float64)

    def log_g(j: F64) -> F64:
        tail = -np.abs(j) / scale + math.log(math.sinh(0.5 / scale))
        return np.asarray(np.where(j == 0, math.log(-math.expm1(-0.5 / scale)), tail))

    return np.asarray(log_g(k - 1.0) - log_g(k), dtype=np.float64)


def race_laplace_scenario(
    epsilon: float, rows: int = 4, width: int = 16, n: int = 200, noise_factor: float = 1.0,
    delta: float = 1e-5,
) -> AuditScenario:  # fmt: skip
    """RACE Algorithm 1 (:meth:`RaceSketch.release_laplace`, the real code, one release per
    trial) on n records and on n + 1. Score: the exact log-likelihood ratio of the R counters
    the extra record touches (:func:`race_laplace_llr` at the claimed scale R/eps), summed;
    its top set "every counter at least 2 above the exact count" has probability ratio
    exactly e^eps. R is small (4) so that set is frequent: the scale R/eps is calibrated by
    the same code for every R. ``noise_factor`` releases at ``epsilon * noise_factor`` while
    the ledger still charges eps (2: half the noise; n: the RACE authors' R/(N eps))."""
    family = make_family("l2", 4, rows, 3, bandwidth=2.0)
    points = public_generator(5).normal(size=(n + 1, 4)).astype(np.float32)
    base = RaceSketch(family, width)
    base.update(points[:n])
    plus = base.copy()
    plus.update(points[n:])
    cells = (np.arange(rows), base.columns(points[n:])[0])
    exact = base.counts[cells].astype(np.float64)
    claim = base.release_laplace(epsilon, NoiseSource.secure().generator("audit:claim"))
    ledger = PrivacyLedger("record")
    claim.statement.record(ledger)
    scale = claim.statement.noise[0]

    def sample(neighbour: bool, trials: int, rng: np.random.Generator) -> F64:
        sketch = plus if neighbour else base
        released = [sketch.release_laplace(epsilon * noise_factor, rng) for _ in range(trials)]
        shifts = np.array([r.counts[cells] for r in released], dtype=np.float64) - exact
        return np.asarray(race_laplace_llr(shifts, scale).sum(axis=1), dtype=np.float64)

    if noise_factor == 1.0:
        name = "race-laplace"
    elif noise_factor == n:
        name = "race-laplace-authors-scale"
    else:
        name = f"race-laplace-noise/{noise_factor:g}"
    return AuditScenario(
        name, sample, ledger.epsilon(delta), delta,
        f"RACE Laplace, eps {epsilon:g}, R {rows}, W {width}, noise scale / {noise_factor:g}; "
        "real release_laplace per trial",
    )  # fmt: skip


def _z(eps: float, delta: float, count: int = 1) -> float:
    return gaussian_noise_multiplier(eps, delta, count)


def _published() -> np.random.Generator:
    return public_generator(PUBLISHED_SEED)


@dataclass(frozen=True)
class Audit:
    """One row of the table: how to build the scenario at target (eps, delta), the default
    runs per input, and the correct mechanism (``family``) whose bound is the audit's power."""

    build: Callable[[float, float], AuditScenario]
    trials: int
    family: str


_G, _S = 1_000_000, 1_000_000  # runs per input: Gaussian releases, the secure sum
AUDITS: dict[str, Audit] = {
    "validation-gaussian": Audit(
        lambda e, d: gaussian_validation_scenario(_z(e, d), delta=d), _G, "validation-gaussian"
    ),
    "summary-tree": Audit(
        lambda e, d: summary_channel_scenario("tree", _z(e, d, 3), delta=d), _G, "summary-tree"
    ),
    "summary-gaussian": Audit(
        lambda e, d: summary_channel_scenario("gaussian", _z(e, d, 4), delta=d),
        _G,
        "summary-gaussian",
    ),
    "auction-pure": Audit(lambda e, d: auction_scenario(e, "pure", delta=d), 50000, "auction-pure"),
    "auction-paper": Audit(
        lambda e, d: auction_scenario(e, "paper", delta=d), 50000, "auction-paper"
    ),
    "race-laplace": Audit(lambda e, d: race_laplace_scenario(e, delta=d), 40000, "race-laplace"),
    "securesum-gaussian": Audit(
        lambda e, d: securesum_scenario(e, delta=d), _S, "securesum-gaussian"
    ),
    "laplace": Audit(lambda e, d: laplace_count_scenario(e, delta=d), 100000, "laplace"),
    "validation-gaussian-vs-seed-adversary": Audit(
        lambda e, d: seeded_noise_scenario(_z(e, d), _published, False, delta=d),
        _G,
        "validation-gaussian",
    ),
}
"""Correctly calibrated mechanisms (the last: the seeded-noise adversary against the correct,
secret-keyed noise, which it cannot regenerate)."""

BROKEN: dict[str, Audit] = {
    "race-laplace-noise/2": Audit(
        lambda e, d: race_laplace_scenario(e, noise_factor=2.0, delta=d), 40000, "race-laplace"
    ),
    "race-laplace-authors-scale": Audit(
        lambda e, d: race_laplace_scenario(e, noise_factor=200.0, delta=d), 40000, "race-laplace"
    ),
    "validation-gaussian-noise/2": Audit(
        lambda e, d: gaussian_validation_scenario(_z(e, d), noise_factor=2.0, delta=d),
        _G,
        "validation-gaussian",
    ),
    "laplace-noise/2": Audit(
        lambda e, d: laplace_count_scenario(e, 2.0, delta=d), 100000, "laplace"
    ),
    "securesum-eps3-claimed-1": Audit(
        lambda e, d: securesum_scenario(3.0 * e, claimed_epsilon=e, delta=d),
        _S,
        "securesum-gaussian",
    ),
    "securesum-colluders-uncounted": Audit(
        lambda e, d: securesum_scenario(e, tolerance=0, delta=d), _S, "securesum-gaussian"
    ),
    "validation-gaussian-seeded-noise": Audit(
        lambda e, d: seeded_noise_scenario(_z(e, d), _published, True, delta=d),
        _G,
        "validation-gaussian",
    ),
}
"""Deliberately mis-calibrated mechanisms: their audits must fail."""


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
    parser.add_argument(
        "--confidence", type=float, default=0.95,
        help="confidence of each lower bound (default 0.95); a mechanism that is tight at its "
        "worst-case pair (auction-pure, laplace) is wrongly refuted with probability up to "
        "1 - confidence, so rerun a single failure with more trials before believing it",
    )  # fmt: skip
    parser.add_argument(
        "--seed", type=int, help="reproducible audit noise (NoiseSource.reproducible); "
        "default: secret-keyed ChaCha20 from the OS",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    parser.set_defaults(func=lambda args: _run(args))
    return parser


def _finite(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None


class _Runner:
    """Runs audits once each (a family's result is reused as the power of its variants)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.noise = (
            NoiseSource.secure() if args.seed is None else NoiseSource.reproducible(args.seed)
        )
        self.done: dict[str, tuple[AuditScenario, AuditResult, float, int]] = {}

    def run(self, name: str) -> tuple[AuditScenario, AuditResult, float, int]:
        if name not in self.done:
            audit = {**AUDITS, **BROKEN}[name]
            scenario = audit.build(self.args.epsilon, self.args.delta)
            trials = self.args.trials or audit.trials
            start = time.perf_counter()
            rng = self.noise.generator(f"audit:{name}")
            result = run_audit(scenario, trials, rng, self.args.confidence)
            self.done[name] = (scenario, result, time.perf_counter() - start, trials)
        return self.done[name]


def _run(args: argparse.Namespace) -> int:
    chosen = list(dict.fromkeys(list(args.mechanism) + (list(BROKEN) if args.broken else [])))
    table = {**AUDITS, **BROKEN}
    runner = _Runner(args)
    rows: list[dict[str, Any]] = []
    print(f"{'mechanism':<38} {'ledger eps':>10} {'empirical >=':>12} {'power':>6} "
          f"{'estimate':>9} {'trials':>8} {'seconds':>8}  verdict")  # fmt: skip
    for name in chosen:
        scenario, result, seconds, trials = runner.run(name)
        power = runner.run(table[name].family)[1].epsilon_lower
        passed = result.epsilon_lower <= scenario.claimed_epsilon
        claimed = "inf" if not math.isfinite(scenario.claimed_epsilon) else (
            f"{scenario.claimed_epsilon:.3f}"
        )  # fmt: skip
        print(
            f"{name:<38} {claimed:>10} {result.epsilon_lower:>12.3f} {power:>6.3f} "
            f"{result.epsilon_estimate:>9.3f} {trials:>8} {seconds:>8.1f}"
            f"  {'pass' if passed else 'FAIL: claim refuted'}"
        )
        rows.append(
            {
                "mechanism": name,
                "description": scenario.description,
                "family": table[name].family,
                "ledger_epsilon": _finite(scenario.claimed_epsilon),
                "epsilon_lower": round(result.epsilon_lower, 4),
                "power": round(power, 4),
                "epsilon_estimate": _finite(result.epsilon_estimate),
                "delta": args.delta,
                "confidence": args.confidence,
                "trials": trials,
                "seconds": round(seconds, 2),
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

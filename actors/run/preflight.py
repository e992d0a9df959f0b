"""Before a market run spends budget: each release's expected signal, noise and cost.

The numbers come from what is public before the run (the config, m, the expected record
count: the simulation's ``n_points`` split or the owners' input files' line counts) through
the pure checks of protocol/summary/snr.py. Nothing here is released or charged; the CLI
(actors/commands/market.py) prints the table, warns, or refuses with ``--strict``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpmarket.actors.config.market import MarketConfig
from dpmarket.actors.run.spawn import OwnerInputs
from dpmarket.protocol.privacy.ledger import PrivacyLedger, record_relation
from dpmarket.protocol.summary.curator import CuratorParams
from dpmarket.protocol.summary.snr import (
    STANDARDIZE_MIN_SNR,
    ReleaseCheck,
    moments_sensitivity,
    normalise_check,
    owners_check,
    owners_total,
    recommend_mechanism,
    scan_check,
    scan_sigma,
    sketch_sensitivity,
    unbounded_reason,
    validation_check,
)

__all__ = ["RunPlan", "plan_run"]


@dataclass(frozen=True)
class RunPlan:
    """What a run will release and what each release costs, decided before it starts."""

    params: CuratorParams
    m: int
    records: float
    checks: tuple[ReleaseCheck, ...]
    unbounded: str | None  # why an owner's epsilon has no finite bound, if it has none
    warnings: tuple[str, ...] = field(default=())
    # the mechanism the plan expects to do best and why (protocol/summary/snr.py
    # recommend_mechanism), beside the one configured (params.mechanism)
    recommendation: tuple[str, str] = ("", "")

    @property
    def weak(self) -> tuple[ReleaseCheck, ...]:
        return tuple(c for c in self.checks if c.weak)


POOL_RELEASES = ("normalise", "scan")  # their signal grows with the pool's size


def _line_count(path: str) -> int:
    try:
        with Path(path).open("rb") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:  # a missing file is reported by the ingest checks, not here
        return 0


def expected_records(inputs: OwnerInputs, files: dict[str, list[str]] | None) -> float:
    """The pool's size before the run: owners' simulated records, else their files' lines (an
    operator-side estimate printed to the terminal only, never written to a report)."""
    if files is not None:
        return float(sum(_line_count(p) for paths in files.values() for p in paths))
    held = [x for x, _ in inputs.owners.values() if isinstance(x, np.ndarray)]
    return float(sum(len(x) for x in held))


def plan_run(
    config: MarketConfig,
    inputs: OwnerInputs,
    gamma: float,
    files: dict[str, list[str]] | None = None,
) -> RunPlan:
    """The run's parameters and a :class:`ReleaseCheck` per release, from public numbers."""
    m = len(inputs.validation)
    remote = config.remote.owners if config.remote is not None else ()
    params = config.curator_params(gamma, m)
    records = expected_records(inputs, files)
    delta, secure = config.delta, config.secure
    checks = [validation_check(params, m, delta)]
    gaussians: list[tuple[float, float, int]] = []  # each owner's secure-sum events
    warnings: list[str] = []
    if secure["enabled"]:
        k, rows = int(inputs.validation.shape[1]), int(secure["rows"])
        bound = float(config.data.get("bound", 10.0))
        # the run's one relation, as actors/run/phases.py plans the rounds
        rel = params.neighbouring
        normalise = normalise_check(
            k, bound, secure["eps_normalise"], delta, records, neighbouring=rel
        )
        sigma = normalise.noise or 0.0
        checks.append(normalise)
        scan = scan_check(
            rows, secure["width"], secure["eps_scan"], delta, records, neighbouring=rel
        )
        checks.append(scan)
        sens_sketch = sketch_sensitivity(rows, neighbouring=rel)
        gaussians.append((sigma, moments_sensitivity(k, bound, neighbouring=rel), 1))
        gaussians.append((scan_sigma(rows, secure["eps_scan"], delta, neighbouring=rel),
                          sens_sketch, 1))  # fmt: skip
        if secure["standardize"] and records < STANDARDIZE_MIN_SNR * sigma and not remote:
            warnings.append(
                f"standardisation will likely be skipped: about {records:.0f} records against "
                f"normalise noise sigma {sigma:.0f} (needs {STANDARDIZE_MIN_SNR:g} sigma); "
                "lower [data].bound or raise [privacy].eps_normalise"
            )
        every = int(secure["refresh_every"])
        refreshes = params.epoch_limit // every if every else 0
        if refreshes:
            sigma_refresh = scan_sigma(rows, secure["eps_refresh"], delta, neighbouring=rel)
            refresh = (sigma_refresh, sens_sketch, refreshes)
            ledger = PrivacyLedger("owner")
            ledger.gaussian(*refresh[:2], count=refreshes, neighbouring=record_relation(rel))
            what = f"one round every {every} epochs over the records added since"
            checks.append(
                ReleaseCheck(
                    f"refresh x {refreshes}", "each owner", None, None,
                    ledger.epsilon(delta), delta, what,
                )
            )  # fmt: skip
            gaussians.append(refresh)
    checks.append(owners_check(params, delta))
    checks.append(owners_total(params, delta, tuple(gaussians)))
    if remote:  # their counts are theirs: a pool-size signal would be a guess
        warnings.append(
            f"{len(remote)} remote owners hold their own records: the signal of the secure "
            "sums below counts only local owners' files (each remote owner sees its own)"
        )
    for check in checks:
        if check.weak and not (remote and check.name in POOL_RELEASES):
            warnings.append(
                f"release {check.name!r} is mostly noise: signal {check.signal:.3g} against "
                f"noise {check.noise:.3g} (SNR {check.snr:.2f}; {check.what}), costing "
                f"eps {check.epsilon:.3g} at delta {check.delta:g} to {check.protects}"
            )
    if params.random_purchase and params.max_points is not None:
        # random-select: one count epoch, then each owner with quota left sells one point per
        # epoch; an epoch limit below budget / K stops the purchase short (the largest quota
        # is at least the budget / K)
        most = (params.epoch_limit - 1) * config.owners
        if most < params.max_points:
            warnings.append(
                f"[summary].max_epochs = {params.epoch_limit} lets random-select buy at most "
                f"{max(0, most)} of its {params.max_points} points ({config.owners} owners, one "
                "point each per epoch after the count epoch): the purchase will stop short; "
                f"raise max_epochs to at least {math.ceil(params.max_points / config.owners) + 1}"
            )
    # judged for the steered mechanisms' g_tilde, even when the configured one releases none
    steered = (
        dataclasses.replace(params, random_purchase=False) if params.random_purchase else params
    )
    recommendation = recommend_mechanism(
        steered, validation_check(steered, m, delta), config.owners
    )
    return RunPlan(
        params, m, records, tuple(checks), unbounded_reason(params, delta), tuple(warnings),
        recommendation,
    )  # fmt: skip

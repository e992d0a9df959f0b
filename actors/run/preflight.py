"""Before a market run spends budget: each release's expected signal, noise and cost.

The numbers come from what is public before the run (the config, m, the expected record
count: the simulation's ``n_points`` split or the owners' input files' line counts) through
the pure checks of protocol/summary/snr.py. Nothing here is released or charged; the CLI
(actors/commands/market.py) prints the table, warns, or refuses with ``--strict``.

Each quantity is computed once here and every line that states it reads the same value: the
steering SNR (g_tilde at the plan's d for this m, whatever the configured mechanism, so
every mechanism's preflight on the same data states the same number and recommendation),
the pool's expected size, and each owner's total.

A normalise round whose release the plan predicts will be discarded (its DP count below
STANDARDIZE_MIN_SNR of its noise, so the standardisation would be skipped) is not run
(:func:`discarded_normalise`): the plan says why and what it saves, and the owners are charged
nothing for it (no round, no event). ``[privacy].normalise_round = "always"`` spends it
anyway. Privacy of that decision: it reads the config and the expected record count only,
which is a config value in a simulation and, for input files, public under the replace-one
relation every files market runs under (each owner's n_i is fixed by it; add/remove is refused
with files: actors/config/market.py), so whether the round runs reveals nothing the relation
protects. The decision and the count are journaled with the run (actors/config/journaled.py):
its resume plans with them rather than recounting files that grew or rotated since.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpmarket.actors.config.market import ConfigError, MarketConfig
from dpmarket.actors.run.spawn import OwnerInputs
from dpmarket.protocol.privacy.dgauss import gaussian_sigma
from dpmarket.protocol.privacy.ledger import PrivacyLedger, record_relation
from dpmarket.protocol.summary.curator import CuratorParams
from dpmarket.protocol.summary.params import ParamError
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

__all__ = [
    "NORMALISE_ROUNDS",
    "RunPlan",
    "check_plan",
    "discarded_normalise",
    "follow_advice",
    "plan_lines",
    "plan_run",
]

NORMALISE_ROUNDS = ("auto", "always")
"""``[privacy].normalise_round``: "auto" (the default) skips a normalise round whose release
the plan predicts will be discarded; "always" spends it anyway."""


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
    # how to follow the recommendation: the exact --set flags ("" when the configured
    # mechanism is the recommended one)
    follow: str = ""
    # the normalise round not run (why, what it saved), or None when it runs
    normalise_skipped: str | None = None

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


def declared_range(config: MarketConfig) -> float | None:
    """The largest absolute value the files' schema declares (``[data].lower``/``upper``),
    the least clip bound that keeps every declared value; None for simulated data."""
    if config.source != "files":
        return None
    values: list[float] = []
    for key in ("lower", "upper"):
        given = config.data.get(key)  # a number or one per feature (checked when loaded)
        values += [abs(float(v)) for v in (given if isinstance(given, list) else [given])
                   if isinstance(v, int | float)]  # fmt: skip
    return max(values) if values else None


def _eps_for_sigma(target: float, delta: float, sensitivity: float) -> float | None:
    """The least ``[privacy].eps_normalise`` (to 2 significant digits, rounded up) whose noise
    sigma is at most ``target``, or None when no value the config accepts (<= 100) gets there."""
    if gaussian_sigma(100.0, delta, sensitivity) > target:
        return None
    low, high = 1e-6, 100.0
    for _ in range(100):  # sigma decreases in eps
        mid = math.sqrt(low * high)
        low, high = (mid, high) if gaussian_sigma(mid, delta, sensitivity) > target else (low, mid)
    scale = 10.0 ** (1 - math.floor(math.log10(high)))
    return float(math.ceil(high * scale) / scale)


def normalise_advice(
    config: MarketConfig, n_features: int, records: float, neighbouring: str
) -> str:
    """What would make the normalise release useful (its DP count >= STANDARDIZE_MIN_SNR
    sigma), as the exact keys and values, fitted to the data as declared: a lower bound only
    when the declared range is below the configured one (a lower bound would clip data)."""
    bound = float(config.data.get("bound", 10.0))
    delta = config.delta
    target = records / STANDARDIZE_MIN_SNR
    ways: list[str] = []
    eps = _eps_for_sigma(
        target, delta, moments_sensitivity(n_features, bound, neighbouring=neighbouring)
    )
    if eps is not None:
        ways.append(f"[privacy].eps_normalise = {eps:g}")
    declared = declared_range(config)
    if declared is not None and declared < bound:
        sens = moments_sensitivity(n_features, declared, neighbouring=neighbouring)
        if gaussian_sigma(config.secure["eps_normalise"], delta, sens) <= target:
            ways.append(f"[data].bound = {declared:g} (the declared range)")
        else:
            need = _eps_for_sigma(target, delta, sens)
            if need is not None:
                ways.append(
                    f"[data].bound = {declared:g} (the declared range) with "
                    f"[privacy].eps_normalise = {need:g}"
                )
    if not ways:
        return f"no eps_normalise up to 100 makes it useful for about {records:.0f} records" + (
            ""
            if declared is None or declared < bound
            else f" ([data].bound {bound:g} is already the declared range)"
        )
    return "it would be useful with " + " or ".join(ways)


def discarded_normalise(
    config: MarketConfig, n_features: int, records: float, params: CuratorParams
) -> tuple[bool, str] | None:
    """Whether the plan predicts the normalise release will be discarded, and the line that
    says so: (True, why) when the round is skipped, (False, why) when it is predicted useless
    but runs (``[privacy].normalise_round = "always"``, or remote owners whose counts the
    plan does not know); None when it is useful or does not run. Public inputs only: the
    config and the expected record count."""
    secure = config.secure
    if not (secure["enabled"] and secure["standardize"]):
        return None
    bound = float(config.data.get("bound", 10.0))
    rel = params.neighbouring
    check = normalise_check(n_features, bound, secure["eps_normalise"], config.delta, records,
                            neighbouring=rel)  # fmt: skip
    sigma = check.noise or 0.0
    if records >= STANDARDIZE_MIN_SNR * sigma:
        return None
    why = (
        f"about {records:.0f} records against normalise noise sigma {sigma:.0f} (the "
        f"standardisation needs {STANDARDIZE_MIN_SNR:g} sigma = {STANDARDIZE_MIN_SNR * sigma:.0f}"
        f"); {normalise_advice(config, n_features, records, rel)}"
    )
    if config.remote is not None and config.remote.owners:
        return False, f"the standardisation may be skipped: {why} (local owners' records only)"
    if secure.get("normalise_round", "auto") == "always":
        return False, (
            f"standardisation will likely be skipped: {why}; [privacy].normalise_round = "
            '"always" spends the round anyway'
        )
    saved = f"eps {secure['eps_normalise']:g} at delta {config.delta:g}"
    return True, (
        f"normalise round skipped, each owner saves {saved}: {why}; "
        '[privacy].normalise_round = "always" spends it anyway'
    )


def follow_advice(config: MarketConfig, params: CuratorParams, name: str, gamma: float,
                  m: int) -> str:  # fmt: skip
    """The exact ``--set`` flags that select the mechanism ``name`` for this config, checked by
    building its parameters (a [summary] key the other mechanism refuses is named with the
    value that passes, from the refusal)."""
    if name == params.mechanism:
        return ""
    flags: dict[str, object] = {"mechanism": name}
    if name == "allocate-select" and params.max_points is None:
        flags["max_points"] = math.ceil(1.5 * params.p)
    overrides = dict(config.overrides) | flags
    for _ in range(4):  # each refusal names one key and the value that passes
        trial = dataclasses.replace(config, overrides=overrides)
        try:
            trial.curator_params(gamma, m)
            break
        except (ParamError, ConfigError) as exc:
            fix = getattr(exc, "passing", None)
            if fix is None:
                return f'set [summary].mechanism = "{name}" (its checks refused: {exc})'
            key, value = fix
            overrides[key] = flags[key] = value
    return " ".join(f"--set summary.{k}={_toml(v)}" for k, v in flags.items())


def _toml(value: object) -> str:
    """A --set value as TOML (a bare word is read as a string too: actors/config/checks.py)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value if value.replace("-", "").isalnum() else f"'{value}'"
    return f"{value:g}" if isinstance(value, float) else str(value)


def plan_run(
    config: MarketConfig,
    inputs: OwnerInputs,
    gamma: float,
    files: dict[str, list[str]] | None = None,
    records: float | None = None,
) -> RunPlan:
    """The run's parameters and a :class:`ReleaseCheck` per release, from public numbers;
    ``records``: the expected record count to plan with (a resume's, journaled when the run
    started: actors/config/journaled.py), else counted now (:func:`expected_records`)."""
    m = len(inputs.validation)
    remote = config.remote.owners if config.remote is not None else ()
    params = config.curator_params(gamma, m)
    records = expected_records(inputs, files) if records is None else records
    delta, secure = config.delta, config.secure
    checks = [validation_check(params, m, delta)]
    gaussians: list[tuple[float, float, int]] = []  # each owner's secure-sum events
    warnings: list[str] = []
    skipped: str | None = None
    if secure["enabled"]:
        k, rows = int(inputs.validation.shape[1]), int(secure["rows"])
        bound = float(config.data.get("bound", 10.0))
        # the run's one relation, as actors/run/phases.py plans the rounds
        rel = params.neighbouring
        discard = discarded_normalise(config, k, records, params)
        if discard is not None and discard[0]:
            skipped = discard[1]
        elif discard is not None:
            warnings.append(discard[1])
        if skipped is None:
            normalise = normalise_check(
                k, bound, secure["eps_normalise"], delta, records, neighbouring=rel
            )
            checks.append(normalise)
            sens_moments = moments_sensitivity(k, bound, neighbouring=rel)
            gaussians.append((normalise.noise or 0.0, sens_moments, 1))
        scan = scan_check(
            rows, secure["width"], secure["eps_scan"], delta, records, neighbouring=rel
        )
        checks.append(scan)
        sens_sketch = sketch_sensitivity(rows, neighbouring=rel)
        gaussians.append((scan_sigma(rows, secure["eps_scan"], delta, neighbouring=rel),
                          sens_sketch, 1))  # fmt: skip
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
    total = owners_total(params, delta, tuple(gaussians))
    checks.append(total)
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
    secure_cost = owners_total(planned_random(params), delta, tuple(gaussians)).epsilon
    recommendation = recommend(config, params, gamma, m, secure_cost if gaussians else None)
    follow = follow_advice(config, params, recommendation[0], gamma, m)
    return RunPlan(
        params, m, records, tuple(checks), unbounded_reason(params, delta), tuple(warnings),
        recommendation, follow, skipped,
    )  # fmt: skip


def planned_random(params: CuratorParams) -> CuratorParams:
    """``params`` as random-select plans them (no summary release): what an owner pays under
    random-select is the secure sums alone."""
    if params.random_purchase:
        return params
    return dataclasses.replace(params, allocate=False, random_purchase=True, random_share=0.0,
                               explore_share=0.0, final_selection="exact", max_deliveries=1,
                               max_points=params.max_points or params.p)  # fmt: skip


VALIDATION_KEYS = ("d", "validation_sigma", "clip_norm", "validation_release",
                   "validation_iterations")  # fmt: skip
"""[summary] keys that change g_tilde's noise against the plan's release for this m."""


def recommend(
    config: MarketConfig, params: CuratorParams, gamma: float, m: int, secure_cost: float | None
) -> tuple[str, str]:
    """:func:`recommend_mechanism` on the g_tilde this config's [summary] would release if it
    steered (the validation row's, for a steered mechanism: one number for both lines), and,
    when [summary] keys make it differ from the plan's release for this m, those keys and the
    plan's SNR, so two configs on the same data are told apart by the key that differs."""
    steered = params
    if params.random_purchase:  # judged as a steered release of the same [summary]
        steered = dataclasses.replace(params, random_purchase=False, random_share=0.0)
    check = validation_check(steered, m, config.delta)
    name, why = recommend_mechanism(steered, check, config.owners, secure_cost)
    keys = [k for k in VALIDATION_KEYS if k in config.overrides]
    plan = steering_check(config, gamma, m).snr
    if keys and plan is not None and (check.snr is None or abs(plan - check.snr) >= 0.005):
        given = ", ".join(f"[summary].{k} = {config.overrides[k]!r}" for k in keys)
        why += f" (g_tilde as {given} makes it; the plan's release for m = {m} has SNR {plan:.2f})"
    return name, why


def steering_check(config: MarketConfig, gamma: float, m: int) -> ReleaseCheck:
    """g_tilde as the plan releases it for this m, at the config's ``[summary].eps_validation``
    and no other [summary] key (the mechanism's own plan does not change it)."""
    kept = {k: v for k, v in config.overrides.items() if k == "eps_validation"}
    steered = dataclasses.replace(config, overrides=kept | {"mechanism": "allocate-select"})
    return validation_check(steered.curator_params(gamma, m), m, config.delta)


def _number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.{digits}g}"


def plan_lines(plan: RunPlan) -> list[str]:
    """The plan as ``dpmarket run`` prints it: each release's expected signal, noise,
    signal-to-noise and cost, a skipped normalise round, and the mechanism the plan expects to
    do best with the flags that select it."""
    delta = plan.checks[0].delta if plan.checks else 0.0
    lines = [
        f"releases (m = {plan.m}, about {plan.records:.0f} pooled records):",
        f"  {'release':<18} {'protects':<11} {'signal':>8} {'noise':>8} {'SNR':>6}"
        f" {f'eps (delta {delta:g})':>18}",
    ]
    for c in plan.checks:
        lines.append(
            f"  {c.name:<18} {c.protects:<11} {_number(c.signal):>8} {_number(c.noise):>8} "
            f"{_number(c.snr):>6} {_number(c.epsilon, 4):>18}"
        )
    if plan.normalise_skipped is not None:
        lines.append(plan.normalise_skipped)
    name, why = plan.recommendation
    if name == plan.params.mechanism:
        lines.append(f"mechanism: {name}, the one the plan expects to do best: {why}")
    elif name:
        lines.append(
            f"mechanism: {plan.params.mechanism}; the plan expects {name} to do best: {why}"
        )
        lines.append(f"  to follow it: {plan.follow}")
    return lines


def check_plan(strict: bool, echo: bool = True) -> Callable[[RunPlan], None]:
    """A run's ``before_start``: print the plan (``echo``) and its warnings; with ``strict``
    refuse (ConfigError, before anything starts) on a warning."""

    def check(plan: RunPlan) -> None:
        if echo:
            print("\n".join(plan_lines(plan)))
        if echo and plan.unbounded is not None:
            print(f"dpmarket: WARNING: {plan.unbounded} (named in [summary])", file=sys.stderr)
        for warning in plan.warnings if echo else ():
            print(f"dpmarket: WARNING: {warning}", file=sys.stderr)
        if strict and plan.warnings:
            raise ConfigError(f"--strict: refused before any release: {'; '.join(plan.warnings)}")

    return check

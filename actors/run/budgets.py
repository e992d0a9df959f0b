"""The driver's side of owners' persistent budgets: the gates it hands out, the comparison after.

Before a run (``run_market``): the run's ledger id (kept in ``OUT/.journal/ledger_run`` so a
resumed run continues the same one, and its summary-phase charge is not made twice) and, per
owner with a store, a :class:`~dpmarket.actors.budgets.gate.BudgetGate`: its store and cap and
the summary phase's planned events (``planned_owner_ledger``: an upper bound, every steering
epoch used), handed to the owner actor at construction like the secure-sum trust anchors.

After a run: :func:`reconcile` compares the curator's ledger of each owner with what that
owner's store recorded for this run. The owner's store must cover the curator's view: the
store's rows of this run, charged or declined (a declined round that still released, within
T, is charged by the curator, conservatively, to every owner), must have a PLD epsilon at the
owner's delta at least the curator's, and for each secure-sum label at least as many rows as
the curator has events. A shortfall means a release the owner never accounted for: it is a
``mismatch``, listed under ``budgets.errors`` of report.json. The store holding more than the
curator (a round charged whose release never happened, planned epochs unused) is the
conservative direction and is reported as ``over``.

What is public (report.json's ``budgets``, :func:`public_budgets`) and what is the consumer's
(report.private.json's ``budgets``, the whole of :func:`reconcile`). Without blocks, an owner's
entry is public: its ``spent``, ``run_charged``, ``over`` and ``declined`` follow from the
public parameters of the releases and the owner's own past charges and declines, never from
its records (a decline is seen by every party as absence anyway). With blocks
(``[privacy].block_records`` or ``block_seconds``) which blocks exist, which were retired and
what each spent depend on the owner's record count and arrival times: ``spent`` (the largest
block's), ``run_charged`` (the releases some live block paid: a refresh reading no new record
pays nothing), ``over``, ``declined`` (from the gate's declines) and ``retired`` (block ids) go
to the consumer only. The public entry keeps ``status`` (does the store record every release
the curator charged: one row per release whatever its state, so it does not depend on the
count), ``cap``, ``delta``, ``curator`` (the curator's epsilon, from the ``privacy`` section's
events) and ``blocks`` (true). ``errors`` is public: its messages name epsilons over rows
counted once per release and per-label release counts, none of them per block.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from dpmarket.actors.budgets.gate import BudgetGate, summary_plan
from dpmarket.actors.budgets.store import LedgerStore
from dpmarket.actors.config.market import MarketConfig
from dpmarket.protocol.privacy.filter import RenyiFilter
from dpmarket.protocol.privacy.ledger import MechanismEvent, PrivacyLedger
from dpmarket.protocol.summary.curator import CuratorParams
from dpmarket.protocol.summary.snr import planned_validation_ledger

__all__ = [
    "budget_report",
    "collect_views",
    "consumer_refusal",
    "ledger_run_id",
    "owner_gates",
    "public_budgets",
    "reconcile",
]

SECURE_LABELS = ("normalise (secure sum)", "scan (secure sum)", "scan refresh (secure sum)")
TOLERANCE = 1e-6  # relative: both sides are the same PLD computation of the same events


def ledger_run_id(journal_dir: Path, fresh: bool, config: MarketConfig) -> str:
    """This run's id in the owners' stores: new for a fresh run, the journaled one on resume
    ("" without persistent budgets; remote owners always keep theirs)."""
    remote = config.remote is not None and config.remote.owners
    if not config.budgets and config.consumer_budget is None and not remote:
        return ""
    path = journal_dir / "ledger_run"
    if not fresh and path.is_file():
        return path.read_text(encoding="utf-8").strip()
    run = uuid.uuid4().hex  # a public name, no guarantee rests on it
    path.write_text(run, encoding="utf-8")
    return run


def owner_gates(
    config: MarketConfig, params: CuratorParams, run: str
) -> dict[str, BudgetGate] | None:
    """Per owner with a store: its gate (store, cap, this run, the planned summary charge)."""
    if not config.budgets:
        return None
    summary = summary_plan(params)
    return {
        name: BudgetGate(b, run, summary, b.block_records, b.block_seconds)
        for name, b in config.budgets.items()
    }


def _consumer_store(config: MarketConfig) -> LedgerStore:
    b = config.consumer_budget
    assert b is not None
    return LedgerStore(b.ledger, "consumer", RenyiFilter(b.epsilon, b.delta))


def consumer_refusal(
    config: MarketConfig, params: CuratorParams, run: str
) -> dict[str, Any] | None:
    """Charge the consumer's store for this purchase's validation release (its planned events,
    fixed by the config and m) before anything is spent; a refusal payload (exit 3) when the
    consumer's cap does not admit it. Release id ``RUN:validation``: a resume pays nothing.
    A mechanism that makes no validation release (random-select, the default) charges nothing:
    the purchase is recorded in the store as a run without rows."""
    if config.consumer_budget is None:
        return None
    events = [
        dataclasses.replace(e, label=f"validation plan: {e.label or e.mechanism}")
        for e in planned_validation_ledger(params).events
    ]
    store = _consumer_store(config)
    try:
        store.begin_run(run)
        if not events:
            return None
        decision = store.charge(f"{run}:validation", run, events)
    finally:
        store.close()
    if decision.admitted:
        return None
    b = config.consumer_budget
    return {
        "state": "refused",
        "reason": (
            f"the consumer's budget ({b.epsilon:g} at delta {b.delta:g}, {decision.spent:.4g} "
            "spent) does not admit this purchase's validation release"
        ),
        "refusal": {"phase": "consumer budget", "before_start": True},  # nothing to resume
    }


def budget_report(
    config: MarketConfig,
    run: str,
    handles: dict[str, Any],
    alive: list[str],
    ledgers: dict[str, dict[str, Any]],
) -> dict[str, Any] | None:
    """The ``budgets`` section of report.json (None without persistent budgets): every owner's
    store, and the consumer's against the validation set's ledger, compared (:func:`reconcile`)."""
    remote = list(config.remote.owners) if config.remote is not None else []
    if not config.budgets and config.consumer_budget is None and not remote:
        return None
    views = collect_views(handles, list(config.budgets) + remote, alive)
    if config.consumer_budget is not None:
        store = _consumer_store(config)
        try:
            views["consumer"] = {
                "run": run,
                "cap": store.filter.epsilon,
                "delta": store.filter.delta,
                "spent": store.filter.spent(store.events()),
                "rows": store.rows(run),
            }
        finally:
            store.close()
        ledgers = ledgers | {"consumer": ledgers.get("validation", {"party": "consumer"})}
    return reconcile(ledgers, views)


def collect_views(
    handles: dict[str, Any], owners: list[str], alive: list[str]
) -> dict[str, dict[str, Any] | None]:
    """Each owner's view of its store at the end of a run (its actor asked directly by the
    driver); an owner whose actor is gone, or does not answer, is ``unreachable``."""
    import ray

    views: dict[str, dict[str, Any] | None] = {}
    for name in owners:
        if name not in alive:
            views[name] = {"unreachable": "the owner's actor was lost during the run"}
            continue
        try:
            views[name] = ray.get(handles[name].budget_view.remote(name), timeout=60)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            views[name] = {"unreachable": f"{type(exc).__name__}: {exc}"}
    return views


def _epsilon(events: list[MechanismEvent], delta: float) -> float:
    return PrivacyLedger("owner", events).epsilon(delta) if events else 0.0


def _row_events(rows: list[dict[str, Any]]) -> list[MechanismEvent]:
    """The events of ``rows``, once per release (with blocks a release has a row per block)."""
    once = {r["release"]: r for r in reversed(rows)}
    return [MechanismEvent.from_dict(e) for r in once.values() for e in r["events"]]


def reconcile(
    curator_ledgers: dict[str, dict[str, Any]], views: dict[str, dict[str, Any] | None]
) -> dict[str, Any]:
    """The ``budgets`` section of report.json: per owner with a store, its totals and whether
    its store covers the curator's view of this run (module docstring); ``errors`` lists every
    mismatch and every owner whose store could not be read."""
    owners: dict[str, Any] = {}
    errors: list[str] = []
    for name, view in sorted(views.items()):
        if view is None:
            continue  # no store for this owner
        if "declined" in view:  # a remote owner's own policy declined: charged nothing
            owners[name] = {"status": "declined", "reason": str(view["declined"])}
            continue
        if "unreachable" in view:
            owners[name] = {"status": "unreachable", "reason": view["unreachable"]}
            errors.append(f"{name}: store not read at the end of the run ({view['unreachable']})")
            continue
        delta = float(view["delta"])
        curator = PrivacyLedger.from_dict(curator_ledgers.get(name, {"party": name}))
        rows = view["rows"]
        charged = [r for r in rows if r["state"] == "charged"]
        covered = _row_events(rows)
        eps_curator = curator.epsilon(delta) if curator.events else 0.0
        eps_covered = _epsilon(covered, delta)
        problems = []
        if eps_curator > eps_covered * (1 + TOLERANCE) + TOLERANCE:
            problems.append(
                f"curator charged eps {eps_curator:.6g} this run; the store covers "
                f"{eps_covered:.6g}"
            )
        counts = Counter(e.label for e in curator.events for _ in range(e.count))
        stored = Counter(e.label for e in covered)
        for label in SECURE_LABELS:
            if counts[label] > stored[label]:
                problems.append(
                    f"{label}: curator {counts[label]} release(s), store {stored[label]} row(s)"
                )
        owners[name] = {
            "status": "mismatch" if problems else "ok",
            "spent": view["spent"],
            "cap": view["cap"],
            "delta": delta,
            "run_charged": _epsilon(_row_events(charged), delta),
            "curator": eps_curator,
            "over": max(0.0, eps_covered - eps_curator),
            "declined": len(view.get("declines", [])),
            "blocks": "retired" in view,  # a gate with blocks lists its retired blocks
        }
        if "retired" in view:
            owners[name]["retired"] = list(view["retired"])
        errors.extend(f"{name}: {p}" for p in problems)
    return {
        "filter": "Rényi filter, protocol/privacy/filter.py (spent: epsilon at the cap's delta)",
        "owners": owners,
        "errors": errors,
    }


# an owner entry's keys that report.json keeps when the owner's budget has blocks (module
# docstring: the others depend on which blocks exist, so on the owner's record count)
PUBLIC_BLOCKED_KEYS = ("status", "cap", "delta", "curator", "blocks")


def public_budgets(section: dict[str, Any] | None) -> dict[str, Any] | None:
    """report.json's ``budgets``: :func:`reconcile`'s section without what depends on an
    owner's record count (module docstring); the whole section is the consumer's."""
    if section is None:
        return None
    owners: dict[str, Any] = {}
    for name, entry in section["owners"].items():
        if entry.get("blocks"):
            owners[name] = {k: entry[k] for k in PUBLIC_BLOCKED_KEYS}
        else:
            owners[name] = {k: v for k, v in entry.items() if k != "retired"}
    return section | {"owners": owners}

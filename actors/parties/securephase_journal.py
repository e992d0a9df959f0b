"""The secure-sum phases journaled round by round: each release is journaled before it is used.

The curator actor runs normalise and scan (actors/parties/dca.py) through this module. The journal
(``OUT/.journal/journal.json``) exists from the start: its first snapshot (curator state
"new", ledgers empty) is written before the first secure-sum round opens, and its
``secure_phases`` key (protocol/summary/journal.py, version 3) records each round:

- ``opened``: written before the aggregator opens the round;
- ``released``: written after the round ends, with its result (the released value: a DP
  output, kept in the curator-private journal) and with the owners' ledgers already charged
  in the same snapshot, before the value is used (standardisation, coverage, the validation
  release); a round that ended without a release (insufficient, failed) is journaled the same
  way and charges nothing;
- ``charged``: an ``opened`` round found on resume (see below).

On resume (``dpmarket resume OUT`` after the driver died, or a curator actor respawned from the
journal during the secure phases) a ``released`` round is not run again: its journaled result
is reused and nothing is charged again (the charge is in the journaled ledgers).

**An opened round without a journaled result is charged once, as released, and not run again.**
The crash came after ``opened`` was written and before ``released`` was: the aggregator (in the
curator's process, the only party that sees a round's sum) may have released the round's value
to the dead process, which used it for nothing (no value is used before it is journaled). So
each owner is charged one Gaussian event with the round's label at the plan's sigma floor for
that label (the least noise any admitted round of that label releases with: the owners and
compute nodes refuse a lower one) and its sensitivity: the ledger holds the same event an
uninterrupted run would hold, once. Running the round again would be a second release of the
same data to the curator (and within one session the owners' and nodes' plans refuse a second
round of a label anyway), so the run continues without that round's result: no
standardisation after a lost normalise, no coverage and no refresh base after a lost scan. The
guarantee: every release a crash may have made is charged exactly once; nothing is charged
twice and nothing is released twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.actors.parties.dca import (
    DcaHub,
    DcaUnavailable,
    charge_at_floor,
    record_for_owners,
    result_from_record,
    result_record,
)
from dpmarket.actors.parties.refresh import REFRESH_LABEL, PoolRefresher
from dpmarket.protocol.privacy.ledger import ADD_REMOVE, PrivacyLedger
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.securesum.spec import DcaConfig, RoundResult
from dpmarket.streams.race.lsh import make_family
from dpmarket.streams.race.sketch import PrivacyStatement, RaceRelease, RaceSketch

__all__ = [
    "SecureHost",
    "charge_lost_refreshes",
    "coverage_of",
    "journaled_summary",
    "pool_release",
    "result_from_record",
    "result_record",
    "run_secure_phases",
    "secure_resumable",
]

LABELS = {"normalise": "normalise (secure sum)", "scan": "scan (secure sum)"}


def charge_lost_refreshes(record: dict[str, Any], ledgers: dict[str, PrivacyLedger]) -> int:
    """On restore: charge each refresh round journaled ``opened`` but never ``released``
    (actors/parties/refresh.py) once, at the sigma floor, sensitivity and relation its ``opened``
    entry
    names (the plan's for "refresh"; a journal from before entries named their relation opened
    its rounds under add/remove), and mark it ``charged`` so it is never charged or run again.
    The caller journals the snapshot. Returns how many rounds were charged."""
    charged = 0
    for entry in record.get("refreshes") or []:
        if entry["state"] == "opened":
            relation = str(entry.get("neighbouring", ADD_REMOVE))
            sigma, sens = entry["sigma"], entry["sensitivity"]
            charge_at_floor(ledgers, sigma, sens, REFRESH_LABEL, relation)
            entry["state"], entry["status"] = "charged", "lost"
            charged += 1
    return charged


def journaled_summary(snapshot: dict[str, Any] | None) -> dict[str, Any] | None:
    """The secure phases' finished summary in a journal snapshot, or None."""
    record = (snapshot or {}).get("secure_phases") or {}
    summary = record.get("summary")
    return None if summary is None else dict(summary)


def secure_resumable(snapshot: dict[str, Any] | None) -> bool:
    """Whether a run from ``snapshot`` still has secure-sum rounds to run or to account for:
    a fresh run, or a journal written before the epochs whose secure phases did not finish."""
    if snapshot is None:
        return True
    return snapshot.get("state") == "new" and journaled_summary(snapshot) is None


def moments_summary(result: RoundResult, k: int) -> dict[str, Any]:
    """DP pool count, per-feature means and spreads from the released (sum, sum sq, n)."""
    if result.value is None:
        return {"status": result.status, "reason": result.reason}
    v = result.value
    n = max(float(v[-1]), 1.0)
    mean = v[:k] / n
    spread = np.sqrt(np.maximum(v[k : 2 * k] / n - mean**2, 1e-12))
    return {
        "status": result.status,
        "count": float(v[-1]),
        "mean": mean.tolist(),
        "std": spread.tolist(),
        "sigma": result.sigma_std,
        "missing": list(result.missing),
    }


def pool_release(
    result: RoundResult, sk: dict[str, Any], n_features: int, neighbouring: str
) -> RaceRelease:
    """The released sketch counters of a secure-sum round as a RACE release with its cost
    (``neighbouring``: the round's relation, the plan's)."""
    assert result.value is not None
    family = make_family(
        sk["family"], n_features, int(sk["rows"]), int(sk["seed"]),
        bandwidth=float(sk["bandwidth"]),
    )  # fmt: skip
    template = RaceSketch(family, int(sk["width"]))
    statement = PrivacyStatement(
        "gaussian", (result.sigma_std,), result.sensitivity, neighbouring, None, 0.0
    )
    return RaceRelease.from_counter_vector(template, result.value, statement)


def coverage_of(release: RaceRelease, validation: npt.NDArray[np.float64], total: float) -> float:
    """Mean KDE of the DP pool sketch at the validation points, per pooled record (the
    sketch's kernel; 1 = every record collides with every validation point)."""
    density = release.query(validation.astype(np.float32))
    return float(np.mean(density) / max(total, 1.0))


def scan_summary(
    result: RoundResult,
    release: RaceRelease | None,
    validation: npt.NDArray[np.float64],
    moments: dict[str, Any],
) -> dict[str, Any]:
    """Coverage of the validation set by the pool (see :func:`coverage_of`)."""
    if result.value is None or release is None:
        return {"status": result.status, "reason": result.reason}
    # the pool's size: the normalise round's DP count, or the sketch's own estimate (the
    # same records, post-processing) when that round was not run
    total = float(moments["count"]) if "count" in moments else release.estimated_size()
    return {
        "status": result.status,
        "coverage": coverage_of(release, validation, total),
        "sigma": result.sigma_std,
        "missing": list(result.missing),
    }


class SecureHost:
    """What the secure phases need of the curator actor: the owners' ledgers, the validation
    set, the journal record (``record``, the snapshot's ``secure_phases``), ``journal()`` (write
    the snapshot now, fsync'd) and ``refuse(result, phase)`` (refuse a round short of T)."""

    def __init__(
        self,
        ledgers: dict[str, PrivacyLedger],
        validation: npt.NDArray[np.float64],
        record: dict[str, Any],
        journal: Callable[[], None],
        refuse: Callable[[RoundResult, str], dict[str, Any] | None],
    ) -> None:
        self.ledgers, self.validation, self.record = ledgers, validation, record
        self.journal, self.refuse = journal, refuse
        self.refresher: PoolRefresher | None = None


async def _journaled_round(
    host: SecureHost, hub: DcaHub, rounds: SecureSumPlan, name: str, number: int,
    what: str, options: dict[str, Any], timeout: float,
) -> RoundResult:  # fmt: skip
    """One round, journaled before it opens and after it ends (module docstring)."""
    entries: dict[str, Any] = host.record.setdefault("rounds", {})
    entry = entries.get(name)
    spec = rounds.spec(name, number)
    if entry is not None and entry["state"] in ("released", "charged"):
        return result_from_record(entry["result"])  # charged when it was journaled
    if entry is not None:  # opened, never journaled as ended: charge once, do not run again
        reason = "opened before a crash, its result never journaled: charged, not run again"
        lost = RoundResult(number, "lost", reason, None, None, (), (), spec.sigma_std,
                           spec.sensitivity)  # fmt: skip
        charge_at_floor(
            host.ledgers, spec.sigma_std, spec.sensitivity, LABELS[name], spec.neighbouring
        )
        entries[name] = {"state": "charged", "result": result_record(lost)}
        host.journal()
        return lost
    # a respawned aggregator must continue the old one's sequence numbers at the nodes: the
    # open sends one frame per node
    seq = hub.aggregator._out._seq = max(hub.aggregator._out._seq, int(host.record["seq"]))
    host.record["seq"] = seq + len(hub.nodes)
    entries[name] = {"state": "opened"}
    host.journal()
    result = await hub.round(spec, what, options, timeout)
    record_for_owners(host.ledgers, result, LABELS[name], spec.neighbouring)
    entries[name] = {"state": "released", "result": result_record(result)}
    host.journal()  # before anything uses the value
    return result


def _short_before_rounds(hub: DcaHub, config: DcaConfig) -> RoundResult | None:
    """The owners that cannot take part in any round of the session (their set-up or roster
    failed: absent, declined, unverifiable; or a compute node refused their registration;
    ``DcaHub.unready``) with the known colluders, when
    they exceed T: an ``insufficient`` result that opens nothing, so the run stops before the
    first round is offered to anyone and no owner pays for a round that cannot release."""
    unready = sorted(hub.unready)
    counted = set(unready) | set(config.colluders)
    if not unready or len(counted) <= config.tolerance:
        return None  # colluders alone: the aggregator refuses the round before sending it
    why = ", ".join(f"{o}: {hub.unready[o]}" for o in unready)
    reason = (
        f"{len(counted)} owners cannot take part (T = {config.tolerance}; colluders "
        f"{sorted(config.colluders)}): {why}; no round was opened"
    )
    return RoundResult(0, "insufficient", reason, None, None, (), tuple(unready), 0.0, 0.0)


async def run_secure_phases(
    host: SecureHost,
    nodes: dict[str, Any],
    owners: dict[str, Any],
    plan: dict[str, Any],
    session_ready: bool = False,
) -> dict[str, Any]:
    """Normalise and scan, each journaled (module docstring); the phases' summary.

    ``session_ready``: the owners and compute nodes already hold this session (a curator
    respawned during the secure phases): the set-up is not repeated (they would refuse it).
    """
    if (done := journaled_summary({"secure_phases": host.record})) is not None:
        return done | {"resumed": "journaled before a restart"}
    config: DcaConfig = plan["config"]
    rounds: SecureSumPlan = plan["rounds"]  # the operator's; owners and nodes hold it too
    host.record.setdefault("seq", 0)
    host.journal()  # the journal exists before the first round opens
    hub = DcaHub(config, nodes, owners, PrivacyLedger("dca"))
    clock = time.perf_counter
    started = clock()
    if not session_ready:
        try:
            await hub.setup()
        except DcaUnavailable as exc:  # a compute node missing: stop before any round opens
            failed = {"status": "failed", "reason": str(exc)}
            stop = RoundResult(0, "failed", str(exc), None, None, (), (), 0.0, 0.0)
            refused = host.refuse(stop, "secure sum: set-up")
            if refused is not None:  # the nodes named in the stopped report's faults
                refused["refusal"] = dict(refused.get("refusal") or {}) | {"nodes": exc.nodes}
            return {"normalise": failed, "scan": failed, "errors": [str(exc)]} | (
                {"refused": refused} if refused is not None else {}
            )
        if (short := _short_before_rounds(hub, config)) is not None:
            failed = {"status": "insufficient", "reason": short.reason}
            return {"normalise": failed, "scan": failed, "unready": dict(hub.unready)} | {
                "refused": host.refuse(short, "secure sum: set-up")
            }
    k, timeout = int(plan["n_features"]), plan["timeout"]
    out: dict[str, Any] = {"nodes": list(config.nodes), "tolerance": config.tolerance,
                           "shares": config.shares}  # fmt: skip
    # wall-clock seconds of the set-up and of each round (what every owner observes)
    seconds = out["seconds"] = {"setup": clock() - started}
    started = clock()
    if "normalise" in rounds.rounds:
        moments = await _journaled_round(
            host, hub, rounds, "normalise", 1, "moments", rounds.options("normalise"), timeout
        )
        seconds["normalise"] = clock() - started
        out["normalise"] = moments_summary(moments, k)
        if (refused := host.refuse(moments, "secure sum: normalise")) is not None:
            return out | {"refused": refused}
    else:  # the plan predicted its release discarded (actors/run/preflight.py): not run
        out["normalise"] = {"status": "skipped", "reason": str(plan.get("normalise_skipped"))}
    sk = plan["sketch"]
    started = clock()
    counters = await _journaled_round(host, hub, rounds, "scan", 2, "sketch", sk, timeout)
    seconds["scan"] = clock() - started
    if (refused := host.refuse(counters, "secure sum: scan")) is not None:
        return out | {"refused": refused}
    n = host.validation.shape[1]
    relation = rounds.rounds["scan"].neighbouring
    pool = pool_release(counters, sk, n, relation) if counters.value is not None else None
    out["scan"] = scan_summary(counters, pool, host.validation, out["normalise"])
    if int(plan.get("refresh_every", 0)) > 0:
        host.refresher = PoolRefresher(
            hub,
            plan,
            pool,
            counters,
            lambda result: pool_release(result, sk, n, relation),
            lambda release, total: coverage_of(release, host.validation, total),
            record=host.record,
            journal=host.journal,
        )
    out["absent"] = {str(r): a for r, a in hub.absent.items()}
    out["errors"] = hub.errors[:20]
    if session_ready:
        out["resumed"] = "curator respawned from the journal during the secure phases"
    host.record["summary"] = out
    host.journal()
    return out

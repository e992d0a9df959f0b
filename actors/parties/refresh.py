"""Streaming refresh of the pool sketch: every E epochs, a secure-sum round over disjoint deltas.

After the scan round the curator holds a DP RACE sketch of the pool. Owners keep ingesting, so
every ``refresh_every`` epochs (``[privacy].refresh_every``) the curator's actor runs one more
secure-sum round, concurrently with the epochs, in which each owner contributes the sketch of
only the records it added since the last released round it was counted in. The released delta
is added to the pool sketch (:meth:`RaceRelease.accumulate`; noise variances add, one Gaussian
part per delta) and the coverage score is recomputed.

Privacy: each delta is the Gaussian mechanism on a RACE counter vector under the run's one
relation (the plan's: L2 sensitivity sqrt(2 R) under replace-one, the default, since a
replaced record moves one counter down and one up per row within the one delta that holds its
position; sqrt(R) under add/remove; protocol/summary/snr.py ``sketch_sensitivity``), sigma from
the round's (eps_refresh, delta) at that sensitivity by the analytic calibration of the secure
sum, Theorem 1 noise split across owners). Each record is
in exactly one released delta, so by parallel composition a record pays for one release; the
ledger is charged more than that, conservatively: every released delta is recorded as one more
Gaussian event on every owner's ledger (label ``scan refresh (secure sum)``). A round that
releases nothing charges nothing, and its records stay in the next delta. A round short of T
(owners missing plus known colluders, ``DcaConfig.colluders``) refuses the whole run, and a
curator refusal cancels a round in flight before it can release (``Aggregator.cancel``).

Journal (as normalise and scan, actors/parties/securephase_journal.py): each refresh round is
journaled
in the secure phases' record (``refreshes``) as ``opened``, with its round, sigma floor and
sensitivity, before it opens; after it ends, as ``released`` with its result, in the same
snapshot as the owners' charges, before the pool sketch uses the delta (a round that ended
without a release, or failed, is journaled the same way and charges nothing). A restored curator
charges an ``opened`` round once at that floor and never runs it again
(:func:`dpmarket.actors.parties.securephase_journal.charge_lost_refreshes`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from dpmarket.actors.parties.dca import DcaHub, record_for_owners, result_record
from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.securesum.spec import RoundResult
from dpmarket.streams.race.sketch import RaceRelease

__all__ = ["PoolRefresher", "finish_refresh", "stop_after_refusal"]

REFRESH_LABEL = "scan refresh (secure sum)"


class PoolRefresher:
    """Keeps the DP pool sketch current while the summary is collected (module docstring)."""

    def __init__(
        self,
        hub: DcaHub,
        plan: dict[str, Any],
        pool: RaceRelease | None,
        scan: RoundResult,
        release_of: Callable[[RoundResult], RaceRelease],
        coverage_of: Callable[[RaceRelease, float], float],
        record: dict[str, Any] | None = None,
        journal: Callable[[], None] = lambda: None,
    ) -> None:
        self.hub, self.plan, self.pool = hub, plan, pool
        self.every = int(plan.get("refresh_every", 0))
        self.next_epoch = self.every
        # the journal record (the secure phases'): ``refreshes`` lists every round opened
        self.record = {} if record is None else record
        self.journaled: list[dict[str, Any]] = self.record.setdefault("refreshes", [])
        self._journal = journal
        # 1: normalise, 2: scan; a journaled round number is never used again
        self.next_round = max([3] + [int(e["round"]) + 1 for e in self.journaled])
        # an owner's next delta starts where its last *released* contribution ended
        released = scan.value is not None
        self.base: dict[str, int] = dict.fromkeys(scan.included, scan.round) if released else {}
        self._release_of, self._coverage_of = release_of, coverage_of
        self.history: list[dict[str, Any]] = []

    def due(self, epoch: int) -> bool:
        """A refresh is due at ``epoch`` (and is then scheduled for E epochs later)."""
        if self.every <= 0 or epoch < self.next_epoch:
            return False
        self.next_epoch = epoch + self.every
        return True

    async def refresh(self, epoch: int, ledgers: dict[str, PrivacyLedger]) -> bool:
        """One delta round; on release, charge every owner and fold the delta into the pool.
        Returns whether anything was released (and charged)."""
        rounds: SecureSumPlan = self.plan["rounds"]
        round_id, self.next_round = self.next_round, self.next_round + 1
        spec = rounds.spec("refresh", round_id)  # at the plan's floor: (eps_refresh, delta)
        options = rounds.options("refresh") | {"base_rounds": dict(self.base)}
        opened = {"state": "opened", "epoch": epoch, "round": round_id,
                  "sigma": spec.sigma_std, "sensitivity": spec.sensitivity,
                  "neighbouring": spec.neighbouring}  # fmt: skip
        self.journaled.append(opened)
        self._journal()  # before the round opens
        try:
            result = await self.hub.round(spec, "sketch_delta", options, self.plan["timeout"])
        except Exception as exc:  # nothing returned to the curator: journaled as failed
            opened.update(state="failed", status="failed", reason=repr(exc))
            self._journal()
            raise
        record_for_owners(ledgers, result, REFRESH_LABEL, spec.neighbouring)  # if released
        opened.update(state="released", status=result.status, result=result_record(result))
        self._journal()  # with the charges, before the pool sketch uses the delta
        entry: dict[str, Any] = {"epoch": epoch, "round": round_id, "status": result.status}
        if result.value is None:
            self.history.append(entry | {"reason": result.reason, "missing": list(result.missing)})
            return False
        delta = self._release_of(result)
        self.pool = delta if self.pool is None else self.pool.accumulate(delta)
        self.base.update(dict.fromkeys(result.included, round_id))
        size = self.pool.estimated_size()
        self.history.append(
            entry
            | {
                "records_estimate": size,
                "coverage": self._coverage_of(self.pool, size),
                "releases": self.pool.statement.releases,
                "sigma": result.sigma_std,
                "missing": list(result.missing),
            }
        )
        return True


def stop_after_refusal(refresher: PoolRefresher | None, curator: Any) -> None:
    """Once the curator has refused the run, cancel the refresh round in flight (if any): it
    ends ``cancelled``, releasing nothing and charging nothing, and partials that arrive later
    are only counted (``Aggregator.cancel``). No release follows a refusal."""
    if refresher is not None and curator.state == "refused":
        refresher.hub.aggregator.cancel(f"the run was refused: {curator.reason}")


async def finish_refresh(
    task: asyncio.Task[None] | None, refresher: PoolRefresher | None, curator: Any
) -> None:
    """At the end of a run: after a refusal, cancel the round in flight *before* waiting for
    its task (:func:`stop_after_refusal`); otherwise let it finish (or time out)."""
    if task is None:
        return
    stop_after_refusal(refresher, curator)
    await asyncio.wait([task])

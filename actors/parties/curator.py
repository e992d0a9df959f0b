"""The curator actor: hosts the Curator party and drives the summarisation over Ray.

It owns the run's private state: the validation set, the summary, the ledgers, and the journal
(written atomically after every release or auction, so a crash or a refusal resumes without
drawing new noise). It talks to owner actors only through :class:`RayTransport` (msgpack frames).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import ray

from dpmarket.actors.cluster.placement import node_report
from dpmarket.actors.parties.refresh import PoolRefresher, finish_refresh, stop_after_refusal
from dpmarket.actors.parties.securephase_journal import (
    SecureHost,
    charge_lost_refreshes,
    run_secure_phases,
)
from dpmarket.actors.parties.transport import FaultPlan, RayTransport, gateways_reachable
from dpmarket.actors.randomness import NoiseSource
from dpmarket.protocol.securesum.spec import RoundResult
from dpmarket.protocol.summary.curator import Curator, CuratorParams, SummaryResult
from dpmarket.protocol.summary.journal import (
    pool_rows,
    restore_curator,
    secure_record,
    snapshot_curator,
)

__all__ = ["CuratorActor", "write_json_atomic"]


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace`` (never half a
    file), fsync'd."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` atomically (:func:`_write_atomic`)."""
    _write_atomic(path, json.dumps(data))


def pool_file(journal: Path) -> Path:
    """The append-only file of purchased-pool rows beside (and named after) the snapshot."""
    return journal.with_name(f"{journal.stem}.pool.jsonl")


def read_pool_rows(path: Path) -> list[dict[str, Any]]:
    """Every complete row of a pool file (a torn last line from a crash is ignored)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def append_pool_rows(path: Path, rows: list[dict[str, Any]], offset: int) -> int:
    """Append ``rows`` after the first ``offset`` bytes (the end of the last good append: any
    tail a failed append left is cut first) and fsync; return the new end. If writing fails the
    file is cut back to ``offset`` where possible and the error is raised, so a retry neither
    duplicates rows nor glues a fragment onto the next one."""
    if path.exists() and path.stat().st_size != offset:
        os.truncate(path, offset)
    try:
        with path.open("a", encoding="utf-8") as fh:
            fh.writelines(json.dumps(row) + "\n" for row in rows)
            fh.flush()
            os.fsync(fh.fileno())
            return fh.tell()
    except BaseException:
        with contextlib.suppress(OSError):
            os.truncate(path, offset)
        raise


def rewrite_pool_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Replace the pool file with exactly ``rows`` (atomically)."""
    _write_atomic(path, "".join(json.dumps(row) + "\n" for row in rows))


@ray.remote(num_cpus=0)
class CuratorActor:
    """Ray actor around the curator. ``journal`` is a path on the curator's node (or None);
    ``noise`` keys the curator's noise generator (validation release, summary channels, MWEM,
    auction coins) in this process: from OS entropy unless the run simulates."""

    def __init__(
        self,
        run: str,
        owners: list[str],
        validation: npt.NDArray[np.float64],
        seed_set: npt.NDArray[np.float64],
        params: CuratorParams,
        noise: NoiseSource,
        journal: str | None = None,
        snapshot: dict[str, Any] | None = None,
    ) -> None:
        self._journal = Path(journal) if journal else None
        self._pool_written = 0  # pool rows already in the journal's append-only pool file
        self._pool_bytes = 0  # where the last good append ended
        if snapshot is not None:
            rows = read_pool_rows(pool_file(self._journal)) if self._journal else None
            # fresh noise for the releases still to come (a reproducible simulation labels the
            # stream by where it resumes, so it never replays the noise of earlier releases)
            # before the epochs (state "new") no curator release was drawn yet: the first stream
            fresh = snapshot.get("state") == "new"
            label = "curator" if fresh else f"curator:resume:{snapshot.get('seq', 0)}"
            rng = noise.generator(label)
            self._curator = restore_curator(snapshot, validation, seed_set, rows, rng=rng)
            if self._journal is not None:  # drop rows bought after the snapshot was written
                path = pool_file(self._journal)
                rewrite_pool_rows(path, pool_rows(self._curator))
                self._pool_written, self._pool_bytes = len(self._curator.pool), path.stat().st_size
        else:
            rng = noise.generator("curator")
            self._curator = Curator(run, owners, validation, seed_set, params, rng)
            if self._journal is not None:  # a fresh run: no rows of an earlier run in OUT
                pool_file(self._journal).unlink(missing_ok=True)
        # a journal written before the epochs (state "new") starts the curator, not resumes it
        self._resumed = snapshot is not None and snapshot.get("state") != "new"
        self._secure: dict[str, Any] = secure_record(snapshot) if snapshot is not None else {}
        self._validation = np.asarray(validation, dtype=np.float64)
        self._transport: RayTransport | None = None
        self._refresher: PoolRefresher | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        self._crash_at: int | None = None
        # a refresh round opened before a crash, its result never journaled: charged once here
        if charge_lost_refreshes(self._secure, self._curator.ledgers):
            self._journal_now()

    def _checkpoint(self) -> None:
        """Append the points bought since the last checkpoint, then rewrite the snapshot (which
        names how many pool rows it covers): each point is written once, not per checkpoint."""
        if self._journal is not None and self._curator.checkpoint_due:
            rows = pool_rows(self._curator, self._pool_written)
            if rows:
                path = pool_file(self._journal)
                self._pool_bytes = append_pool_rows(path, rows, self._pool_bytes)
                self._pool_written += len(rows)
            snap = snapshot_curator(self._curator, pool_inline=False, secure_phases=self._secure)
            write_json_atomic(self._journal, snap)
            self._curator.checkpoint_due = False

    async def where(self, paths: list[str]) -> dict[str, Any]:
        """This node (Ray id, IP) and the dpmarket running here (actors/config/placement.py)."""
        return node_report(paths)

    async def progress(self) -> dict[str, Any]:
        """Where the run stands (served while ``run`` is in progress)."""
        c = self._curator
        return {
            "state": c.state,
            "epoch": c.epoch.number,
            "summary_size": len(c.provenance),
            "lost": sorted(c.lost),
            "absent": sorted(set(c.owners) - c.live),  # from this epoch (lost, not back)
        }

    async def secure_phases(
        self,
        nodes: dict[str, Any],
        owners: dict[str, Any],
        plan: dict[str, Any],
        session_ready: bool = False,
    ) -> dict[str, Any]:
        """Normalise and scan, two secure-sum rounds over the owners, each journaled before its
        result is used (actors/parties/securephase_journal.py: a journaled round is reused on
        resume, an
        opened one charged once and not run again). Both releases are charged to every owner's
        ledger (Gaussian, record-level add/remove); a curator resumed after the epochs began
        skips them (they are in its journaled ledgers already)."""
        if self._resumed:
            return {"skipped": "resumed run: the secure-sum phases ran before"}
        host = SecureHost(
            self._curator.ledgers, self._validation, self._secure, self._journal_now,
            self._refuse_short,
        )  # fmt: skip
        out = await run_secure_phases(host, nodes, owners, plan, session_ready)
        self._refresher = host.refresher
        self._curator.checkpoint_due = True
        return out

    def _journal_now(self) -> None:
        """Write the snapshot now (with the secure phases' record), whatever is due."""
        self._curator.checkpoint_due = True
        self._checkpoint()

    def _refuse_short(self, result: RoundResult, phase: str) -> dict[str, Any] | None:
        """A secure round short of T (missing + known colluders), or one that failed (a compute
        node lost: the DCA needs every node's partial sum) or whose nodes disagreed, released
        and charged nothing: it refuses the run, journaled, before any further release (never
        a later phase without it): the refused payload, or None."""
        if result.status not in ("insufficient", "failed", "inconsistent"):
            return None  # released, or charged once after a crash ("lost"): the run goes on
        self._curator.refuse_round(phase, result.reason, list(result.missing))
        self._checkpoint()
        c = self._curator
        ledgers = {k: v.to_dict() for k, v in c.ledgers.items()}  # what was charged before it
        return {
            "state": c.state,
            "reason": c.reason,
            "refusal": dict(c.refusal),
            "ledgers": ledgers,
        }

    async def standardize(self, center: list[float], scale: list[float], gamma: float) -> None:
        """Hash standardised features from now on (before ``run``; see Curator.standardize)."""
        self._curator.standardize(center, scale, gamma)

    async def run(
        self, handles: dict[str, Any], faults: FaultPlan | None = None, crash_at: int | None = None
    ) -> dict[str, Any]:
        """Drive the run to completion or refusal; return the result as plain data.
        ``crash_at`` simulates a curator crash: the process exits once epoch ``crash_at`` is
        reached, after journaling what is due (what a crash between two releases leaves).

        A curator restored from a journal in state "done" (it finished after its driver died)
        sends nothing: it returns the journaled result, so a resume writes the finished run's
        outputs without buying anything again."""
        self._crash_at = crash_at
        curator = self._curator
        started = time.perf_counter()
        if curator.state == "done":
            first: list[Any] = []
        else:
            first = curator.resume() if self._resumed else curator.start()
        self._checkpoint()
        transport = RayTransport(handles, faults, reachable=gateways_reachable(handles))
        self._transport = transport
        await transport.drive(
            curator, first, lambda: curator.state in ("done", "refused"), self._on_step
        )
        # a refusal cancels a refresh in flight first; otherwise it may finish (or time out)
        await finish_refresh(self._refresh_task, self._refresher, curator)
        self._checkpoint()
        payload = result_payload(curator.result(), curator, transport)
        payload["run_seconds"] = time.perf_counter() - started
        if self._refresher is not None:
            payload["refreshes"] = self._refresher.history
        return payload

    def _on_step(self) -> None:
        """After every state change: journal, and start a pool refresh when one is due."""
        self._checkpoint()
        refresher, curator = self._refresher, self._curator
        if self._crash_at is not None and curator.epoch.number >= self._crash_at:
            os._exit(70)  # simulated crash: no cleanup, no reply
        busy = self._refresh_task is not None and not self._refresh_task.done()
        stop_after_refusal(refresher, curator)  # no release after a refusal
        if refresher is None or busy or curator.state in ("done", "refused"):
            return
        if refresher.due(curator.epoch.number):
            self._refresh_task = asyncio.ensure_future(self._refresh(curator.epoch.number))

    async def _refresh(self, epoch: int) -> None:
        assert self._refresher is not None
        try:  # the refresher journals the round (opened, then its result with the charges)
            await self._refresher.refresh(epoch, self._curator.ledgers)
        except Exception as exc:  # an owner or node failing mid-round: report, run goes on
            self._refresher.history.append(
                {"epoch": epoch, "status": "failed", "reason": repr(exc)}
            )
        last = self._refresher.history[-1]
        if last["status"] == "insufficient":  # short of T: the run stops as for an epoch
            # the refusal's notices to owners are not sent: the drive loop ends at the refusal
            # and the market shuts the owners down
            self._curator.refuse_round(
                f"secure sum: scan refresh at epoch {epoch}", last["reason"], last["missing"]
            )
            self._checkpoint()


def allocation_record(params: CuratorParams) -> dict[str, Any] | None:
    """allocate-select's public settings for report.json (None: no allocation): its rule, for
    the histogram rule the score ridge an owner needs to rebuild its frame from g_tilde, and
    how much of max_points was not steered (the hedge's random share, the counts' floor)."""
    if not params.allocate:
        return None
    histogram = params.allocation_rule == "histogram"
    return {
        "rule": params.allocation_rule,
        "ridge": params.allocation_ridge if histogram else None,
        "noise_multiplier": params.allocation_sigma,
        "random_share": params.random_share,
        "floor": params.allocation_floor,
    }


def result_payload(res: SummaryResult, curator: Curator, transport: RayTransport) -> dict[str, Any]:
    """The curator's result as plain picklable data for the driver."""
    return {
        "state": curator.state,
        "reason": res.reason,
        "refusal": dict(curator.refusal),
        "points": res.points,
        "hashed": res.hashed,
        "labels": res.labels,
        "provenance": [dataclasses.asdict(p) for p in res.provenance],
        "epochs": res.epochs,
        "exploration_epochs": min(res.epochs, curator.params.explore_epochs(len(curator.owners))),
        "final_selection": curator.params.final_selection,
        "mechanism": curator.params.mechanism,
        "purchased": len(curator.pool),
        "max_points": curator.params.max_points,
        "allocation": allocation_record(curator.params),
        "value": res.value,
        "distinct_points": res.transfers.distinct_points,
        "total_transfers": res.transfers.total_transfers,
        "ledgers": {k: v.to_dict() for k, v in res.ledgers.items()},
        "dropped": res.dropped,
        "rejected": res.rejected,
        "lost": dict(curator.lost),
        "returned": dict(sorted(curator.returns.items())),  # owners taken back, how often
        "kept_out": curator.kept_out(),  # lost owners not taken back again, and why
        "late_frames": res.late_frames,
        "transport": {
            "frames_sent": transport.frames_sent,
            "bytes_sent": transport.bytes_sent,
            "calls": transport.calls,
            "errors": transport.errors,
            "refused": dict(sorted(transport.refused.items())),  # refused frames per owner
            "expelled": sorted(transport.expelled),  # lost for more than MAX_FAULTS of them
            "dead": sorted(transport.dead),
        },
    }

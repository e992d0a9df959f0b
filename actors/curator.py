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

from dpmarket.actors.dca import DcaHub, DcaUnavailable, record_for_owners
from dpmarket.actors.randomness import NoiseSource
from dpmarket.actors.refresh import PoolRefresher, finish_refresh, stop_after_refusal
from dpmarket.actors.transport import FaultPlan, RayTransport
from dpmarket.protocol.privacy.ledger import ADD_REMOVE, PrivacyLedger
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.securesum.spec import DcaConfig, RoundResult
from dpmarket.protocol.summary.curator import Curator, CuratorParams, SummaryResult
from dpmarket.protocol.summary.journal import pool_rows, restore_curator, snapshot_curator
from dpmarket.streams.race.lsh import make_family
from dpmarket.streams.race.sketch import PrivacyStatement, RaceRelease, RaceSketch

__all__ = ["CuratorActor", "write_json_atomic"]


def _moments_summary(result: RoundResult, k: int) -> dict[str, Any]:
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


def _pool_release(result: RoundResult, sk: dict[str, Any], n_features: int) -> RaceRelease:
    """The released sketch counters of a secure-sum round as a RACE release with its cost."""
    assert result.value is not None
    family = make_family(
        sk["family"],
        n_features,
        int(sk["rows"]),
        int(sk["seed"]),
        bandwidth=float(sk["bandwidth"]),
    )
    template = RaceSketch(family, int(sk["width"]))
    statement = PrivacyStatement(
        "gaussian", (result.sigma_std,), result.sensitivity, ADD_REMOVE, None, 0.0
    )
    return RaceRelease.from_counter_vector(template, result.value, statement)


def _coverage(release: RaceRelease, validation: npt.NDArray[np.float64], total: float) -> float:
    """Mean KDE of the DP pool sketch at the validation points, per pooled record (the
    sketch's kernel; 1 = every record collides with every validation point)."""
    density = release.query(validation.astype(np.float32))
    return float(np.mean(density) / max(total, 1.0))


def _scan_summary(
    result: RoundResult,
    release: RaceRelease | None,
    validation: npt.NDArray[np.float64],
    moments: dict[str, Any],
) -> dict[str, Any]:
    """Coverage of the validation set by the pool (see :func:`_coverage`)."""
    if result.value is None or release is None:
        return {"status": result.status, "reason": result.reason}
    total = float(moments.get("count", 1.0))
    return {
        "status": result.status,
        "coverage": _coverage(release, validation, total),
        "sigma": result.sigma_std,
        "missing": list(result.missing),
    }


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
            rng = noise.generator(f"curator:resume:{snapshot.get('seq', 0)}")
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
        self._resumed = snapshot is not None
        self._validation = np.asarray(validation, dtype=np.float64)
        self._transport: RayTransport | None = None
        self._refresher: PoolRefresher | None = None
        self._refresh_task: asyncio.Task[None] | None = None
        self._crash_at: int | None = None

    def _checkpoint(self) -> None:
        """Append the points bought since the last checkpoint, then rewrite the snapshot (which
        names how many pool rows it covers): each point is written once, not per checkpoint."""
        if self._journal is not None and self._curator.checkpoint_due:
            rows = pool_rows(self._curator, self._pool_written)
            if rows:
                path = pool_file(self._journal)
                self._pool_bytes = append_pool_rows(path, rows, self._pool_bytes)
                self._pool_written += len(rows)
            write_json_atomic(self._journal, snapshot_curator(self._curator, pool_inline=False))
            self._curator.checkpoint_due = False

    async def progress(self) -> dict[str, Any]:
        """Where the run stands (served while ``run`` is in progress)."""
        c = self._curator
        return {
            "state": c.state,
            "epoch": c.epoch.number,
            "summary_size": len(c.provenance),
            "lost": sorted(c.lost),
        }

    async def secure_phases(
        self, nodes: dict[str, Any], owners: dict[str, Any], plan: dict[str, Any]
    ) -> dict[str, Any]:
        """Normalise and scan: two secure-sum rounds over the owners (see actors/dca.py).

        Both releases are charged to every owner's ledger (Gaussian, record-level add/remove);
        a resumed curator skips them (they are in its journaled ledgers already).
        """
        if self._resumed:
            return {"skipped": "resumed run: the secure-sum phases ran before"}
        config: DcaConfig = plan["config"]
        rounds: SecureSumPlan = plan["rounds"]  # the operator's; owners and nodes hold it too
        hub = DcaHub(config, nodes, owners, PrivacyLedger("dca"))
        try:
            await hub.setup()
        except DcaUnavailable as exc:  # nothing was released, nothing is charged
            failed = {"status": "failed", "reason": str(exc)}
            return {"normalise": failed, "scan": failed, "errors": [str(exc)]}
        k = int(plan["n_features"])
        out: dict[str, Any] = {
            "nodes": list(config.nodes),
            "tolerance": config.tolerance,
            "shares": config.shares,
        }
        spec, timeout = rounds.spec("normalise", 1), plan["timeout"]
        moments = await hub.round(spec, "moments", rounds.options("normalise"), timeout)
        record_for_owners(self._curator.ledgers, moments, "normalise (secure sum)")
        out["normalise"] = _moments_summary(moments, k)
        if (refused := self._refuse_short(moments, "secure sum: normalise")) is not None:
            return out | {"refused": refused}
        sk = plan["sketch"]
        counters = await hub.round(rounds.spec("scan", 2), "sketch", sk, timeout)
        record_for_owners(self._curator.ledgers, counters, "scan (secure sum)")
        if (refused := self._refuse_short(counters, "secure sum: scan")) is not None:
            return out | {"normalise": out["normalise"], "refused": refused}
        n = self._validation.shape[1]
        pool = _pool_release(counters, sk, n) if counters.value is not None else None
        out["scan"] = _scan_summary(counters, pool, self._validation, out["normalise"])
        if int(plan.get("refresh_every", 0)) > 0:
            self._refresher = PoolRefresher(
                hub,
                plan,
                pool,
                counters,
                lambda result: _pool_release(result, sk, n),
                lambda release, total: _coverage(release, self._validation, total),
            )
        out["absent"] = {str(r): a for r, a in hub.absent.items()}
        out["errors"] = hub.errors[:20]
        self._curator.checkpoint_due = True
        return out

    def _refuse_short(self, result: RoundResult, phase: str) -> dict[str, Any] | None:
        """A secure round short of T (missing + known colluders; released and charged nothing)
        refuses the run, journaled, before any further release: the refused payload, or None."""
        if result.status != "insufficient":
            return None
        self._curator.refuse_round(phase, result.reason, list(result.missing))
        self._checkpoint()
        c = self._curator
        return {"state": c.state, "reason": c.reason, "refusal": dict(c.refusal)}

    async def standardize(self, center: list[float], scale: list[float], gamma: float) -> None:
        """Hash standardised features from now on (before ``run``; see Curator.standardize)."""
        self._curator.standardize(center, scale, gamma)

    async def run(
        self, handles: dict[str, Any], faults: FaultPlan | None = None, crash_at: int | None = None
    ) -> dict[str, Any]:
        """Drive the run to completion or refusal; return the result as plain data.
        ``crash_at`` simulates a curator crash: the process exits once epoch ``crash_at`` is
        reached, after journaling what is due (what a crash between two releases leaves)."""
        self._crash_at = crash_at
        curator = self._curator
        started = time.perf_counter()
        first = curator.resume() if self._resumed else curator.start()
        self._checkpoint()
        transport = RayTransport(handles, faults)
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
        try:
            released = await self._refresher.refresh(epoch, self._curator.ledgers)
        except Exception as exc:  # an owner or node failing mid-round: report, run goes on
            self._refresher.history.append(
                {"epoch": epoch, "status": "failed", "reason": repr(exc)}
            )
            released = True  # it may have charged the ledgers before failing: journal them

        if released:  # the ledgers changed: journal them
            self._curator.checkpoint_due = True
            self._checkpoint()
        last = self._refresher.history[-1]
        if last["status"] == "insufficient":  # short of T: the run stops as for an epoch
            # the refusal's notices to owners are not sent: the drive loop ends at the refusal
            # and the market shuts the owners down
            self._curator.refuse_round(
                f"secure sum: scan refresh at epoch {epoch}", last["reason"], last["missing"]
            )
            self._checkpoint()


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
        "purchased": len(curator.pool),
        "value": res.value,
        "distinct_points": res.transfers.distinct_points,
        "total_transfers": res.transfers.total_transfers,
        "ledgers": {k: v.to_dict() for k, v in res.ledgers.items()},
        "dropped": res.dropped,
        "rejected": res.rejected,
        "lost": dict(curator.lost),
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

"""The curator actor: hosts the Curator party and drives the summarisation over Ray.

It owns the run's private state: the validation set, the summary, the ledgers, and the journal
(written atomically after every release or auction, so a crash or a refusal resumes without
drawing new noise). It talks to owner actors only through :class:`RayTransport` (msgpack frames).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import ray

from dpmarket.actors.transport import FaultPlan, RayTransport
from dpmarket.protocol.curator import Curator, CuratorParams, SummaryResult
from dpmarket.protocol.journal import restore_curator, snapshot_curator

__all__ = ["CuratorActor", "write_json_atomic"]


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` through a temporary file and ``os.replace`` (never half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@ray.remote(num_cpus=0)
class CuratorActor:
    """Ray actor around the curator. ``journal`` is a path on the curator's node (or None)."""

    def __init__(
        self,
        run: str,
        owners: list[str],
        validation: npt.NDArray[np.float64],
        seed_set: npt.NDArray[np.float64],
        params: CuratorParams,
        seed: int,
        journal: str | None = None,
        snapshot: dict[str, Any] | None = None,
    ) -> None:
        if snapshot is not None:
            self._curator = restore_curator(snapshot, validation, seed_set)
        else:
            rng = np.random.default_rng(seed)
            self._curator = Curator(run, owners, validation, seed_set, params, rng)
        self._resumed = snapshot is not None
        self._journal = Path(journal) if journal else None
        self._transport: RayTransport | None = None

    def _checkpoint(self) -> None:
        if self._journal is not None and self._curator.checkpoint_due:
            write_json_atomic(self._journal, snapshot_curator(self._curator))
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

    async def run(self, handles: dict[str, Any], faults: FaultPlan | None = None) -> dict[str, Any]:
        """Drive the run to completion or refusal; return the result as plain data."""
        curator = self._curator
        first = curator.resume() if self._resumed else curator.start()
        self._checkpoint()
        transport = RayTransport(handles, faults)
        self._transport = transport
        await transport.drive(
            curator, first, lambda: curator.state in ("done", "refused"), self._checkpoint
        )
        self._checkpoint()
        return result_payload(curator.result(), curator, transport)


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
            "dead": sorted(transport.dead),
        },
    }

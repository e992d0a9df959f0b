"""The owner actor: hosts an owner's sans-I/O parties and only decodes, calls, encodes.

One Ray async actor per data owner. It holds the summarisation :class:`Owner` party (and, as the
runtime grows, the owner's secure-sum client, RACE sketch and file tailer). Only msgpack frames
cross the actor boundary: ``handle(frames)`` decodes each frame with the owner's replay guard,
hands it to the party and returns the encoded replies. A refused frame is logged and dropped;
the actor keeps serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import ray

from dpmarket.protocol.errors import RemoteProtocolError
from dpmarket.protocol.messages import ReplayGuard, decode, encode
from dpmarket.protocol.securesum import Client, DcaConfig, RoundSpec
from dpmarket.protocol.summarize import Owner
from dpmarket.streams.lsh import make_family
from dpmarket.streams.race import RaceSketch
from dpmarket.streams.records import RejectsWriter, Schema
from dpmarket.streams.tail import FileTailer

__all__ = ["OwnerActor", "handle_frames"]


def handle_frames(
    party: Owner, guard: ReplayGuard, frames: list[bytes]
) -> tuple[list[bytes], list[str]]:
    """Decode, hand to the party, encode: the whole job of an actor. Returns (replies, errors)."""
    replies: list[bytes] = []
    errors: list[str] = []
    for frame in frames:
        try:
            msg = decode(frame, guard)
            replies.extend(encode(m) for m in party.receive(msg))
        except RemoteProtocolError as exc:
            errors.append(str(exc))
    return replies, errors


@ray.remote(num_cpus=0)
class OwnerActor:
    """Ray actor around one owner. ``X`` is the owner's records, or their feature count when
    the records arrive from files (:meth:`start_ingest`). ``delay`` simulates a slow owner."""

    def __init__(
        self,
        name: str,
        run: str,
        X: npt.NDArray[np.float64] | int,
        y: npt.NDArray[np.float64] | None,
        delay: float = 0.0,
    ) -> None:
        # an int means "no records yet, this many features": records arrive by ingestion
        X0 = np.zeros((0, X)) if isinstance(X, int) else X
        self._party = Owner(name, run, X0, y)
        self._guard = ReplayGuard()
        self._delay = delay
        self.errors: list[str] = []
        self._tailers: dict[str, FileTailer] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.ingested = 0
        self.rejected = 0
        self._dca: Client | None = None
        self._dca_rng = np.random.default_rng(0)

    async def handle(self, frames: list[bytes]) -> list[bytes]:
        if self._delay:
            await asyncio.sleep(self._delay)
        replies, errors = handle_frames(self._party, self._guard, frames)
        self.errors.extend(errors)
        return replies

    async def start_ingest(
        self, inputs: list[str], schema: Schema, state_dir: str, poll_interval: float = 0.25
    ) -> None:
        """Follow each input file with a tailer: every valid record (clipped to the public
        bounds by the schema) is handed to the owner party, then the file offset is committed;
        rejects go to ``state_dir/rejects.jsonl`` with their source and byte offset."""
        state = Path(state_dir)
        state.mkdir(parents=True, exist_ok=True)
        rejects = RejectsWriter(state / "rejects.jsonl")
        for path in inputs:
            key = hashlib.blake2b(str(Path(path).resolve()).encode(), digest_size=8).hexdigest()
            tailer = FileTailer(
                path, schema, state / f"{key}.pos", poll_interval=poll_interval, rejects=rejects
            )
            self._tailers[path] = tailer
            self._tasks.append(asyncio.get_running_loop().create_task(self._follow(tailer)))

    async def _follow(self, tailer: FileTailer) -> None:
        async for batch in tailer:
            if len(batch):
                labels = batch.records.labels
                self._party.add_records(
                    batch.features.astype(np.float64),
                    None if labels is None else np.asarray(labels, dtype=np.float64),
                )
            self.ingested += len(batch)
            self.rejected += len(batch.records.rejects)
            await tailer.commit(batch)

    async def ingest_status(self) -> dict[str, Any]:
        """Records taken in, rejects, and whether every input has been read to its current end."""
        caught_up = all(
            t.read_offset >= os.path.getsize(path) if os.path.exists(path) else False
            for path, t in self._tailers.items()
        )
        failed = [
            str(task.exception())
            for task in self._tasks
            if task.done() and not task.cancelled() and task.exception()
        ]
        return {
            "records": self.ingested,
            "rejected": self.rejected,
            "caught_up": caught_up,
            "failed": failed,
        }

    async def warm_up(self) -> float:
        """Compile the sketch kernels now (numba; cached on disk after the first process), so
        the first secure-sum round is not delayed past its deadline; returns seconds spent."""
        start = time.perf_counter()
        sketch = RaceSketch(make_family("l2", 2, 2, 0, bandwidth=1.0), 4)
        sketch.update(np.zeros((1, 2), dtype=np.float32))
        sketch.query(np.zeros((1, 2), dtype=np.float32))
        return time.perf_counter() - start

    # ------------------------------------------------------------------ secure-sum client
    async def dca_setup(
        self,
        config: DcaConfig,
        node_keys: dict[str, bytes],
        seed: int | None = None,
        behaviour: str | None = None,
    ) -> list[bytes]:
        """Become this owner's secure-sum client; return the registration frames. ``seed`` makes
        the DP noise reproducible in simulation (OS entropy otherwise); ``behaviour`` simulates
        a colluder ("reveal" or "withhold" its noise)."""
        name = self._party.name
        self._dca = Client(
            config,
            f"client:{name}",
            node_keys,
            (name,),
            {name: behaviour} if behaviour else None,
        )
        entropy = seed if seed is not None else secrets.randbits(128)
        self._dca_rng = np.random.default_rng(entropy)
        return [encode(m) for m in self._dca.start()]

    async def dca_contribute(
        self, spec: RoundSpec, what: str, options: dict[str, Any]
    ) -> list[bytes]:
        """This owner's contribution to a secure-sum round, as sealed share frames.

        ``moments``: per-feature sums and sums of squares of the records clipped to
        ``options['bound']``, and the record count. ``sketch``: the int64 counters of a RACE
        sketch of the records (``options``: family parameters and width).
        """
        if self._dca is None:
            raise RuntimeError("dca_contribute before dca_setup")
        X = self._party.records()
        if what == "moments":
            b = float(options["bound"])
            Xc = np.clip(X, -b, b)
            row = np.concatenate([Xc.sum(axis=0), (Xc**2).sum(axis=0), [float(len(Xc))]])
        elif what == "sketch":
            sketch = RaceSketch(
                make_family(
                    options["family"],
                    X.shape[1],
                    int(options["rows"]),
                    int(options["seed"]),
                    bandwidth=float(options["bandwidth"]),
                ),
                int(options["width"]),
            )
            if len(X):
                sketch.update(X.astype(np.float32))
            row = sketch.counter_vector().astype(np.float64)
        else:
            raise ValueError(f"what: unknown contribution {what!r}")
        frames = self._dca.contribute(spec, row[None, :], self._dca_rng)
        return [encode(m) for m in frames]

    async def add_records(
        self, X: npt.NDArray[np.float64], y: npt.NDArray[np.float64] | None = None
    ) -> int:
        """New records, biddable from the next epoch on; returns the owner's record count."""
        self._party.add_records(X, y)
        return self._party.n_records

    async def status(self) -> dict[str, Any]:
        return {
            "name": self._party.name,
            "state": self._party.state,
            "records": self._party.n_records,
            "epochs_seen": self._party.epochs_seen,
            "asks": self._party.asks,
            "errors": list(self.errors),
        }

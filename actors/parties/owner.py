"""The owner actor: hosts an owner's sans-I/O parties and only decodes, calls, encodes.

:class:`OwnerHost` imports no Ray (an owner's agent hosts it without Ray installed); the Ray
actor is actors/parties/ray_actors.py ``OwnerActor``. One Ray async actor per data owner (or
per group of co-located owners in a simulation on few cores). Per owner it holds the
summarisation :class:`Owner` party, the secure-sum client, the RACE sketch of its records for
secure-sum rounds and its file tailers. Only msgpack frames cross the actor boundary:
``handle({owner: frames})`` decodes each frame with that owner's replay guard, hands it to the
party and returns the encoded replies. A refused frame is logged and dropped; the actor keeps
serving. The secure-sum calls name one owner, or several at once (``for_owners``: one call per
actor from the curator's hub, each owner answered alone).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.actors.budgets.gate import BudgetGate, OwnerGate
from dpmarket.actors.parties.dca import OwnerAnswers, error_line
from dpmarket.actors.parties.dcaowner import OperatorTrust, OwnerSecureSum, gated_contribute
from dpmarket.actors.randomness import NoiseSource
from dpmarket.protocol.agents.policy import RoundPrice
from dpmarket.protocol.securesum.client import NodeKeyMismatch
from dpmarket.protocol.securesum.spec import DcaConfig, RoundSpec
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.wire.codec import ReplayGuard, decode, encode
from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.streams.race.kernels import numba_installed
from dpmarket.streams.race.lsh import make_family
from dpmarket.streams.race.sketch import RaceSketch
from dpmarket.streams.records.files import CsvDecoder, Schema
from dpmarket.streams.records.tail import FileTailer, TailBatch

__all__ = ["OwnerHost", "handle_frames", "warm_kernels"]


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


def warm_kernels() -> None:
    """Run the sketch kernels an owner uses once (numba compiles them, or loads them from its
    cache: the first process on a machine writes it). ``make test`` calls this before its
    parallel parts, so their owner processes load the kernels instead of each compiling them."""
    if not numba_installed():
        return  # an agent's install without numba: its sketches take the numpy path
    sketch = RaceSketch(make_family("l2", 2, 2, 0, bandwidth=1.0), 4, backend="numba")
    sketch.update(np.zeros((1, 2), dtype=np.float32))
    sketch.query(np.zeros((1, 2), dtype=np.float32))


@dataclass
class _Hosted:
    """One owner inside an owner actor: its parties, replay guard, tailers and counters."""

    party: Owner
    guard: ReplayGuard
    delay: float = 0.0
    errors: list[str] = field(default_factory=list)
    tailers: dict[str, FileTailer] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    ingested: int = 0
    reader_errors: list[str] = field(default_factory=list)
    rejected: int = 0
    dca: OwnerSecureSum | None = None  # its secure-sum side, under the operator's trust
    gate: OwnerGate | None = None  # its durable ledger and cap (actors/budgets/gate.py)


OwnerData = tuple[npt.NDArray[np.float64] | int, npt.NDArray[np.float64] | None]


class OwnerHost:
    """The owners of one process: as a Ray actor (ray_actors.py ``OwnerActor``), one owner or
    several co-located ones (a simulation on few cores; in a deployment every owner runs its own
    actor on its own node); in an owner's own agent (actors/remote/owneragent.py), that owner
    alone. ``owners`` maps a name to (records, labels), where records may be a feature count
    when they arrive from files (:meth:`start_ingest`). ``delays`` simulates slow owners
    (seconds before every reply).

    Every method names the owner it acts for; each hosted owner keeps its own party, replay
    guard, secure-sum client and tailers, so co-location shares the process and nothing else.
    """

    def __init__(
        self,
        run: str,
        owners: dict[str, OwnerData],
        noise: NoiseSource,
        delays: dict[str, float] | None = None,
        dca: OperatorTrust | None = None,
        budgets: dict[str, BudgetGate] | None = None,
        profile_floor: float | None = None,
        point_limit: int | None = None,
    ) -> None:
        """``dca``: the operator's trust anchors for the secure sum (actors/parties/dcaowner.py),
        given
        here (or by the operator's :meth:`begin_request`) and never by a curator; without them
        the owner takes no part in a secure sum.
        ``budgets``: per owner, its store, cap and the summary phase's planned charge
        (actors/budgets/gate.py): such an owner charges its own ledger before contributing.
        ``profile_floor``: the operator's noise multiplier for allocate-select's profile;
        ``point_limit``: the most distinct points each owner delivers (an agent's own policy)."""
        if not owners:
            raise ValueError("owners: an owner actor hosts at least one owner")
        delays = delays or {}
        self._noise = noise
        self._hosted: dict[str, _Hosted] = {}
        for name, (X, y) in owners.items():
            # an int means "no records yet, this many features": records arrive by ingestion
            X0 = np.zeros((0, X)) if isinstance(X, int) else X
            rng = noise.generator(f"summary:{name}")
            owner = Owner(
                name, run, X0, y, rng=rng, profile_floor=profile_floor, point_limit=point_limit
            )
            hosted = _Hosted(owner, ReplayGuard(), delays.get(name, 0.0))
            if dca is not None:  # noise keyed in this process (OS entropy unless simulated)
                hosted.dca = OwnerSecureSum(name, dca, noise.generator(f"dca:{name}"))
                hosted.dca.sketch_ahead(np.asarray(X0, dtype=np.float64), 0)
            if budgets and name in budgets:  # opens (or creates) the owner's own store
                hosted.gate = OwnerGate(name, budgets[name])
                hosted.gate.arrived(0, owner.n_records, time.time(), owner.records())
            self._hosted[name] = hosted

    async def begin_request(
        self,
        run: str,
        noise: NoiseSource,
        dca: OperatorTrust | None = None,
        budgets: dict[str, BudgetGate] | None = None,
        profile_floor: float | None = None,
        point_limit: int | None = None,
    ) -> dict[str, Any]:
        """A later purchase on this actor (``[[requests]]``, actors/run/requests.py), given by
        the operator (the driver), never by a curator: per hosted owner a fresh party of run
        ``run`` holding every record taken in so far (its tailers keep feeding it), a fresh
        replay guard, a secure-sum client under this request's trust anchors and a gate on the
        same store (its filter decides over every earlier request's charges). Returns this
        process's id, to show that the actors outlive requests."""
        for name, hosted in self._hosted.items():
            if hosted.gate is not None:
                hosted.gate.store.close()
            rng = noise.generator(f"summary:{name}")
            hosted.party = hosted.party.fork(run, rng, profile_floor, point_limit)
            hosted.guard, hosted.errors = ReplayGuard(), []
            hosted.dca = (
                None if dca is None else OwnerSecureSum(name, dca, noise.generator(f"dca:{name}"))
            )
            if hosted.dca is not None:
                hosted.dca.sketch_ahead(hosted.party.records(), 0)
            gate = (budgets or {}).get(name)
            hosted.gate = None if gate is None else OwnerGate(name, gate)
            if hosted.gate is not None:  # records taken in without a gate: stamped now
                party = hosted.party
                hosted.gate.arrived(0, party.n_records, time.time(), party.records())
        return {"pid": os.getpid()}

    def _owner(self, name: str) -> _Hosted:
        hosted = self._hosted.get(name)
        if hosted is None:
            raise KeyError(f"owner {name!r} is not hosted here (hosted: {sorted(self._hosted)})")
        return hosted

    async def handle(self, batches: dict[str, list[bytes]]) -> list[bytes]:
        """Frames per hosted owner in, every reply frame out."""
        hosted = [self._owner(name) for name in batches]
        delay = max((h.delay for h in hosted), default=0.0)
        if delay:
            await asyncio.sleep(delay)
        out: list[bytes] = []
        for h, frames in zip(hosted, batches.values(), strict=True):
            if h.gate is not None:  # its cap (actors/budgets/gate.py): charged before replies
                live = h.gate.summary_gate(h.party.n_records)
                if live is None:
                    continue  # declined: silent, so the curator counts it lost (T)
                h.party.retire(~live)  # records of blocks that cannot pay are never bid
            replies, errors = handle_frames(h.party, h.guard, frames)
            h.errors.extend(errors)
            out.extend(replies)
        return out

    async def start_ingest(
        self,
        owner: str,
        inputs: list[str],
        schema: Schema,
        state_dir: str,
        poll_interval: float = 0.25,
        headers: tuple[str, ...] = (),
    ) -> None:
        """Follow each input file with a tailer: every valid record (clipped to the public
        bounds by the schema) is handed to the owner party, then the file offset is committed;
        rejects go to ``state_dir/rejects.jsonl`` (the first input; ``rejects-KEY.jsonl`` for
        the others: each tailer commits its rejects with its offsets) with their source and
        byte offset. The CSV files in ``headers`` have a header line (skipped, not rejected).
        Each tailer reads on its own thread and event loop (:func:`_read_thread`)."""
        hosted = self._owner(owner)
        state = Path(state_dir)
        state.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        for i, path in enumerate(inputs):
            key = hashlib.blake2b(str(Path(path).resolve()).encode(), digest_size=8).hexdigest()
            decoder = CsvDecoder(schema, header=True) if path in headers else schema
            rejects = state / ("rejects.jsonl" if i == 0 else f"rejects-{key}.jsonl")
            tailer = FileTailer(
                path, decoder, state / f"{key}.state", poll_interval=poll_interval, rejects=rejects
            )
            hosted.tailers[path] = tailer
            queue: asyncio.Queue[TailBatch | str] = asyncio.Queue()
            reader = threading.Thread(
                target=_read_thread, args=(tailer, queue, loop), name=f"tail:{path}", daemon=True
            )
            reader.start()
            hosted.tasks.append(loop.create_task(_follow(hosted, tailer, queue)))

    async def ingest_status(self, owner: str) -> dict[str, Any]:
        """Records taken in, rejects, whether every input has been read to its current end,
        and the copytruncate gaps (bytes that existed nowhere readable, tail.py "Limits")."""
        hosted = self._owner(owner)
        caught_up = all(
            t.caught_up() and t.read_offset >= os.path.getsize(path)
            if os.path.exists(path)
            else False
            for path, t in hosted.tailers.items()
        )
        failed = [
            str(task.exception())
            for task in hosted.tasks
            if task.done() and not task.cancelled() and task.exception()
        ]
        return {
            "records": hosted.ingested,
            "rejected": hosted.rejected,
            "caught_up": caught_up,
            "failed": failed + list(hosted.reader_errors),
            "missing": [path for path in hosted.tailers if not os.path.exists(path)],
            "gaps": sum(t.gaps for t in hosted.tailers.values()),
            "gap_bytes": sum(t.gap_bytes for t in hosted.tailers.values()),
        }

    async def rounds_used(self, owner: str, used: dict[str, int]) -> None:
        """Start the owner's round allowance of this purchase at ``used`` rounds per label
        (an agent resuming a purchase: the rounds its store shows it already contributed to
        count against the plan, so a resumed market cannot ask for them again)."""
        dca = _dca_of(self._owner(owner), owner)
        for label, count in used.items():
            dca.allowance.used[label] = max(dca.allowance.used[label], int(count))

    async def warm_up(self) -> float:
        """Before the secure sums: hash every hosted owner's records not hashed yet for the
        plan's sketch rounds (normally none: records are hashed as they arrive,
        ``OwnerSecureSum.sketch_ahead``), so that each round only counts kept columns and runs
        no sketch kernel (numba is never loaded for a round: streams/race/columns.py counts
        with numpy); returns the seconds spent. A record that cannot be hashed is left to its
        round, which refuses that owner's contribution as it always did."""
        start = time.perf_counter()
        for hosted in self._hosted.values():
            if hosted.dca is not None:
                hosted.dca.sketch_current(hosted.party.records())
        return time.perf_counter() - start

    # ------------------------------------------------------------------ secure-sum client
    async def for_owners(self, method: str, calls: dict[str, tuple[Any, ...]]) -> OwnerAnswers:
        """One secure-sum call for several hosted owners at once (the hub's batch,
        actors/parties/dca.py ``DcaHub.ask``): ``calls`` maps each owner to its arguments
        after its name for ``method`` (``dca_identity``, ``dca_setup``, ``dca_roster`` or
        ``dca_contribute``).
        Each owner is answered by exactly the per-owner method, so with its own keys, plan,
        allowance and gate, one after the other; an owner that fails or declines is in the
        answer's errors alone and the others' answers stand. The batch only saves calls: every
        frame in it is sealed by its owner as when asked alone, nothing is combined here."""
        if method not in _BATCHED:
            raise ValueError(f"for_owners: {method!r} is not one of {sorted(_BATCHED)}")
        results: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for owner, args in calls.items():
            try:
                results[owner] = await getattr(self, method)(owner, *args)
            except Exception as exc:  # that owner's failure alone, as when asked alone
                errors[owner] = error_line(exc)
        return OwnerAnswers(results, errors)

    async def dca_identity(self, owner: str) -> bytes:
        """The public half of this owner's secure-sum X25519 key, for the operator to pin at the
        compute nodes (asked by the driver directly, never through the curator)."""
        return _dca_of(self._owner(owner), owner).public_key()

    async def dca_setup(
        self,
        owner: str,
        config: DcaConfig,
        node_keys: dict[str, bytes],
    ) -> list[bytes]:
        """Become this owner's secure-sum client of the operator's session (once); return the
        registration frames. Node keys are checked against the fingerprints the operator gave
        at construction (actors/parties/dcaowner.py), as are the plan and a simulated colluder's
        behaviour: nothing the caller passes changes them."""
        hosted = self._owner(owner)
        try:
            frames = _dca_of(hosted, owner).setup(config, node_keys)
        except (NodeKeyMismatch, RuntimeError, ValueError) as exc:  # take no part in it
            hosted.errors.append(f"dca_setup: {exc}")
            raise
        return [encode(m) for m in frames]

    async def dca_roster(self, owner: str, attestations: dict[str, Any]) -> dict[str, Any]:
        """Take the compute nodes' roster attestations to ``owner`` (actors/parties/dcaowner.py
        ``OwnerSecureSum.attested``): the roster size it counts on, the nodes that did not
        check signatures. A bad one is refused
        (``ValueError``, recorded): an owner that must have one then contributes to no round."""
        hosted = self._owner(owner)
        try:
            return _dca_of(hosted, owner).attested(attestations)
        except (RuntimeError, ValueError) as exc:
            hosted.errors.append(f"dca_roster: {exc}")
            raise

    async def price_rounds(self, owner: str, prices: dict[str, RoundPrice]) -> None:
        """The owner's own price of each round label (protocol/agents/policy.py): what its
        gate charges from then on, whatever the round's spec declares."""
        gate = self._owner(owner).gate
        if gate is None:
            raise RuntimeError(f"{owner}: no store to charge: a priced owner needs one")
        gate.prices = dict(prices)

    async def dca_contribute(
        self, owner: str, spec: RoundSpec, what: str, options: dict[str, Any]
    ) -> list[bytes]:
        """This owner's contribution to a secure-sum round, as sealed share frames.

        ``moments``: per-feature sums and sums of squares of the records clipped to
        ``options['bound']``, and the record count. ``sketch``: the int64 counters of a RACE
        sketch of the records (``options``: family parameters and width). ``sketch_delta``: the
        same over only the records added since the round ``options['base_rounds'][owner]``
        (the last released round this owner was counted in; every record if none), so
        successive deltas cover disjoint record sets. Refused unless the operator's round plan
        admits the round (actors/parties/dcaowner.py).
        """
        hosted = self._owner(owner)
        dca = _dca_of(hosted, owner)  # charged durably before any frame leaves (or declined)
        records = hosted.party.records()
        frames = gated_contribute(dca, hosted.gate, records, spec, what, options)
        return [encode(m) for m in frames]

    async def budget_view(self, owner: str) -> dict[str, Any] | None:
        """The owner's decisions in this run and its store's totals (None: no store)."""
        gate = self._owner(owner).gate
        return None if gate is None else gate.view()

    async def add_records(
        self, owner: str, X: npt.NDArray[np.float64], y: npt.NDArray[np.float64] | None = None
    ) -> int:
        """New records, biddable from the next epoch on; returns the owner's record count."""
        hosted = self._owner(owner)
        if hosted.gate is not None:  # its block, by arrival time, before anything reads it
            hosted.gate.arrived(hosted.party.n_records, len(X), time.time(), X)
        start = hosted.party.n_records
        hosted.party.add_records(X, y)
        if hosted.dca is not None:  # hashed now, while no round waits for it
            hosted.dca.sketch_ahead(np.asarray(X, dtype=np.float64), start)
        return hosted.party.n_records

    async def where(self, paths: list[str]) -> dict[str, Any]:
        """This actor's node (Ray id, IP) and which of ``paths`` cannot be read here: the
        driver's preflight (actors/config/placement.py), asked before any secure sum; only
        a Ray actor is asked (imported here: an agent's process holds no Ray)."""
        from dpmarket.actors.cluster.placement import node_report

        return node_report(paths)

    async def status(self, owner: str) -> dict[str, Any]:
        hosted = self._owner(owner)
        party = hosted.party
        return {
            "name": party.name,
            "state": party.state,
            "records": party.n_records,
            "epochs_seen": party.epochs_seen,
            "asks": party.asks,
            "errors": list(hosted.errors),
        }


_BATCHED = frozenset({"dca_identity", "dca_setup", "dca_roster", "dca_contribute"})  # for_owners


def _dca_of(hosted: _Hosted, owner: str) -> OwnerSecureSum:
    """The owner's secure-sum side (a function, not an actor method: Ray would expose it)."""
    if hosted.dca is None:
        raise RuntimeError(f"{owner}: no secure-sum trust anchors from the operator")
    return hosted.dca


def _read_thread(
    tailer: FileTailer, queue: asyncio.Queue[TailBatch | str], owner_loop: asyncio.AbstractEventLoop
) -> None:
    """A tailer's own thread and event loop: reads into ``queue`` on the actor's loop, so a
    blocked actor loop (a synchronous numba compilation in ``warm_up``, a long bid) never
    stalls reading, and rotation is followed while the actor is busy."""

    async def pump() -> None:
        async for batch in tailer:
            owner_loop.call_soon_threadsafe(queue.put_nowait, batch)

    try:
        asyncio.run(pump())
    except Exception as exc:  # a message instead of a batch: reported by ingest_status
        if owner_loop.is_closed():
            return  # the owner's process is ending (an agent's loop closed): nobody to tell
        owner_loop.call_soon_threadsafe(queue.put_nowait, f"tailer {tailer.path}: {exc!r}")


async def _follow(
    hosted: _Hosted, tailer: FileTailer, queue: asyncio.Queue[TailBatch | str]
) -> None:
    """On the actor's loop: hand every batch the tailer thread read to the owner party, then
    commit it (rejects and offsets together; ``commit`` never suspends)."""
    while True:
        batch = await queue.get()
        if isinstance(batch, str):
            hosted.reader_errors.append(batch)
            return
        if len(batch):
            features = batch.features.astype(np.float64)
            if hosted.gate is not None:  # its block, by arrival time, before anything reads it
                hosted.gate.arrived(hosted.party.n_records, len(batch), time.time(), features)
            labels, start = batch.records.labels, hosted.party.n_records
            hosted.party.add_records(
                features, None if labels is None else np.asarray(labels, dtype=np.float64)
            )
            if hosted.dca is not None:  # hashed now, while no round waits for it
                hosted.dca.sketch_ahead(features, start)
        hosted.ingested += len(batch)
        hosted.rejected += len(batch.records.rejects)
        await tailer.commit(batch)

"""In-process transport: moves encoded msgpack frames between sans-I/O parties, deterministically.

``LoopbackTransport`` keeps a simulated clock and a queue ordered by (delivery time, send order).
Every frame crosses the codec (``encode`` on send, ``decode`` with the recipient's
``ReplayGuard`` on delivery), so what runs here is exactly what would cross actor boundaries.
Fault hooks let tests drop frames, delay a party's frames, or kill a party from an epoch on.
A frame the recipient refuses (``RemoteProtocolError``: undecodable, or a value the party cannot
use) is recorded in ``errors``, counted against its sender in ``refused`` and dropped; the run
goes on. A sender refused more than :data:`MAX_FAULTS` times by a party that can lose peers (the
curator's ``lose``) is expelled: lost from that moment, which counts against T like any other
loss, and its later frames are dropped unread.
"""

from __future__ import annotations

import heapq
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from dpmarket.actors.parties.faults import FaultPlan
from dpmarket.protocol.wire.codec import Message, ReplayGuard, decode, encode, encode_all
from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.protocol.wire.parties import Party

__all__ = [
    "MAX_FAULTS",
    "FaultPlan",
    "LoopbackTransport",
    "RayTransport",
    "TransportStalled",
    "gateways_reachable",
]

MAX_FAULTS = 3
"""Refused frames a sender may cause before it is expelled (lost) by the party it talks to."""


class TransportStalled(RuntimeError):
    """The run made no progress: no frame in flight and no deadline left to fire."""


class FaultCounter:
    """Refused frames per sender, and the senders expelled for too many of them."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []
        self.refused: dict[str, int] = {}
        self.expelled: set[str] = set()

    def fault(self, party: Any, senders: set[str], reason: str) -> list[Message]:
        """Count one refused frame against ``senders``; return what ``party`` sends after
        losing those now past :data:`MAX_FAULTS` (nothing if it cannot lose peers)."""
        self.errors.append((party.name, reason))
        over = set()
        for sender in sorted(senders - self.expelled):
            self.refused[sender] = self.refused.get(sender, 0) + 1
            if self.refused[sender] > MAX_FAULTS and hasattr(party, "lose"):
                over.add(sender)
        if not over:
            return []
        self.expelled |= over
        return list(party.lose(over))


class LoopbackTransport:
    """Deterministic in-process delivery of encoded frames between named parties."""

    def __init__(
        self,
        parties: Sequence[Party],
        faults: FaultPlan | None = None,
        latency: float = 0.001,
        idle_step: float = 0.25,
    ) -> None:
        names = [p.name for p in parties]
        if len(set(names)) != len(names):
            raise ValueError(f"parties: duplicate names in {names}")
        if latency <= 0 or idle_step <= 0:
            raise ValueError("latency and idle_step must be positive")
        self.parties = {p.name: p for p in parties}
        # the parties told the time: a party that declares it has no deadlines of its own
        # (``keeps_deadlines = False``: an owner) is skipped, so a tick costs O(curators), not
        # O(K) after every frame (O(K^2) per epoch)
        self._timed = [p for p in parties if getattr(p, "keeps_deadlines", True)]
        self.guards = {name: ReplayGuard() for name in names}
        self.faults = faults or FaultPlan()
        self.latency, self.idle_step = latency, idle_step
        self.now = 0.0
        self._queue: list[tuple[float, int, str, str, int, bytes]] = []
        self._order = 0
        self.counter = FaultCounter()
        self.errors, self.refused = self.counter.errors, self.counter.refused
        self.expelled = self.counter.expelled
        self.frames_sent = 0
        self.bytes_sent = 0
        self.dropped_frames = 0

    def send(self, messages: Iterable[Message]) -> None:
        for msg in messages:
            if self.faults.is_dead(msg.sender, msg.round):
                self.dropped_frames += 1
                continue
            if self.faults.drop is not None and self.faults.drop(msg):
                self.dropped_frames += 1
                continue
            self.deliver_frame(msg.sender, msg.recipient, msg.round, encode(msg))

    def deliver_frame(self, sender: str, recipient: str, round_: int, frame: bytes) -> None:
        """Queue one encoded frame as sent by ``sender`` (tests send hostile bytes this way)."""
        if sender in self.counter.expelled:
            self.dropped_frames += 1
            return
        self.frames_sent += 1
        self.bytes_sent += len(frame)
        at = self.now + self.latency + self.faults.delay.get(sender, 0.0)
        self._order += 1
        heapq.heappush(self._queue, (at, self._order, sender, recipient, round_, frame))

    def step(self) -> bool:
        """Deliver the next frame or advance the clock by at most ``idle_step`` towards it;
        False when nothing is in flight."""
        if not self._queue:
            return False
        if self._queue[0][0] > self.now + self.idle_step:
            self.now += self.idle_step  # let deadlines fire before a late frame lands
            return True
        at, _, sender, recipient, round_, frame = heapq.heappop(self._queue)
        self.now = max(self.now, at)
        party = self.parties.get(recipient)
        if party is None or self.faults.is_dead(recipient, round_):
            self.dropped_frames += 1
            return True
        if sender in self.counter.expelled:
            self.dropped_frames += 1
            return True
        try:
            msg = decode(frame, self.guards[recipient])
            if msg.sender != sender:
                raise RemoteProtocolError(f"from: {msg.sender!r} in a frame sent by {sender!r}")
            out = party.receive(msg)
        except RemoteProtocolError as exc:
            out = self.counter.fault(party, {sender}, str(exc))
        self.send(out)
        return True

    def tick(self) -> None:
        """Give every party with deadlines the current time so they can fire."""
        for party in self._timed:
            out = party.expire(self.now)
            if out:
                self.send(out)

    def run_until(self, done: Callable[[], bool], max_seconds: float = 1e6) -> None:
        """Deliver frames and fire deadlines until ``done()`` or the simulated time limit."""
        self.tick()
        while not done():
            if self.now > max_seconds:
                raise TransportStalled(f"simulated time limit of {max_seconds} s reached")
            if not self.step():
                self.now += self.idle_step
            self.tick()


class RayTransport:
    """Delivers a driving party's frames to Ray actors and feeds their replies back to it.

    Runs inside an async actor (the curator's). Frames for each owner actor go out as one
    ``handle.remote({owner: frames})`` call (several owners when they share an actor); replies
    are awaited with ``asyncio.wait`` up to the driving party's deadline (never ``ray.get`` in
    async code). An actor whose call raises ``RayActorError`` is known dead, with every owner
    it hosts, and is reported to the party at once through ``lose``; an owner that simply does
    not answer in time is dropped when the party's deadline fires.
    Late replies of an earlier phase are still handed to the party, which counts them as late.

    ``reachable`` (optional): which parties can be reached again (remote owners whose link is
    back and that showed they are there, by an answer or by dialling in again:
    :func:`gateways_reachable`), asked at most every ``reach_every`` seconds and handed to a
    party with ``returned`` (the curator takes a lost owner back from the next epoch, at most
    ``MAX_RETURNS`` times); a dead or expelled owner is never handed back.
    """

    def __init__(
        self,
        handles: dict[str, Any],
        faults: FaultPlan | None = None,
        clock: Callable[[], float] | None = None,
        poll: float = 0.05,
        reachable: Callable[[], Awaitable[set[str]]] | None = None,
        reach_every: float = 1.0,
    ) -> None:
        import time

        self.handles = dict(handles)
        self.hosted: dict[Any, set[str]] = {}  # handle -> the owners it hosts, found once
        for owner, handle in self.handles.items():
            self.hosted.setdefault(handle, set()).add(owner)
        self.faults = faults or FaultPlan()
        self.clock = clock or time.monotonic
        self.poll = poll
        self.guard = ReplayGuard()
        self.counter = FaultCounter()
        self.errors, self.refused = self.counter.errors, self.counter.refused
        self.expelled = self.counter.expelled
        self.dead: set[str] = set()
        self.frames_sent = 0
        self.bytes_sent = 0
        self.calls = 0
        self.reachable, self.reach_every = reachable, reach_every
        self._reach_at = 0.0

    async def drive(
        self,
        party: Any,
        first: list[Message],
        until: Callable[[], bool],
        on_step: Callable[[], None] | None = None,
    ) -> None:
        """Run ``party`` (with ``receive``, ``expire``, ``lose``, ``deadline``) until ``until()``;
        ``on_step`` runs after every state change of the party (the curator journals there)."""
        import asyncio

        import ray

        outbox = list(first)
        pending: dict[asyncio.Future[Any], Any] = {}  # call -> the actor handle it went to
        while not until():
            self._dispatch(outbox, pending)
            await self._hand_back(party)
            outbox = list(party.expire(self.clock()))
            if on_step is not None:
                on_step()
            if outbox or until():
                continue
            timeout = self.poll
            if party.deadline is not None:
                timeout = max(0.0, min(party.deadline - self.clock(), 60.0)) + 1e-3
            if not pending:
                await asyncio.sleep(timeout)
                continue
            done, _ = await asyncio.wait(
                pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            for fut in done:
                handle = pending.pop(fut)
                try:
                    frames = fut.result()
                except ray.exceptions.RayActorError:  # every owner the actor hosted is gone
                    hosted = set(self.hosted[handle])
                    self.dead.update(hosted)
                    outbox.extend(party.lose(hosted))
                    if on_step is not None:  # a loss can refuse the run: the curator must see
                        on_step()  # it (journal, cancel a refresh in flight) before the loop ends
                    continue
                outbox.extend(self._receive(party, frames, self.hosted[handle]))
                if on_step is not None:
                    on_step()

    async def _hand_back(self, party: Any) -> None:
        """Tell ``party`` which lost parties are reachable again (class docstring)."""
        if self.reachable is None or not hasattr(party, "returned"):
            return
        if self.clock() < self._reach_at:
            return
        self._reach_at = self.clock() + self.reach_every
        try:
            back = await self.reachable()
        except Exception as exc:  # the gateway gone: its parties are the run's concern
            self.errors.append(("reachable", f"{type(exc).__name__}: {exc}"))
            return
        party.returned(set(back) - self.dead - self.counter.expelled)

    def _dispatch(self, outbox: list[Message], pending: dict[Any, Any]) -> None:
        """Encode the outbox and send it as one call per actor (co-located owners share one)."""
        import asyncio

        import ray

        by_actor: dict[Any, dict[str, list[bytes]]] = {}
        sending: list[tuple[Message, Any]] = []
        for msg in outbox:
            if self.faults.drop is not None and self.faults.drop(msg):
                continue
            handle = self.handles.get(msg.recipient)
            if handle is None:
                self.errors.append((msg.recipient, "no actor for this recipient"))
                continue
            if self.faults.is_dead(msg.recipient, msg.round) and msg.recipient not in self.dead:
                ray.kill(handle, no_restart=True)  # with every owner the process hosts
                self.dead.update(self.hosted[handle])
            sending.append((msg, handle))
        # a broadcast's body (the epoch's g_l to every owner) is converted once, not per owner
        frames = encode_all([msg for msg, _ in sending])
        for (msg, handle), frame in zip(sending, frames, strict=True):
            self.frames_sent += 1
            self.bytes_sent += len(frame)
            by_actor.setdefault(handle, {}).setdefault(msg.recipient, []).append(frame)
        for handle, batches in by_actor.items():
            self.calls += 1
            ref = handle.handle.remote(batches)
            pending[asyncio.ensure_future(ref)] = handle

    def _receive(self, party: Any, frames: list[bytes], hosted: set[str]) -> list[Message]:
        """Hand ``frames`` from the actor hosting ``hosted`` to ``party``. A refused frame counts
        against its sender, or against every owner of the actor if it names none of them (the
        actor is one process: its owners fail together)."""
        out: list[Message] = []
        for frame in frames:
            if hosted <= self.counter.expelled:
                break  # every owner of this actor is expelled: its frames are not read
            senders = hosted
            try:
                msg = decode(frame, self.guard)
                if msg.sender not in hosted:
                    raise RemoteProtocolError(f"from: {msg.sender!r} is not hosted by its actor")
                senders = {msg.sender}
                if msg.sender in self.counter.expelled:
                    continue
                out.extend(party.receive(msg))
            except RemoteProtocolError as exc:
                out.extend(self.counter.fault(party, senders, str(exc)))
        return out


def gateways_reachable(handles: dict[str, Any]) -> Callable[[], Awaitable[set[str]]] | None:
    """For :class:`RayTransport`'s ``reachable``: the parties connected to the gateways behind
    the remote stand-ins among ``handles`` (a stand-in carries its ``gateway``:
    actors/remote/handles.py; an actor handle has none), or None without remote parties."""
    gateways: dict[int, Any] = {}
    for handle in handles.values():
        gateway = getattr(handle, "gateway", None) if hasattr(handle, "party") else None
        if gateway is not None:
            gateways[id(gateway)] = gateway
    if not gateways:
        return None

    async def reachable() -> set[str]:
        names: set[str] = set()
        for gateway in gateways.values():
            names |= set(await gateway.reachable.remote())
        return names

    return reachable

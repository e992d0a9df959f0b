"""Secure-sum rounds across Ray actors: the curator's actor hosts the Aggregator and relays.

Owners' actors host secure-sum Clients, compute-node actors host ComputeNodes. Every frame goes
through this hub: frames addressed to the aggregator are decoded and handed to it, all others
are forwarded as bytes to the node they name. Shares are sealed end to end (client to node), so
the relay learns nothing from them. The hub passes one clock to the aggregator and the nodes,
so the round's deadlines mean the same everywhere.

The owners are asked per owner process (:func:`ask_owners`): an actor hosting several owners
gets one call for all of them (``OwnerHost.for_owners``) at the set-up and the roster, and one
for up to :data:`OWNERS_PER_CALL` of them at every round; it answers owner by owner
(:class:`OwnerAnswers`). Each owner's frames are still made by its own client with its own keys
and charged by its own gate, so the nodes receive the same sealed frames as with one call per
owner; an owner failing inside a batch is absent alone. A round's shares go on to the nodes as
each call answers, so no process (owner host, hub or node) holds every owner's shares at once:
at K = 1024 a scan's shares are about 100 MB, a batch of 128 owners' about 13 MB.

Phases of a market run built on it (the ``[privacy]`` budgets of the config):
Every round is charged under the run's one neighbouring relation (the round plan's, set from
``CuratorParams.neighbouring`` in actors/run/phases.py ``prepare_secure``; replace-one by default,
the owners' counts being public): the spec carries it and every ledger records it.

- normalise: each owner sends its clipped per-feature sums, sums of squares and count; the
  released pool count, means and spreads go into the public report.json (actors/run/report.py) and,
  with ``standardize`` on, reach the owners as h1's center and scale in the summary's setup frame.
- scan: each owner sends its RACE sketch counters; the curator gets a DP sketch of the pool and
  scores how well the pool covers the validation set (mean KDE of the pool at validation points).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.securesum.aggregator import Aggregator
from dpmarket.protocol.securesum.node import owner_attestation
from dpmarket.protocol.securesum.spec import DcaConfig, RoundResult, RoundSpec
from dpmarket.protocol.summary.snr import moments_sensitivity  # one formula, also pre-run
from dpmarket.protocol.wire.codec import ReplayGuard, decode, encode, recipient
from dpmarket.protocol.wire.errors import RemoteProtocolError

__all__ = [
    "DcaHub",
    "DcaUnavailable",
    "OwnerAnswers",
    "ask_owners",
    "charge_at_floor",
    "error_line",
    "moments_sensitivity",
    "owner_answers",
    "result_from_record",
    "result_record",
]


class DcaUnavailable(RuntimeError):
    """A secure-sum session could not start (a compute node is unreachable, or failed its
    part of the set-up): nothing released. ``nodes``: the compute nodes missing."""

    def __init__(self, message: str, nodes: list[str]) -> None:
        super().__init__(message)
        self.nodes = nodes


@dataclass(frozen=True)
class OwnerAnswers:
    """An owner host's answer to a batched call (``OwnerHost.for_owners``), owner by owner:
    each owner's own result, or its own error line; one owner's failure leaves the others'."""

    results: dict[str, Any]
    errors: dict[str, str]


Calls = dict[asyncio.Future[Any], list[str]]  # a call in flight -> the owners it answers for

OWNERS_PER_CALL = 128
"""The most owners one round's batched call asks: a host with more gets several calls, each
reply (its owners' share frames) routed on and dropped as it comes."""


def _by_host(owners: dict[str, Any]) -> dict[Any, list[str]]:
    """Owners grouped by the handle that hosts them (co-located owners share one; handles and
    stand-ins hash by actor and by party), in the owners' order."""
    hosts: dict[Any, list[str]] = {}
    for owner, handle in owners.items():
        hosts.setdefault(handle, []).append(owner)
    return hosts


class DcaHub:
    """Runs DCA sessions and rounds over actor handles from inside an async actor."""

    def __init__(
        self,
        config: DcaConfig,
        nodes: dict[str, Any],
        owners: dict[str, Any],
        ledger: PrivacyLedger,
        clock: Callable[[], float] = time.monotonic,
        owners_per_call: int = OWNERS_PER_CALL,
    ) -> None:
        self.config, self.nodes, self.owners, self.clock = config, nodes, owners, clock
        self.owners_per_call = owners_per_call
        self.aggregator = Aggregator(config, ledger)
        self.guard = ReplayGuard()
        self.errors: list[str] = []
        self.failed: dict[str, str] = {}  # compute node -> its first failed call (route, attest)
        self.absent: dict[int, list[str]] = {}
        # owners whose set-up or roster failed: absent from every round of the session, so
        # counted against T before any round opens (actors/parties/securephase_journal.py)
        self.unready: dict[str, str] = {}

    async def route(self, frames: list[bytes]) -> None:
        """Deliver frames (and everything they cause) until nothing is left in flight."""
        pending = list(frames)
        while pending:
            by_recipient: dict[str, list[bytes]] = {}
            for frame in pending:
                try:
                    to = recipient(frame)  # the relay reads the envelope only
                except RemoteProtocolError as exc:
                    self.errors.append(str(exc))
                    continue
                by_recipient.setdefault(to, []).append(frame)
            pending = []
            for frame in by_recipient.pop(self.aggregator.name, []):
                try:
                    out = self.aggregator.receive(decode(frame, self.guard))
                except RemoteProtocolError as exc:
                    self.errors.append(str(exc))
                    continue
                pending.extend(encode(m) for m in out)
            names = [n for n in by_recipient if n in self.nodes]
            replies = await asyncio.gather(
                *(self.nodes[n].handle.remote(by_recipient[n]) for n in names),
                return_exceptions=True,
            )
            for name, reply in zip(names, replies, strict=True):
                if isinstance(reply, BaseException):
                    self.errors.append(f"{name}: {type(reply).__name__}")
                    self.failed.setdefault(name, f"frames refused ({error_line(reply)})")
                else:
                    pending.extend(reply)

    async def setup(self) -> None:
        """Session set-up: node keys to owners, owners' registrations to nodes, the nodes'
        roster attestations to owners. The DCA needs every compute node's partial sum, so a
        node that gives no key, refuses the relayed frames or gives no attestation stops the
        session before any round opens (:class:`DcaUnavailable`, naming it); an owner some
        node did not register is unready (absent from every round, counted against T)."""
        answers = await asyncio.gather(
            *(h.public_key.remote() for h in self.nodes.values()), return_exceptions=True
        )
        dead = [n for n, a in zip(self.nodes, answers, strict=True) if isinstance(a, BaseException)]
        if dead:
            raise DcaUnavailable(f"compute nodes unreachable: {dead}", dead)
        keys = dict(zip(self.nodes, answers, strict=True))
        frames, failed = await self.collect(self.ask("dca_setup", lambda o: (self.config, keys)))
        for owner, line in failed.items():
            self.unready[owner] = f"set-up failed ({line})"
        await self.route([f for owner in self.owners if owner in frames for f in frames[owner]])
        await self.attest()

    def _stop_if_nodes_failed(self) -> None:
        if self.failed:
            nodes = sorted(self.failed)
            why = "; ".join(f"{n}: {self.failed[n]}" for n in nodes)
            raise DcaUnavailable(f"compute nodes failed the set-up: {nodes} ({why})", nodes)

    async def attest(self) -> None:
        """Hand every owner its compute nodes' roster attestations (the owners registered
        with each node, MACed under the owner's pair key with that node: the relay passes them
        on, it cannot alter them); an owner that cannot verify one from each node it pinned
        takes part in no round if it needs them (a remote owner: actors/parties/dcaowner.py).
        An owner a node did not register (its registration refused there) is unready; a node
        with no attestation, or one that refused the relayed frames, stops the session."""
        answers = await asyncio.gather(
            *(h.attest.remote() for h in self.nodes.values()), return_exceptions=True
        )
        per_node = {n: a for n, a in zip(self.nodes, answers, strict=True) if isinstance(a, dict)}
        for name, answer in zip(self.nodes, answers, strict=True):
            if not isinstance(answer, dict):
                self.errors.append(f"{name}: no roster attestation ({type(answer).__name__})")
                why = error_line(answer) if isinstance(answer, BaseException) else "not a map"
                self.failed.setdefault(name, f"no roster attestation ({why})")
        self._stop_if_nodes_failed()
        parts = {
            o: {n: part for n, a in per_node.items() if (part := owner_attestation(a, o))}
            for o in self.owners
        }
        for owner, held in parts.items():
            refused = sorted(set(per_node) - set(held))
            if refused:  # some node holds no registration of it: it can take part in no round
                self.unready.setdefault(owner, f"registration refused by {refused}")
        _, failed = await self.collect(self.ask("dca_roster", lambda o: (parts[o],)))
        for owner in self.owners:
            if owner in failed:
                self.errors.append(f"{owner}: roster refused ({failed[owner].split(':')[0]})")
                self.unready.setdefault(owner, f"roster refused ({failed[owner]})")

    def ask(
        self, method: str, args: Callable[[str], tuple[Any, ...]], per_call: int | None = None
    ) -> Calls:
        """:func:`ask_owners` for every owner of the session, each call as a future."""
        asked = ask_owners(self.owners, method, args, per_call)
        return {asyncio.ensure_future(r): o for r, o in asked}

    async def collect(
        self, calls: Calls, timeout: float | None = None
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The owners' answers to :meth:`ask`'s calls: (owner -> result, owner -> error line).
        An owner whose host did not answer within ``timeout``, or whose host failed, is in the
        errors with every owner of that host; an owner that failed inside a batch is there alone
        (the batch's other owners keep their results)."""
        if not calls:
            return {}, {}
        done, _ = await asyncio.wait(calls, timeout=timeout)
        results: dict[str, Any] = {}
        failed: dict[str, str] = {}
        for call, owners in calls.items():
            if call not in done:
                failed.update({o: f"no answer within {timeout} s" for o in owners})
                continue
            got, lost = call_answers(call, owners)
            results.update(got)
            failed.update(lost)
        return results, failed

    async def relay_shares(self, calls: Calls, timeout: float | None) -> dict[str, str]:
        """Route each call's share frames to the nodes as soon as it answers (one call per
        node for them), until every call has answered or ``timeout`` seconds have passed.
        Returns the owners without shares, as :meth:`collect` does: a call not answered in
        time names each of its owners (one that answers later, while earlier frames are being
        routed, too); a failed or declined owner in a batch is there alone. Consumes
        ``calls``: a call routed is dropped from it, so its frames are freed once delivered."""
        failed: dict[str, str] = {}
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        answered = _answer_times(calls, loop)  # nothing else here holds a call until routed
        rank = {o: i for i, o in enumerate(self.owners)}
        while calls:
            if not any(c in answered and (end is None or answered[c] <= end) for c in calls):
                left = None if end is None else end - loop.time()
                if left is not None and left <= 0:
                    break
                await asyncio.wait(calls, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                continue  # its time is recorded before the wait returns (callback order)
            await self.route(_take_frames(calls, answered, end, rank, failed))
        for owners in calls.values():
            failed.update({o: f"no answer within {timeout} s" for o in owners})
        return failed

    async def round(
        self, spec: RoundSpec, what: str, options: dict[str, Any], timeout: float
    ) -> RoundResult:
        """One round: open, collect contributions (owners that fail are absent), wait."""
        deadline = self.clock() + timeout
        opened = [encode(m) for m in self.aggregator.open_round(spec, deadline)]
        refused = self.aggregator.result(spec.round)  # known colluders alone exceed T
        if refused is not None:
            self.absent[spec.round] = []
            return refused
        calls = self.ask("dca_contribute", lambda o: (spec, what, options), self.owners_per_call)
        await self.route(opened)  # while owners compute; nodes see the open before any share
        failed = await self.relay_shares(calls, timeout)
        self.absent[spec.round] = [o for o in self.owners if o in failed]
        while (result := self.aggregator.result(spec.round)) is None:
            now = self.clock()
            frames = [encode(m) for m in self.aggregator.expire(now)]
            ticks = await asyncio.gather(
                *(h.tick.remote(now) for h in self.nodes.values()), return_exceptions=True
            )
            frames += [f for t in ticks if not isinstance(t, BaseException) for f in t]
            await self.route(frames)
            if self.aggregator.result(spec.round) is None:
                await asyncio.sleep(0.05)
        return result


def ask_owners(
    owners: dict[str, Any],
    method: str,
    args: Callable[[str], tuple[Any, ...]],
    per_call: int | None = None,
) -> list[tuple[Any, list[str]]]:
    """Call ``method`` for every owner of ``owners`` (name -> handle), one call per owner
    host (per ``per_call`` of its owners, if given): a host with several owners (co-located
    in one actor) answers for them in ``for_owners`` calls, each owner's answer computed with
    its own keys, ledger and gate as if asked alone (actors/parties/owner.py); a host with one
    owner (a remote owner's stand-in, an owner alone in its actor) gets the per-owner call.
    ``args(owner)``: that owner's arguments after its name. Returns each call's reference with
    the owners it answers for (unpack its answer with :func:`owner_answers`)."""
    if per_call is not None and per_call < 1:
        raise ValueError(f"ask_owners: per_call must be at least 1, got {per_call!r}")
    calls = []
    for handle, names in _by_host(owners).items():
        if len(names) == 1:
            calls.append((getattr(handle, method).remote(names[0], *args(names[0])), names))
            continue
        step = per_call or len(names)
        for start in range(0, len(names), step):
            batch = names[start : start + step]
            calls.append((handle.for_owners.remote(method, {o: args(o) for o in batch}), batch))
    return calls


def call_answers(
    call: asyncio.Future[Any], owners: list[str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """:func:`owner_answers` of a finished call (cancelled: every owner of it absent)."""
    answer = asyncio.CancelledError() if call.cancelled() else call.exception()
    return owner_answers(owners, answer or call.result())


def _answer_times(
    calls: Calls, loop: asyncio.AbstractEventLoop
) -> dict[asyncio.Future[Any], float]:
    """When each call answered, by the loop's clock (filled in by a done-callback, which runs
    before any ``asyncio.wait`` on the call returns)."""
    answered: dict[asyncio.Future[Any], float] = {}
    for call in calls:
        call.add_done_callback(lambda c: answered.setdefault(c, loop.time()))
    return answered


def _take_frames(
    calls: Calls,
    answered: dict[asyncio.Future[Any], float],
    end: float | None,
    rank: dict[str, int],
    failed: dict[str, str],
) -> list[bytes]:
    """The frames of every call answered by ``end``, in roster order; those calls leave
    ``calls`` and ``answered``, so nothing holds them once their frames are routed. Their
    owners without shares go into ``failed``."""
    ready = [c for c in calls if c in answered and (end is None or answered[c] <= end)]
    frames: list[bytes] = []
    for call in sorted(ready, key=lambda c: rank.get(calls[c][0], 0)):
        owners = calls.pop(call)
        del answered[call]
        got, lost = call_answers(call, owners)
        failed.update(lost)
        frames += [f for o in owners if o in got for f in got[o]]
    return frames


def owner_answers(owners: list[str], answer: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """One call of :func:`ask_owners` answered (a result, an :class:`OwnerAnswers` or the
    exception the call raised), owner by owner: (owner -> result, owner -> error line)."""
    if isinstance(answer, BaseException):
        return {}, {o: error_line(answer) for o in owners}
    if isinstance(answer, OwnerAnswers):
        results = {o: answer.results[o] for o in owners if o in answer.results}
        return results, {o: answer.errors.get(o, "no answer") for o in owners if o not in results}
    return {owners[0]: answer}, {}


def error_line(exc: BaseException) -> str:
    """An exception's type and its first line (a Ray task error carries the remote traceback
    below it: never printed)."""
    cause = getattr(exc, "cause", None)
    exc = cause if isinstance(cause, BaseException) else exc
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def record_for_owners(
    ledgers: dict[str, PrivacyLedger], result: RoundResult, label: str, neighbouring: str
) -> None:
    """Charge a released round to every owner's ledger: one Gaussian event at the round's sigma
    and L2 sensitivity under ``neighbouring``, the relation of the round's spec (the plan's)."""
    if result.value is None or result.sigma_std <= 0:
        return
    for party, ledger in ledgers.items():
        if party != "validation":
            ledger.gaussian(
                result.sigma_std, result.sensitivity, label=label, neighbouring=neighbouring
            )


def coverage(release: npt.NDArray[np.float64], total: float) -> float:
    """Mean pool density at the validation points, per pooled record (KDE normalised)."""
    return float(np.mean(release) / max(total, 1.0))


def charge_at_floor(
    ledgers: dict[str, PrivacyLedger],
    sigma: float,
    sensitivity: float,
    label: str,
    neighbouring: str,
) -> None:
    """Charge a round whose release may have happened but was never journaled (a crash after
    it opened): one Gaussian event per owner at the plan's sigma floor for its label, under
    the plan's relation ``neighbouring``."""
    for party, ledger in ledgers.items():
        if party != "validation":
            ledger.gaussian(sigma, sensitivity, label=label, neighbouring=neighbouring)


def result_record(result: RoundResult) -> dict[str, Any]:
    """A round result as JSON-safe data (float64 values round-trip exactly through JSON)."""
    return {
        "round": result.round,
        "status": result.status,
        "reason": result.reason,
        "value": None if result.value is None else [float(v) for v in result.value],
        "included": list(result.included),
        "missing": list(result.missing),
        "sigma_std": result.sigma_std,
        "sensitivity": result.sensitivity,
    }


def result_from_record(d: dict[str, Any]) -> RoundResult:
    """The inverse of :func:`result_record` (``ring_total`` is not journaled: nothing after
    the release uses it)."""
    value = None if d["value"] is None else np.asarray(d["value"], dtype=np.float64)
    return RoundResult(
        int(d["round"]), str(d["status"]), str(d["reason"]), value, None,
        tuple(d["included"]), tuple(d["missing"]), float(d["sigma_std"]), float(d["sensitivity"]),
    )  # fmt: skip

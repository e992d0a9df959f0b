"""Secure sums per owner host (actors/parties/dca.py ``DcaHub.ask``, actors/parties/owner.py
``OwnerHost.for_owners``): an actor hosting several owners answers the set-up, the roster and
each round for all of them in one call.

Real ``OwnerHost`` objects, compute-node parties, the aggregator and the codec; only Ray is
replaced by handles whose calls are coroutines (as in test_refresh.py). The nodes pin every
owner's key, as the operator does. Noise is reproducible, so the same owners give the same
release whether they are asked per owner or per host.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import weakref
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dpmarket.actors.budgets.gate import BudgetGate, OwnerBudget
from dpmarket.actors.parties.compute import ComputeNodeHost
from dpmarket.actors.parties.dca import OWNERS_PER_CALL, DcaHub, ask_owners
from dpmarket.actors.parties.dcaowner import OperatorTrust, OwnerSecureSum
from dpmarket.actors.parties.owner import OwnerHost
from dpmarket.actors.randomness import NoiseSource
from dpmarket.protocol.privacy.ledger import ADD_REMOVE, PrivacyLedger
from dpmarket.protocol.securesum.messages import RegisterBody, SharesBody
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.securesum.sealing import generate_keypair, key_fingerprint
from dpmarket.protocol.securesum.spec import DcaConfig, RoundResult
from dpmarket.protocol.wire.codec import decode

pytestmark = pytest.mark.asyncio

OWNERS = ("owner-0", "owner-1", "owner-2", "owner-3", "owner-4")
NODES = ("compute-1", "compute-2", "compute-3")
DIM, RECORDS, BOUND = 2, 1000, 3.0
MOMENTS = {"bound": BOUND}
SKETCH = {"family": "l2", "rows": 4, "width": 8, "seed": 7, "bandwidth": 1.5}


class _Handle:
    """An actor's handle without Ray: ``METHOD.remote(*args)`` runs the object's method as a
    task; every call is counted by method (what crosses the actor boundary)."""

    def __init__(self, target: Any) -> None:
        self.target, self.calls = target, []

    def __getattr__(self, method: str) -> SimpleNamespace:
        if method.startswith("_"):
            raise AttributeError(method)
        return SimpleNamespace(remote=lambda *args: self._call(method, args))

    def _call(self, method: str, args: tuple[Any, ...]) -> asyncio.Future[Any]:
        self.calls.append(method)
        return asyncio.ensure_future(getattr(self.target, method)(*args))


class _Staggered(_Handle):
    """A host whose round batches answer one at a time, each only once every earlier batch's
    owners' shares have reached the nodes (``delivered``, the owners the nodes were handed
    shares from): a hub that routed nothing before every call answered would wait for ever."""

    def __init__(
        self, target: Any, delivered: Callable[[int], set[str]], progress: asyncio.Event
    ) -> None:
        super().__init__(target)
        self.delivered, self.progress, self.asked = delivered, progress, []
        self.answers: list[weakref.ref[Any]] = []  # every batch's answer, weakly
        self.held: list[int] = []  # at each answer: how many earlier answers were still held

    def _call(self, method: str, args: tuple[Any, ...]) -> asyncio.Future[Any]:
        if method != "for_owners" or args[0] != "dca_contribute":
            return super()._call(method, args)
        self.calls.append(method)
        spec = next(iter(args[1].values()))[0]  # the round's spec, the same for every owner
        earlier = [o for r, batch in self.asked if r == spec.round for o in batch]
        self.asked.append((spec.round, list(args[1])))

        async def in_turn() -> Any:
            while not set(earlier) <= self.delivered(spec.round):
                self.progress.clear()
                await self.progress.wait()
            gc.collect()
            self.held.append(sum(ref() is not None for ref in self.answers))
            answer = await self.target.for_owners(*args)
            self.answers.append(weakref.ref(answer))
            return answer

        return asyncio.ensure_future(in_turn())


class _Node(ComputeNodeHost):
    """A local compute node's actor class that keeps every frame it is handed (its whole view
    of the owners), and each call's frames apart."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[bytes] = []
        self.deliveries: list[list[bytes]] = []  # each call's frames
        self.progress = asyncio.Event()
        self.hold: asyncio.Event | None = None

    async def handle(self, frames: list[bytes]) -> list[bytes]:
        self.seen.extend(frames)
        self.deliveries.append(list(frames))
        self.progress.set()
        if self.hold is not None and any(isinstance(decode(f).body, SharesBody) for f in frames):
            await self.hold.wait()  # a slow delivery: the hub is routing until it is set
        return await super().handle(frames)

    def shares_from(self, round_: int) -> set[str]:
        """The owners whose share frames of round ``round_`` this node was handed."""
        out = (decode(f) for f in self.seen)
        return {
            m.sender.removeprefix("client:")
            for m in out
            if isinstance(m.body, SharesBody) and m.round == round_
        }


def _records(owner: str, dim: int = DIM) -> np.ndarray[Any, np.dtype[np.float64]]:
    index = OWNERS.index(owner)
    return np.random.default_rng(100 + index).uniform(0.0, BOUND, (RECORDS, dim))


class _Market:
    """The operator's session: node keys and plan first, owner hosts built with the trust
    anchors (grouped as ``hosts`` says), then nodes pinning every owner's key (``swap``: two
    owners' keys pinned under each other's names)."""

    def __init__(self, hosts: list[tuple[str, ...]], **options: Any) -> None:
        self.config = DcaConfig("run-dca", OWNERS, NODES, tolerance=1, bound=1e7, frac_bits=24)
        self.plan = SecureSumPlan.calibrated(
            self.config,
            1e-5,
            {
                "normalise": ("moments", 2 * DIM + 1, 1.0, 2 * BOUND, 1, MOMENTS),
                "scan": ("sketch", 32, 1.0, 2.0, 1, SKETCH),
            },
            neighbouring=ADD_REMOVE,
        )
        self.node_keys = {n: generate_keypair() for n in NODES}
        pins = {n: key_fingerprint(pub) for n, (_, pub) in self.node_keys.items()}
        trust = OperatorTrust(self.config, pins, self.plan)
        noise = NoiseSource.reproducible(7)
        dims = options.get("dims", {})
        self.handles: dict[str, _Handle] = {}
        self.progress = asyncio.Event()  # set by every node delivery (stagger)
        for group in hosts:
            data = {o: (_records(o, dims.get(o, DIM)), None) for o in group}
            host = OwnerHost("run", data, noise, dca=trust, budgets=options.get("budgets"))
            handle = (
                _Staggered(host, self.delivered, self.progress)
                if options.get("stagger")
                else _Handle(host)
            )  # one per host, as co-located owners share their actor's
            self.handles.update((o, handle) for o in group)
        self.swap: tuple[str, ...] = options.get("swap", ())
        self.early: bool = options.get("early", False)
        self.per_call: int = options.get("per_call", OWNERS_PER_CALL)

    async def start(self) -> DcaHub:
        """Pin the owners' keys at the nodes (the operator asks each owner directly) and set
        the session up through the hub."""
        keys = {o: await h.target.dca_identity(o) for o, h in self.handles.items()}
        if self.swap:
            a, b = self.swap
            keys[a], keys[b] = keys[b], keys[a]
        if self.early:  # spawned with the owners, before their keys: begun by the operator
            self.nodes = {
                n: _Node(self.config, n, private.private_bytes_raw(), await_session=True)
                for n, (private, _) in self.node_keys.items()
            }
            for node in self.nodes.values():
                assert await node.begin(keys, self.plan) == {"ready": True}
        else:
            self.nodes = {
                n: _Node(self.config, n, private.private_bytes_raw(), keys, self.plan)
                for n, (private, _) in self.node_keys.items()
            }
        for node in self.nodes.values():
            node.progress = self.progress
        self.node_handles = {n: _Handle(node) for n, node in self.nodes.items()}
        ticks = itertools.count(0.0, 5.0)  # simulated time: a round with an absent owner
        # closes at its deadline after a few of the hub's polls, not a minute later
        self.hub = DcaHub(
            self.config, self.node_handles, dict(self.handles), PrivacyLedger("dca"),
            ticks.__next__, owners_per_call=self.per_call,
        )  # fmt: skip
        await self.hub.setup()
        return self.hub

    async def normalise(self) -> RoundResult:
        await self.start()
        spec = self.plan.spec("normalise", 1)
        return await self.hub.round(spec, "moments", MOMENTS, timeout=60.0)

    async def scan(self) -> RoundResult:
        """The second round: every owner's RACE sketch counters (counted from the columns
        each owner kept as its records arrived, streams/race/columns.py)."""
        return await self.hub.round(self.plan.spec("scan", 2), "sketch", SKETCH, timeout=60.0)

    def delivered(self, round_: int) -> set[str]:
        """The owners whose shares of round ``round_`` some node has been handed."""
        return set().union(*(n.shares_from(round_) for n in self.nodes.values()))

    def calls(self, method: str) -> int:
        unique = {id(h): h for h in self.handles.values()}
        return sum(h.calls.count(method) for h in unique.values())

    def client_frames(self) -> list[Any]:
        """Every frame an owner sent to a node, decoded (the nodes' view of the owners)."""
        frames = [decode(f) for node in self.nodes.values() for f in node.seen]
        return [m for m in frames if m.sender.startswith("client:")]


def _truth(owners: tuple[str, ...]) -> np.ndarray[Any, np.dtype[np.float64]]:
    rows = [_records(o) for o in owners]
    X = np.vstack(rows)
    return np.concatenate([X.sum(axis=0), (X**2).sum(axis=0), [float(len(X))]])


def _view(market: _Market) -> list[tuple[Any, ...]]:
    """What the nodes received from the owners, without the key-dependent bytes: who sent it,
    to whom, its kind, which roster clients it carries and the shapes of its sealed arrays."""
    out = []
    for m in market.client_frames():
        body = m.body
        if isinstance(body, RegisterBody):
            rows = (tuple(np.asarray(body.clients).tolist()), np.asarray(body.public_keys).shape)
        else:
            assert isinstance(body, SharesBody)
            rows = (
                tuple(np.asarray(body.value_clients).tolist()),
                np.asarray(body.value_frames).shape,
                tuple(np.asarray(body.seed_clients).tolist()),
                np.asarray(body.seed_frames).shape,
            )
        out.append((m.sender, m.recipient, type(body).__name__, rows))
    return sorted(out)


async def test_a_batch_releases_what_owners_asked_one_by_one_release() -> None:
    """Three owners in one host and two alone: the host gets one call per step (set-up,
    roster, each round), and both releases (moments, sketch counters) equal, bit for bit, those
    of the same owners each asked alone (each owner's share is its own, sealed with its own
    keys: the masks cancel exactly)."""
    batched = _Market([OWNERS[:3], OWNERS[3:4], OWNERS[4:]])
    alone = _Market([(o,) for o in OWNERS])
    got, want = await batched.normalise(), await alone.normalise()
    assert got.released and want.released and got.value is not None and want.value is not None
    assert set(got.included) == set(OWNERS) and batched.hub.absent[1] == []
    np.testing.assert_array_equal(got.value, want.value)
    assert abs(got.value[-1] - _truth(OWNERS)[-1]) < 6 * got.sigma_std  # the count, within noise
    got, want = await batched.scan(), await alone.scan()
    assert got.released and got.value is not None and want.value is not None
    np.testing.assert_array_equal(got.value, want.value)  # the sketches' counters too
    big = batched.handles["owner-0"]
    assert big.calls == ["for_owners"] * 4  # set-up, roster, two rounds: one call each
    assert batched.calls("dca_contribute") == 2 * 2  # the two owners alone: per owner
    assert alone.calls("dca_contribute") == 2 * len(OWNERS) and alone.calls("for_owners") == 0
    assert batched.hub.errors == [] and batched.hub.unready == {}


async def test_a_host_of_more_owners_than_a_call_takes_is_asked_in_batches() -> None:
    """Five owners in one host, at most two per round's call: the host gets one call at the
    set-up and the roster, three per round (owners 0-1, 2-3, 4), each answered owner by owner.
    Each call's shares go on to the nodes as it answers: the host answers a batch only once
    the earlier batches' shares have reached the nodes (a hub that held every share until all
    calls answered would wait until the round's deadline, the later owners absent), by then
    the hub holds none of the earlier answers, and no node is handed two batches' shares at
    once. Both releases equal, bit for bit, those of
    one call for the five."""
    small = _Market([OWNERS], per_call=2, stagger=True)
    whole = _Market([OWNERS])
    got, want = await small.normalise(), await whole.normalise()
    assert got.released and got.value is not None and want.value is not None
    np.testing.assert_array_equal(got.value, want.value)
    got, want = await small.scan(), await whole.scan()
    assert got.released and got.value is not None and want.value is not None
    np.testing.assert_array_equal(got.value, want.value)
    assert small.calls("for_owners") == 2 + 3 * 2  # set-up, roster; two rounds: three each
    assert whole.calls("for_owners") == 4
    assert small.hub.absent == {1: [], 2: []} and small.hub.errors == []
    host = small.handles["owner-0"]
    assert isinstance(host, _Staggered)
    batches = [["owner-0", "owner-1"], ["owner-2", "owner-3"], ["owner-4"]]
    assert host.asked == [(r, b) for r in (1, 2) for b in batches]
    assert host.held == [0] * 6  # a batch's answer is dropped once its shares are delivered
    for node in small.nodes.values():
        for frames in node.deliveries:
            senders = {
                m.sender.removeprefix("client:")
                for m in map(decode, frames)
                if isinstance(m.body, SharesBody)
            }
            assert any(senders <= set(b) for b in batches), senders
    with pytest.raises(ValueError, match="per_call must be at least 1"):
        ask_owners(dict(small.handles), "dca_identity", lambda o: (), per_call=0)


class _Late(_Handle):
    """A host whose round batch holding ``owner`` answers only once ``late`` is set."""

    def __init__(self, target: Any, owner: str, late: asyncio.Event) -> None:
        super().__init__(target)
        self.owner, self.late = owner, late

    def _call(self, method: str, args: tuple[Any, ...]) -> asyncio.Future[Any]:
        if method != "for_owners" or args[0] != "dca_contribute" or self.owner not in args[1]:
            return super()._call(method, args)
        self.calls.append(method)

        async def late() -> Any:
            await self.late.wait()
            return await self.target.for_owners(*args)

        return asyncio.ensure_future(late())


async def test_a_batch_answering_after_the_deadline_while_shares_are_routed_is_absent() -> None:
    """The round's deadline is the hub's: a batch whose answer comes after it is absent, even
    when it comes while the hub is still routing an earlier batch's shares (the nodes being
    slow), as when it never answered; the batch that answered in time is not absent."""
    market = _Market([OWNERS], per_call=3)
    await market.start()
    host = market.handles["owner-0"]
    late, released = asyncio.Event(), asyncio.Event()
    staggered = _Late(host.target, "owner-3", late)
    market.hub.owners = dict.fromkeys(OWNERS, staggered)
    for node in market.nodes.values():
        node.hold = released
    loop = asyncio.get_running_loop()
    timeout = 2.0  # the owners in time answer within milliseconds (in process)
    loop.call_later(timeout + 0.5, late.set)  # after the deadline, while the hub routes
    loop.call_later(timeout + 1.0, released.set)
    result = await market.hub.round(market.plan.spec("normalise", 1), "moments", MOMENTS, timeout)
    assert market.hub.absent[1] == ["owner-3", "owner-4"]
    assert result.status == "insufficient" and {"owner-3", "owner-4"} <= set(result.missing)


async def test_the_nodes_see_the_same_sealed_frames_per_owner_as_without_batches() -> None:
    """Adversary view of a compute node: with batches it receives exactly the messages it
    received before, the same registrations and share frames per owner, each from that
    owner's client and carrying that owner's roster index alone: the host combines nothing,
    and every share reaches the node sealed, as its owner made it."""
    batched = _Market([OWNERS[:4], OWNERS[4:]])
    alone = _Market([(o,) for o in OWNERS])
    await batched.normalise()
    await alone.normalise()
    view = _view(batched)
    assert view == _view(alone)
    assert {kind for _, _, kind, _ in view} == {"RegisterBody", "SharesBody"}
    index = batched.config.index
    for m in batched.client_frames():
        owner = m.sender.removeprefix("client:")
        body = m.body
        clients = body.clients if isinstance(body, RegisterBody) else body.value_clients
        seeds = [] if isinstance(body, RegisterBody) else np.asarray(body.seed_clients).tolist()
        assert set(np.asarray(clients).tolist()) | set(seeds) == {index[owner]}


async def test_each_owner_registers_its_own_key_inside_a_batch() -> None:
    """The nodes pin every owner's key; a batch's registrations each carry the key of the
    owner that sent it and are admitted, so no owner's key served another. With owner-0's and
    owner-1's keys pinned under each other's names, the nodes refuse exactly those two."""
    market = _Market([OWNERS])
    await market.start()
    host = market.handles["owner-0"].target
    registrations = [m for m in market.client_frames() if isinstance(m.body, RegisterBody)]
    assert len(registrations) == len(OWNERS) * len(NODES)
    for m in registrations:
        owner = m.sender.removeprefix("client:")
        assert np.asarray(m.body.public_keys).tobytes() == await host.dca_identity(owner)
    for node in market.nodes.values():
        assert set((await node.attest())["admitted"]) == set(OWNERS)
    assert market.hub.unready == {}

    crossed = _Market([OWNERS], swap=("owner-0", "owner-1"))
    await crossed.start()
    for node in crossed.nodes.values():
        assert set((await node.attest())["admitted"]) == set(OWNERS[2:])
        assert len(node.errors) == 2  # the two refused registrations, nothing else
    assert set(crossed.hub.unready) == {"owner-0", "owner-1"}  # their rosters do not verify


async def test_a_failing_and_a_declining_owner_in_a_batch_answer_alone(tmp_path: Any) -> None:
    """In one host of five owners, owner-1's records have another feature count (its
    contribution fails) and owner-3's cap cannot pay the round (its gate declines): each is
    reported by name with its own reason, and the other three owners' shares come back."""
    store = str(tmp_path / "owner-3.sqlite")
    budgets = {"owner-3": BudgetGate(OwnerBudget(store, 0.01, 1e-6), "run")}
    market = _Market([OWNERS], dims={"owner-1": DIM + 1}, budgets=budgets)
    hub = await market.start()
    spec = market.plan.spec("normalise", 1)
    shares, failed = await hub.collect(
        hub.ask("dca_contribute", lambda o: (spec, "moments", MOMENTS))
    )
    assert market.calls("for_owners") == 3  # set-up, roster, this round: one call each
    assert set(failed) == {"owner-1", "owner-3"}
    assert failed["owner-3"].startswith("BudgetDeclined")
    assert failed["owner-1"].startswith("ValueError")
    assert set(shares) == {"owner-0", "owner-2", "owner-4"} and all(shares.values())
    view = await market.handles["owner-3"].target.budget_view("owner-3")
    assert view is not None and view["declines"], view  # its own store recorded the decline


async def test_a_round_counts_the_batch_owners_that_answered() -> None:
    """The round itself: the failing owner is absent and missing, the other four included,
    and their sum released (the count within noise of theirs alone, not of all five)."""
    market = _Market([OWNERS], dims={"owner-1": DIM + 1})
    result = await market.normalise()
    assert result.released and result.value is not None
    assert market.hub.absent[1] == ["owner-1"]
    assert set(result.included) == set(OWNERS) - {"owner-1"}
    truth = _truth(tuple(o for o in OWNERS if o != "owner-1"))
    assert abs(result.value[-1] - truth[-1]) < 6 * result.sigma_std
    assert abs(result.value[-1] - truth[-1] - RECORDS) > 6 * result.sigma_std


async def test_a_host_batches_only_the_secure_sum_calls() -> None:
    market = _Market([OWNERS[:2]])
    host = market.handles["owner-0"].target
    with pytest.raises(ValueError, match="for_owners: 'add_records' is not one of"):
        await host.for_owners("add_records", {"owner-0": (np.zeros((1, DIM)),)})
    answer = await host.for_owners("dca_roster", {"owner-9": ({},), "owner-0": ({},)})
    assert set(answer.errors) == {"owner-9", "owner-0"} and answer.results == {}
    assert "not hosted here" in answer.errors["owner-9"]
    assert "before dca_setup" in answer.errors["owner-0"]


async def test_a_node_spawned_before_the_owners_keys_takes_part_only_once_begun() -> None:
    """A local node spawned with the owners (actors/run/phases.py ``spawn_local_nodes``) holds
    the operator's key (the pinned one) but no session: it handles no frame, tick or
    attestation before the operator's ``begin``; begun, its session releases bit for bit what
    a node built with the keys releases."""
    config = _Market([OWNERS]).config
    private, public = generate_keypair()
    waiting = ComputeNodeHost(config, "compute-1", private.private_bytes_raw(), await_session=True)
    assert await waiting.public_key() == public  # what the owners pinned, before any session
    for call in (waiting.handle([b"x"]), waiting.tick(0.0), waiting.attest()):
        with pytest.raises(RuntimeError, match="compute-1: no secure-sum session has begun"):
            await call
    assert await waiting.status() == {"registered": 0, "errors": []}
    with pytest.raises(ValueError, match="compute-2: a node awaiting its session needs"):
        ComputeNodeHost(config, "compute-2", await_session=True)
    early, built = _Market([OWNERS[:3], OWNERS[3:]], early=True), _Market([OWNERS[:3], OWNERS[3:]])
    got, want = await early.normalise(), await built.normalise()
    assert got.released and got.value is not None and want.value is not None
    np.testing.assert_array_equal(got.value, want.value)


async def test_whoever_holds_a_begun_nodes_handle_cannot_swap_an_owners_key() -> None:
    """Adversary view of the curator, which relays through the nodes' handles once the
    operator has begun them: it calls ``begin`` again with a key of its own under owner-0's
    name (to register as owner-0 and read its share). Refused; the node still pins owner-0's
    own key: the session stands and owner-0 is released with its own share."""
    market = _Market([OWNERS], early=True)
    await market.start()
    _, mine = generate_keypair()
    keys = {o: await market.handles[o].target.dca_identity(o) for o in OWNERS}
    for node in market.nodes.values():
        with pytest.raises(RuntimeError, match="holds its session's owners' keys already"):
            await node.begin(keys | {"owner-0": mine}, market.plan)
    assert market.hub.unready == {}
    result = await market.hub.round(market.plan.spec("normalise", 1), "moments", MOMENTS, 60.0)
    assert result.released and "owner-0" in result.included


async def _arrive(market: _Market) -> None:
    """A hundred more records per owner after the hosts were built (the host's ingestion)."""
    for owner, handle in market.handles.items():
        await handle.target.add_records(owner, _records(owner)[:100] + 0.5)


async def test_records_are_hashed_as_they_arrive_and_the_scan_counts_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each owner hashes its records for the plan's sketch when they arrive (at the host's
    construction and at every later batch), before any round; the scan then counts them and
    releases, bit for bit, what owners that hash every record inside the round release."""
    ahead = _Market([OWNERS[:3], OWNERS[3:]])
    await _arrive(ahead)
    for owner, handle in ahead.handles.items():
        held = list(handle.target._hosted[owner].dca.columns.values())
        assert [c.n for c in held] == [RECORDS + 100]  # one sketch in the plan, all hashed
    await ahead.normalise()
    got = await ahead.scan()
    monkeypatch.setattr(OwnerSecureSum, "sketch_ahead", lambda self, new, start: None)
    monkeypatch.setattr(OwnerSecureSum, "sketch_columns", lambda self, records, options: None)
    inside = _Market([OWNERS[:3], OWNERS[3:]])  # hashes every record in the round, as before
    await _arrive(inside)
    await inside.normalise()
    want = await inside.scan()
    assert got.released and got.value is not None and want.value is not None
    np.testing.assert_array_equal(got.value, want.value)
    assert all(h.target._hosted[o].dca.columns == {} for o, h in inside.handles.items())


async def test_a_record_the_hash_refuses_is_taken_in_and_only_its_owners_scan_fails() -> None:
    """A record beyond the hash's range is still taken in (hashing ahead never stops an
    owner's ingestion); its owner's scan contribution is refused as it was before records were
    hashed ahead, so that owner alone is absent from the scan."""
    market = _Market([OWNERS])
    host = market.handles["owner-0"].target
    assert await host.add_records("owner-0", np.full((1, DIM), 1e16)) == RECORDS + 1
    assert await market.normalise() is not None
    result = await market.scan()
    assert result.released and market.hub.absent[2] == ["owner-0"]
    assert set(result.included) == set(OWNERS) - {"owner-0"}

"""A curator refusal stops a refresh round in flight (actors/parties/refresh.py,
actors/parties/transport.py).

The refresh round runs through the real DcaHub, compute-node parties, clients and codec; only
Ray is replaced by fake handles whose calls are coroutines (as in test_transport.py). The
owners' contributions wait on a gate the test opens, so the refusal provably comes while the
round is open at the nodes and the aggregator, and the round would otherwise release.

The same round also shows the refresh journal: a crash between the release and its journal
write leaves the round ``opened``, and a restore charges it exactly once.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dpmarket.actors.parties.dca import DcaHub
from dpmarket.actors.parties.refresh import REFRESH_LABEL, PoolRefresher, finish_refresh
from dpmarket.actors.parties.securephase_journal import charge_lost_refreshes
from dpmarket.actors.parties.transport import RayTransport
from dpmarket.protocol.privacy.ledger import ADD_REMOVE, PrivacyLedger
from dpmarket.protocol.securesum.client import Client
from dpmarket.protocol.securesum.node import ComputeNode
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.securesum.spec import DcaConfig, RoundResult
from dpmarket.protocol.wire.codec import ReplayGuard, decode, encode
from tests.actors.test_transport import _market, _params
from tests.small import small_scenario

pytestmark = pytest.mark.asyncio

OWNERS = ("owner-0", "owner-1", "owner-2")
NODES = ("compute-1", "compute-2")
D = 4


def _remote(fn: Any) -> SimpleNamespace:
    return SimpleNamespace(remote=lambda *a: asyncio.ensure_future(fn(*a)))


class _Node:
    """A compute-node handle: decode, call the party, encode (as actors/parties/compute.py)."""

    def __init__(self, config: DcaConfig, name: str) -> None:
        self.node, self.guard = ComputeNode(config, name), ReplayGuard()
        self.public_key = _remote(self._public_key)
        self.handle = _remote(self._handle)
        self.tick = _remote(self._tick)
        self.attest = _remote(self._attest)

    async def _attest(self) -> dict[str, Any]:
        return self.node.attest(True)

    async def _public_key(self) -> bytes:
        return bytes(self.node.public_key)

    async def _handle(self, frames: list[bytes]) -> list[bytes]:
        return [encode(m) for f in frames for m in self.node.receive(decode(f, self.guard))]

    async def _tick(self, now: float) -> list[bytes]:
        return [encode(m) for m in self.node.expire(now)]


class _Owner:
    """An owner handle whose contribution waits for ``gate`` (and says it was asked)."""

    def __init__(self, gate: asyncio.Event, asked: list[str]) -> None:
        self.client: Client | None = None
        self.gate, self.asked = gate, asked
        self.dca_setup = _remote(self._setup)
        self.dca_contribute = _remote(self._contribute)
        self.dca_roster = _remote(self._roster)
        self.roster: dict[str, tuple[bool, tuple[str, ...]]] = {}

    async def _roster(self, owner: str, attestations: dict[str, Any]) -> int:
        assert self.client is not None
        for node, attestation in attestations.items():
            self.roster[node] = self.client.attested(owner, node, attestation)
        return min(len(names) for _, names in self.roster.values())

    async def _setup(self, owner: str, config: DcaConfig, keys: dict[str, bytes]) -> list[bytes]:
        self.client = Client(config, f"client:{owner}", keys, (owner,))
        return [encode(m) for m in self.client.start()]

    async def _contribute(self, owner: str, spec: Any, what: str, opts: Any) -> list[bytes]:
        self.asked.append(owner)
        await self.gate.wait()
        assert self.client is not None
        rng = np.random.default_rng(len(self.asked))
        return [encode(m) for m in self.client.contribute(spec, np.ones((1, D)), rng)]


InFlight = tuple[PoolRefresher, dict[str, PrivacyLedger], asyncio.Event, asyncio.Task[bool]]


async def _refresh_in_flight(
    record: dict[str, Any] | None = None,
    journal: Callable[[dict[str, PrivacyLedger]], None] = lambda ledgers: None,
) -> InFlight:
    config = DcaConfig("run-dca", OWNERS, NODES, tolerance=0, bound=10.0, frac_bits=24)
    plan = SecureSumPlan.calibrated(
        config, 1e-5, {"refresh": ("sketch_delta", D, 1.0, 1.0, 3, {})}, neighbouring=ADD_REMOVE
    )
    gate, asked = asyncio.Event(), []
    owners = {o: _Owner(gate, asked) for o in OWNERS}
    hub = DcaHub(config, {n: _Node(config, n) for n in NODES}, owners, PrivacyLedger("dca"))
    await hub.setup()
    # set-up hands every owner each node's roster attestation, which its client verifies (these
    # nodes pin no owner's key, so they attest the roster as not checked)
    assert all(o.roster == {n: (False, OWNERS) for n in NODES} for o in owners.values())
    assert hub.errors == []
    scan = RoundResult(2, "failed", "", None, None, (), OWNERS, 1.0, 1.0)
    release = SimpleNamespace(estimated_size=lambda: 3.0, statement=SimpleNamespace(releases=1))
    ledgers = {o: PrivacyLedger(o) for o in OWNERS}
    refresher = PoolRefresher(
        hub,
        {"rounds": plan, "timeout": 600.0, "refresh_every": 1},
        None,
        scan,
        lambda result: release,  # type: ignore[arg-type,return-value]
        lambda pool, total: 0.5,
        record=record,
        journal=lambda: journal(ledgers),
    )
    task = asyncio.ensure_future(refresher.refresh(1, ledgers))
    while len(asked) < len(OWNERS):  # the round is open and every owner was asked
        await asyncio.sleep(0)
    return refresher, ledgers, gate, task


async def _finish(state: str) -> tuple[PoolRefresher, dict[str, PrivacyLedger]]:
    refresher, ledgers, gate, task = await _refresh_in_flight()
    curator = SimpleNamespace(state=state, reason="2 owners lost > T = 1")
    end = asyncio.ensure_future(finish_refresh(task, refresher, curator))  # type: ignore[arg-type]
    await asyncio.sleep(0)  # the run's end begins (and, after a refusal, cancels) first
    gate.set()  # then the owners' shares arrive: enough for a release
    await asyncio.wait_for(end, timeout=60)
    return refresher, ledgers


async def test_the_round_in_flight_releases_when_the_run_completes() -> None:
    """The control: the same round, at the end of a completed run, releases and charges."""
    refresher, ledgers = await _finish("done")
    assert refresher.history[-1]["status"] == "released"
    assert all(ledger.events for ledger in ledgers.values())


async def test_a_refused_run_cancels_the_refresh_in_flight_before_it_releases() -> None:
    refresher, ledgers = await _finish("refused")
    last = refresher.history[-1]
    assert last["status"] == "cancelled" and "refused" in last["reason"]
    assert not any(ledger.events for ledger in ledgers.values())  # nothing released or charged


async def test_a_dead_owner_actor_that_refuses_the_run_reaches_on_step() -> None:
    """RayTransport used to skip ``on_step`` after losing a dead actor's owners, so when that
    loss refused the run the curator never saw the refusal before the drive ended (and its
    cancel of a refresh in flight did not run)."""
    scenario = small_scenario(31, n_points=600)
    curator, handles = _market(scenario, _params(scenario, max_lost=0), 2)
    handles[scenario.owner_names[0]].dead = True
    seen: list[str] = []
    transport = RayTransport(handles)
    done = lambda: curator.state in ("done", "refused")  # noqa: E731
    await asyncio.wait_for(
        transport.drive(curator, curator.start(), done, lambda: seen.append(curator.state)),
        timeout=60,
    )
    assert curator.state == "refused" and seen[-1] == "refused"


class _Crash(Exception):
    """The curator process dies here (in the test: the refresh task ends)."""


async def test_a_refresh_released_but_never_journaled_is_charged_once_on_restore() -> None:
    """The crash comes after the round released and before its ``released`` journal write: the
    last snapshot holds the round ``opened`` and no charge. A restore charges every owner once,
    at the round's sigma floor, and a second restore of the journal it then writes charges
    nothing more; the round is never run again (its number is not reused)."""
    record: dict[str, Any] = {}
    snapshots: list[tuple[dict[str, Any], dict[str, PrivacyLedger]]] = []

    def journal(ledgers: dict[str, PrivacyLedger]) -> None:
        if record["refreshes"][-1]["state"] == "released":
            raise _Crash("before the released journal write")
        snapshots.append(copy.deepcopy((record, ledgers)))

    refresher, ledgers, gate, task = await _refresh_in_flight(record, journal)
    gate.set()
    with pytest.raises(_Crash):
        await asyncio.wait_for(task, timeout=60)
    assert all(ledger.events for ledger in ledgers.values())  # it released (in the dead process)
    assert not refresher.history  # and the pool sketch never used it
    saved, saved_ledgers = snapshots[-1]
    (opened,) = saved["refreshes"]
    assert opened["state"] == "opened" and not any(lg.events for lg in saved_ledgers.values())

    assert charge_lost_refreshes(saved, saved_ledgers) == 1  # the restore
    spec = refresher.plan["rounds"].spec("refresh", opened["round"])
    for ledger in saved_ledgers.values():
        (event,) = ledger.events
        assert event.label == REFRESH_LABEL
        assert event.count == 1 and event.param("sigma") == spec.sigma_std
        assert event.sensitivity == spec.sensitivity
    again = copy.deepcopy((saved, saved_ledgers))
    assert charge_lost_refreshes(*again) == 0  # a second restore: nothing charged twice
    assert all(len(lg.events) == 1 for lg in again[1].values())
    restored = PoolRefresher(
        refresher.hub, refresher.plan, None,
        RoundResult(2, "failed", "", None, None, (), OWNERS, 1.0, 1.0),
        refresher._release_of, refresher._coverage_of, record=saved,
    )  # fmt: skip
    assert restored.next_round == opened["round"] + 1

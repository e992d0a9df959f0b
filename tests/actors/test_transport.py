"""RayTransport's asyncio loop without Ray: fake actor handles whose calls are coroutines.

The same frames, grouping and fault handling run as under Ray (``ray.exceptions`` is importable
without a running Ray); what Ray adds (processes, object refs) is covered by tests/integration.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import ray.exceptions

from dpmarket.actors.harness.inprocess import run_inprocess
from dpmarket.actors.parties.owner import handle_frames
from dpmarket.actors.parties.transport import RayTransport
from dpmarket.protocol.summary.curator import Curator, CuratorParams
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.wire.codec import ReplayGuard
from dpmarket.streams.synthetic import Scenario
from tests.small import small_params, small_scenario

pytestmark = pytest.mark.asyncio


class _Method:
    def __init__(self, actor: _FakeActor) -> None:
        self.actor = actor

    def remote(self, batches: dict[str, list[bytes]]) -> Any:
        return self.actor.call(batches)


class _FakeActor:
    """Hosts owners like OwnerActor; ``dead`` makes every call raise RayActorError; ``slow``
    holds every reply until set (OwnerActor's ``faults.delay``, without a clock)."""

    def __init__(self, owners: list[Owner]) -> None:
        self.owners = {o.name: (o, ReplayGuard()) for o in owners}
        self.handle = _Method(self)
        self.calls = 0
        self.dead = False
        self.slow: asyncio.Event | None = None

    async def call(self, batches: dict[str, list[bytes]]) -> list[bytes]:
        self.calls += 1
        await asyncio.sleep(0)
        if self.slow is not None:
            await self.slow.wait()
        if self.dead:
            raise ray.exceptions.RayActorError()
        out: list[bytes] = []
        for name, frames in batches.items():
            party, guard = self.owners[name]
            replies, errors = handle_frames(party, guard, frames)
            assert not errors
            out.extend(replies)
        return out


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return small_scenario(31, n_points=600)


def _params(scenario: Scenario, **kw: object) -> CuratorParams:
    return small_params(scenario, **({"p": 6, "h1_seed": 4, "phase_timeout": 1.0} | kw))


def _market(
    scenario: Scenario, params: CuratorParams, per_actor: int
) -> tuple[Curator, dict[str, _FakeActor]]:
    owners = [
        Owner(n, "async", X, y)
        for n, (X, y) in zip(scenario.owner_names, scenario.owners, strict=True)
    ]
    curator = Curator(
        "async",
        list(scenario.owner_names),
        scenario.validation,
        scenario.seed_set,
        params,
        np.random.default_rng(9),
    )
    handles: dict[str, _FakeActor] = {}
    for i in range(0, len(owners), per_actor):
        actor = _FakeActor(owners[i : i + per_actor])
        handles.update(dict.fromkeys(actor.owners, actor))
    return curator, handles


@pytest.mark.parametrize("per_actor", [1, 2, 4])
async def test_grouped_calls_give_the_loopback_summary(scenario: Scenario, per_actor: int) -> None:
    params = _params(scenario)
    loop = run_inprocess(scenario, params, np.random.default_rng(9), run_id="async").result
    curator, handles = _market(scenario, params, per_actor)
    transport = RayTransport(handles)
    await transport.drive(curator, curator.start(), lambda: curator.done)
    res = curator.result()
    assert [(p.owner, p.token) for p in res.provenance] == [
        (p.owner, p.token) for p in loop.provenance
    ]
    actors = {id(a): a for a in handles.values()}.values()
    assert transport.calls == sum(a.calls for a in actors)
    # one call per actor per phase: at most (actors) calls per phase, two phases per epoch
    assert transport.calls <= len(actors) * 2 * (res.epochs + 2)


async def test_a_dead_actor_loses_every_owner_it_hosts_at_once(scenario: Scenario) -> None:
    params = _params(scenario, max_lost=2)
    curator, handles = _market(scenario, params, 2)
    victim = handles[scenario.owner_names[0]]
    victim.dead = True
    transport = RayTransport(handles)
    await asyncio.wait_for(
        transport.drive(curator, curator.start(), lambda: curator.done), timeout=60
    )
    res = curator.result()
    hosted = set(victim.owners)
    assert transport.dead == hosted and set(curator.lost) == hosted
    assert res.reason == "complete" and all(p.owner not in hosted for p in res.provenance)


async def test_an_owner_that_answers_after_the_deadline_is_lost_and_the_run_completes(
    scenario: Scenario,
) -> None:
    """Moved here from tests/integration/test_ray_summary.py (issue 37): an owner actor whose
    replies are held past the phase deadline is lost once; the run completes without it and
    buys nothing from it. The deadline is the test's (0.2 s); the reply never comes before it:
    it is held on an event, released only after the run."""
    params = _params(scenario, phase_timeout=0.2, max_lost=1)
    curator, handles = _market(scenario, params, 1)
    slow = scenario.owner_names[1]
    held = handles[slow].slow = asyncio.Event()
    transport = RayTransport(handles)
    await asyncio.wait_for(
        transport.drive(curator, curator.start(), lambda: curator.done), timeout=60
    )
    held.set()
    res = curator.result()
    assert res.reason == "complete" and slow in curator.lost
    assert all(p.owner != slow for p in res.provenance)

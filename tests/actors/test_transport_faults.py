"""A hostile owner cannot crash the market (issue 14, item 2): every frame it sends that a party
cannot use is refused and counted against it; past MAX_FAULTS it is expelled (lost, counted
against T) and the run completes with the other owners."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from dpmarket.actors.parties.faults import FaultPlan
from dpmarket.actors.parties.transport import MAX_FAULTS, LoopbackTransport
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.wire.codec import Message, encode
from tests.small import small_curator, small_params, small_scenario

RUN = "hostile"


class HostileOwner:
    """An honest owner that sends a spoiled copy of every bid and delivery before the real one:
    a token of -1 in bids, a coordinate of 1e39 in delivered points."""

    def __init__(self, owner: Owner) -> None:
        self.owner, self.name = owner, owner.name
        self.transport: LoopbackTransport | None = None
        self.sent = 0

    def receive(self, msg: Message) -> list[Message]:
        replies = self.owner.receive(msg)
        assert self.transport is not None
        for reply in replies:
            if reply.kind in ("summary.bid", "summary.deliver"):
                self.transport.deliver_frame(self.name, reply.recipient, reply.round, spoil(reply))
                self.sent += 1
        return replies

    def expire(self, now: float) -> list[Message]:
        return []


def spoil(msg: Message) -> bytes:
    frame: dict[str, Any] = msgpack.unpackb(encode(msg), raw=False)
    body = frame["body"]
    if msg.kind == "summary.bid":
        body["token"] = -1
    else:
        point = np.full(len(body["point"]["data"]) // 8, 1e39)
        body["point"]["data"] = point.tobytes()
    return bytes(msgpack.packb(frame, use_bin_type=True))


def test_a_hostile_owner_is_expelled_after_max_faults_and_the_run_completes() -> None:
    scenario = small_scenario(11)
    params = small_params(scenario, max_lost=1)
    curator = small_curator(RUN, scenario, params, seed=4)
    owners = [
        Owner(n, RUN, X, y) for n, (X, y) in zip(scenario.owner_names, scenario.owners, strict=True)
    ]
    hostile = HostileOwner(owners[1])
    transport = LoopbackTransport([curator, owners[0], hostile, *owners[2:]])
    hostile.transport = transport
    transport.send(curator.start())
    transport.run_until(lambda: curator.state in ("done", "refused"))

    assert curator.state == "done" and curator.reason == "complete"
    assert len(curator.provenance) == params.p
    assert transport.expelled == {hostile.name}
    assert transport.refused == {hostile.name: MAX_FAULTS + 1}  # later frames are not read
    assert hostile.sent == MAX_FAULTS + 1  # one spoiled frame per bid or delivery until expelled
    assert set(curator.lost) == {hostile.name}
    assert curator.live == set(scenario.owner_names) - {hostile.name}
    epoch_lost = curator.lost[hostile.name]
    assert epoch_lost > 1  # its faults spread over epochs; it never missed a deadline
    assert all(owner != hostile.name or epoch == epoch_lost for epoch, owner, _ in curator.dropped)
    assert all(p.epoch <= epoch_lost for p in curator.provenance if p.owner == hostile.name)
    reasons = [why for party, why in transport.errors if party == "curator"]
    assert len(reasons) == MAX_FAULTS + 1
    assert all("token: -1 outside" in r or "point: a value beyond" in r for r in reasons)


def test_a_hostile_owner_beyond_t_refuses_the_run() -> None:
    scenario = small_scenario(11)
    params = small_params(scenario, max_lost=0)
    curator = small_curator(RUN, scenario, params, seed=4)
    owners = [
        Owner(n, RUN, X, y) for n, (X, y) in zip(scenario.owner_names, scenario.owners, strict=True)
    ]
    hostile = HostileOwner(owners[0])
    transport = LoopbackTransport([curator, hostile, *owners[1:]])
    hostile.transport = transport
    transport.send(curator.start())
    transport.run_until(lambda: curator.state in ("done", "refused"))
    assert curator.state == "refused" and curator.refusal["lost"] == [hostile.name]


class CountingOwner(Owner):
    """An owner that counts how often a transport tells it the time."""

    told = 0

    def expire(self, now: float) -> list[Message]:
        CountingOwner.told += 1
        return super().expire(now)


def test_the_loopback_tells_only_parties_with_deadlines_the_time() -> None:
    """issue 29: a tick after every frame asked all K owners (O(K^2) per epoch); owners keep
    no deadlines and are skipped, while the curator's deadlines still fire: a silent owner is
    dropped at its deadline and the run completes."""
    scenario = small_scenario(11)
    params = small_params(scenario, max_lost=1)
    curator = small_curator(RUN, scenario, params, seed=4)
    owners = [
        CountingOwner(n, RUN, X, y)
        for n, (X, y) in zip(scenario.owner_names, scenario.owners, strict=True)
    ]
    silent = owners[2].name
    transport = LoopbackTransport([curator, *owners], faults=FaultPlan(kill_at={silent: 3}))
    transport.send(curator.start())
    transport.run_until(lambda: curator.state in ("done", "refused"))
    assert curator.state == "done" and curator.lost == {silent: 3}
    assert CountingOwner.told == 0

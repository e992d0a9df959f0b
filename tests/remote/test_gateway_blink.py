"""A link that blinks costs nothing (issue 38): a call to a party whose stream broke waits for
it to come back within the reconnect grace, a call in flight when the stream breaks is sent
again on the new stream, and the agent runs it once. In one event loop on 127.0.0.1, no Ray;
the cut is the suite's own TCP proxy."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from dpmarket.actors.remote import tls
from dpmarket.actors.remote.agent import Link, serve
from dpmarket.actors.remote.control import ABSENT
from dpmarket.actors.remote.gateway import Gateway
from tests.remote.echo import Certs
from tests.remote.proxy import FaultProxy

MARKET = "gw-blink"


class Party:
    """Counts the status calls it ran; ``hold`` keeps a call running until released."""

    def __init__(self) -> None:
        self.runs = 0
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()

    async def dispatch(self, method: str, args: dict[str, Any]) -> Any:
        assert method == "status"
        self.runs += 1
        self.entered.set()
        await self.release.wait()
        return {"name": "owner-1", "state": "idle", "records": self.runs}


def _gateway(certs: Certs, grace: float) -> Gateway:
    declared = {"owner-1": ("owner", tls.fingerprint(certs.read("owner-1.crt")))}
    return Gateway(
        MARKET, "127.0.0.1:0", certs.read("market.crt"), certs.read("market.key"),
        certs.read("ca.crt"), declared, call_timeout=60.0, reconnect_grace=grace,
    )  # fmt: skip


def _link(certs: Certs, port: int) -> Link:
    return Link(
        f"127.0.0.1:{port}", MARKET, "owner-1", "owner", certs.read("ca.crt"),
        certs.read("owner-1.crt"), certs.read("owner-1.key"),
    )  # fmt: skip


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 120))


@contextlib.asynccontextmanager
async def _joined(certs: Certs, grace: float) -> AsyncIterator[tuple[Gateway, Party, FaultProxy]]:
    """owner-1's agent joined through a proxy; at the end the market finishes and the agent
    exits 0 by itself."""
    gw, party = _gateway(certs, grace), Party()
    port = await gw.start()
    with FaultProxy(("127.0.0.1", port)) as proxy:
        agent = asyncio.ensure_future(serve(_link(certs, proxy.port), party.dispatch, "t"))
        assert (await gw.joined(30, ["owner-1"]))["owner-1"]
        yield gw, party, proxy
        await gw.finish("complete", finished=True)
        assert await agent == 0


async def _gone(gw: Gateway) -> None:
    while await gw.connected():
        await asyncio.sleep(0.05)


def test_a_call_made_during_a_cut_is_answered_once_the_link_is_back(certs: Certs) -> None:
    async def body() -> None:
        async with _joined(certs, grace=60.0) as (gw, party, proxy):
            proxy.drop()
            await _gone(gw)
            call = asyncio.ensure_future(gw.invoke("owner-1", "status", ()))
            proxy.restore()
            status = await call
            assert status != ABSENT[("owner", "status")] and status["state"] == "idle"
            assert party.runs == 1

    _run(body)


def test_a_call_in_flight_when_the_link_breaks_is_sent_again_and_runs_once(certs: Certs) -> None:
    async def body() -> None:
        async with _joined(certs, grace=60.0) as (gw, party, proxy):
            party.release.clear()
            call = asyncio.ensure_future(gw.invoke("owner-1", "status", ()))
            await party.entered.wait()  # the agent runs it; its reply will find no stream
            proxy.drop()
            await _gone(gw)
            party.release.set()
            proxy.restore()
            status = await call
            assert status["records"] == 1 and party.runs == 1  # the earlier reply, not a rerun

    _run(body)


def test_without_a_grace_a_cut_party_is_absent_at_once(certs: Certs) -> None:
    async def body() -> None:
        async with _joined(certs, grace=0.0) as (gw, party, proxy):
            proxy.drop()
            await _gone(gw)
            assert await gw.invoke("owner-1", "status", ()) == ABSENT[("owner", "status")]
            proxy.restore()
            assert (await gw.joined(30, ["owner-1"]))["owner-1"]
        assert party.runs == 0

    _run(body)


def test_an_agent_back_after_a_cut_rejoins_and_is_not_counted_as_replaced(certs: Certs) -> None:
    """A reset link and the agent dialling in again: one ``rejoined``, no ``stream replaced``
    (that is for a second agent with the party's certificate), and the agent is not told to
    stop: it answers on its new stream and exits 0 at the end."""

    async def body() -> None:
        async with _joined(certs, grace=60.0) as (gw, _, proxy):
            proxy.drop()
            await _gone(gw)
            proxy.restore()
            assert (await gw.joined(30, ["owner-1"]))["owner-1"]
            assert (await gw.invoke("owner-1", "status", ()))["state"] == "idle"
            assert [(e["claimed"], e["reason"], e["count"]) for e in await gw.refusals()] == [
                ("owner-1", "rejoined", 1)
            ]

    _run(body)


class Offered(Party):
    """A party that takes the offer (``begin``) and holds its status calls like Party."""

    async def dispatch(self, method: str, args: dict[str, Any]) -> Any:
        if method == "begin":
            return {"accepted": True}
        return await super().dispatch(method, args)


def test_a_connected_owner_that_leaves_a_call_unanswered_is_reachable_only_once_it_answers(
    certs: Certs,
) -> None:
    """Reachable (a lost owner the curator may take back) means connected, offer taken and
    shown to be there: an owner with a call unanswered on its open stream is not, nor one
    whose call timed out on an open stream, until it answers (here: its late reply)."""

    async def body() -> None:
        gw, party = _gateway(certs, grace=60.0), Offered()
        gw.call_timeout = 2.0  # the call below times out while the agent holds it
        port = await gw.start()
        agent = asyncio.ensure_future(serve(_link(certs, port), party.dispatch, "t"))
        assert (await gw.joined(30, ["owner-1"]))["owner-1"]
        assert (await gw.invoke("owner-1", "begin", ({"market": MARKET},)))["accepted"]
        assert await gw.reachable() == ["owner-1"]
        party.release.clear()
        call = asyncio.ensure_future(gw.invoke("owner-1", "status", ()))
        await party.entered.wait()
        assert await gw.reachable() == []  # connected, silent: not shown to be there
        assert await call == ABSENT[("owner", "status")]  # timed out on an open stream
        assert await gw.connected() == ["owner-1"] and await gw.reachable() == []
        party.release.set()  # its late reply: it answers, so it is there
        while await gw.reachable() != ["owner-1"]:
            await asyncio.sleep(0.05)
        await gw.finish("complete", finished=True)
        assert await agent == 0

    _run(body)

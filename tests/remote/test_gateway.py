"""The market's gateway and an agent's link, in one event loop on 127.0.0.1 (no Ray: the gateway
actor's class runs here as it does in its actor): admission by certificate and hello, calls and
their absent values, refusals on both sides, a cut and a half-open connection (the test's own
fault proxy), a hostile agent."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

from dpmarket.actors.remote import tls
from dpmarket.actors.remote.agent import Link, serve
from dpmarket.actors.remote.channel import open_channel, stream
from dpmarket.actors.remote.control import ABSENT, AgentUnavailable
from dpmarket.actors.remote.gateway import GATEWAY, Gateway
from dpmarket.protocol.agents.messages import HelloBody
from dpmarket.protocol.wire.codec import encode
from dpmarket.protocol.wire.parties import Outbox
from tests.remote.echo import Certs
from tests.remote.proxy import FaultProxy

MARKET = "gw-test"


class Party:
    """An agent's dispatcher that records every call it served."""

    def __init__(self, status: Any = None) -> None:
        self.calls: list[str] = []
        self.status = (
            {"name": "owner-1", "state": "idle", "records": 0} if status is None else status
        )

    async def dispatch(self, method: str, args: dict[str, Any]) -> Any:
        self.calls.append(method)
        if method == "status":
            return self.status
        if method == "handle":
            return list(args["frames"])
        raise RuntimeError(f"no {method}")


def _gateway(certs: Certs, parties: tuple[str, ...] = ("owner-1", "owner-2")) -> Gateway:
    declared = {p: ("owner", tls.fingerprint(certs.read(f"{p}.crt"))) for p in parties}
    return Gateway(
        MARKET, "127.0.0.1:0", certs.read("market.crt"), certs.read("market.key"),
        certs.read("ca.crt"), declared, call_timeout=20.0,
    )  # fmt: skip


def _link(certs: Certs, port: int, party: str = "owner-1", cert_of: str | None = None,
          other_cert: bool = False, other_ca: bool = False) -> Link:  # fmt: skip
    name = cert_of or party
    return Link(
        f"127.0.0.1:{port}", MARKET, party, "owner",
        certs.read("ca.crt", other=other_ca),
        certs.read(f"{name}.crt", other=other_cert),
        certs.read(f"{name}.key", other=other_cert),
    )  # fmt: skip


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 120))


def _agent(link: Link, party: Party, give_up: float = 60.0) -> asyncio.Task[int]:
    return asyncio.ensure_future(serve(link, party.dispatch, "test", 0.05, 0.5, give_up))


def test_an_agent_joins_answers_calls_and_exits_when_the_market_finishes(certs: Certs) -> None:
    async def body() -> None:
        gw, party = _gateway(certs), Party()
        port = await gw.start()
        agent = _agent(_link(certs, port), party)
        assert (await gw.joined(30, ["owner-1"])) == {"owner-1": True}
        assert (await gw.invoke("owner-1", "status", ()))["state"] == "idle"
        assert await gw.invoke("owner-1", "handle", ({"owner-1": [b"a", b"b"]},)) == [b"a", b"b"]
        # a call the agent fails is the method's absent value (or raises where a local actor
        # would): the caller sees a lost party, never the agent's exception
        assert await gw.invoke("owner-1", "ingest_status", ()) == ABSENT[("owner", "ingest_status")]
        with pytest.raises(AgentUnavailable, match="owner-1: dca_setup failed"):
            await gw.invoke("owner-1", "dca_setup", ("owner-1", _config(), {}))
        # a party that never joined answers absent at once
        assert await gw.invoke("owner-2", "handle", ({"owner-2": [b"x"]},)) == []
        await gw.finish("complete", finished=True)
        assert await agent == 0
        assert [e["event"] for e in gw.log] == ["joined", "left"]

    _run(body)


def _config() -> Any:
    from dpmarket.protocol.securesum.spec import DcaConfig

    return DcaConfig("x", ("owner-1", "owner-2", "owner-3"), ("node-1", "node-2"))


@pytest.mark.parametrize(
    ("case", "market_says", "agent_code"),
    [
        ("another owner's name", "claims to be owner 'owner-1'", 2),
        ("an undeclared certificate", "is not declared for any party", 2),
        ("a certificate from another CA", None, 1),
        ("a market the agent does not trust", None, 2),
    ],
)
def test_identities_that_are_not_what_they_claim_are_refused_on_both_sides(
    certs: Certs, capsys: pytest.CaptureFixture[str], case: str, market_says: str | None,
    agent_code: int,
) -> None:  # fmt: skip
    async def body() -> None:
        gw, party = _gateway(certs, ("owner-1", "owner-2") if case != "an undeclared certificate"
                             else ("owner-1",)), Party()  # fmt: skip
        port = await gw.start()
        link = {
            "another owner's name": _link(certs, port, "owner-1", cert_of="owner-2"),
            "an undeclared certificate": _link(certs, port, "owner-2"),
            "a certificate from another CA": _link(certs, port, other_cert=True),
            "a market the agent does not trust": _link(certs, port, other_ca=True),
        }[case]
        code = await serve(link, party.dispatch, "test", 0.05, 0.5, give_up=3.0)
        assert code == agent_code
        assert party.calls == []  # nothing reached it, nothing left it
        assert await gw.connected() == []
        assert await gw.invoke("owner-1", "handle", ({"owner-1": [b"x"]},)) == []
        refused = [e["detail"] for e in gw.log if e["event"] == "refused"]
        if market_says is not None:
            assert len(refused) == 1 and market_says in refused[0]
        else:  # TLS refused the handshake: the gateway's code never saw the connection
            assert refused == []
        await gw.finish("done")

    _run(body)
    err = capsys.readouterr().err
    if market_says is not None:
        assert "the market refused this agent" in err and market_says in err
        assert "refused a connection" in err  # the market's side says it too
    elif case == "a certificate from another CA":  # TLS 1.3: the market just closes
        assert "does not accept this agent's certificate" in err and "gave up" in err
    else:
        assert "TLS handshake with the market failed" in err


def test_plain_tcp_is_refused(certs: Certs) -> None:
    async def body() -> None:
        gw = _gateway(certs)
        port = await gw.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = stream(channel)()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call.write(b"hello")
                await call.read()
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert await gw.connected() == []
        await gw.finish("done")

    _run(body)


def test_a_cut_connection_is_a_lost_party_until_the_agent_reconnects(certs: Certs) -> None:
    async def body() -> None:
        gw, party = _gateway(certs), Party()
        port = await gw.start()
        with FaultProxy(("127.0.0.1", port)) as proxy:
            agent = _agent(_link(certs, proxy.port), party)
            assert (await gw.joined(30, ["owner-1"]))["owner-1"]
            proxy.drop()  # every connection reset, new ones refused
            for _ in range(200):
                if not await gw.connected():
                    break
                await asyncio.sleep(0.05)
            assert await gw.invoke("owner-1", "status", ()) == ABSENT[("owner", "status")]
            proxy.restore()  # the agent comes back with backoff and is called again
            assert (await gw.joined(30, ["owner-1"]))["owner-1"]
            assert (await gw.invoke("owner-1", "status", ()))["state"] == "idle"
            assert [e["event"] for e in gw.log].count("joined") == 2
            await gw.finish("complete", finished=True)
            assert await agent == 0

    _run(body)


def test_a_half_open_connection_is_detected_and_its_call_answered_absent(certs: Certs) -> None:
    async def body() -> None:
        gw, party = _gateway(certs), Party()
        port = await gw.start()
        with FaultProxy(("127.0.0.1", port)) as proxy:
            agent = _agent(_link(certs, proxy.port), party, give_up=60.0)
            assert (await gw.joined(30, ["owner-1"]))["owner-1"]
            proxy.half_open()  # both sockets open, nothing passes
            # the call waits for a reply that cannot come: keepalive ends the stream first
            assert await gw.invoke("owner-1", "handle", ({"owner-1": [b"x"]},)) == []
            assert any("disconnected" in e for e in gw.errors["owner-1"])
            proxy.restore()
            assert (await gw.joined(30, ["owner-1"]))["owner-1"]
            await gw.finish("complete", finished=True)
            assert await agent == 0

    _run(body)


def test_a_hostile_agent_gets_its_results_refused_and_its_stream_closed(certs: Certs) -> None:
    async def body() -> None:
        gw, party = _gateway(certs), Party(status=[1, 2, 3])  # not a status
        port = await gw.start()
        agent = _agent(_link(certs, port), party)
        assert (await gw.joined(30, ["owner-1"]))["owner-1"]
        assert await gw.invoke("owner-1", "status", ()) == ABSENT[("owner", "status")]
        assert "refused its result" in gw.errors["owner-1"][-1]
        await gw.finish("done")
        agent.cancel()
        # a second hello after admission is not a reply: the gateway ends the connection
        link = _link(certs, await _restart(gw))
        creds = tls.channel_credentials(link.ca, link.certificate, link.key)
        async with open_channel(link.address, creds) as channel:
            call = stream(channel)()
            out = Outbox(MARKET, "owner-1")
            await call.write(encode(out.make(GATEWAY, 0, HelloBody("owner", "x"))))
            assert (await gw.joined(30, ["owner-1"]))["owner-1"]
            await call.write(encode(out.make(GATEWAY, 0, HelloBody("owner", "x"))))
            for _ in range(200):
                if not await gw.connected():
                    break
                await asyncio.sleep(0.05)
            assert await gw.connected() == []
        assert any(e.startswith("protocol:") for e in gw.errors["owner-1"])
        await gw.finish("done")

    _run(body)


async def _restart(gw: Gateway) -> int:
    return await gw.start()

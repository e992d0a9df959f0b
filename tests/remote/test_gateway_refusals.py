"""Every refusal visible (issue 38): the gateway counts each refused or replaced connection by
the name claimed, the certificate's fingerprint and the reason; the driver prints them
rate-limited; a replaced stream's agent is told. In one event loop on 127.0.0.1, no Ray."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from dpmarket.actors.remote import tls
from dpmarket.actors.remote.agent import Link, serve
from dpmarket.actors.remote.channel import open_channel, stream
from dpmarket.actors.remote.gateway import GATEWAY, Gateway
from dpmarket.actors.remote.refused import MAX_KINDS, RefusalCounts, other_reason
from dpmarket.actors.run.refusals import RefusalLines
from dpmarket.protocol.agents.messages import EndBody, HelloBody
from dpmarket.protocol.wire.codec import decode, encode
from dpmarket.protocol.wire.parties import Outbox
from tests.remote.echo import Certs

MARKET = "gw-refusals"


async def _status(method: str, args: dict[str, Any]) -> Any:
    if method == "status":
        return {"name": "owner-1", "state": "idle", "records": 0}
    raise RuntimeError(f"no {method}")


def _gateway(certs: Certs, parties: tuple[str, ...] = ("owner-1",)) -> Gateway:
    declared = {p: ("owner", tls.fingerprint(certs.read(f"{p}.crt"))) for p in parties}
    return Gateway(
        MARKET, "127.0.0.1:0", certs.read("market.crt"), certs.read("market.key"),
        certs.read("ca.crt"), declared, call_timeout=20.0,
    )  # fmt: skip


def _link(certs: Certs, port: int, party: str, cert_of: str) -> Link:
    return Link(
        f"127.0.0.1:{port}", MARKET, party, "owner", certs.read("ca.crt"),
        certs.read(f"{cert_of}.crt"), certs.read(f"{cert_of}.key"),
    )  # fmt: skip


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 120))


def test_an_undeclared_certificate_is_refused_on_its_certificate_before_any_hello(
    certs: Certs,
) -> None:
    """owner-2's certificate (not declared in this market) claiming owner-1, three times: one
    kind, (its fingerprint, "certificate not declared"), counted three times with no name (its
    hello is never read); a connection under it that says nothing is refused the same way (not
    left to the hello's timeout); the real owner-1 still joins and answers."""

    async def body() -> None:
        gw = _gateway(certs)
        port = await gw.start()
        for _ in range(3):
            code = await serve(_link(certs, port, "owner-1", "owner-2"), _status, "t", 0.05, 0.5, 3)
            assert code == 2
        fp = tls.fingerprint(certs.read("owner-2.crt"))
        code = await _say_nothing(_link(certs, port, "owner-1", "owner-2"))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        real = asyncio.ensure_future(
            serve(_link(certs, port, "owner-1", "owner-1"), _status, "t", 0.05, 0.5, 60)
        )
        assert (await gw.joined(30, ["owner-1"]))["owner-1"]
        assert (await gw.invoke("owner-1", "status", ()))["state"] == "idle"
        [entry] = await gw.refusals()
        assert entry["claimed"] is None and entry["fingerprint"] == fp
        # >= 4, not == 4: under load gRPC can end a refused stream as INTERNAL ("Internal error
        # from Core") rather than UNAUTHENTICATED, and the agent then retries; each retry is one
        # more refused connection under the same certificate, counted in the same entry.
        assert entry["reason"] == "certificate not declared" and entry["count"] >= 4
        lines = RefusalLines(every=10.0)
        [said] = lines.add([entry], now=0.0)
        assert fp in said and "no name read" in said
        await gw.finish("complete", finished=True)
        assert await real == 0

    _run(body)


async def _say_nothing(link: Link) -> grpc.StatusCode:
    """Open a stream under ``link``'s certificate, send nothing; how the market ends it."""
    creds = tls.channel_credentials(link.ca, link.certificate, link.key)
    async with open_channel(link.address, creds) as channel:
        call = stream(channel)()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call.read()
        return refused.value.code()


async def _hello(
    link: Link, claimed: str, instance: str = ""
) -> tuple[grpc.aio.StreamStreamCall, Any]:
    """A stream under ``link``'s certificate whose hello claims ``claimed``; the call and its
    channel (closed by the caller)."""
    creds = tls.channel_credentials(link.ca, link.certificate, link.key)
    channel = open_channel(link.address, creds)
    opened = await channel.__aenter__()
    call = stream(opened)()
    out = Outbox(MARKET, claimed)
    await call.write(encode(out.make(GATEWAY, 0, HelloBody("owner", "t", instance))))
    return call, channel


def test_a_flood_of_names_claimed_under_one_certificate_is_one_kind_and_one_line(
    certs: Certs,
) -> None:
    """owner-2's certificate (declared) claiming 30 different names: one kind, keyed by its
    fingerprint and the reason, not by the names: one line at once, the first name kept and
    the other claims counted."""

    async def body() -> None:
        gw = _gateway(certs, ("owner-1", "owner-2"))
        port = await gw.start()
        for i in range(30):
            call, channel = await _hello(_link(certs, port, "x", "owner-2"), f"name-{i}")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call.read()
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            await channel.__aexit__(None, None, None)
        [entry] = await gw.refusals()
        assert entry["fingerprint"] == tls.fingerprint(certs.read("owner-2.crt"))
        assert entry["reason"] == "name claimed with the certificate of owner-2"
        assert (entry["claimed"], entry["count"], entry["other_names"]) == ("name-0", 30, 29)
        assert len(RefusalLines(every=10.0).add([entry], now=0.0)) == 1
        assert len([e for e in gw.log if e["event"] == "refused"]) == 1  # its log: the first
        await gw.finish("done")

    _run(body)


def test_the_kinds_kept_are_bounded_and_the_rest_counted_together() -> None:
    """More distinct undeclared certificates than the pool: the first kinds are kept, every
    later one is counted per reason under one entry; nothing is lost from the total; a
    declared certificate's kinds are kept apart even after the pool is full."""
    counts = RefusalCounts(declared=["sha256:declared"], max_kinds=4)
    firsts = [counts.add(None, f"sha256:{i:02x}", "r", "d") for i in range(10)]
    assert firsts == [True] * 4 + [True] + [False] * 5  # OTHER's first, then counted
    assert counts.add(None, None, "s", "d")  # another reason past the pool: its own entry
    assert counts.add("owner-9", "sha256:declared", "name claimed", "d")
    entries = counts.entries()
    assert len(entries) == 7 and sum(e["count"] for e in entries) == 12
    pooled = next(e for e in entries if e["reason"] == other_reason("r"))
    assert (pooled["count"], pooled["fingerprint"], pooled["claimed"]) == (6, None, None)
    assert entries[-1]["fingerprint"] == "sha256:declared"


def test_a_full_pool_of_undeclared_certificates_never_hides_a_declared_impersonation(
    tmp_path: Path,
) -> None:
    """MAX_KINDS + 1 certificates the agents' CA signed but the market does not declare fill
    the undeclared pool (the last is counted under OTHER, without its fingerprint); owner-2's
    declared certificate claiming owner-1 afterwards is still its own kind, with owner-2's
    fingerprint and the name it claimed."""
    extra = [f"owner-{i}" for i in range(3, MAX_KINDS + 4)]
    tls.write_party_certs(tmp_path, ["owner-1", "owner-2", *extra], [])
    many = Certs(tmp_path, tmp_path)

    async def body() -> None:
        gw = _gateway(many, ("owner-1", "owner-2"))
        port = await gw.start()
        for name in extra:
            code = await _say_nothing(_link(many, port, name, name))
            assert code == grpc.StatusCode.UNAUTHENTICATED
        call, channel = await _hello(_link(many, port, "x", "owner-2"), "owner-1")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call.read()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        await channel.__aexit__(None, None, None)
        entries = await gw.refusals()
        pooled = [e for e in entries if e["reason"] == "certificate not declared"]
        assert len(pooled) == MAX_KINDS
        [other] = [e for e in entries if e["reason"] == other_reason("certificate not declared")]
        assert (other["fingerprint"], other["count"]) == (None, 1)
        [impostor] = [e for e in entries if e["reason"].startswith("name claimed")]
        assert impostor["fingerprint"] == tls.fingerprint(many.read("owner-2.crt"))
        assert (impostor["claimed"], impostor["count"]) == ("owner-1", 1)
        await gw.finish("done")

    _run(body)


def test_a_party_that_keeps_dialling_in_grows_no_log(certs: Certs) -> None:
    """owner-1's agent dials in 12 times (each stream ends the one before: a rejoin): the log
    keeps its last ``log_kept`` entries and counts every join; report() says how many entries
    it no longer holds."""

    async def body() -> None:
        declared = {"owner-1": ("owner", tls.fingerprint(certs.read("owner-1.crt")))}
        gw = Gateway(
            MARKET, "127.0.0.1:0", certs.read("market.crt"), certs.read("market.key"),
            certs.read("ca.crt"), declared, log_kept=5,
        )  # fmt: skip
        port = await gw.start()
        link = _link(certs, port, "owner-1", "owner-1")
        previous, opened = await _hello(link, "owner-1", "agent-a")
        channels = [opened]
        assert (await gw.joined(30, ["owner-1"]))["owner-1"]
        for _ in range(11):
            call, opened = await _hello(link, "owner-1", "agent-a")
            channels.append(opened)
            assert await previous.read() is grpc.aio.EOF  # its successor was admitted
            previous = call
        assert len(gw.log) == 5 and {e["event"] for e in gw.log} == {"joined"}
        report = await gw.report()
        assert report["log"]["counts"] == {"owner-1": {"joined": 12}}
        assert report["log"]["dropped"] == 7 and len(report["log"]["last"]) == 5
        [rejoined] = await gw.refusals()
        assert (rejoined["reason"], rejoined["count"]) == ("rejoined", 11)
        await gw.finish("done")
        for channel in channels:
            await channel.__aexit__(None, None, None)

    _run(body)


def test_a_second_stream_with_a_partys_certificate_replaces_the_first_and_its_agent_is_told(
    certs: Certs, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two agents with owner-1's certificate: the second replaces the first, which is told
    (it stops with exit 2 and says why) instead of being closed silently; the replacement is
    counted."""

    async def body() -> None:
        gw = _gateway(certs)
        port = await gw.start()
        first = asyncio.ensure_future(
            serve(_link(certs, port, "owner-1", "owner-1"), _status, "t", 0.05, 0.5, 60)
        )
        assert (await gw.joined(30, ["owner-1"]))["owner-1"]
        second = asyncio.ensure_future(
            serve(_link(certs, port, "owner-1", "owner-1"), _status, "t", 0.05, 0.5, 60)
        )
        assert await first == 2  # told, and does not fight for the name
        assert (await gw.invoke("owner-1", "status", ()))["state"] == "idle"  # the second
        events = await gw.refusals()
        assert [(e["claimed"], e["reason"]) for e in events] == [("owner-1", "stream replaced")]
        assert events[0]["fingerprint"] == tls.fingerprint(certs.read("owner-1.crt"))
        await gw.finish("complete", finished=True)
        assert await second == 0

    _run(body)
    assert "the market replaced this connection" in capsys.readouterr().err


def test_refusal_lines_are_rate_limited_per_kind_and_count_every_one() -> None:
    """200 impostor hellos of one kind: one line at once, then one line per ``every`` seconds
    with how many came meanwhile; another kind gets its own first line; the counts are exact."""
    lines = RefusalLines(every=10.0)
    impostor = {"claimed": "owner-1", "fingerprint": "sha256:aa", "reason": "r", "count": 100}
    assert len(lines.add([impostor], now=0.0)) == 1
    assert lines.add([impostor | {"count": 200}], now=5.0) == []  # counted, not said
    [later] = lines.add([], now=10.0)
    assert "(199 more since)" in later
    other = {"claimed": None, "fingerprint": None, "reason": "no client certificate", "count": 1}
    [first] = lines.add([other], now=11.0)
    assert "no client certificate" in first and "no certificate" in first
    assert lines.flush(12.0, force=True) == []  # nothing left unsaid
    counts = {e["reason"]: e["count"] for e in lines.entries()}
    assert counts == {"r": 200, "no client certificate": 1}


def test_the_same_agent_dialling_in_again_rejoins_and_a_second_agent_replaces_it(
    certs: Certs,
) -> None:
    """A second stream whose hello names the first one's agent process (its link went silent:
    the market has not seen the first stream end yet) rejoins: counted as ``rejoined``, not a
    replacement, and the first stream ends without telling anyone; a stream of another agent
    process with the same certificate replaces it, and the replaced one is told."""

    async def body() -> None:
        gw = _gateway(certs)
        port = await gw.start()
        link = _link(certs, port, "owner-1", "owner-1")
        first, first_channel = await _hello(link, "owner-1", "agent-a")
        assert (await gw.joined(30, ["owner-1"]))["owner-1"]
        again, again_channel = await _hello(link, "owner-1", "agent-a")
        assert await first.read() is grpc.aio.EOF  # ended, told nothing
        assert [(e["claimed"], e["reason"]) for e in await gw.refusals()] == [
            ("owner-1", "rejoined")
        ]
        _, other_channel = await _hello(link, "owner-1", "agent-b")
        told = decode(await again.read()).body
        assert isinstance(told, EndBody) and told.replaced
        reasons = {e["reason"]: e["count"] for e in await gw.refusals()}
        assert reasons == {"rejoined": 1, "stream replaced": 1}
        lines = RefusalLines(every=10.0)
        said = lines.add(await gw.refusals(), now=0.0)
        assert any("owner-1 rejoined" in line for line in said)
        assert [e["reason"] for e in lines.entries()] == ["stream replaced"]
        assert [e["reason"] for e in lines.entries(rejoined=True)] == ["rejoined"]
        await gw.finish("done")
        for channel in (first_channel, again_channel, other_channel):
            await channel.__aexit__(None, None, None)

    _run(body)

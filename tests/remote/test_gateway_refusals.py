"""Every refusal visible (issue 38): the gateway counts each refused or replaced connection by
the name claimed, the certificate's fingerprint and the reason; the driver prints them
rate-limited; a replaced stream's agent is told. In one event loop on 127.0.0.1, no Ray."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dpmarket.actors.remote import tls
from dpmarket.actors.remote.agent import Link, serve
from dpmarket.actors.remote.gateway import Gateway
from dpmarket.actors.run.refusals import RefusalLines
from tests.remote.echo import Certs

MARKET = "gw-refusals"


async def _status(method: str, args: dict[str, Any]) -> Any:
    if method == "status":
        return {"name": "owner-1", "state": "idle", "records": 0}
    raise RuntimeError(f"no {method}")


def _gateway(certs: Certs) -> Gateway:
    declared = {p: ("owner", tls.fingerprint(certs.read(f"{p}.crt"))) for p in ("owner-1",)}
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


def test_a_name_claimed_with_another_partys_certificate_is_counted_by_name_and_fingerprint(
    certs: Certs,
) -> None:
    """owner-2's certificate (not declared in this market) claiming owner-1, three times: one
    kind of refusal counted three times, naming the claim and owner-2's fingerprint; the real
    owner-1 still joins and answers."""

    async def body() -> None:
        gw = _gateway(certs)
        port = await gw.start()
        for _ in range(3):
            code = await serve(_link(certs, port, "owner-1", "owner-2"), _status, "t", 0.05, 0.5, 3)
            assert code == 2
        real = asyncio.ensure_future(
            serve(_link(certs, port, "owner-1", "owner-1"), _status, "t", 0.05, 0.5, 60)
        )
        assert (await gw.joined(30, ["owner-1"]))["owner-1"]
        assert (await gw.invoke("owner-1", "status", ()))["state"] == "idle"
        total, events = await gw.refusals()
        assert total == 3
        lines = RefusalLines(every=10.0)
        said = lines.add(events, now=0.0)
        fp = tls.fingerprint(certs.read("owner-2.crt"))
        assert len(said) == 1 and "'owner-1'" in said[0] and fp in said[0]
        [entry] = lines.entries()
        assert entry["claimed"] == "owner-1" and entry["fingerprint"] == fp
        assert entry["reason"] == "certificate not declared" and entry["count"] == 3
        await gw.finish("complete", finished=True)
        assert await real == 0

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
        _, events = await gw.refusals()
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
    impostor = {"claimed": "owner-1", "fingerprint": "sha256:aa", "reason": "r"}
    assert len(lines.add([impostor] * 100, now=0.0)) == 1
    assert lines.add([impostor] * 100, now=5.0) == []  # within the window: counted, not said
    [later] = lines.add([], now=10.0)
    assert "(199 more since)" in later
    other = {"claimed": None, "fingerprint": None, "reason": "no client certificate"}
    [first] = lines.add([other], now=11.0)
    assert "no client certificate" in first and "no certificate" in first
    assert lines.flush(12.0, force=True) == []  # nothing left unsaid
    counts = {e["reason"]: e["count"] for e in lines.entries()}
    assert counts == {"r": 200, "no client certificate": 1}

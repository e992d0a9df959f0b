"""The fault proxy between an agent and the market: it passes a mutual-TLS stream through,
holds it back, cuts it and silences it, and a silenced stream is found dead by keepalive."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import grpc
import pytest

from dpmarket.actors.remote import channel
from tests.remote.echo import Certs, Echo, code_of, exchange, start_echo
from tests.remote.proxy import FaultProxy

GENEROUS = 30.0  # a bound nothing should come near: keepalive finds a silent peer in seconds


async def _with_proxy(certs: Certs, body: Any) -> Any:
    """Start an echo market, a proxy to it and a channel through the proxy; run ``body``."""
    echo = Echo()
    server, port = await start_echo(certs, echo)
    try:
        with FaultProxy(("127.0.0.1", port)) as proxy:
            address = f"127.0.0.1:{proxy.port}"
            async with channel.open_channel(address, certs.client("owner-1")) as chan:
                return await body(proxy, chan, echo)
    finally:
        await server.stop(None)


async def _open_stream(chan: Any) -> Any:
    """A Connect stream that has exchanged one frame (the connection is up)."""
    call = channel.stream(chan)(timeout=GENEROUS * 2)
    await call.write(b"ping")
    assert (await call.read()).startswith(b"sha256:")
    assert await call.read() == b"ping"
    return call


async def _fails(call: Any) -> grpc.StatusCode:
    """Read on ``call`` until it fails; its status code. (Reads, because a write racing with
    a reset may fail as INTERNAL "Internal error from Core" before the read sees UNAVAILABLE.)"""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        while True:
            await asyncio.wait_for(call.read(), GENEROUS)
    return code_of(caught.value)


def test_pass_through_forwards_and_counts(certs: Certs) -> None:
    async def body(proxy: FaultProxy, chan: Any, echo: Echo) -> None:
        replies = await exchange(chan, [b"a" * 1000, b"b"])
        assert replies[1:] == [b"a" * 1000, b"b"]
        assert proxy.bytes_up > 1000 and proxy.bytes_down > 1000

    asyncio.run(_with_proxy(certs, body))


def test_delay_holds_every_chunk_and_restore_releases_them(certs: Certs) -> None:
    async def body(proxy: FaultProxy, chan: Any, echo: Echo) -> None:
        call = await _open_stream(chan)
        proxy.delay(0.2)
        await call.write(b"slow")
        assert await asyncio.wait_for(call.read(), GENEROUS) == b"slow"
        proxy.delay(3600)
        sent = proxy.bytes_up
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await exchange(chan, [b"too late"], timeout=1.0)
        assert code_of(caught.value) == grpc.StatusCode.DEADLINE_EXCEEDED
        assert proxy.bytes_up == sent  # held, not forwarded
        await call.write(b"held")
        proxy.restore()
        assert await asyncio.wait_for(call.read(), GENEROUS) == b"held"
        assert (await exchange(chan, [b"fine"]))[1:] == [b"fine"]

    asyncio.run(_with_proxy(certs, body))


def test_drop_cuts_streams_and_refuses_until_restored(certs: Certs) -> None:
    async def body(proxy: FaultProxy, chan: Any, echo: Echo) -> None:
        call = await _open_stream(chan)
        proxy.drop()
        assert await _fails(call) == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await exchange(chan, [b"while dropped"])
        assert code_of(caught.value) == grpc.StatusCode.UNAVAILABLE
        proxy.restore()
        again = channel.stream(chan)(iter([b"back"]), timeout=GENEROUS, wait_for_ready=True)
        assert [bytes(r) async for r in again][1:] == [b"back"]

    asyncio.run(_with_proxy(certs, body))


def test_half_open_is_found_by_keepalive(certs: Certs) -> None:
    async def body(proxy: FaultProxy, chan: Any, echo: Echo) -> None:
        call = await _open_stream(chan)
        proxy.half_open()
        down = proxy.bytes_down
        assert await _fails(call) == grpc.StatusCode.UNAVAILABLE
        assert proxy.bytes_down == down  # nothing came back: the peer was silent
        await asyncio.wait_for(echo.ended.wait(), GENEROUS)  # the market noticed too
        proxy.restore()
        again = channel.stream(chan)(iter([b"back"]), timeout=GENEROUS, wait_for_ready=True)
        assert [bytes(r) async for r in again][1:] == [b"back"]

    asyncio.run(_with_proxy(certs, body))


def test_a_dropped_raw_connection_is_reset() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as target,
        FaultProxy(target.getsockname()[:2]) as proxy,
    ):
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=GENEROUS) as conn:
            accepted, _ = target.accept()
            with accepted:
                conn.sendall(b"x")
                assert accepted.recv(1) == b"x"
                proxy.drop()
                with pytest.raises(ConnectionResetError):
                    conn.recv(1)
        with (  # accepted and reset at once while dropped
            pytest.raises(ConnectionResetError),
            socket.create_connection(("127.0.0.1", proxy.port), GENEROUS) as conn,
        ):
            conn.recv(1)


def test_close_leaves_no_thread_and_no_listener() -> None:
    with socket.create_server(("127.0.0.1", 0)) as target:
        proxy = FaultProxy(target.getsockname()[:2]).start()
        port = proxy.port
        conn = socket.create_connection(("127.0.0.1", port), timeout=GENEROUS)
        proxy.close()
        with conn, pytest.raises(ConnectionResetError):
            conn.recv(1)
    assert not proxy._thread.is_alive()
    assert "fault-proxy" not in {t.name for t in threading.enumerate()}
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=GENEROUS).close()

"""The gRPC stream every agent holds with the market: bytes frames, no protobuf.

One service, ``dpmarket.Market``, with one bidirectional stream-stream method, ``Connect``
(``METHOD``). Messages are raw bytes both ways (no serializers): each is one codec frame, and the
receiver applies the frame limits before decoding. gRPC's own message limit is the frame limit
plus a little slack (``options``), so an oversized message is refused by the transport before it
is buffered whole.

Keepalive: both ends ping every 2 s and drop a connection whose ping (a keepalive or a
flow-control probe alike) is not answered within 2 s, with or without calls in flight, so a
silent (half-open) peer is found within seconds rather than when TCP gives up; the server
accepts pings that often.

The server's handler is an async generator: ``handler(requests, context)`` iterates the
client's frames (``async for frame in requests``) and yields reply frames; returning ends the
stream. ``peer_certificate(context)`` is the client's certificate as mutual TLS verified it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import grpc
import grpc.aio

from dpmarket.actors.config.market import ConfigError
from dpmarket.protocol.wire.limits import MAX_FRAME_BYTES

__all__ = [
    "KEEPALIVE_MS",
    "METHOD",
    "SERVICE",
    "Handler",
    "open_channel",
    "options",
    "peer_certificate",
    "start_server",
    "stream",
]

SERVICE = "dpmarket.Market"
METHOD = f"/{SERVICE}/Connect"
KEEPALIVE_MS = 2000
_SLACK = 4096  # gRPC's message limit over the frame limit; the codec checks the frame itself

Handler = Callable[[AsyncIterator[bytes], Any], AsyncIterator[bytes]]
"""``handler(requests, context)``: an async generator of reply frames (``context`` is a
``grpc.aio.ServicerContext``)."""


def options(max_frame: int = MAX_FRAME_BYTES) -> list[tuple[str, int]]:
    """Channel and server options: message limits of ``max_frame`` (+ slack) each way, and
    keepalive pings every ``KEEPALIVE_MS``, and every ping answered within ``KEEPALIVE_MS``
    (without ``ping_timeout_ms`` a flow-control probe sent with data waits a minute and holds
    back keepalive meanwhile); the server allows such pings also without calls in flight."""
    if max_frame < 1:
        raise ValueError(f"max_frame must be positive, not {max_frame}")
    limit = max_frame + _SLACK
    return [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_MS // 2),
        ("grpc.http2.ping_timeout_ms", KEEPALIVE_MS),
    ]


async def start_server(
    address: str,
    credentials: grpc.ServerCredentials,
    handler: Handler,
    max_frame: int = MAX_FRAME_BYTES,
) -> tuple[grpc.aio.Server, int]:
    """A started gRPC server on ``address`` (``host:port``; port 0 picks a free one) with TLS
    ``credentials`` serving ``METHOD`` by ``handler``; returns it and the bound port. The port is
    not shared (SO_REUSEPORT off): a port already in use is a ConfigError naming it."""
    server = grpc.aio.server(options=[*options(max_frame), ("grpc.so_reuseport", 0)])
    method = grpc.stream_stream_rpc_method_handler(
        handler, request_deserializer=None, response_serializer=None
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"Connect": method}),)
    )
    try:
        port = int(server.add_secure_port(address, credentials))
    except RuntimeError as exc:
        raise ConfigError(f"market address {address}: cannot listen there ({exc})") from None
    if port == 0:
        raise ConfigError(f"market address {address}: cannot listen there (in use or not local)")
    await server.start()
    return server, port


def peer_certificate(context: Any) -> bytes | None:
    """The client's certificate (PEM) as the TLS handshake verified it, or None on a
    connection without one."""
    values = context.auth_context().get("x509_pem_cert")
    if not values:
        return None
    return cast(bytes, values[0])


def open_channel(
    address: str,
    credentials: grpc.ChannelCredentials,
    server_name: str | None = None,
    max_frame: int = MAX_FRAME_BYTES,
) -> grpc.aio.Channel:
    """A TLS channel to the market at ``address`` (``host:port``). ``server_name``, when given,
    is the name the market's certificate must carry instead of the host in ``address``.

    Each channel has its own subchannel pool: gRPC otherwise shares one connection per address
    across channels, with its reconnect backoff (growing to two minutes), so after a cut a new
    channel would fail at once from the shared state long after the link is back; the agent's
    own retry loop (actors/remote/agent.py) is the only backoff."""
    opts: list[tuple[str, int | str]] = list(options(max_frame))
    opts.append(("grpc.use_local_subchannel_pool", 1))
    if server_name is not None:
        opts.append(("grpc.ssl_target_name_override", server_name))
    return grpc.aio.secure_channel(address, credentials, options=opts)


def stream(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamMultiCallable:
    """The ``Connect`` method on ``channel``: call it (``stream(channel)()``) for a call to
    ``write`` frames to and ``read`` frames from, or pass it an iterator of frames."""
    return channel.stream_stream(METHOD, request_serializer=None, response_deserializer=None)

"""An agent's connection to the market: dial out, say who it is, answer calls, reconnect.

The agent opens the only connection (no inbound port at the agent): a TLS channel to the
market's address, trusting only the market CA in its own configuration and presenting its own
certificate (mutual TLS), then one ``Connect`` stream (actors/remote/channel.py). Its first
frame is ``agent.hello``; after that it answers each ``agent.call`` in order with an
``agent.reply`` (the party's :class:`Dispatcher` decides), until the market's ``agent.end``.
Frames from the market are decoded with the codec's limits and a replay guard fresh per
connection; a frame the agent cannot accept is answered with an error, never acted on. A call
the market sends again after a broken stream carries the token it had (``CallBody.token``): the
agent keeps its last :data:`ANSWERED` replies by token, across connections, and answers a token
it already answered with the same reply, so a call runs at most once however often it is sent.

A broken connection (market not up yet, connection cut, keepalive unanswered) is retried with
exponential backoff and jitter (``backoff`` seconds doubling up to ``max_backoff``), for at
most ``give_up`` seconds without a connection; a refusal of who the agent is (its certificate
or name refused by the market, or the market's certificate refused by the agent) is not retried:
a configuration error is not fixed by waiting. (A market that refuses the agent's certificate
at the TLS layer just closes the socket, which a cut connection does too: the agent says what
it probably means and keeps trying until ``give_up``; the market's gRPC logs the failed
handshake with ``GRPC_VERBOSITY=INFO``.) Exit codes (:func:`serve`): 0 the market
finished, 2 refused identity or configuration, 3 the market stopped short (refused by
T-tolerance: the owner comes back for a resume), 1 gave up waiting.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from dpmarket.actors.remote.channel import open_channel, stream
from dpmarket.actors.remote.control import pack_result, read_args
from dpmarket.protocol.agents.messages import GATEWAY, CallBody, EndBody, HelloBody, ReplyBody
from dpmarket.protocol.wire.codec import ReplayGuard, decode, encode
from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.protocol.wire.parties import Outbox

__all__ = ["Declined", "Dispatcher", "Link", "serve"]

EXIT_FINISHED, EXIT_GAVE_UP, EXIT_REFUSED, EXIT_STOPPED = 0, 1, 2, 3
ANSWERED = 64  # replies kept by token for calls sent again (module docstring)
IDENTITY_CODES = (
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
)
TLS_REFUSALS = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "Handshake failed",
                "handshake failed", "SSL_ERROR")  # fmt: skip


# a TLS 1.3 server that refuses the client's certificate closes the connection after the
# client's side of the handshake is done: the agent sees the socket closed, not a refusal
CLOSED_EARLY = ("Socket closed", "Connection reset")


class Declined(Exception):
    """Raised by a dispatcher: the party's policy declines (the reply says so)."""


Dispatcher = Callable[[str, dict[str, Any]], Awaitable[Any]]
"""``dispatch(method, checked_args) -> result``; raises :class:`Declined`, or any exception
(reported to the market as the call's error)."""


@dataclass(frozen=True)
class Link:
    """Where and how an agent dials: the market's address and name, its own name and role,
    and its TLS material (PEM bytes)."""

    address: str
    market: str
    party: str
    role: str
    ca: bytes
    certificate: bytes
    key: bytes
    server_name: str | None = None


def say(party: str, line: str) -> None:
    print(f"dpmarket {party}: {line}", file=sys.stderr, flush=True)


async def serve(
    link: Link,
    dispatch: Dispatcher,
    software: str,
    backoff: float = 0.5,
    max_backoff: float = 5.0,
    give_up: float = 600.0,
) -> int:
    """Hold the link until the market ends it; the exit code (module docstring)."""
    credentials = grpc.ssl_channel_credentials(link.ca, link.key, link.certificate)
    delay, waited = backoff, 0.0
    answered: dict[str, ReplyBody] = {}  # token -> reply, across this agent's connections
    instance = secrets.token_hex(8)  # this process on each of its connections (HelloBody)
    while True:
        outcome = await _session(link, credentials, dispatch, software, answered, instance)
        if isinstance(outcome, int):
            return outcome
        connected, reason = outcome
        if connected:
            delay, waited = backoff, 0.0
        if waited >= give_up:
            say(link.party, f"gave up after {waited:.0f} s without the market ({reason})")
            return EXIT_GAVE_UP
        pause = min(max_backoff, delay) * (0.5 + secrets.randbelow(1000) / 1000)  # jitter
        say(link.party, f"connection to {link.address}: {reason}; retrying in {pause:.1f} s")
        await asyncio.sleep(pause)
        waited += pause
        delay = min(max_backoff, delay * 2)


async def _session(
    link: Link,
    credentials: grpc.ChannelCredentials,
    dispatch: Dispatcher,
    software: str,
    answered: dict[str, ReplyBody],
    instance: str = "",
) -> int | tuple[bool, str]:
    """One connection: an exit code when the agent is done, else (was it admitted, why it
    ended) for the retry loop."""
    out = Outbox(link.market, link.party)
    guard = ReplayGuard()
    admitted = False
    async with open_channel(link.address, credentials, link.server_name) as channel:
        call = stream(channel)()
        try:
            await call.write(encode(out.make(GATEWAY, 0, HelloBody(link.role, software, instance))))
            while True:
                frame = await call.read()
                if frame is grpc.aio.EOF:
                    return admitted, "the market closed the stream"
                if not admitted:
                    admitted = True
                    say(link.party, f"joined market {link.market!r} at {link.address}")
                reply = await _answer(link, dispatch, frame, guard, answered)
                if isinstance(reply, int):
                    await call.done_writing()
                    return reply
                if reply is not None:
                    await call.write(encode(out.make(GATEWAY, 0, reply)))
        except asyncio.InvalidStateError:  # a reply for a stream that broke while it ran
            return admitted, "the stream ended while a call was answered"
        except grpc.aio.AioRpcError as exc:
            details = exc.details() or ""
            if exc.code() in IDENTITY_CODES:
                say(link.party, f"the market refused this agent: {details}")
                return EXIT_REFUSED
            if any(marker in details for marker in TLS_REFUSALS):
                say(
                    link.party,
                    "TLS handshake with the market failed: either the market does not accept "
                    "this agent's certificate (not signed by its CA) or the market's certificate "
                    f"is not signed by the CA this agent trusts ({details})",
                )
                return EXIT_REFUSED
            if not admitted and any(marker in details for marker in CLOSED_EARLY):
                return admitted, (
                    f"{exc.code().name}: {details}; the market closed the connection before "
                    "admitting this agent: if this repeats, the market does not accept this "
                    "agent's certificate (not signed by the CA the market trusts for agents)"
                )
            return admitted, f"{exc.code().name}: {details}"


async def _answer(
    link: Link,
    dispatch: Dispatcher,
    frame: bytes,
    guard: ReplayGuard,
    answered: dict[str, ReplyBody] | None = None,
) -> ReplyBody | int | None:
    """The reply to one frame from the market (None: nothing to send), or an exit code."""
    try:
        msg = decode(frame, guard)
    except RemoteProtocolError as exc:
        say(link.party, f"refused a frame from the market: {exc}")
        return None
    body = msg.body
    if msg.sender != GATEWAY or msg.run != link.market:
        say(link.party, f"refused a frame from {msg.sender!r} of run {msg.run!r}")
        return None
    if isinstance(body, EndBody):
        if body.replaced:  # another process holds this party's certificate: never fight it
            say(
                link.party,
                f"the market replaced this connection: {body.reason}; another agent runs with "
                "this party's certificate (stopping)",
            )
            return EXIT_REFUSED
        if body.finished:
            say(link.party, f"the market has finished ({body.reason})")
            return EXIT_FINISHED
        say(link.party, f"the market stopped: {body.reason}")
        return EXIT_STOPPED
    if not isinstance(body, CallBody):
        say(link.party, f"refused a {msg.kind} frame from the market")
        return None
    answered = {} if answered is None else answered
    if body.token and (earlier := answered.get(body.token)) is not None:
        return dataclasses.replace(earlier, call=body.call)  # sent again: never run twice
    reply = await _run_call(link, dispatch, body)
    if body.token:
        answered[body.token] = reply
        while len(answered) > ANSWERED:
            del answered[next(iter(answered))]
    return reply


async def _run_call(link: Link, dispatch: Dispatcher, body: CallBody) -> ReplyBody:
    try:
        args = read_args(link.role, body.method, body.args)
        result = await dispatch(body.method, args)
        return ReplyBody(body.call, pack_result(result))
    except Declined as exc:
        return ReplyBody(body.call, declined=True, error=str(exc) or "declined")
    except Exception as exc:  # the call fails; the agent keeps serving
        return ReplyBody(body.call, error=f"{type(exc).__name__}: {exc}"[:4000] or "error")

"""The market's gateway: the one TLS listener agents dial into, and the stand-ins' other end.

A Ray actor on the driver's node (:data:`GatewayActor`) listens on the market's address with
the market's certificate and requires a client certificate signed by the market's client CA
(mutual TLS: a stranger's certificate, no certificate or plain TCP never reach this code). A
connection is then admitted only if its certificate's SHA-256 fingerprint is the one the market
config declares for a party and the agent's first frame, ``agent.hello``, names that party and
its role: a valid certificate claiming another party's name is refused and logged. Every later
frame must be an ``agent.reply`` to a call made on this connection (the codec's replay guard,
fresh per connection, checks its sequence); anything else closes the connection.

The curator and the driver never see a connection: they call a party's stand-in
(actors/remote/handles.py), which becomes :meth:`Gateway.invoke`, one ``agent.call`` frame on
the party's current stream and its reply, checked for its method (actors/remote/control.py). A
party not connected, one whose connection breaks while a call is in flight, or one that does not
answer within ``call_timeout``, answers with its method's absent value (a lost party to the
caller: counted against T at the next deadline); an agent that reconnects replaces its old
stream and is called again from then on. :meth:`finish` tells every agent the market is over.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import ray

from dpmarket.actors.remote.channel import peer_certificate, start_server
from dpmarket.actors.remote.control import ABSENT, RAISE, AgentUnavailable, pack_call, read_result
from dpmarket.actors.remote.tls import fingerprint, server_credentials
from dpmarket.protocol.agents.messages import ROLES, CallBody, EndBody, HelloBody, ReplyBody
from dpmarket.protocol.wire.codec import ReplayGuard, decode, encode
from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.protocol.wire.parties import Outbox

__all__ = ["GATEWAY", "Gateway", "GatewayActor"]

GATEWAY = "market"  # the gateway's name in frames (sender of calls, recipient of replies)
HELLO_TIMEOUT = 10.0  # seconds an admitted connection has to say who it is


@dataclass
class _Session:
    """One agent's current connection: its outgoing frames, calls in flight, replay guard."""

    party: str
    role: str
    outbox: Outbox
    guard: ReplayGuard = field(default_factory=ReplayGuard)
    queue: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)
    pending: dict[int, asyncio.Future[ReplyBody | None]] = field(default_factory=dict)
    calls: int = 0

    def close(self) -> None:
        self.queue.put_nowait(None)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_result(None)


class Gateway:
    """The gateway's state (module docstring); run as :data:`GatewayActor`."""

    def __init__(
        self,
        market: str,
        listen: str,
        certificate: bytes,
        key: bytes,
        client_ca: bytes,
        parties: dict[str, tuple[str, str]],
        call_timeout: float = 120.0,
    ) -> None:
        """``parties``: name -> (role, certificate fingerprint) of every declared remote party."""
        for name, (role, _) in parties.items():
            if role not in ROLES:
                raise ValueError(f"{name}: role {role!r} is not one of {ROLES}")
        self.market, self.listen = market, listen
        self._credentials = server_credentials(certificate, key, client_ca)
        self.parties = dict(parties)
        self._by_fingerprint = {fp: name for name, (_, fp) in parties.items()}
        self.call_timeout = call_timeout
        self._sessions: dict[str, _Session] = {}
        self._server: grpc.aio.Server | None = None
        self.port = 0
        self.log: list[dict[str, Any]] = []  # joins, leaves and refusals, in order
        self.errors: dict[str, list[str]] = {}

    def _note(self, event: str, party: str | None, detail: str = "") -> None:
        self.log.append({"at": time.time(), "event": event, "party": party, "detail": detail})
        if event == "refused":
            print(f"dpmarket gateway: refused a connection: {detail}", file=sys.stderr, flush=True)

    async def start(self) -> int:
        """Listen (once); returns the bound port."""
        if self._server is None:
            self._server, self.port = await start_server(
                self.listen, self._credentials, self._connect
            )
        return self.port

    async def joined(self, timeout: float, parties: list[str] | None = None) -> dict[str, bool]:
        """Wait until every party in ``parties`` (default: all declared) is connected, at most
        ``timeout`` seconds; which of them are."""
        wanted = list(self.parties) if parties is None else parties
        deadline = time.monotonic() + timeout
        while not all(p in self._sessions for p in wanted) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return {p: p in self._sessions for p in wanted}

    async def connected(self) -> list[str]:
        return sorted(self._sessions)

    async def report(self) -> dict[str, Any]:
        """Joins, leaves and refusals so far, and each party's call errors."""
        return {"log": list(self.log), "errors": dict(self.errors), "port": self.port}

    async def invoke(self, party: str, method: str, args: tuple[Any, ...]) -> Any:
        """Call ``method`` of remote ``party`` through its stream (module docstring)."""
        role = self.parties[party][0]
        absent = ABSENT[(role, method)]  # KeyError: not a method a remote party has
        session = self._sessions.get(party)
        why = "not connected"
        if session is not None:
            session.calls += 1
            call = session.calls
            fut: asyncio.Future[ReplyBody | None] = asyncio.get_running_loop().create_future()
            session.pending[call] = fut
            body = CallBody(call, method, pack_call(role, method, args))
            session.queue.put_nowait(encode(session.outbox.make(party, 0, body)))
            try:
                reply = await asyncio.wait_for(fut, self.call_timeout)
            except TimeoutError:
                reply, why = None, f"no answer to {method} within {self.call_timeout:g} s"
            finally:
                session.pending.pop(call, None)
            if reply is None:
                why = why if why != "not connected" else "disconnected during the call"
            elif reply.declined:
                why = f"declined: {reply.error or 'its policy'}"
                if method == "begin":  # the owner's reasons go into the run's report
                    self.errors.setdefault(party, []).append(why)
                    return {"accepted": False, "reasons": [reply.error or "declined"]}
            elif reply.error is not None:
                why = f"{method} failed: {reply.error}"
            else:
                try:
                    return read_result(role, method, reply.result)
                except RemoteProtocolError as exc:
                    why = f"{method}: refused its result ({exc})"
        self.errors.setdefault(party, []).append(why)
        if absent is RAISE:
            raise AgentUnavailable(f"{party}: {why}")
        return absent

    async def finish(self, reason: str, finished: bool = True, grace: float = 5.0) -> None:
        """Tell every connected agent the market is over (``finished``: complete; else refused
        with ``reason``), give the frames ``grace`` seconds to leave, and stop listening."""
        for party, session in list(self._sessions.items()):
            session.queue.put_nowait(
                encode(session.outbox.make(party, 0, EndBody(reason, finished)))
            )
            session.queue.put_nowait(None)
        deadline = time.monotonic() + grace
        while self._sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._server is not None:
            await self._server.stop(grace=1.0)
            self._server = None

    # ------------------------------------------------------------------ one connection
    async def _refuse(self, context: Any, code: grpc.StatusCode, detail: str) -> None:
        self._note("refused", None, detail)
        await context.abort(code, detail)

    async def _admit(self, requests: AsyncIterator[bytes], context: Any) -> _Session | None:
        """The party this connection is, from its certificate and its hello, or refused."""
        pem = peer_certificate(context)
        if pem is None:
            await self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, "no client certificate")
            return None
        fp = fingerprint(pem)
        party = self._by_fingerprint.get(fp)
        if party is None:
            await self._refuse(
                context,
                grpc.StatusCode.UNAUTHENTICATED,
                f"certificate {fp} is not declared for any party of market {self.market!r}",
            )
            return None
        role = self.parties[party][0]
        guard = ReplayGuard()
        try:
            first = await asyncio.wait_for(requests.__anext__(), HELLO_TIMEOUT)
            hello = decode(first, guard)
        except (TimeoutError, StopAsyncIteration, RemoteProtocolError) as exc:
            detail = f"{party}: no valid hello ({type(exc).__name__}: {exc})"
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, detail)
            return None
        body = hello.body
        if not isinstance(body, HelloBody):
            await self._refuse(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"{party}: first frame {hello.kind}"
            )
            return None
        if hello.sender != party or body.role != role:
            await self._refuse(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"the certificate of {role} {party!r} ({fp}) claims to be {body.role} "
                f"{hello.sender!r}",
            )
            return None
        if hello.run != self.market or hello.recipient != GATEWAY:
            await self._refuse(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{party}: asked for market {hello.run!r}; this is market {self.market!r}",
            )
            return None
        return _Session(party, role, Outbox(self.market, GATEWAY), guard)

    async def _connect(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        session = await self._admit(requests, context)
        if session is None:
            return
        party = session.party
        old = self._sessions.get(party)
        if old is not None:  # a reconnection: the new stream replaces the old one
            old.close()
        self._sessions[party] = session
        self._note("joined", party, "rejoined" if old is not None else "")
        reader = asyncio.ensure_future(self._read(session, requests))
        try:
            while (frame := await session.queue.get()) is not None:
                yield frame
        finally:
            reader.cancel()
            session.close()
            if self._sessions.get(party) is session:
                del self._sessions[party]
                self._note("left", party)

    async def _read(self, session: _Session, requests: AsyncIterator[bytes]) -> None:
        """The agent's replies, each handed to the call it answers; a frame that is not a
        reply to a call in flight ends the connection."""
        try:
            async for frame in requests:
                msg = decode(frame, session.guard)
                body = msg.body
                if msg.sender != session.party or not isinstance(body, ReplyBody):
                    raise RemoteProtocolError(
                        f"expected a reply from {session.party}, got {msg.kind}"
                    )
                fut = session.pending.get(body.call)
                if fut is None:
                    continue  # a reply to a call that timed out: dropped
                if not fut.done():
                    fut.set_result(body)
        except RemoteProtocolError as exc:
            self.errors.setdefault(session.party, []).append(f"protocol: {exc}")
            self._note("dropped", session.party, str(exc))
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            return  # the stream ended or broke: the session closes below, its calls answer absent
        finally:
            session.close()


GatewayActor = ray.remote(num_cpus=0)(Gateway)
"""The Ray actor of :class:`Gateway` (one per market run, on the driver's node)."""

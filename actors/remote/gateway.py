"""The market's gateway: the one TLS listener agents dial into, and the stand-ins' other end.

A Ray actor on the driver's node (:data:`GatewayActor`) listens on the market's address with
the market's certificate and requires a client certificate signed by the market's client CA
(mutual TLS: a stranger's certificate, no certificate or plain TCP never reach this code). A
connection is then admitted only if its certificate's SHA-256 fingerprint is the one the market
config declares for a party (checked before anything the connection sends is read: an
undeclared certificate's hello is never read) and the agent's first frame, ``agent.hello``,
names that party and its role: a valid certificate claiming another party's name is refused.
Every refused connection the gateway's code sees, every stream replaced by a second concurrent
one with the same certificate, and every party that dials in again after its stream ended
(rejoined) is counted by kind, (the certificate's fingerprint, the reason), in a bounded table
(actors/remote/refused.py, :meth:`Gateway.refusals`; the declared parties' kinds are never
crowded out by undeclared ones, and the log of joins and leaves is counted and its last
entries kept): the driver prints each kind, rate-limited,
and report.json lists them (actors/run/remote.py). The same agent process dialling in again
(its hello's ``instance``) rejoins even if its old stream has not been seen to end; another
process's stream replaces the first, whose agent is told (``agent.end`` with ``replaced``)
before its stream closes. A TLS handshake the market's TLS refuses (a foreign CA, plain TCP)
never reaches this code and is not counted. Every later
frame must be an ``agent.reply`` to a call made on this connection (the codec's replay guard,
fresh per connection, checks its sequence); anything else closes the connection.

The curator and the driver never see a connection: they call a party's stand-in
(actors/remote/handles.py), which becomes :meth:`Gateway.invoke`, one ``agent.call`` frame on
the party's current stream and its reply, checked for its method (actors/remote/control.py). A
party not connected, one whose connection breaks while a call is in flight, or one that does not
answer within ``call_timeout``, answers with its method's absent value (a lost party to the
caller: counted against T at the next deadline); an agent that reconnects replaces its old
stream and is called again from then on. A link that blinks costs nothing: a call to a party
whose stream broke less than ``reconnect_grace`` seconds ago (the run's phase deadline) waits
for it to come back within that grace and the call's timeout, and a call whose stream broke
while it was in flight is sent again on the new stream under the same token (``CallBody.token``:
the agent answers a token it already answered from its cache, so no call runs twice). A party
that never joined, or left longer ago, answers absent at once. :meth:`reachable` names the
parties a lost owner may be taken back among: connected, offer taken, and shown to be there (no
call left unanswered on its stream since it last answered or dialled in). :meth:`finish` tells
every agent the market is over.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import ray

from dpmarket.actors.remote.channel import peer_certificate, start_server
from dpmarket.actors.remote.control import ABSENT, RAISE, AgentUnavailable, pack_call, read_result
from dpmarket.actors.remote.refused import (
    LOG_KEPT,
    REJOINED,
    REPLACED,
    EventLog,
    RefusalCounts,
)
from dpmarket.actors.remote.tls import fingerprint, server_credentials
from dpmarket.protocol.agents.messages import (
    GATEWAY,
    ROLES,
    CallBody,
    EndBody,
    HelloBody,
    ReplyBody,
)
from dpmarket.protocol.wire.codec import ReplayGuard, decode, encode
from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.protocol.wire.parties import Outbox

__all__ = ["GATEWAY", "Gateway", "GatewayActor"]

HELLO_TIMEOUT = 10.0  # seconds an admitted connection has to say who it is
ERRORS_KEPT = 20  # each party's last call or protocol errors kept (a redialling party grows none)


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
    fingerprint: str = ""
    instance: str = ""  # the agent process's own token from its hello (empty: not said)
    closed: bool = False

    def close(self) -> None:
        self.closed = True
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
        reconnect_grace: float = 0.0,
        log_kept: int = LOG_KEPT,
    ) -> None:
        """``parties``: name -> (role, certificate fingerprint) of every declared remote party;
        ``reconnect_grace``: seconds a call waits for a party whose stream broke to come back
        (module docstring); ``log_kept``: the log's last entries kept (every one counted)."""
        for name, (role, _) in parties.items():
            if role not in ROLES:
                raise ValueError(f"{name}: role {role!r} is not one of {ROLES}")
        self.market, self.listen = market, listen
        self._credentials = server_credentials(certificate, key, client_ca)
        self.parties = dict(parties)
        self._by_fingerprint = {fp: name for name, (_, fp) in parties.items()}
        self.call_timeout, self.reconnect_grace = call_timeout, reconnect_grace
        self._left: dict[str, float] = {}  # party -> when its last stream broke (monotonic)
        self._took_offer: set[str] = set()  # owners whose last offer (begin) was accepted
        self._tokens = 0
        self._nonce = secrets.token_hex(8)  # a token of this gateway is never another's
        self._sessions: dict[str, _Session] = {}
        self._server: grpc.aio.Server | None = None
        self.port = 0
        self._log = EventLog(log_kept)  # joins, leaves and first refusals: counted, last kept
        self.errors: dict[str, list[str]] = {}  # each party's last ERRORS_KEPT call errors
        # refused, replaced, rejoined: by (fingerprint, reason); the declared never pooled
        self._counts = RefusalCounts(self._by_fingerprint)
        self._silent: set[str] = set()  # left a call unanswered on an open stream (reachable)

    @property
    def log(self) -> list[dict[str, Any]]:
        """The log's last entries (at most ``log_kept``), oldest first."""
        return self._log.entries()

    def _note(self, event: str, party: str | None, detail: str = "") -> None:
        self._log.add(time.time(), event, party, detail)
        if event == "refused":
            print(f"dpmarket gateway: refused a connection: {detail}", file=sys.stderr, flush=True)

    def _error(self, party: str, why: str) -> None:
        """One call or protocol error of ``party``; its last ERRORS_KEPT are kept."""
        kept = self.errors.setdefault(party, [])
        kept.append(why[:300])
        del kept[:-ERRORS_KEPT]

    def _count(self, claimed: str | None, fp: str | None, reason: str, detail: str) -> bool:
        """One refused, replaced or rejoined connection (actors/remote/refused.py); True for the
        first of its kind."""
        return self._counts.add(claimed, fp, reason, detail)

    async def refusals(self) -> list[dict[str, Any]]:
        """Every kind of refused, replaced or rejoined connection with its count so far (at
        most ``MAX_KINDS`` undeclared kinds, one per reason past them, and the declared
        parties' own, however many connections came)."""
        return self._counts.entries()

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

    async def reachable(self) -> list[str]:
        """The parties connected now that took the current offer (a node takes none) and
        showed they are there: none of them leaves a call unanswered on its current stream,
        nor let one time out on an open stream since it last answered or dialled in (a
        connected owner that stays silent is no more reachable than an absent one). A lost
        owner among them may be asked again (actors/parties/transport.py)."""
        owners = {p for p, (role, _) in self.parties.items() if role == "owner"}
        return sorted(
            p
            for p, session in self._sessions.items()
            if (p not in owners or p in self._took_offer)
            and p not in self._silent
            and not session.pending
        )

    async def report(self) -> dict[str, Any]:
        """Joins, leaves and refusals so far (each (party, event) counted, the last entries
        kept: :class:`EventLog`), and each party's last call errors."""
        return {"log": self._log.summary(), "errors": {p: list(e) for p, e in self.errors.items()},
                "port": self.port}  # fmt: skip

    async def _session_of(self, party: str, deadline: float) -> _Session | None:
        """The party's open stream, or the one it comes back with within the reconnect grace
        of its last break (and before ``deadline``); None: absent."""
        while True:
            session, now = self._sessions.get(party), time.monotonic()
            if session is not None and not session.closed:
                return session
            left = now if session is not None else self._left.get(party)  # closing right now
            if left is None or now >= min(left + self.reconnect_grace, deadline):
                return None
            await asyncio.sleep(0.05)

    async def _call(self, party: str, method: str, packed: bytes) -> tuple[ReplyBody | None, str]:
        """Send one call, again on a new stream if its stream breaks within the grace; the
        reply (None: none) and why there is none."""
        deadline = time.monotonic() + self.call_timeout
        self._tokens += 1
        token, why = f"{self._nonce}:{self._tokens}", "not connected"
        while (session := await self._session_of(party, deadline)) is not None:
            session.calls += 1
            call = session.calls
            fut: asyncio.Future[ReplyBody | None] = asyncio.get_running_loop().create_future()
            session.pending[call] = fut
            body = CallBody(call, method, packed, token=token)
            session.queue.put_nowait(encode(session.outbox.make(party, 0, body)))
            try:
                reply = await asyncio.wait_for(fut, max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                if not session.closed:  # connected, and silent: not reachable until it answers
                    self._silent.add(party)
                return None, f"no answer to {method} within {self.call_timeout:g} s"
            finally:
                session.pending.pop(call, None)
            if reply is not None:
                return reply, ""
            why = "disconnected during the call"  # sent again if it comes back in the grace
        return None, why

    async def invoke(self, party: str, method: str, args: tuple[Any, ...]) -> Any:
        """Call ``method`` of remote ``party`` through its stream (module docstring)."""
        role = self.parties[party][0]
        absent = ABSENT[(role, method)]  # KeyError: not a method a remote party has
        reply, why = await self._call(party, method, pack_call(role, method, args))
        if method == "begin" or (reply is not None and reply.declined):  # declined at any call
            self._took_offer.discard(party)
        if method == "begin" and reply is not None and not reply.declined and reply.error is None:
            self._took_offer.add(party)
        if reply is not None:
            if reply.declined:
                why = f"declined: {reply.error or 'its policy'}"
                if method == "begin":  # the owner's reasons go into the run's report
                    self._error(party, why)
                    return {"accepted": False, "reasons": [reply.error or "declined"]}
            elif reply.error is not None:
                why = f"{method} failed: {reply.error}"
            else:
                try:
                    return read_result(role, method, reply.result)
                except RemoteProtocolError as exc:
                    why = f"{method}: refused its result ({exc})"
        self._error(party, why)
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
    async def _refuse(
        self,
        context: Any,
        code: grpc.StatusCode,
        detail: str,
        seen: tuple[str | None, str | None, str] = (None, None, "refused"),
    ) -> None:
        """Refuse the connection; ``seen``: (the name claimed, the fingerprint, the reason).
        Only the first of each kind goes into the gateway's own log."""
        if self._count(*seen, detail):
            self._note("refused", None, detail)
        await context.abort(code, detail)

    async def _admit(self, requests: AsyncIterator[bytes], context: Any) -> _Session | None:
        """The party this connection is, from its certificate and its hello, or refused."""
        pem = peer_certificate(context)
        if pem is None:
            await self._refuse(
                context, grpc.StatusCode.UNAUTHENTICATED, "no client certificate",
                (None, None, "no client certificate"),
            )  # fmt: skip
            return None
        fp = fingerprint(pem)
        party = self._by_fingerprint.get(fp)
        if party is None:  # refused on its certificate alone: its hello is never read
            await self._refuse(
                context,
                grpc.StatusCode.UNAUTHENTICATED,
                f"certificate {fp} is not declared for any party of market {self.market!r}",
                (None, fp, "certificate not declared"),
            )
            return None
        guard = ReplayGuard()
        try:  # the hello: what a declared certificate's connection claims to be
            first = await asyncio.wait_for(requests.__anext__(), HELLO_TIMEOUT)
            hello = decode(first, guard)
        except (TimeoutError, StopAsyncIteration, RemoteProtocolError) as exc:
            detail = f"{party}: no valid hello ({type(exc).__name__}: {exc})"
            seen = (party, fp, "no valid hello")
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, detail, seen)
            return None
        claimed, body = hello.sender, hello.body
        role = self.parties[party][0]
        if not isinstance(body, HelloBody):
            detail = f"{party}: first frame {hello.kind}"
            seen = (claimed, fp, "first frame not a hello")
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, detail, seen)
            return None
        if claimed != party or body.role != role:
            await self._refuse(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"the certificate of {role} {party!r} ({fp}) claims to be {body.role} {claimed!r}",
                (claimed, fp, f"name claimed with the certificate of {party}"),
            )
            return None
        if hello.run != self.market or hello.recipient != GATEWAY:
            await self._refuse(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{party}: asked for market {hello.run!r}; this is market {self.market!r}",
                (claimed, fp, "another market"),
            )
            return None
        outbox = Outbox(self.market, GATEWAY)
        return _Session(party, role, outbox, guard, fingerprint=fp, instance=body.instance)

    async def _connect(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        session = await self._admit(requests, context)
        if session is None:
            return
        party = session.party
        old = self._sessions.get(party)
        rejoined = old is None and party in self._left
        if old is not None and _same_agent(old, session):  # its own old stream: ended or dead
            old.close()
            old, rejoined = None, True
        if old is not None:  # a second concurrent stream: it replaces the first
            reason = "replaced by a newer stream with this party's certificate"
            self._count(party, session.fingerprint, REPLACED, f"{party}: {reason}")
            # its agent is told why (a second agent with its certificate is running), then
            # the stream closes
            end = EndBody(reason, finished=False, replaced=True)
            old.queue.put_nowait(encode(old.outbox.make(party, 0, end)))
            old.close()
        elif rejoined:
            self._count(party, session.fingerprint, REJOINED, f"{party}: dialled in again")
        self._silent.discard(party)  # dialling in again shows it is there (reachable)
        self._sessions[party] = session
        self._note("joined", party, "rejoined" if rejoined else "")
        reader = asyncio.ensure_future(self._read(session, requests))
        try:
            while (frame := await session.queue.get()) is not None:
                yield frame
        finally:
            reader.cancel()
            session.close()
            if self._sessions.get(party) is session:
                del self._sessions[party]
                self._left[party] = time.monotonic()
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
                self._silent.discard(session.party)  # it answers: it is there (reachable)
                fut = session.pending.get(body.call)
                if fut is None:
                    continue  # a reply to a call that timed out: dropped
                if not fut.done():
                    fut.set_result(body)
        except RemoteProtocolError as exc:
            self._error(session.party, f"protocol: {exc}")
            self._note("dropped", session.party, str(exc))
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            return  # the stream ended or broke: the session closes below, its calls answer absent
        finally:
            session.close()


def _same_agent(old: _Session, new: _Session) -> bool:
    """Whether ``new`` is the agent of ``old`` dialling in again: the old stream ended (or is
    closing), or the hello names the same agent process (its stream is dead at the agent, not
    yet at the market: a link that went silent)."""
    return old.closed or (bool(new.instance) and new.instance == old.instance)


GatewayActor = ray.remote(num_cpus=0)(Gateway)
"""The Ray actor of :class:`Gateway` (one per market run, on the driver's node)."""

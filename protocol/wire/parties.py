"""What every sans-I/O party shares: the Party protocol, outbound sequencing, dispatch.

A party consumes one decoded :class:`Message` at a time and returns the messages it wants sent;
``expire(now)`` tells it the time so it can act on deadlines (it never reads a clock). Each role
keeps one transition table ``{(state, kind): handler}``; :func:`dispatch` checks a message against
the table *before* any state changes, so a refused message leaves the party untouched.

Anything a peer sends that a party cannot use is the peer's fault: a ``ValueError``,
``TypeError`` or ``ArithmeticError`` raised while a handler uses a peer's values comes out of
:func:`dispatch` as :class:`RemoteProtocolError`, never as a crash of the party. Handlers check
a message's values before they change state (the hypothesis tests of every party state check
that a refused message leaves the party as it was).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from dpmarket.protocol.wire.codec import Body, Message
from dpmarket.protocol.wire.errors import RemoteProtocolError

__all__ = ["Outbox", "Party", "body_of", "dispatch"]


class Party(Protocol):
    """The contract every transport relies on."""

    name: str

    def receive(self, msg: Message) -> list[Message]: ...

    def expire(self, now: float) -> list[Message]: ...


class Outbox:
    """Builds outbound messages with a strictly increasing ``seq`` per sender."""

    def __init__(self, run: str, sender: str) -> None:
        self.run = run
        self.sender = sender
        self._seq = 0

    def make(self, recipient: str, round_: int, body: Body) -> Message:
        self._seq += 1
        return Message(self.run, round_, self.sender, recipient, self._seq, body)


S = TypeVar("S")
BodyT = TypeVar("BodyT", bound=Body)
Handler = Callable[[Message], list[Message]]


def dispatch(
    party_name: str,
    run: str,
    state: S,
    table: Mapping[tuple[S, str], Handler],
    msg: Message,
) -> list[Message]:
    """Route ``msg`` through the transition table or refuse it without touching state."""
    if msg.run != run:
        raise RemoteProtocolError(f"run: message for run {msg.run!r} reached run {run!r}")
    if msg.recipient != party_name:
        raise RemoteProtocolError(f"to: message for {msg.recipient!r} reached {party_name!r}")
    handler = table.get((state, msg.kind))
    if handler is None:
        raise RemoteProtocolError(f"kind: {msg.kind} is not expected by {party_name} in {state}")
    try:
        return handler(msg)
    except (ValueError, TypeError, ArithmeticError) as exc:  # a peer's value the party cannot use
        raise RemoteProtocolError(f"{msg.kind}: from {msg.sender}: {exc}") from None


def body_of(msg: Message, cls: type[BodyT]) -> BodyT:
    """The message's body as ``cls``, or a refusal naming the mismatch."""
    if not isinstance(msg.body, cls):
        raise RemoteProtocolError(f"kind: expected {cls.KIND}, got {msg.kind}")
    return msg.body

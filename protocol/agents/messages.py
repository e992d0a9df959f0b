"""Control frames between the market's gateway and a remote agent (kinds ``agent.*``).

An agent (an owner or a compute node run by another organisation) holds one stream to the
market. Everything crosses it as frames of the one codec (protocol/wire/codec.py): the agent's
``agent.hello``, the market's ``agent.call`` (one control call the driver or the curator makes
on a party's stand-in: its method name and its arguments), the agent's ``agent.reply`` and the
market's ``agent.end``. A call's arguments and a reply's result are msgpack values packed by
:mod:`.records`, bounded by the frame limits before they are unpacked and checked method by
method, so nothing reaches an agent's parties but checked values.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpmarket.protocol.wire.checks import Count
from dpmarket.protocol.wire.codec import Body, register

__all__ = ["GATEWAY", "ROLES", "CallBody", "EndBody", "HelloBody", "ReplyBody"]

ROLES = ("owner", "node")
GATEWAY = "market"  # the gateway's name in frames (sender of calls, recipient of replies)


@register("agent.hello")
@dataclass(frozen=True, slots=True)
class HelloBody(Body):
    """Agent -> market, first on every connection: what the agent is (its name is the
    envelope's sender, checked against its certificate) and the dpmarket it runs."""

    role: str  # one of ROLES (the gateway refuses any other)
    software: str
    # a token the agent process draws once and says on each of its connections (empty: not
    # said): the gateway tells the same agent dialling in again (a blink) from a second agent
    # with the same certificate (actors/remote/gateway.py)
    instance: str = ""


@register("agent.call")
@dataclass(frozen=True, slots=True)
class CallBody(Body):
    """Market -> agent: control call ``call`` (numbered per connection) of ``method`` with its
    packed arguments (:func:`.records.pack`)."""

    call: Count
    method: str
    args: bytes
    # the same call sent again on a later connection of the same party carries the same token
    # (empty: never sent again); an agent that already answered that token answers it with the
    # same reply without running the call again (at most once: actors/remote/agent.py)
    token: str = ""


@register("agent.reply")
@dataclass(frozen=True, slots=True)
class ReplyBody(Body):
    """Agent -> market: the answer to call ``call``: its packed result, or ``error`` (the call
    failed: the message, nothing else), or ``declined`` (the owner's policy refused the
    purchase: it takes no part and counts against T like a lost owner)."""

    call: Count
    result: bytes = b""
    error: str | None = None
    declined: bool = False


@register("agent.end")
@dataclass(frozen=True, slots=True)
class EndBody(Body):
    """Market -> agent: the market has finished (the agent exits) or refuses it (``reason``)."""

    reason: str
    finished: bool = True
    # the market closed this stream because a newer one with the same certificate replaced
    # it (another agent runs as this party): the agent stops, exit 2 (added with a default)
    replaced: bool = False

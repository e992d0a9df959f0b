"""One error hierarchy for the whole protocol layer.

``ProtocolError`` is the root. ``LocalProtocolError`` means *we* misused the protocol (built an
invalid message, asked a party to do something its state forbids); ``RemoteProtocolError`` means
a *peer* sent something malformed, unknown, oversized, replayed or out of order. The decoder
raises only ``RemoteProtocolError``; parties raise ``LocalProtocolError`` for misuse and leave
their state untouched when they do. Plain argument checks in pure helpers raise ``ValueError``.
"""

from __future__ import annotations

__all__ = ["LocalProtocolError", "ProtocolError", "RemoteProtocolError"]


class ProtocolError(Exception):
    """Base class of every protocol failure."""


class LocalProtocolError(ProtocolError):
    """This side used the protocol wrongly (invalid message built, illegal transition)."""


class RemoteProtocolError(ProtocolError):
    """A peer sent a frame or message that this side must refuse."""

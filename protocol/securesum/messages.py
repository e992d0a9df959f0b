"""DCA secure sum: the wire bodies of a session and a round, and the packed client sets.

Registered with the codec at import (kinds ``dca.*``); the session and round they belong to are
described in :mod:`.spec`. Bodies follow the codec's evolution rules: fields are only ever added,
as optional.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.wire.checks import Count
from dpmarket.protocol.wire.codec import Body, register

__all__ = [
    "AbortBody",
    "OpenBody",
    "PartialBody",
    "RegisterBody",
    "SeenBody",
    "SharesBody",
    "pack_set",
    "unpack_set",
]

Array = npt.NDArray[np.generic]
BoolArray = npt.NDArray[np.bool_]


@register("dca.register")
@dataclass(frozen=True, slots=True)
class RegisterBody(Body):
    """Client party -> node: roster indices (uint32), raw X25519 public keys (uint8, n x 32) and
    proofs (uint8, n x 32): HMAC under each pair's PRK of :func:`register_info` (only the
    holder of the client's private key, or the node, can compute it). Optional on the wire
    (added field); nodes refuse a registration without them."""

    clients: Array
    public_keys: Array
    proofs: Array | None = None


@register("dca.open")
@dataclass(frozen=True, slots=True)
class OpenBody(Body):
    """Aggregator -> node: the envelope's round opens with this spec; close at ``deadline``."""

    d: int
    sigma_std: float
    sensitivity: float
    label: str
    neighbouring: str
    deadline: float


@register("dca.shares")
@dataclass(frozen=True, slots=True)
class SharesBody(Body):
    """Client party -> node: sealed frames, one row per client (roster indices as uint32).

    ``value_frames`` rows seal a share vector (8 d bytes), ``seed_frames`` rows a 32-byte seed."""

    value_clients: Array
    value_frames: Array
    seed_clients: Array
    seed_frames: Array


@register("dca.seen")
@dataclass(frozen=True, slots=True)
class SeenBody(Body):
    """Node -> node: the clients whose frames this node accepted by its close (packed bits)."""

    received: Array


@register("dca.partial")
@dataclass(frozen=True, slots=True)
class PartialBody(Body):
    """Node -> aggregator: the ring sum (uint64, d) of its shares over the agreed set."""

    total: Array
    included: Array


@register("dca.abort")
@dataclass(frozen=True, slots=True)
class AbortBody(Body):
    """Node -> aggregator: the round ends without a release (too few clients, peer missing)."""

    reason: str
    missing: Count


def pack_set(members: BoolArray) -> npt.NDArray[np.uint8]:
    """A boolean membership vector as packed bits (big-endian bit order)."""
    return np.packbits(np.asarray(members, dtype=np.bool_))


def unpack_set(packed: object, n: int) -> BoolArray | None:
    """Inverse of :func:`pack_set` for ``n`` members; None if the bytes cannot be such a set."""
    if not isinstance(packed, np.ndarray) or packed.dtype != np.uint8 or packed.ndim != 1:
        return None
    if packed.size != (n + 7) // 8:
        return None
    bits = np.unpackbits(packed)
    if bits[n:].any():  # padding bits must be zero
        return None
    return bits[:n].astype(np.bool_)

"""Wire bodies of RACE sketches and releases in the project's msgpack codec.

A frame carries the public family parameters (enough to rebuild the hash functions: family
name, dim, rows, seed, bits, bandwidth), the width, the weight bound and the int64 counters; a
release also carries its :class:`~dpmarket.streams.race.releases.PrivacyStatement`. The codec
checks types; :func:`decode_body` adds what it cannot (counter dtype and shape, width, weight
bound, family parameters, statement), so that any bad frame raises ``RemoteProtocolError`` and
nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from numpy.typing import NDArray

from dpmarket.protocol.wire.codec import Body, Message, decode, encode, register
from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.streams.race.lsh import LshFamily, make_family
from dpmarket.streams.race.queries import RaceQueries, check_width
from dpmarket.streams.race.releases import PrivacyStatement

__all__ = [
    "RaceReleaseBody",
    "RaceSketchBody",
    "decode_body",
    "encode_body",
    "family_fields",
    "family_of",
    "statement_fields",
    "statement_of",
]

_COUNTS_DTYPE = "<i8"


@register("race.sketch")
@dataclass(frozen=True, slots=True)
class RaceSketchBody(Body):
    """A RACE sketch: the public family parameters and the int64 counters (rows x width)."""

    family: str
    dim: int
    rows: int
    width: int
    seed: int
    bits: int
    weight_bound: int
    bandwidth: float | None
    counts: NDArray[Any]


@register("race.release")
@dataclass(frozen=True, slots=True)
class RaceReleaseBody(Body):
    """A released sketch: family parameters, noisy int64 counters and the privacy statement."""

    family: str
    dim: int
    rows: int
    width: int
    seed: int
    bits: int
    weight_bound: int
    bandwidth: float | None
    counts: NDArray[Any]
    mechanism: str
    noise: tuple[float, ...]
    sensitivity: float
    neighbouring: str
    epsilon: float | None
    delta: float


BodyT = TypeVar("BodyT", RaceSketchBody, RaceReleaseBody)


def family_fields(sketch: RaceQueries) -> dict[str, Any]:
    """The body fields that describe ``sketch``'s family, width and weight bound."""
    f = sketch.family
    return {
        "family": f.name, "dim": f.dim, "rows": f.rows, "width": sketch.width, "seed": f.seed,
        "bits": f.bits, "weight_bound": sketch.weight_bound,
        "bandwidth": getattr(f, "bandwidth", None),
    }  # fmt: skip


def statement_fields(statement: PrivacyStatement) -> dict[str, Any]:
    """The body fields of a release's privacy statement."""
    s = statement
    return {
        "mechanism": s.mechanism, "noise": s.noise, "sensitivity": s.sensitivity,
        "neighbouring": s.neighbouring, "epsilon": s.epsilon, "delta": s.delta,
    }  # fmt: skip


def encode_body(body: RaceSketchBody | RaceReleaseBody) -> bytes:
    """One msgpack frame of the project's codec holding ``body``."""
    message = Message(run="race", round=0, sender="sketch", recipient="sketch", seq=0, body=body)
    return encode(message)


def decode_body(data: bytes, kind: type[BodyT]) -> BodyT:
    """Decode a frame of body ``kind`` and check what the codec cannot: counter dtype and shape,
    width and weight bound (semantic checks live here, not in the body, so that the codec's
    property tests can build arbitrary bodies)."""
    body = decode(data).body
    if not isinstance(body, kind):
        raise RemoteProtocolError(f"kind: expected {kind.KIND}, got {body.KIND}")
    try:
        _check_counts(body)
    except ValueError as exc:
        raise RemoteProtocolError(f"{body.KIND}: {exc}") from None
    return body


def _check_counts(body: RaceSketchBody | RaceReleaseBody) -> None:
    shape = (body.rows, body.width)
    if body.counts.dtype.str != _COUNTS_DTYPE or body.counts.shape != shape:
        raise ValueError(
            f"counts must be {_COUNTS_DTYPE} of shape {shape}, got {body.counts.shape}"
        )
    if body.weight_bound < 1:
        raise ValueError(f"weight_bound must be positive, got {body.weight_bound}")
    check_width(body.width)


def family_of(body: RaceSketchBody | RaceReleaseBody) -> LshFamily:
    """The LSH family a body describes; bad parameters raise ``RemoteProtocolError``."""
    try:
        return make_family(
            body.family, body.dim, body.rows, body.seed, bandwidth=body.bandwidth, bits=body.bits
        )
    except ValueError as exc:
        raise RemoteProtocolError(f"{body.KIND}: {exc}") from None


def statement_of(body: RaceReleaseBody) -> PrivacyStatement:
    """The privacy statement a release body carries; a bad one raises ``RemoteProtocolError``."""
    try:
        return PrivacyStatement(
            body.mechanism, body.noise, body.sensitivity, body.neighbouring, body.epsilon,
            body.delta,
        )  # fmt: skip
    except ValueError as exc:
        raise RemoteProtocolError(f"{body.KIND}: {exc}") from None

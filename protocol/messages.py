"""Wire messages: typed frozen dataclasses and the one msgpack codec of the project.

Theory of operation
-------------------
Every frame is a msgpack map (``use_bin_type=True`` on encode, ``raw=False`` and
``strict_map_key=True`` on decode, hard length limits on every container) holding the envelope

    {"v": 1, "kind": str, "run": str, "round": int, "from": str, "to": str, "seq": int,
     "body": {...}}

``kind`` selects a registered body dataclass; the body's fields are checked against the
dataclass's type hints. numpy arrays travel as ``{"dtype": "<f4", "shape": [..], "data": bytes}``
with a dtype allow-list (never pickle, never object arrays) and a byte cap (which also bounds the
extents of empty arrays); boolean data must be bytes 0/1. Floats must be finite. Decoded arrays
are read-only views of ``bytes`` the message owns, never of the caller's buffer. ``encode``
re-checks the body (its arrays may have been mutated since construction), so every frame it
emits is one ``decode`` accepts.

``decode`` either returns a valid :class:`Message` or raises :class:`RemoteProtocolError` naming
the offending field; it never raises anything else (a hypothesis test feeds it random and mutated
frames). Passing a :class:`ReplayGuard` additionally refuses frames whose ``seq`` does not
strictly increase per (run, sender, recipient) or whose ``round`` goes backwards; the guard is
updated only after the frame was fully accepted.

Evolution rules (as dp_accounting's event schema)
------------------------------------------------
1. Never remove a body class, a field, or a registered ``kind``.
2. Add fields only with a default, so that frames from an older sender still decode.
3. Never change what a field means or its type: add a new field or a new kind instead.
4. ``PROTOCOL_VERSION`` changes only when the envelope itself changes; a decoder refuses other
   versions. Unknown kinds and unknown body keys are refused (strict schema).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, Union

import msgpack
import numpy as np
import numpy.typing as npt

from dpmarket.protocol.errors import LocalProtocolError, ProtocolError, RemoteProtocolError

__all__ = [
    "ALLOWED_DTYPES",
    "MAX_ARRAY_BYTES",
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "Body",
    "Message",
    "ReplayGuard",
    "body_kinds",
    "decode",
    "encode",
    "register",
]

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 64 * 1024 * 1024  # a whole frame
MAX_ARRAY_BYTES = 48 * 1024 * 1024  # one array's payload
MAX_ARRAY_DIMS = 4
MAX_STR_LEN = 256  # names, run ids, kinds
MAX_TEXT_BYTES = 64 * MAX_STR_LEN  # other string fields, in UTF-8 bytes
MAX_LIST_LEN = 1_000_000
MAX_MAP_LEN = 64
MAX_INT = 2**64 - 1
MIN_INT = -(2**63)
MAX_COUNTER = 2**53  # round and seq stay exact in every language's doubles

ALLOWED_DTYPES = frozenset(
    {"|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f4", "<f8"}
)

Array = npt.NDArray[Any]
_ENVELOPE_KEYS = frozenset({"v", "kind", "run", "round", "from", "to", "seq", "body"})


class Body:
    """Base of every message body. Subclasses are frozen dataclasses registered by ``kind``."""

    KIND: ClassVar[str] = ""

    def __post_init__(self) -> None:
        _check_body(self, LocalProtocolError)


_REGISTRY: dict[str, type[Body]] = {}
_HINTS: dict[type[Body], dict[str, Any]] = {}
B = TypeVar("B", bound=type[Body])


def register(kind: str) -> Callable[[B], B]:
    """Class decorator: register a frozen dataclass body under ``kind`` (never reuse a kind)."""

    def wrap(cls: B) -> B:
        if kind in _REGISTRY:
            raise ValueError(f"message kind {kind!r} is already registered")
        if not dataclasses.is_dataclass(cls):
            raise ValueError(f"{cls.__name__} must be a dataclass")
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if not _supported(hints[f.name]):
                raise ValueError(f"{cls.__name__}.{f.name}: unsupported field type {f.type!r}")
        cls.KIND = kind
        _REGISTRY[kind] = cls
        _HINTS[cls] = hints
        return cls

    return wrap


def body_kinds() -> list[str]:
    """All registered message kinds, sorted."""
    return sorted(_REGISTRY)


@dataclass(frozen=True, slots=True)
class Message:
    """An envelope around one typed body. ``round`` is the epoch or DCA round number."""

    run: str
    round: int
    sender: str
    recipient: str
    seq: int
    body: Body

    def __post_init__(self) -> None:
        for name in ("run", "sender", "recipient"):
            _check_str(name, getattr(self, name), LocalProtocolError)
        for name in ("round", "seq"):
            _check_counter(name, getattr(self, name), LocalProtocolError)
        if type(self.body) not in _HINTS:
            raise LocalProtocolError(f"body: {type(self.body).__name__} is not a registered kind")

    @property
    def kind(self) -> str:
        return self.body.KIND


# ---------------------------------------------------------------------------------- checks
ErrorType = type[ProtocolError]
_SCALARS = (bool, int, float, str, bytes, type(None))


def _show(value: object) -> str:
    """A short, never-failing description of a peer's value for an error message."""
    if isinstance(value, _SCALARS):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    return f"<{type(value).__name__}>"


def _supported(hint: Any) -> bool:
    """Whether the codec can carry a field of type ``hint`` (checked once, in ``register``)."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return len(inner) == 1 and _supported(inner[0])
    if origin is tuple:
        args = typing.get_args(hint)
        return len(args) == 2 and args[1] is Ellipsis and _supported(args[0])
    return hint in (bool, int, float, str, bytes, np.ndarray) or origin is np.ndarray


def _utf8_len(name: str, value: str, err: ErrorType) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise err(f"{name}: not encodable as UTF-8") from None


def _check_str(name: str, value: object, err: ErrorType) -> str:
    if not isinstance(value, str):
        raise err(f"{name}: expected a string, got {type(value).__name__}")
    if not value or len(value) > MAX_STR_LEN:
        raise err(f"{name}: length {len(value)} outside 1..{MAX_STR_LEN}")
    _utf8_len(name, value, err)
    return value


def _check_counter(name: str, value: object, err: ErrorType) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise err(f"{name}: expected an integer, got {type(value).__name__}")
    if not 0 <= value <= MAX_COUNTER:
        raise err(f"{name}: {value} outside 0..2^53")
    return value


def _capacity(shape: list[int] | tuple[int, ...], itemsize: int) -> int:
    """Bytes the shape would need if every zero extent were one (bounds empty arrays too)."""
    return math.prod(max(s, 1) for s in shape) * itemsize


def _check_array(name: str, value: object, err: ErrorType) -> None:
    if not isinstance(value, np.ndarray):
        raise err(f"{name}: expected a numpy array, got {type(value).__name__}")
    if value.dtype.str not in ALLOWED_DTYPES:
        raise err(f"{name}: dtype {value.dtype.str} is not allowed")
    if value.ndim > MAX_ARRAY_DIMS:
        raise err(f"{name}: {value.ndim} dimensions, at most {MAX_ARRAY_DIMS}")
    if _capacity(value.shape, value.dtype.itemsize) > MAX_ARRAY_BYTES:
        raise err(f"{name}: shape {list(value.shape)} exceeds {MAX_ARRAY_BYTES} bytes")
    if value.dtype.kind == "f" and not bool(np.isfinite(value).all()):
        raise err(f"{name}: contains NaN or infinity")


def _check_value(name: str, hint: Any, value: object, err: ErrorType) -> object:
    """Check ``value`` against a type hint; return it (ints widened to float where asked)."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check_value(name, inner[0], value, err)
    if origin is tuple:
        item_hint = typing.get_args(hint)[0]
        if not isinstance(value, (tuple, list)):
            raise err(f"{name}: expected a list, got {type(value).__name__}")
        if len(value) > MAX_LIST_LEN:
            raise err(f"{name}: {len(value)} items, at most {MAX_LIST_LEN}")
        return tuple(_check_value(f"{name}[{i}]", item_hint, v, err) for i, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise err(f"{name}: expected a boolean, got {type(value).__name__}")
        return value
    if hint is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise err(f"{name}: expected an integer, got {type(value).__name__}")
        if not MIN_INT <= value <= MAX_INT:
            raise err(f"{name}: integer {value} out of the 64-bit range")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise err(f"{name}: expected a number, got {type(value).__name__}")
        if isinstance(value, int) and not MIN_INT <= value <= MAX_INT:
            raise err(f"{name}: integer {value} out of the 64-bit range")
        if not math.isfinite(value):
            raise err(f"{name}: must be finite, got {value}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise err(f"{name}: expected a string, got {type(value).__name__}")
        if _utf8_len(name, value, err) > MAX_TEXT_BYTES:
            raise err(f"{name}: string of {len(value)} characters is too long")
        return value
    if hint is bytes:
        if not isinstance(value, bytes):
            raise err(f"{name}: expected bytes, got {type(value).__name__}")
        return value
    if hint is np.ndarray or typing.get_origin(hint) is np.ndarray:
        _check_array(name, value, err)
        return value
    raise err(f"{name}: unsupported field type {hint!r}")  # pragma: no cover - see register


def _check_body(body: Body, err: ErrorType) -> None:
    hints = _HINTS.get(type(body))
    if hints is None:
        raise err(f"body: {type(body).__name__} is not a registered message kind")
    for f in dataclasses.fields(body):  # type: ignore[arg-type]
        value = getattr(body, f.name)
        checked = _check_value(f"{body.KIND}.{f.name}", hints[f.name], value, err)
        if checked is not value:
            object.__setattr__(body, f.name, checked)


# ------------------------------------------------------------------------------ the codec
def _to_wire(value: object) -> object:
    if isinstance(value, np.ndarray):
        # tobytes(order="C") for any layout; np.ascontiguousarray would turn 0-d into 1-d.
        return {"dtype": value.dtype.str, "shape": list(value.shape), "data": value.tobytes("C")}
    if isinstance(value, tuple):
        return [_to_wire(v) for v in value]
    return value


def encode(msg: Message) -> bytes:
    """Encode a message to one msgpack frame that :func:`decode` accepts.

    The body is checked again first (its arrays may have been mutated since construction), so
    an invalid body raises :class:`LocalProtocolError` here rather than being refused remotely.
    """
    if not isinstance(msg, Message):
        raise LocalProtocolError(f"msg: expected a Message, got {type(msg).__name__}")
    _check_body(msg.body, LocalProtocolError)
    body = {f.name: _to_wire(getattr(msg.body, f.name)) for f in dataclasses.fields(msg.body)}  # type: ignore[arg-type]
    frame = {
        "v": PROTOCOL_VERSION,
        "kind": msg.kind,
        "run": msg.run,
        "round": msg.round,
        "from": msg.sender,
        "to": msg.recipient,
        "seq": msg.seq,
        "body": body,
    }
    data: bytes = msgpack.packb(frame, use_bin_type=True)
    if len(data) > MAX_FRAME_BYTES:
        raise LocalProtocolError(f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    return data


def _array_from_wire(name: str, raw: object) -> Array:
    err = RemoteProtocolError
    if not isinstance(raw, dict) or set(raw) != {"dtype", "shape", "data"}:
        raise err(f"{name}: an array must be a map of exactly dtype, shape, data")
    dtype, shape, data = raw["dtype"], raw["shape"], raw["data"]
    if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:
        raise err(f"{name}: dtype {_show(dtype)} is not allowed")
    if not isinstance(shape, list) or len(shape) > MAX_ARRAY_DIMS:
        raise err(f"{name}: shape must be a list of at most {MAX_ARRAY_DIMS} sizes")
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise err(f"{name}: shape entries must be non-negative integers")
    if not isinstance(data, bytes):
        raise err(f"{name}: data must be bytes")
    itemsize = np.dtype(dtype).itemsize
    if _capacity(shape, itemsize) > MAX_ARRAY_BYTES:
        raise err(f"{name}: shape {shape} exceeds {MAX_ARRAY_BYTES} bytes")
    if len(data) != math.prod(shape) * itemsize:
        raise err(f"{name}: {len(data)} data bytes do not match shape {shape} of {dtype}")
    if dtype == "|b1" and data.translate(None, b"\x00\x01"):
        raise err(f"{name}: boolean data must be bytes 0 or 1")
    # A read-only view of the frame's own immutable ``bytes``: never aliases a caller's buffer.
    arr = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(tuple(shape))
    _check_array(name, arr, err)
    return arr


def _from_wire(name: str, hint: Any, raw: object) -> object:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        if raw is None:
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
        origin = typing.get_origin(hint)
    if hint is np.ndarray or origin is np.ndarray:
        return _array_from_wire(name, raw)
    if origin is tuple and isinstance(raw, list):
        item_hint = typing.get_args(hint)[0]
        return tuple(_from_wire(f"{name}[{i}]", item_hint, v) for i, v in enumerate(raw))
    return raw


def _refuse_ext(code: int, data: bytes) -> object:
    raise ValueError(f"extension type {code} is not part of the protocol")


def _unpack(data: object) -> dict[str, Any]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RemoteProtocolError(f"frame: expected bytes, got {type(data).__name__}")
    size = memoryview(data).nbytes
    if size > MAX_FRAME_BYTES:
        raise RemoteProtocolError(f"frame: {size} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        obj = msgpack.unpackb(
            bytes(data),
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=4 * MAX_TEXT_BYTES,  # so that the field check names it
            max_bin_len=MAX_ARRAY_BYTES,
            max_array_len=MAX_LIST_LEN,
            max_map_len=MAX_MAP_LEN,
            max_ext_len=0,
            ext_hook=_refuse_ext,
        )
    except Exception as exc:  # msgpack raises many types for garbage; all mean the same
        reason = type(exc).__name__
        raise RemoteProtocolError(f"frame: not a valid msgpack frame ({reason})") from None
    if not isinstance(obj, dict):
        raise RemoteProtocolError(f"frame: expected a map, got {type(obj).__name__}")
    return obj


def _body_values(kind: str, raw_body: object) -> dict[str, object]:
    """The body's constructor arguments from the wire: strict keys, arrays rebuilt."""
    if not isinstance(raw_body, dict):
        raise RemoteProtocolError(f"body: expected a map for {kind}")
    cls = _REGISTRY[kind]
    hints = _HINTS[cls]
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = ", ".join(sorted(map(_show, set(raw_body) - set(fields))))
    if unknown:
        raise RemoteProtocolError(f"{kind}: unknown fields [{unknown}]")
    values: dict[str, object] = {}
    for name, f in fields.items():
        if name in raw_body:
            values[name] = _from_wire(f"{kind}.{name}", hints[name], raw_body[name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RemoteProtocolError(f"{kind}.{name}: missing")
    return values


def decode(data: bytes | bytearray | memoryview, guard: ReplayGuard | None = None) -> Message:
    """Decode one frame; raise :class:`RemoteProtocolError` naming the problem, nothing else.

    Arrays in the result are read-only views of bytes objects owned by the message (``decode``
    copies a ``bytearray``/``memoryview`` input first), so no later write by anyone changes it.
    """
    frame = _unpack(data)
    keys = set(frame)
    if keys != _ENVELOPE_KEYS:
        missing = sorted(_ENVELOPE_KEYS - keys)
        extra = ", ".join(sorted(map(_show, keys - _ENVELOPE_KEYS)))
        raise RemoteProtocolError(f"envelope: missing {missing}, unknown [{extra}]")
    version = frame["v"]
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise RemoteProtocolError(f"v: unsupported protocol version {_show(version)}")
    kind = frame["kind"]
    if not isinstance(kind, str) or kind not in _REGISTRY:
        raise RemoteProtocolError(f"kind: unknown message kind {_show(kind)}")
    values = _body_values(kind, frame["body"])
    try:
        msg = Message(
            run=frame["run"],
            round=frame["round"],
            sender=frame["from"],
            recipient=frame["to"],
            seq=frame["seq"],
            body=_REGISTRY[kind](**values),
        )
    except RemoteProtocolError:
        raise
    except ProtocolError as exc:  # the field checks name the field already
        raise RemoteProtocolError(str(exc)) from None
    except (TypeError, ValueError) as exc:  # a body's own __post_init__ argument check
        raise RemoteProtocolError(f"{kind}: {exc}") from None
    if guard is not None:
        guard.accept(msg)
    return msg


@dataclass
class ReplayGuard:
    """Refuses replayed and out-of-order frames per (run, sender, recipient).

    ``seq`` must strictly increase and ``round`` must not go backwards. State changes only when a
    frame is accepted, so a refused frame leaves the guard as it was.
    """

    _last: dict[tuple[str, str, str], tuple[int, int]] = field(default_factory=dict)

    def check(self, msg: Message) -> None:
        key = (msg.run, msg.sender, msg.recipient)
        last = self._last.get(key)
        if last is None:
            return
        last_round, last_seq = last
        if msg.seq <= last_seq:
            raise RemoteProtocolError(
                f"seq: {msg.seq} from {msg.sender} is replayed or out of order (last {last_seq})"
            )
        if msg.round < last_round:
            raise RemoteProtocolError(
                f"round: {msg.round} from {msg.sender} is older than round {last_round}"
            )

    def accept(self, msg: Message) -> None:
        self.check(msg)
        self._last[(msg.run, msg.sender, msg.recipient)] = (msg.round, msg.seq)


# ------------------------------------------------------- bodies of private summarisation
# Algorithm 3 of Sarpatwar et al.: curator -> owners and owners -> curator.
@register("summary.setup")
@dataclass(frozen=True, slots=True)
class SetupBody(Body):
    """Curator -> owner: the public parameters of the run (h1 is shared by everybody).

    ``max_deliveries``: an owner withdraws a point after delivering it this many times.
    ``center`` and ``scale`` (added later, optional): h1 hashes ``(x - center) / scale``."""

    n_features: int
    d: int
    gamma: float
    h1_seed: int
    tau: int
    less_trusted: bool = False
    max_deliveries: int = 3
    center: Array | None = None
    scale: Array | None = None


@register("summary.validation")
@dataclass(frozen=True, slots=True)
class ValidationBody(Body):
    """Curator -> owner: g_tilde, the DP release of the mean of h1 over the validation set."""

    g_validation: Array


@register("summary.epoch")
@dataclass(frozen=True, slots=True)
class EpochBody(Body):
    """Curator -> owner: epoch l opens; g_summary estimates the mean of h1 over the summary S
    (seed removed), ``summary_size`` is q = |S|."""

    g_summary: Array
    summary_size: int


@register("summary.bid")
@dataclass(frozen=True, slots=True)
class BidBody(Body):
    """Owner -> curator: its best point's approximate marginal gain and an opaque token."""

    token: int
    bid: float


@register("summary.pass")
@dataclass(frozen=True, slots=True)
class PassBody(Body):
    """Owner -> curator: nothing left to bid this epoch."""

    reason: str = "exhausted"


@register("summary.ask")
@dataclass(frozen=True, slots=True)
class AskBody(Body):
    """Curator -> owner: deliver the point behind ``token`` (private auction)."""

    token: int


@register("summary.deliver")
@dataclass(frozen=True, slots=True)
class DeliverBody(Body):
    """Owner -> curator: the asked point. Trusted mode sends ``point``; the less-trusted mode
    of appendix F sends only ``hashed`` = h1(x) and the label."""

    token: int
    point: Array | None = None
    hashed: Array | None = None
    label: float | None = None


@register("summary.finish")
@dataclass(frozen=True, slots=True)
class FinishBody(Body):
    """Curator -> owner: the summary is complete (or the run was stopped)."""

    epochs: int
    reason: str = "complete"

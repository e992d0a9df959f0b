"""Wire messages: typed frozen dataclasses and the one msgpack codec of the project.

Theory of operation
-------------------
Every frame is a msgpack map (``use_bin_type=True`` on encode, ``raw=False`` and
``strict_map_key=True`` on decode, depth, count and length limits checked before anything is
built: :mod:`.limits`) holding the envelope

    {"v": 1, "kind": str, "run": str, "round": int, "from": str, "to": str, "seq": int,
     "body": {...}}

``kind`` selects a registered body dataclass; the body's fields are checked against the
dataclass's type hints. numpy arrays travel as ``{"dtype": "<f4", "shape": [..], "data": bytes}``
with a dtype allow-list (never pickle, never object arrays) and a byte cap (which also bounds the
extents of empty arrays); boolean data must be bytes 0/1. Floats must be finite. Decoded arrays
are read-only views of ``bytes`` the message owns, never of the caller's buffer. Bodies are
frozen dataclasses checked when built; ``encode`` re-checks their arrays (the one thing that can
change in place after construction), so every frame it emits is one ``decode`` accepts.

``decode`` either returns a valid :class:`Message` or raises :class:`RemoteProtocolError` naming
the offending field; it never raises anything else (a hypothesis test feeds it random and mutated
frames). Passing a :class:`ReplayGuard` additionally refuses frames whose ``seq`` does not
strictly increase per (run, sender, recipient) or whose ``round`` goes backwards; the guard is
updated only after the frame was fully accepted.

Evolution rules (as dp_accounting's event schema)
------------------------------------------------
1. Never remove a body class, a field, or a registered ``kind``.
2. Add fields only with a default, so that frames from an older sender still decode.
3. Never change what a field means, its type or its default: add a new field or a new kind.
4. ``PROTOCOL_VERSION`` changes only when the envelope itself changes; a decoder refuses other
   versions. Unknown kinds and unknown body keys are refused (strict schema).
5. The encoder omits a field that holds its default (None or the scalar default), and the
   decoder fills it back in; so a newer sender that does not use a field added later (rule 2)
   still speaks to an older receiver.

Bodies are registered by the modules of the parties that exchange them:
:mod:`dpmarket.protocol.summary.messages` (summarisation),
:mod:`dpmarket.protocol.securesum.messages` (secure sum), ``streams/race/wire.py`` (RACE
sketches). The value limits and checks are in :mod:`.checks`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, Union

import msgpack
import numpy as np
import numpy.typing as npt

from dpmarket.protocol.wire.checks import (
    ALLOWED_DTYPES,
    MAX_ARRAY_BYTES,
    MAX_ARRAY_DIMS,
    MAX_INT,
    MAX_LIST_LEN,
    MAX_STR_LEN,
    MIN_INT,
    Checker,
    ErrorType,
    capacity,
    check_counter,
    check_str,
    compile_check,
    plain,
    show,
    supported,
)
from dpmarket.protocol.wire.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from dpmarket.protocol.wire.limits import MAX_FRAME_BYTES, scan_frame, unpack_options

__all__ = [
    "ALLOWED_DTYPES",
    "MAX_ARRAY_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_INT",
    "MAX_LIST_LEN",
    "MAX_STR_LEN",
    "MIN_INT",
    "PROTOCOL_VERSION",
    "Body",
    "Message",
    "ReplayGuard",
    "body_kinds",
    "decode",
    "encode",
    "encode_all",
    "recipient",
    "register",
]

PROTOCOL_VERSION = 1

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


@dataclass(frozen=True, slots=True)
class _Field:
    """One body field as the codec uses it, taken apart once in ``register``."""

    name: str
    label: str  # "kind.field" in error messages
    check: Checker
    read: Callable[[str, object], object]  # wire value -> constructor argument
    spec: dataclasses.Field[Any]


_FIELDS: dict[type[Body], tuple[_Field, ...]] = {}
_NAMES: dict[type[Body], frozenset[str]] = {}
_ARRAYS: dict[type[Body], tuple[_Field, ...]] = {}  # fields holding arrays: mutable in place


def register(kind: str) -> Callable[[B], B]:
    """Class decorator: register a frozen dataclass body under ``kind`` (never reuse a kind)."""

    def wrap(cls: B) -> B:
        if kind in _REGISTRY:
            raise ValueError(f"message kind {kind!r} is already registered")
        if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:
            raise ValueError(f"{cls.__name__} must be a frozen dataclass")
        hints = typing.get_type_hints(cls, include_extras=True)  # value rules kept
        for f in dataclasses.fields(cls):
            if not supported(hints[f.name]):
                raise ValueError(f"{cls.__name__}.{f.name}: unsupported field type {f.type!r}")
        cls.KIND = kind
        _REGISTRY[kind] = cls
        _HINTS[cls] = hints
        _FIELDS[cls] = tuple(
            _Field(f.name, f"{kind}.{f.name}", compile_check(hints[f.name]),
                   _wire_reader(hints[f.name]), f)
            for f in dataclasses.fields(cls)
        )  # fmt: skip
        _NAMES[cls] = frozenset(f.name for f in _FIELDS[cls])
        _ARRAYS[cls] = tuple(f for f in _FIELDS[cls] if f.read is not _raw)
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
            check_str(name, getattr(self, name), LocalProtocolError)
        for name in ("round", "seq"):
            check_counter(name, getattr(self, name), LocalProtocolError)
        if type(self.body) not in _HINTS:
            raise LocalProtocolError(f"body: {type(self.body).__name__} is not a registered kind")

    @property
    def kind(self) -> str:
        return self.body.KIND


def _check_body(body: Body, err: ErrorType, fields: tuple[_Field, ...] | None = None) -> None:
    """Check ``fields`` of ``body`` (all of them by default)."""
    if fields is None:
        fields = _FIELDS.get(type(body))
        if fields is None:
            raise err(f"body: {type(body).__name__} is not a registered message kind")
    for f in fields:
        value = getattr(body, f.name)
        checked = f.check(f.label, value, err)
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

    The body's arrays are checked again first (they may have been mutated in place since
    construction; every other field of a frozen body was checked when it was built), so an
    invalid body raises :class:`LocalProtocolError` here rather than being refused remotely.
    """
    if not isinstance(msg, Message):
        raise LocalProtocolError(f"msg: expected a Message, got {type(msg).__name__}")
    return _frame(msg, _wire_body(msg.body))


def encode_all(messages: Sequence[Message]) -> list[bytes]:
    """:func:`encode` of each message, a body shared by several (a broadcast) checked and
    converted once: nothing runs between the frames of one call that could change its arrays."""
    bodies: dict[int, dict[str, object]] = {}
    out = []
    for msg in messages:
        if not isinstance(msg, Message):
            raise LocalProtocolError(f"msg: expected a Message, got {type(msg).__name__}")
        body = bodies.get(id(msg.body))
        if body is None:
            body = bodies[id(msg.body)] = _wire_body(msg.body)
        out.append(_frame(msg, body))
    return out


def _wire_body(body: Body) -> dict[str, object]:
    """The body's fields as the wire holds them, its arrays checked again first."""
    _check_body(body, LocalProtocolError, _ARRAYS[type(body)])
    return {
        f.name: _to_wire(value)
        for f in _FIELDS[type(body)]
        if not _at_default(f.spec, value := getattr(body, f.name))
    }


def _frame(msg: Message, body: dict[str, object]) -> bytes:
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


def _at_default(f: dataclasses.Field[Any], value: object) -> bool:
    """True if ``value`` is the field's default None or bool/int/float/str default: the encoder
    omits it (rule 5)."""
    default = f.default
    if default is dataclasses.MISSING:
        return False
    if default is None:
        return value is None
    if type(default) not in (bool, int, float, str):  # tuples: (-0.0,) == (0.0,), keep them
        return False
    if type(value) is not type(default) or value != default:
        return False
    if isinstance(value, float) and isinstance(default, float):  # -0.0 == 0.0: keep the bits
        return math.copysign(1.0, value) == math.copysign(1.0, default)
    return True


def _array_from_wire(name: str, raw: object) -> Array:
    err = RemoteProtocolError
    if not isinstance(raw, dict) or set(raw) != {"dtype", "shape", "data"}:
        raise err(f"{name}: an array must be a map of exactly dtype, shape, data")
    dtype, shape, data = raw["dtype"], raw["shape"], raw["data"]
    if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:
        raise err(f"{name}: dtype {show(dtype)} is not allowed")
    if not isinstance(shape, list) or len(shape) > MAX_ARRAY_DIMS:
        raise err(f"{name}: shape must be a list of at most {MAX_ARRAY_DIMS} sizes")
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise err(f"{name}: shape entries must be non-negative integers")
    if not isinstance(data, bytes):
        raise err(f"{name}: data must be bytes")
    itemsize = np.dtype(dtype).itemsize
    if capacity(shape, itemsize) > MAX_ARRAY_BYTES:
        raise err(f"{name}: shape {shape} exceeds {MAX_ARRAY_BYTES} bytes")
    if len(data) != math.prod(shape) * itemsize:
        raise err(f"{name}: {len(data)} data bytes do not match shape {shape} of {dtype}")
    if dtype == "|b1" and data.translate(None, b"\x00\x01"):
        raise err(f"{name}: boolean data must be bytes 0 or 1")
    # A read-only view of the frame's own immutable ``bytes``: never aliases a caller's buffer.
    # Finiteness and the field's own rules: the body's check when decode builds it.
    return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(tuple(shape))


def _raw(name: str, raw: object) -> object:
    return raw


def _wire_reader(hint: Any) -> Callable[[str, object], object]:
    """How a field of type ``hint`` is rebuilt from its wire value (arrays from their maps, lists
    of arrays item by item); anything else is passed on as it is, for the field check."""
    origin = typing.get_origin(hint := plain(hint))
    if origin in (Union, types.UnionType):
        some = _wire_reader(next(a for a in typing.get_args(hint) if a is not type(None)))
        if some is _raw:
            return _raw
        return lambda name, raw: None if raw is None else some(name, raw)
    if hint is np.ndarray or origin is np.ndarray:
        return _array_from_wire
    if origin is tuple:
        item = _wire_reader(typing.get_args(hint)[0])
        if item is _raw:
            return _raw
        return lambda name, raw: (
            tuple(item(f"{name}[{i}]", v) for i, v in enumerate(raw))
            if isinstance(raw, list)
            else raw
        )
    return _raw


def _refuse_ext(code: int, data: bytes) -> object:
    raise ValueError(f"extension type {code} is not part of the protocol")


def _unpack(data: object) -> dict[str, Any]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RemoteProtocolError(f"frame: expected bytes, got {type(data).__name__}")
    size = memoryview(data).nbytes
    if size > MAX_FRAME_BYTES:
        raise RemoteProtocolError(f"frame: {size} bytes exceeds {MAX_FRAME_BYTES}")
    frame = bytes(data)
    scan_frame(frame)  # depth, container, item and memory limits before anything is built
    try:
        obj = msgpack.unpackb(
            frame, raw=False, strict_map_key=True, use_list=True, ext_hook=_refuse_ext,
            **unpack_options(size),
        )  # fmt: skip
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
    fields = _FIELDS[_REGISTRY[kind]]
    extra = raw_body.keys() - _NAMES[_REGISTRY[kind]]
    if extra:
        unknown = ", ".join(sorted(map(show, extra)))
        raise RemoteProtocolError(f"{kind}: unknown fields [{unknown}]")
    values: dict[str, object] = {}
    for f in fields:
        if f.name in raw_body:
            values[f.name] = f.read(f.label, raw_body[f.name])
        elif f.spec.default is dataclasses.MISSING and (
            f.spec.default_factory is dataclasses.MISSING
        ):
            raise RemoteProtocolError(f"{f.label}: missing")
    return values


def recipient(data: bytes | bytearray | memoryview) -> str:
    """The envelope's ``to`` of a frame, read without building its body: what a relay needs to
    forward it (actors/parties/dca.py). The frame's limits are checked as by :func:`decode` and
    the envelope must be a map whose ``to`` is a string; nothing else is validated here: the
    recipient decodes the whole frame and refuses what is wrong. Raises
    :class:`RemoteProtocolError` naming the problem, nothing else."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise RemoteProtocolError(f"frame: expected bytes, got {type(data).__name__}")
    size = memoryview(data).nbytes
    if size > MAX_FRAME_BYTES:
        raise RemoteProtocolError(f"frame: {size} bytes exceeds {MAX_FRAME_BYTES}")
    frame = data if isinstance(data, bytes) else bytes(data)
    scan_frame(frame)
    unpacker = msgpack.Unpacker(
        raw=False, strict_map_key=True, ext_hook=_refuse_ext, max_buffer_size=max(size, 1),
        **unpack_options(size),
    )  # fmt: skip
    try:
        unpacker.feed(frame)
        for _ in range(unpacker.read_map_header()):
            if unpacker.unpack() != "to":
                unpacker.skip()
                continue
            to = unpacker.unpack()
            if not isinstance(to, str):
                raise RemoteProtocolError(f"to: expected a string, got {show(to)}")
            return to
    except RemoteProtocolError:
        raise
    except Exception as exc:  # msgpack raises many types for garbage; all mean the same
        reason = type(exc).__name__
        raise RemoteProtocolError(f"frame: not a valid msgpack frame ({reason})") from None
    raise RemoteProtocolError("envelope: missing ['to']")


def decode(data: bytes | bytearray | memoryview, guard: ReplayGuard | None = None) -> Message:
    """Decode one frame; raise :class:`RemoteProtocolError` naming the problem, nothing else.

    Arrays in the result are read-only views of bytes objects owned by the message (``decode``
    copies a ``bytearray``/``memoryview`` input first), so no later write by anyone changes it.
    """
    frame = _unpack(data)
    keys = set(frame)
    if keys != _ENVELOPE_KEYS:
        missing = sorted(_ENVELOPE_KEYS - keys)
        extra = ", ".join(sorted(map(show, keys - _ENVELOPE_KEYS)))
        raise RemoteProtocolError(f"envelope: missing {missing}, unknown [{extra}]")
    version = frame["v"]
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise RemoteProtocolError(f"v: unsupported protocol version {show(version)}")
    kind = frame["kind"]
    if not isinstance(kind, str) or kind not in _REGISTRY:
        raise RemoteProtocolError(f"kind: unknown message kind {show(kind)}")
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

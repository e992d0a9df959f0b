"""Values inside control frames: packed with msgpack, unpacked within the frame limits, and
rebuilt into the protocol's frozen dataclasses field by field (unknown or mistyped fields are
refused by name, then the dataclass's own checks run).

A remote party is a stranger to the market and the market to it: everything either side takes
from a call's arguments or a reply's result goes through :func:`unpack` (depth, count and
memory bounded before msgpack builds anything: protocol/wire/limits.py) and, for a structured
value, :func:`from_record`; either raises ``RemoteProtocolError`` naming what is wrong.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, TypeVar, Union

import msgpack

from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.protocol.wire.limits import MAX_FRAME_BYTES, scan_frame, unpack_options

__all__ = ["from_record", "pack", "plain_value", "record", "unpack"]

T = TypeVar("T")
MAX_PLAIN_DEPTH = 6  # nested maps/lists inside one free-form value (options, a status)


def pack(value: object) -> bytes:
    """One msgpack value (maps, lists, str, bytes, int, float, bool, None)."""
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def _refuse_ext(code: int, data: bytes) -> object:
    raise ValueError("msgpack extension types are not accepted")


def unpack(data: object, what: str) -> Any:
    """The value packed in ``data``, within the frame limits; ``RemoteProtocolError`` naming
    ``what`` for anything else (too big, too deep, not msgpack, an extension type)."""
    if not isinstance(data, bytes):
        raise RemoteProtocolError(f"{what}: expected bytes, got {type(data).__name__}")
    if len(data) > MAX_FRAME_BYTES:
        raise RemoteProtocolError(f"{what}: {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        scan_frame(data)
    except RemoteProtocolError as exc:
        raise RemoteProtocolError(f"{what}: {exc}") from None
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True, ext_hook=_refuse_ext,
            **unpack_options(len(data)),
        )  # fmt: skip
    except Exception as exc:  # msgpack raises many types for garbage; all mean the same
        raise RemoteProtocolError(f"{what}: not a msgpack value ({type(exc).__name__})") from None


def record(value: object) -> object:
    """A dataclass (recursively), tuple, dict or scalar as plain msgpack-able data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [f for f in dataclasses.fields(value) if f.init]
        return {f.name: record(getattr(value, f.name)) for f in fields}
    if isinstance(value, (tuple, list)):
        return [record(v) for v in value]
    if isinstance(value, dict):
        return {str(k): record(v) for k, v in value.items()}
    if isinstance(value, bool) or value is None or isinstance(value, (str, bytes)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    raise TypeError(f"cannot put a {type(value).__name__} into a control frame")


def plain_value(value: object, what: str, depth: int = 0) -> object:
    """A free-form value (a round's options, a status): maps with string keys, lists, str,
    bytes, bool, finite numbers and None only, at most :data:`MAX_PLAIN_DEPTH` deep."""
    if depth > MAX_PLAIN_DEPTH:
        raise RemoteProtocolError(f"{what}: nested too deeply")
    if value is None or isinstance(value, (bool, str, bytes, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RemoteProtocolError(f"{what}: {value!r} is not finite")
        return value
    if isinstance(value, list):
        return [plain_value(v, f"{what}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise RemoteProtocolError(f"{what}: a key is not a string")
            out[k] = plain_value(v, f"{what}.{k}", depth + 1)
        return out
    raise RemoteProtocolError(f"{what}: {type(value).__name__} is not a plain value")


def _value(hint: Any, raw: object, what: str) -> object:
    """``raw`` checked against the type ``hint`` and converted (lists to tuples, ints to
    floats where a float is declared)."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if raw is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise RemoteProtocolError(f"{what}: unsupported union type")
        return _value(inner[0], raw, what)
    if hint is Any:
        return plain_value(raw, what)
    if hint is bool:
        if not isinstance(raw, bool):
            raise RemoteProtocolError(f"{what}: expected true or false, got {type(raw).__name__}")
        return raw
    if hint is int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise RemoteProtocolError(f"{what}: expected an integer, got {type(raw).__name__}")
        return raw
    if hint is float:
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise RemoteProtocolError(f"{what}: expected a number, got {type(raw).__name__}")
        if not math.isfinite(raw):
            raise RemoteProtocolError(f"{what}: {raw!r} is not finite")
        return float(raw)
    if hint is str:
        if not isinstance(raw, str):
            raise RemoteProtocolError(f"{what}: expected a string, got {type(raw).__name__}")
        return raw
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(raw, list) or len(args) != 2 or args[1] is not Ellipsis:
            raise RemoteProtocolError(f"{what}: expected a list")
        return tuple(_value(args[0], v, f"{what}[{i}]") for i, v in enumerate(raw))
    if origin is dict:
        key, val = typing.get_args(hint)
        if not isinstance(raw, dict) or key is not str:
            raise RemoteProtocolError(f"{what}: expected a map")
        return {str(k): _value(val, v, f"{what}.{k}") for k, v in raw.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return from_record(hint, raw, what)
    raise RemoteProtocolError(f"{what}: unsupported field type {hint!r}")


def from_record(cls: type[T], raw: object, what: str) -> T:
    """An instance of the dataclass ``cls`` from :func:`record`'s output: every key a field of
    ``cls`` (missing ones take their defaults), every value of its declared type, then the
    class's own checks; ``RemoteProtocolError`` naming the field otherwise."""
    if not isinstance(raw, dict):
        raise RemoteProtocolError(f"{what}: expected a map, got {type(raw).__name__}")
    assert dataclasses.is_dataclass(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(str(k) for k in raw if k not in fields)
    if unknown:
        raise RemoteProtocolError(f"{what}: unknown fields {unknown}")
    hints = typing.get_type_hints(cls)
    values = {name: _value(hints[name], v, f"{what}.{name}") for name, v in raw.items()}
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise RemoteProtocolError(f"{what}: {exc}") from None

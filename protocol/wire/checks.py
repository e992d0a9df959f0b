"""Value checks of the wire codec (:mod:`.messages`): the limits every field must respect and
the functions that enforce them, shared by construction (``LocalProtocolError``) and decoding
(``RemoteProtocolError``). Pure: no I/O.
"""

from __future__ import annotations

import functools
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Union

import numpy as np

from dpmarket.protocol.wire.errors import ProtocolError

__all__ = [
    "ALLOWED_DTYPES",
    "FLOAT32_MAX",
    "MAX_ARRAY_BYTES",
    "MAX_ARRAY_DIMS",
    "MAX_COUNTER",
    "MAX_INT",
    "MAX_LIST_LEN",
    "MAX_STR_LEN",
    "MAX_TEXT_BYTES",
    "MIN_INT",
    "Checker",
    "Count",
    "ErrorType",
    "Positive",
    "Range",
    "Token",
    "Vector",
    "capacity",
    "check_array",
    "check_counter",
    "check_str",
    "check_value",
    "compile_check",
    "plain",
    "show",
    "supported",
]

MAX_ARRAY_BYTES = 48 * 1024 * 1024  # one array's payload
MAX_ARRAY_DIMS = 4
MAX_STR_LEN = 256  # names, run ids, kinds
MAX_TEXT_BYTES = 64 * MAX_STR_LEN  # other string fields, in UTF-8 bytes
MAX_LIST_LEN = 1_000_000
MAX_INT = 2**64 - 1
MIN_INT = -(2**63)
MAX_COUNTER = 2**53  # round and seq stay exact in every language's doubles
FLOAT32_MAX = float(np.finfo(np.float32).max)  # points are hashed in float32

ALLOWED_DTYPES = frozenset(
    {"|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "<f4", "<f8"}
)

ErrorType = type[ProtocolError]
_SCALARS = (bool, int, float, str, bytes, type(None))


@dataclass(frozen=True, slots=True)
class Range:
    """A field's inclusive range, ``Annotated[int, Range(0, 2**63 - 1)]`` (a value check: it
    tightens what a field accepts, never changes what it means)."""

    low: float | None = None
    high: float | None = None

    def check(self, name: str, value: float, err: ErrorType) -> None:
        if (self.low is not None and value < self.low) or (
            self.high is not None and value > self.high
        ):
            low = "" if self.low is None else f"{self.low:g}"
            high = "" if self.high is None else f"{self.high:g}"
            raise err(f"{name}: {show(value)} outside {low}..{high}")


@dataclass(frozen=True, slots=True)
class Positive:
    """A number > 0."""

    def check(self, name: str, value: float, err: ErrorType) -> None:
        if not value > 0:
            raise err(f"{name}: {show(value)} must be > 0")


@dataclass(frozen=True, slots=True)
class Vector:
    """An array field's rule: ``ndim`` dimensions, a dtype of one of ``kinds`` (numpy kind
    letters), and every value within +-``bound``."""

    ndim: int = 1
    kinds: str = "biuf"
    bound: float | None = None

    def check(self, name: str, value: Any, err: ErrorType) -> None:
        if value.ndim != self.ndim:
            raise err(f"{name}: {value.ndim} dimensions, expected {self.ndim}")
        if value.dtype.kind not in self.kinds:
            raise err(f"{name}: dtype {value.dtype.str}, expected one of kinds {self.kinds!r}")
        if self.bound is not None and value.size and float(np.abs(value).max()) > self.bound:
            raise err(f"{name}: a value beyond +-{self.bound:.4g}")


Token = Annotated[int, Range(0, 2**63 - 1)]  # an owner's record index
Count = Annotated[int, Range(0, MAX_COUNTER)]  # sizes and counts, exact in doubles
Rule = Range | Positive | Vector


def plain(hint: Any) -> Any:
    """``hint`` without its ``Annotated`` value rules."""
    return typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint


def show(value: object) -> str:
    """A short, never-failing description of a peer's value for an error message."""
    if isinstance(value, _SCALARS):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    return f"<{type(value).__name__}>"


def supported(hint: Any) -> bool:
    """Whether the codec can carry a field of type ``hint`` (checked once, in ``register``)."""
    if typing.get_origin(hint) is Annotated:
        rules = typing.get_args(hint)[1:]
        return all(isinstance(r, Rule) for r in rules) and supported(plain(hint))
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return len(inner) == 1 and supported(inner[0])
    if origin is tuple:
        args = typing.get_args(hint)
        return len(args) == 2 and args[1] is Ellipsis and supported(args[0])
    return hint in (bool, int, float, str, bytes, np.ndarray) or origin is np.ndarray


def _utf8_len(name: str, value: str, err: ErrorType) -> int:
    if value.isascii():
        return len(value)
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise err(f"{name}: not encodable as UTF-8") from None


def check_str(name: str, value: object, err: ErrorType) -> str:
    if not isinstance(value, str):
        raise err(f"{name}: expected a string, got {type(value).__name__}")
    if not value or len(value) > MAX_STR_LEN:
        raise err(f"{name}: length {len(value)} outside 1..{MAX_STR_LEN}")
    _utf8_len(name, value, err)
    return value


def check_counter(name: str, value: object, err: ErrorType) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise err(f"{name}: expected an integer, got {type(value).__name__}")
    if not 0 <= value <= MAX_COUNTER:
        raise err(f"{name}: {value} outside 0..2^53")
    return value


def capacity(shape: list[int] | tuple[int, ...], itemsize: int) -> int:
    """Bytes the shape would need if every zero extent were one (bounds empty arrays too)."""
    return math.prod(max(s, 1) for s in shape) * itemsize


def check_array(name: str, value: object, err: ErrorType) -> None:
    if not isinstance(value, np.ndarray):
        raise err(f"{name}: expected a numpy array, got {type(value).__name__}")
    if value.dtype.str not in ALLOWED_DTYPES:
        raise err(f"{name}: dtype {value.dtype.str} is not allowed")
    if value.ndim > MAX_ARRAY_DIMS:
        raise err(f"{name}: {value.ndim} dimensions, at most {MAX_ARRAY_DIMS}")
    if capacity(value.shape, value.dtype.itemsize) > MAX_ARRAY_BYTES:
        raise err(f"{name}: shape {list(value.shape)} exceeds {MAX_ARRAY_BYTES} bytes")
    if value.dtype.kind == "f" and not bool(np.isfinite(value).all()):
        raise err(f"{name}: contains NaN or infinity")


Checker = Callable[[str, object, ErrorType], object]


def check_value(name: str, hint: Any, value: object, err: ErrorType) -> object:
    """Check ``value`` against a type hint; return it (ints widened to float where asked)."""
    return compile_check(hint)(name, value, err)


@functools.cache
def compile_check(hint: Any) -> Checker:
    """The check of one type hint as a function, built once per hint: the codec checks every
    field of every frame, so the hint is taken apart here rather than on each value."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        inner, rules = compile_check(plain(hint)), typing.get_args(hint)[1:]

        def annotated(name: str, value: object, err: ErrorType) -> object:
            checked = inner(name, value, err)
            for rule in rules:
                rule.check(name, checked, err)
            return checked

        return annotated
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        allow_none = type(None) in args
        some = compile_check(next(a for a in args if a is not type(None)))

        def optional(name: str, value: object, err: ErrorType) -> object:
            return None if value is None and allow_none else some(name, value, err)

        return optional
    if origin is tuple:
        item = compile_check(typing.get_args(hint)[0])

        def items(name: str, value: object, err: ErrorType) -> object:
            if not isinstance(value, (tuple, list)):
                raise err(f"{name}: expected a list, got {type(value).__name__}")
            if len(value) > MAX_LIST_LEN:
                raise err(f"{name}: {len(value)} items, at most {MAX_LIST_LEN}")
            return tuple(item(f"{name}[{i}]", v, err) for i, v in enumerate(value))

        return items
    if hint is np.ndarray or origin is np.ndarray:
        return _array
    simple = _SIMPLE.get(hint)
    if simple is not None:
        return simple

    def unsupported(name: str, value: object, err: ErrorType) -> object:  # pragma: no cover
        raise err(f"{name}: unsupported field type {hint!r}")  # register refuses such fields

    return unsupported


def _bool(name: str, value: object, err: ErrorType) -> object:
    if not isinstance(value, bool):
        raise err(f"{name}: expected a boolean, got {type(value).__name__}")
    return value


def _int(name: str, value: object, err: ErrorType) -> object:
    if not isinstance(value, int) or isinstance(value, bool):
        raise err(f"{name}: expected an integer, got {type(value).__name__}")
    if not MIN_INT <= value <= MAX_INT:
        raise err(f"{name}: integer {value} out of the 64-bit range")
    return value


def _float(name: str, value: object, err: ErrorType) -> object:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise err(f"{name}: expected a number, got {type(value).__name__}")
    if isinstance(value, int) and not MIN_INT <= value <= MAX_INT:
        raise err(f"{name}: integer {value} out of the 64-bit range")
    if not math.isfinite(value):
        raise err(f"{name}: must be finite, got {value}")
    return float(value)


def _text(name: str, value: object, err: ErrorType) -> object:
    if not isinstance(value, str):
        raise err(f"{name}: expected a string, got {type(value).__name__}")
    if _utf8_len(name, value, err) > MAX_TEXT_BYTES:
        raise err(f"{name}: string of {len(value)} characters is too long")
    return value


def _bytes(name: str, value: object, err: ErrorType) -> object:
    if not isinstance(value, bytes):
        raise err(f"{name}: expected bytes, got {type(value).__name__}")
    return value


def _array(name: str, value: object, err: ErrorType) -> object:
    check_array(name, value, err)
    return value


_SIMPLE: dict[Any, Checker] = {bool: _bool, int: _int, float: _float, str: _text, bytes: _bytes}

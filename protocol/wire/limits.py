"""Frame limits: bound the decoder's work and memory by the frame before msgpack builds anything.

msgpack allocates a container as soon as it reads its header (a list of the declared length),
and a one-byte empty array becomes a 72-byte Python list: a 7.6 MB frame of nested empty
arrays cost 545 MB to decode. :func:`scan_frame` therefore walks the frame's headers first,
without building a single object, and refuses it with :class:`RemoteProtocolError` when

- the frame is not exactly one msgpack object (truncated, trailing bytes, reserved or
  extension type codes),
- containers nest deeper than :data:`MAX_DEPTH`, or there are more than :data:`MAX_CONTAINERS`
  of them, or more than :data:`MAX_ITEMS` elements and map entries in all,
- a container declares more elements than bytes remain (each element takes at least one),
- the objects it would build are estimated (:func:`_cost`, an upper bound of CPython's sizes)
  at more than ``MEMORY_FACTOR`` times the frame plus :data:`MEMORY_SLACK`.

The scan itself keeps one small stack entry per open container (at most :data:`MAX_DEPTH`) and
visits at most :data:`MAX_ITEMS` items: strings and binaries are skipped by their length, so a
frame of large arrays costs a few steps. :func:`unpack_options` then caps msgpack's own
``max_*_len`` by the frame's size as a second line of defence. No frame under the size limit
can cost more than ``MEMORY_FACTOR`` times its size (plus the slack) to decode.
"""

from __future__ import annotations

from typing import Any

from dpmarket.protocol.wire.checks import MAX_ARRAY_BYTES, MAX_LIST_LEN, MAX_TEXT_BYTES
from dpmarket.protocol.wire.errors import RemoteProtocolError

__all__ = [
    "MAX_CONTAINERS",
    "MAX_DEPTH",
    "MAX_FRAME_BYTES",
    "MAX_ITEMS",
    "MAX_MAP_LEN",
    "MEMORY_FACTOR",
    "MEMORY_SLACK",
    "scan_frame",
    "unpack_options",
]

MAX_FRAME_BYTES = 64 * 1024 * 1024  # a whole frame
MAX_MAP_LEN = 64  # keys of one map (the envelope, a body, an array)
MAX_DEPTH = 8  # envelope > body > tuple > array map > shape list is 5 deep
MAX_CONTAINERS = 4096  # maps and lists in one frame
MAX_ITEMS = MAX_LIST_LEN + 65536  # elements and map entries in one frame
MEMORY_FACTOR = 4  # decoded objects at most this many times the frame ...
MEMORY_SLACK = 256 * 1024  # ... plus this (a small frame's envelope and body maps)

# Upper bounds of CPython's object sizes (64-bit, allocator rounding and GC header included).
_LIST, _DICT, _DICT_ENTRY, _POINTER = 72, 240, 48, 8
_STR, _BYTES, _NUMBER = 80, 40, 32

# first byte -> (kind, width): kind "fix" is a one-byte scalar that CPython caches (nil, bools,
# 0..127); "num" a number of ``width`` payload bytes; "str"/"bin"/"arr"/"map" read their length
# from the next ``width`` bytes; the fix* forms carry it in the first byte (width 0).
_CODES: dict[int, tuple[str, int]] = {
    0xC0: ("fix", 0), 0xC2: ("fix", 0), 0xC3: ("fix", 0),
    0xC4: ("bin", 1), 0xC5: ("bin", 2), 0xC6: ("bin", 4),
    0xCA: ("num", 4), 0xCB: ("num", 8),
    0xCC: ("num", 1), 0xCD: ("num", 2), 0xCE: ("num", 4), 0xCF: ("num", 8),
    0xD0: ("num", 1), 0xD1: ("num", 2), 0xD2: ("num", 4), 0xD3: ("num", 8),
    0xD9: ("str", 1), 0xDA: ("str", 2), 0xDB: ("str", 4),
    0xDC: ("arr", 2), 0xDD: ("arr", 4), 0xDE: ("map", 2), 0xDF: ("map", 4),
}  # fmt: skip


def _refuse(reason: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"frame: {reason}")


def _invalid(reason: str) -> RemoteProtocolError:
    return RemoteProtocolError(f"frame: not a valid msgpack frame ({reason})")


def _header(data: bytes, pos: int) -> tuple[str, int, int]:
    """(kind, length or 0, position after the header) of the object at ``pos``."""
    code = data[pos]
    if code <= 0x7F:
        return "fix", 0, pos + 1
    if code >= 0xE0:  # negative fixint: -32..-6 are not cached
        return ("fix" if code >= 0xFB else "num"), 0, pos + 1
    if code <= 0x8F:
        return "map", code & 0x0F, pos + 1
    if code <= 0x9F:
        return "arr", code & 0x0F, pos + 1
    if code <= 0xBF:
        return "str", code & 0x1F, pos + 1
    kind, width = _CODES.get(code, ("", 0))
    if not kind:
        raise _invalid(f"type code 0x{code:02x} is not part of the protocol")
    end = pos + 1 + width
    if end > len(data):
        raise _invalid("truncated")
    if kind in ("fix", "num"):
        return kind, width, end
    return kind, int.from_bytes(data[pos + 1 : end], "big"), end


def _cost(kind: str, length: int) -> int:
    """Upper bound of the bytes the decoded object takes, beyond its parent's pointer."""
    if kind == "arr":
        return _LIST + _POINTER * length
    if kind == "map":
        return _DICT + _DICT_ENTRY * length
    if kind == "str":
        return _STR + length
    if kind == "bin":
        return _BYTES + length
    return _NUMBER if kind == "num" else 0


def scan_frame(data: bytes) -> None:
    """Refuse ``data`` unless it is one msgpack object within every limit of this module."""
    size = len(data)
    budget = MEMORY_FACTOR * size + MEMORY_SLACK
    pending = [1]  # items still to read per open container (the root counts as one)
    pos = containers = items = memory = 0
    while pending:
        if pending[-1] == 0:
            pending.pop()
            continue
        pending[-1] -= 1
        if pos >= size:
            raise _invalid("truncated")
        code = data[pos]
        if code <= 0x7F or code >= 0xFB:  # cached one-byte scalars: no header, no cost
            pos += 1
            continue
        if 0xA0 <= code <= 0xBF:  # a short string (every map key): _header's "str", inline
            pos += 1 + (code & 0x1F)
            memory += _STR + (code & 0x1F)
            if pos > size:
                raise _invalid("truncated")
            if memory > budget:
                raise _refuse(f"would take more than {MEMORY_FACTOR}x its {size} bytes to decode")
            continue
        kind, length, pos = _header(data, pos)
        memory += _cost(kind, length)
        if kind in ("str", "bin"):
            pos += length
            if pos > size:
                raise _invalid("truncated")
        elif kind in ("arr", "map"):
            entries = length * (2 if kind == "map" else 1)
            containers += 1
            items += length
            if len(pending) > MAX_DEPTH:
                raise _refuse(f"containers nested deeper than {MAX_DEPTH}")
            if containers > MAX_CONTAINERS:
                raise _refuse(f"more than {MAX_CONTAINERS} maps and lists")
            if items > MAX_ITEMS:
                raise _refuse(f"more than {MAX_ITEMS} elements and map entries")
            if entries > size - pos:
                raise _refuse(f"a container declares {length} elements in {size - pos} bytes")
            pending.append(entries)
        if memory > budget:
            raise _refuse(f"would take more than {MEMORY_FACTOR}x its {size} bytes to decode")
    if pos != size:
        raise _invalid("ExtraData")  # bytes after the one message


def unpack_options(size: int) -> dict[str, Any]:
    """msgpack's length limits for a frame of ``size`` bytes that :func:`scan_frame` accepted."""
    return {
        "max_str_len": min(4 * MAX_TEXT_BYTES, size),  # 4x: the field check names it
        "max_bin_len": min(MAX_ARRAY_BYTES, size),
        "max_array_len": min(MAX_LIST_LEN, size),
        "max_map_len": min(MAX_MAP_LEN, size),
        "max_ext_len": 0,
    }

"""Frame limits (protocol/wire/limits.py): crafted frames that cost far more memory to decode
than their size are refused by name, and decoding them grows the process's peak memory by no
more than a small multiple of the frame (measured in a fresh subprocess: a memory bound, never
a time bound)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import msgpack
import numpy as np
import pytest

from dpmarket.protocol.summary import messages as summary_messages
from dpmarket.protocol.wire.codec import Message, decode, encode
from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.protocol.wire.limits import (
    MAX_CONTAINERS,
    MAX_DEPTH,
    MAX_FRAME_BYTES,
    MAX_ITEMS,
    scan_frame,
    unpack_options,
)

MB = 1024 * 1024


# Each builder takes a byte budget n and returns a frame of about that size (a bytes expression
# of the standard library only, so that the subprocess below can rebuild it). The tiled ones
# hold lists of 65,535 small items, within msgpack's per-container limits.
def _tiled(item: str, width: int) -> str:
    k = f"(n // (3 + {width} * 65535))"
    return f"b'\\xdd' + {k}.to_bytes(4, 'big') + (b'\\xdc\\xff\\xff' + {item} * 65535) * {k}"


CRAFTED = {
    "empty arrays": _tiled("b'\\x90'", 1),
    "empty maps": _tiled("b'\\x80'", 1),
    "nested empty arrays": _tiled("b'\\x91\\x90'", 2),
    "empty arrays in an envelope": "b'\\x81\\xa4body' + " + _tiled("b'\\x90'", 1),
    "short strings": _tiled("b'\\xa2ab'", 3),
    "uint16s": _tiled("b'\\xcd\\x01\\x00'", 3),
    "deep nesting": "b'\\x91' * (n - 1) + b'\\xc0'",
    "declared lengths": "b'\\xdd\\x00\\x0f\\x42\\x40' * (n // 5)",
}


def build(name: str, n: int) -> bytes:
    frame: bytes = eval(CRAFTED[name], {"n": n})
    return frame


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_frames_near_the_size_limit_are_refused(name: str) -> None:
    frame = build(name, MAX_FRAME_BYTES - 16)
    assert len(frame) <= MAX_FRAME_BYTES
    with pytest.raises(RemoteProtocolError, match=r"^frame: "):
        decode(frame)


def padded(payload: bytes) -> bytes:
    """``[<4 MB of binary>, payload]``: a memory budget large enough for the count limits."""
    return b"\x92\xc6" + (4 * MB).to_bytes(4, "big") + bytes(4 * MB) + payload


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (b"\x91" * (MAX_DEPTH + 1) + b"\xc0", rf"nested deeper than {MAX_DEPTH}$"),
        (b"\x81\xa1a" + b"\x91" * MAX_DEPTH + b"\xc0", rf"nested deeper than {MAX_DEPTH}$"),
        (
            padded(
                b"\xdd" + (MAX_CONTAINERS + 1).to_bytes(4, "big") + b"\x90" * (MAX_CONTAINERS + 1)
            ),
            rf"more than {MAX_CONTAINERS} maps and lists$",
        ),
        (
            padded(b"\xdd" + (MAX_ITEMS + 1).to_bytes(4, "big") + b"\xc0" * (MAX_ITEMS + 1)),
            rf"more than {MAX_ITEMS} elements and map entries$",
        ),
        (b"\xdd\x00\x0f\x42\x40\xc0", r"declares 1000000 elements in 1 bytes$"),
        (b"\xdf\x00\x00\x00\x02\xa1a\xc0", r"declares 2 elements in 3 bytes$"),
        (b"\xdc\x10\x00" + b"\xa2ab" * 4096, r"would take more than 4x its 12291 bytes"),
        (b"\xdc\x40\x00" + b"\xcd\x01\x00" * 16384, r"would take more than 4x its 49155 bytes"),
        (b"\xc1", r"^frame: not a valid msgpack frame \(type code 0xc1"),
        (b"\xd4\x01\x00", r"^frame: not a valid msgpack frame \(type code 0xd4"),
        (b"\xc4\x05ab", r"^frame: not a valid msgpack frame \(truncated\)"),
        (b"\x92\xc0", r"^frame: .*declares 2 elements in 1 bytes"),
    ],
)
def test_limits_are_refused_by_name(frame: bytes, match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        scan_frame(frame)
    with pytest.raises(RemoteProtocolError, match=match):
        decode(frame)


def test_every_valid_frame_passes_the_scan() -> None:
    """The limits refuse no frame the encoder makes, large arrays included."""
    big = np.zeros(MAX_FRAME_BYTES // 8 // 2 - 1024)
    for body in (
        summary_messages.BidBody(token=3, bid=0.5),
        summary_messages.ValidationBody(g_validation=big),
        summary_messages.DeliverBody(token=1, point=big[:1000], hashed=big[:10], label=1.0),
    ):
        frame = encode(Message("run", 1, "owner-0", "curator", 1, body))
        scan_frame(frame)
        assert decode(frame).body.KIND == body.KIND


def test_msgpack_caps_follow_the_frame_size() -> None:
    options = unpack_options(100)
    assert options["max_array_len"] == options["max_bin_len"] == 100
    assert options["max_ext_len"] == 0
    with pytest.raises(ValueError):
        msgpack.unpackb(b"\xdd\x00\x00\x00\x65" + b"\xc0" * 101, **options)


_MEASURE = textwrap.dedent(
    """
    import json, resource, sys
    from dpmarket.protocol.wire.codec import decode
    from dpmarket.protocol.wire.errors import RemoteProtocolError
    n = int(sys.argv[2])
    frame = eval(sys.argv[1], {"n": n})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        decode(frame)
        outcome = "accepted"
    except RemoteProtocolError as exc:
        outcome = str(exc)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"growth": (after - before) * 1024, "size": len(frame), "outcome": outcome}))
    """
)


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_decoding_crafted_frames_costs_a_small_multiple_of_their_size(name: str) -> None:
    """Peak RSS growth of decoding an 8 MB crafted frame stays under twice its size (before the
    limits: 545 MB for 7.6 MB of empty arrays)."""
    run = subprocess.run(
        [sys.executable, "-c", _MEASURE, CRAFTED[name], str(8 * MB)],
        capture_output=True,
        text=True,
        check=True,
    )
    measured = json.loads(run.stdout)
    assert measured["outcome"].startswith("frame: ")
    assert measured["growth"] < 2 * measured["size"], measured

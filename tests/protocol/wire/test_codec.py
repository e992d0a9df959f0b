"""Tests of the wire codec in ``dpmarket.protocol.wire.codec``.

Covers: a round trip of every registered kind, a deterministic hypothesis fuzz of the decoder
invariant "a Message or RemoteProtocolError, never anything else" over more than 10,000 frames
(random bytes, mutated valid frames, structurally valid msgpack garbage), named refusals, the
ReplayGuard, local versus remote errors, and the immutability of decoded arrays.

Decoded arrays are *read-only views* of ``bytes`` objects owned by the decoded message (decode
copies a ``bytearray``/``memoryview`` input), so neither the caller nor the receiver can change
a decoded message afterwards. Locally built bodies keep the caller's array (no copy); ``encode``
re-checks them.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import math
import pkgutil
import typing
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dpmarket.protocol
from dpmarket.protocol.summary import messages as summary_messages
from dpmarket.protocol.wire.codec import (
    ALLOWED_DTYPES,
    MAX_ARRAY_BYTES,
    MAX_FRAME_BYTES,
    MAX_INT,
    MAX_STR_LEN,
    MIN_INT,
    Body,
    Message,
    ReplayGuard,
    body_kinds,
    decode,
    encode,
    encode_all,
    recipient,
    register,
)
from dpmarket.protocol.wire.errors import LocalProtocolError, ProtocolError, RemoteProtocolError

# Register the bodies of every protocol module, so "every registered kind" means all of them.
for _info in pkgutil.walk_packages(dpmarket.protocol.__path__, "dpmarket.protocol."):
    importlib.import_module(_info.name)


# ------------------------------------------------------------------------------- helpers
def body_classes() -> dict[str, type[Body]]:
    """Every registered body class by kind (walks the subclasses of Body)."""
    found: dict[str, type[Body]] = {}
    todo: list[type[Body]] = [Body]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.KIND:
            found[cls.KIND] = cls
    return {kind: found[kind] for kind in body_kinds()}


def make(body: Body, seq: int = 0, round_: int = 0, sender: str = "owner-1") -> Message:
    return Message(
        run="run-1", round=round_, sender=sender, recipient="curator", seq=seq, body=body
    )


def assert_same(a: object, b: object) -> None:
    """Deep equality of messages/bodies with arrays compared by dtype, shape and content."""
    assert type(a) is type(b)
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def wire(msg: Message) -> dict[str, Any]:
    """The decoded msgpack map of a valid message, for hand-made corruption."""
    raw: dict[str, Any] = msgpack.unpackb(encode(msg), raw=False)
    return raw


def pack(obj: object) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def check_invariant(frame: bytes) -> None:
    """The fuzz invariant; an accepted frame must also survive encode -> decode unchanged, and
    the relay's :func:`recipient` raises nothing but RemoteProtocolError and, on a frame the
    decoder accepts, names the decoded recipient."""
    try:
        to: str | None = recipient(frame)
    except RemoteProtocolError:
        to = None
    try:
        msg = decode(frame)
    except RemoteProtocolError:
        return
    assert to == msg.recipient
    assert_same(decode(encode(msg)), msg)


rng = np.random.default_rng(20240601)
EXAMPLES: list[Body] = [
    summary_messages.SetupBody(n_features=7, d=32, gamma=0.25, h1_seed=2**40, tau=3),
    summary_messages.SetupBody(n_features=1, d=1, gamma=1, h1_seed=-5, tau=1, less_trusted=True),
    summary_messages.SetupBody(  # every later, optional field away from its default (fuzz seeds)
        n_features=2,
        d=4,
        gamma=0.5,
        h1_seed=1,
        tau=1,
        max_deliveries=5,
        center=np.array([0.5, -1.0]),
        scale=np.array([2.0, 0.25]),
    ),
    summary_messages.ValidationBody(g_validation=rng.normal(size=32)),
    summary_messages.ValidationBody(g_validation=np.zeros(0, dtype="<f4")),
    summary_messages.EpochBody(g_summary=rng.normal(size=8).astype("<f4"), summary_size=12),
    summary_messages.EpochBody(g_summary=np.zeros(0), summary_size=0),
    summary_messages.EpochBody(g_summary=np.zeros(3), summary_size=0, explore=True),
    summary_messages.EpochBody(
        g_summary=np.zeros(3),
        summary_size=0,
        profile_sigma=4.5,
        profile_clip=0.3,
        profile_basis=rng.normal(size=6),
        profile_center=np.ones(3),
    ),
    summary_messages.ProfileBody(mean=rng.normal(size=8), records=180),
    summary_messages.BidBody(token=2**63 - 1, bid=-1.5e300),
    summary_messages.BidBody(token=0, bid=0.0),
    summary_messages.PassBody(),
    summary_messages.PassBody(reason="budget spent: é ∑ 漢"),
    summary_messages.CountBody(records=140),
    summary_messages.AskBody(token=17),
    summary_messages.DeliverBody(token=3, point=rng.integers(-9, 9, size=5), label=1.0),
    summary_messages.DeliverBody(token=4, hashed=np.array([True, False]), label=None),
    summary_messages.DeliverBody(
        token=5, point=np.arange(6, dtype="|u1"), hashed=np.arange(3, dtype="<i2")
    ),
    summary_messages.DeliverBody(token=6, point=np.array([1, 2], dtype="<u8")),
    summary_messages.FinishBody(epochs=9),
    summary_messages.FinishBody(epochs=0, reason="stopped"),
]
SEED_FRAMES = [encode(make(b, seq=i, round_=i // 3)) for i, b in enumerate(EXAMPLES)]
SEED_MAPS = [msgpack.unpackb(f, raw=False) for f in SEED_FRAMES]


# ------------------------------------------------------------------------------ round trips
@pytest.mark.parametrize("body", EXAMPLES, ids=lambda b: b.KIND)
def test_round_trip_examples(body: Body) -> None:
    msg = make(body, seq=5, round_=2)
    back = decode(encode(msg))
    assert_same(back, msg)
    assert back.kind == body.KIND


def test_examples_cover_every_kind_of_the_module() -> None:
    own = {k for k, cls in body_classes().items() if cls.__module__ == summary_messages.__name__}
    assert own == {b.KIND for b in EXAMPLES}
    dtypes = {
        getattr(b, f.name).dtype.str
        for b in EXAMPLES
        for f in dataclasses.fields(b)  # type: ignore[arg-type]
        if isinstance(getattr(b, f.name), np.ndarray)
    }
    assert {"<f8", "<f4", "<i8", "|b1", "|u1", "<i2", "<u8"} <= dtypes


def strategy_for(hint: Any) -> st.SearchStrategy[Any]:
    """Values of a supported field type (the set ``register`` admits)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return st.none() | strategy_for(inner)
    if origin is tuple:
        return st.lists(strategy_for(args[0]), max_size=4).map(tuple)
    if hint is np.ndarray or origin is np.ndarray:
        return st.sampled_from(sorted(ALLOWED_DTYPES)).flatmap(array_strategy)
    simple: dict[Any, st.SearchStrategy[Any]] = {
        bool: st.booleans(),
        int: st.integers(0, 64) | st.integers(MIN_INT, MAX_INT),
        float: st.floats(0, 1) | st.floats(allow_nan=False, allow_infinity=False),
        str: st.text(min_size=1, max_size=12),
        bytes: st.binary(max_size=32),
    }
    return simple[hint]


def array_strategy(dtype: str) -> st.SearchStrategy[Any]:
    shapes = hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=5)
    if dtype[1] == "f":
        width = 8 * int(dtype[2:])
        elements = st.floats(allow_nan=False, allow_infinity=False, width=width)  # type: ignore[arg-type]
        return hnp.arrays(np.dtype(dtype), shapes, elements=elements)
    return hnp.arrays(np.dtype(dtype), shapes)


@st.composite
def bodies(draw: st.DrawFn, kinds: list[str] | None = None) -> Body:
    cls = body_classes()[draw(st.sampled_from(kinds or body_kinds()))]
    hints = typing.get_type_hints(cls)
    values = {f.name: draw(strategy_for(hints[f.name])) for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    try:
        return cls(**values)
    except (ValueError, LocalProtocolError):  # a body's own semantic checks
        reject()


messages_strategy = st.builds(
    Message,
    run=st.text(min_size=1, max_size=8),
    round=st.integers(0, 2**53),
    sender=st.text(min_size=1, max_size=8),
    recipient=st.text(min_size=1, max_size=8),
    seq=st.integers(0, 2**53),
    body=bodies(),
)


@pytest.mark.parametrize("kind", body_kinds())
def test_round_trip_every_registered_kind(kind: str) -> None:
    @settings(
        max_examples=60,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
    )
    @given(body=bodies([kind]), seq=st.integers(0, 2**53))
    def run(body: Body, seq: int) -> None:
        msg = make(body, seq=seq)
        assert_same(decode(encode(msg)), msg)

    run()


# ----------------------------------------------------------------------------------- fuzz
FUZZ_QUOTA = {"random": 4000, "mutated": 3500, "structured": 3000}


def test_fuzz_quota_is_at_least_ten_thousand() -> None:
    assert sum(FUZZ_QUOTA.values()) >= 10_000


def run_counted(quota: int, strategy: st.SearchStrategy[bytes]) -> None:
    """Run the invariant over ``quota`` examples and check that they all really ran."""
    seen = [0]

    @settings(
        max_examples=quota,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(frame=strategy)
    def run(frame: bytes) -> None:
        seen[0] += 1
        check_invariant(frame)

    run()
    assert seen[0] >= quota


@pytest.mark.slow
def test_fuzz_random_bytes() -> None:
    strategy = st.binary(max_size=300) | st.binary(max_size=40).map(lambda b: b"\x88" + b)
    run_counted(FUZZ_QUOTA["random"], strategy)


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    frame = bytearray(draw(st.sampled_from(SEED_FRAMES)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "splice", "byte"]))
        i = draw(st.integers(0, max(len(frame) - 1, 0)))
        if op == "flip" and frame:
            frame[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "byte" and frame:
            frame[i] = draw(st.sampled_from([0x00, 0x7F, 0xC0, 0xC1, 0xC3, 0xCF, 0xD3, 0xDF, 0xFF]))
        elif op == "truncate":
            del frame[i:]
        elif op == "insert":
            frame[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del frame[i : i + draw(st.integers(1, 8))]
        else:
            other = draw(st.sampled_from(SEED_FRAMES))
            frame = frame[:i] + other[draw(st.integers(0, len(other))) :]
    return bytes(frame)


@pytest.mark.slow
def test_fuzz_mutated_frames() -> None:
    run_counted(FUZZ_QUOTA["mutated"], mutated_frames())


HUGE_INTS = [2**53, 2**53 + 1, 2**63 - 1, 2**63, MAX_INT, MIN_INT, -1]
BAD_DTYPES = ["|O", "<c16", ">f8", ">i4", "<f2", "|V8", "|S3", "<U4", "<M8[s]", "f8", "", "<f8 "]
leaves = (
    st.none()
    | st.booleans()
    | st.integers(MIN_INT, MAX_INT)
    | st.sampled_from(HUGE_INTS)
    | st.floats()
    | st.sampled_from([float("nan"), float("inf"), -float("inf")])
    | st.text(max_size=10)
    | st.binary(max_size=16)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=6))
)
keys = st.text(max_size=6) | st.sampled_from(["dtype", "shape", "data", "v", "kind", "body"])
garbage = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=10,
)
sizes = st.sampled_from([0, 1, 2, 3, 0, 2**20, 2**31, 2**63, MAX_INT, -1, True, 2.0])
EDGE_SHAPES = [[], [0], [0, 2**63], [2**31, 0, 2**31], [0, MAX_INT], [0, 2**20, 2**20, 2**20]]


@st.composite
def array_maps(draw: st.DrawFn) -> dict[str, object]:
    """Array maps that are often right in all but one respect (dtype, shape, data, keys)."""
    dtype = draw(st.sampled_from(sorted(ALLOWED_DTYPES)) | st.sampled_from(BAD_DTYPES) | garbage)
    shape: Any = draw(st.sampled_from(EDGE_SHAPES) | st.lists(sizes, max_size=5) | garbage)
    count = -1  # unless dtype and shape make sense, the data size does not matter
    sensible = isinstance(shape, list) and all(type(s) is int for s in shape)
    if sensible and isinstance(dtype, str) and dtype in ALLOWED_DTYPES:
        count = math.prod(shape) * np.dtype(dtype).itemsize
    choice = draw(st.sampled_from(["match", "match", "short", "nan", "random", "garbage"]))
    n = count if 0 <= count <= 256 else 0
    data: object = {
        "match": draw(st.binary(min_size=n, max_size=n)),
        "short": bytes(max(n - 1, 0)),
        "nan": b"\xff" * n,
        "random": draw(st.binary(max_size=64)),
        "garbage": draw(garbage),
    }[choice]
    raw = {"dtype": dtype, "shape": shape, "data": data}
    if draw(st.integers(0, 9)) == 0:
        raw[draw(st.sampled_from(["extra", "dtype", "shape", "data"]))] = draw(garbage)
    elif draw(st.integers(0, 9)) == 0:
        del raw[draw(st.sampled_from(sorted(raw)))]
    return raw


@st.composite
def structured_frames(draw: st.DrawFn) -> bytes:
    frame = copy.deepcopy(draw(st.sampled_from(SEED_MAPS)))
    body = frame["body"]
    arrays = sorted(k for k, v in body.items() if isinstance(v, dict) and "dtype" in v)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.integers(0, 8))
        target = frame if op < 3 else body
        name = draw(st.sampled_from([*sorted(target), "extra", "v", "token"]))
        if op in (0, 3):
            target[name] = draw(garbage)
        elif op in (1, 4):
            target.pop(name, None)
        elif op == 2:
            frame["kind"] = draw(st.sampled_from(body_kinds()))
        elif op in (5, 6):
            target[draw(st.sampled_from(arrays)) if arrays and op == 5 else name] = draw(
                array_maps()
            )
        elif op == 7:
            target[name] = draw(st.sampled_from([float("nan"), float("inf"), True, False]))
        else:
            target[name] = draw(st.sampled_from(HUGE_INTS))
    return pack(frame)


@pytest.mark.slow
def test_fuzz_structured_frames() -> None:
    run_counted(FUZZ_QUOTA["structured"], structured_frames())


# ------------------------------------------------------------------------ named refusals
def nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def frame_of(body: Body, /, **envelope: object) -> dict[str, Any]:
    raw = wire(make(body))
    raw.update(envelope)
    return raw


def refused(raw: object, match: str) -> None:
    data = raw if isinstance(raw, bytes) else pack(raw)
    with pytest.raises(RemoteProtocolError, match=match):
        decode(data)


def with_array(**array: object) -> dict[str, Any]:
    raw = frame_of(summary_messages.ValidationBody(g_validation=np.zeros(2)))
    raw["body"]["g_validation"].update(array)
    return raw


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"kind": "summary.nope"}, r"^kind: unknown message kind 'summary.nope'"),
        ({"kind": ["x"] * 2000}, r"^kind: unknown message kind <list>"),
        ({"kind": nested(3)}, r"^kind: unknown message kind <list>"),
        ({"kind": nested(1020)}, r"^frame: containers nested deeper than 8"),
        ({"v": 2}, r"^v: unsupported protocol version 2"),
        ({"v": 1.0}, r"^v: unsupported protocol version 1.0"),
        ({"v": True}, r"^v: unsupported protocol version True"),
        ({"seq": 2**53 + 1}, r"^seq: .* outside 0\.\.2\^53"),
        ({"seq": -1}, r"^seq: -1 outside"),
        ({"round": True}, r"^round: expected an integer, got bool"),
        ({"run": "r" * (MAX_STR_LEN + 1)}, r"^run: length 257 outside"),
        ({"from": ""}, r"^sender: length 0"),
        ({"to": b"curator"}, r"^recipient: expected a string, got bytes"),
        ({"body": [1, 2]}, r"^body: expected a map"),
    ],
)
def test_envelope_refusals(change: dict[str, object], match: str) -> None:
    refused(frame_of(summary_messages.AskBody(token=1), **change), match)


def test_missing_and_unknown_envelope_keys() -> None:
    raw = frame_of(summary_messages.AskBody(token=1))
    del raw["seq"]
    refused(raw, r"^envelope: missing \['seq'\], unknown \[\]")
    raw = frame_of(summary_messages.AskBody(token=1), sig=b"x")
    refused(raw, r"^envelope: missing \[\], unknown \['sig'\]")


def test_body_refusals() -> None:
    raw = frame_of(summary_messages.BidBody(token=1, bid=0.5))
    raw["body"]["colour"] = "red"
    refused(raw, r"^summary\.bid: unknown fields \['colour'\]")
    del raw["body"]["colour"], raw["body"]["token"]
    refused(raw, r"^summary\.bid\.token: missing")
    for bad, match in [
        (True, r"^summary\.bid\.token: expected an integer, got bool"),
        (1.0, r"^summary\.bid\.token: expected an integer, got float"),
    ]:
        raw = frame_of(summary_messages.BidBody(token=1, bid=0.5))
        raw["body"]["token"] = bad
        refused(raw, match)
    for bad in (float("nan"), float("inf"), -float("inf")):
        raw = frame_of(summary_messages.BidBody(token=1, bid=0.5))
        raw["body"]["bid"] = bad
        refused(raw, r"^summary\.bid\.bid: must be finite")
    raw = frame_of(summary_messages.PassBody())
    raw["body"]["reason"] = "x" * (64 * MAX_STR_LEN + 1)
    refused(raw, r"^summary\.pass\.reason: string of 16385 characters is too long")


@pytest.mark.parametrize("dtype", ["|O", "<c16", ">f8", "<f2", "float64"])
def test_dtype_refusals(dtype: str) -> None:
    refused(with_array(dtype=dtype), rf"^summary\.validation\.g_validation: dtype '{dtype}'")


@pytest.mark.parametrize(
    ("array", "match"),
    [
        ({"data": b"\x00" * 15}, r"15 data bytes do not match shape \[2\] of <f8"),
        ({"shape": [3]}, r"16 data bytes do not match shape \[3\]"),
        ({"shape": [2, -1]}, r"shape entries must be non-negative integers"),
        ({"shape": [True, 2]}, r"shape entries must be non-negative integers"),
        ({"shape": [1, 1, 1, 1, 2]}, r"shape must be a list of at most 4"),
        ({"shape": [0, 2**63], "data": b""}, r"shape \[0, 9223372036854775808\] exceeds"),
        ({"shape": [0, 2**20, 2**20], "data": b""}, r"exceeds \d+ bytes"),
        ({"data": np.array([1.0, np.nan]).tobytes()}, r"contains NaN or infinity"),
        ({"dtype": "|b1", "data": b"\x01\x02", "shape": [2]}, r"boolean data must be bytes 0 or 1"),
        ({"data": "text"}, r"data must be bytes"),
        ({"extra": 1}, r"an array must be a map of exactly dtype, shape, data"),
    ],
)
def test_array_refusals(array: dict[str, object], match: str) -> None:
    refused(with_array(**array), r"^summary\.validation\.g_validation: .*" + match)


def test_frame_level_refusals() -> None:
    refused(b"\x00" * (MAX_FRAME_BYTES + 1), rf"^frame: {MAX_FRAME_BYTES + 1} bytes exceeds")
    refused(b"", r"^frame: not a valid msgpack frame")
    refused(SEED_FRAMES[0] + b"\x00", r"^frame: not a valid msgpack frame \(ExtraData\)")
    refused(pack([1, 2]), r"^frame: expected a map, got list")
    refused(pack({1: 2}), r"^frame: not a valid msgpack frame")  # non-string map key
    ext = frame_of(summary_messages.AskBody(token=1), kind=msgpack.ExtType(1, b""))
    refused(ext, r"^frame: not a valid msgpack frame")
    with pytest.raises(RemoteProtocolError, match=r"^frame: expected bytes, got str"):
        decode("not bytes")  # type: ignore[arg-type]


def test_recipient_reads_the_envelope_alone_and_refuses_by_name() -> None:
    """What a relay reads of a frame it forwards: its ``to``, for every example kind and for
    bytearray and memoryview input; the frame limits are checked as by decode, and a frame
    without a string ``to`` is refused by name (the body is not read: its recipient decodes
    it and refuses what is wrong)."""
    for body in EXAMPLES:
        msg = make(body)
        data = encode(msg)
        assert recipient(data) == recipient(bytearray(data)) == msg.recipient
        assert recipient(memoryview(data)) == msg.recipient
    with pytest.raises(RemoteProtocolError, match=rf"^frame: {MAX_FRAME_BYTES + 1} bytes"):
        recipient(b"\x00" * (MAX_FRAME_BYTES + 1))
    for bad, match in [
        (b"", r"^frame: not a valid msgpack frame"),
        (SEED_FRAMES[0] + b"\x00", r"^frame: not a valid msgpack frame \(ExtraData\)"),
        (pack([1, 2]), r"^frame: not a valid msgpack frame"),
        (pack({"v": 1, "kind": "x"}), r"^envelope: missing \['to'\]"),
        (pack({"to": 7, "body": {}}), r"^to: expected a string, got 7"),
        (pack({"a": [[[[[[[[[[1]]]]]]]]]], "to": "n"}), r"^frame: containers nested deeper"),
    ]:
        with pytest.raises(RemoteProtocolError, match=match):
            recipient(bad)
    with pytest.raises(RemoteProtocolError, match=r"^frame: expected bytes, got str"):
        recipient("not bytes")  # type: ignore[arg-type]
    # a body the decoder refuses still names its recipient: the recipient refuses it
    assert recipient(pack({"to": "compute-1", "body": "garbage"})) == "compute-1"


def test_decode_accepts_bytearray_and_memoryview() -> None:
    msg = make(EXAMPLES[2])
    data = encode(msg)
    assert_same(decode(bytearray(data)), msg)
    assert_same(decode(memoryview(data)), msg)


def test_oversized_frame_refused_at_encode() -> None:
    big = np.zeros(MAX_ARRAY_BYTES // 8 - 16)
    body = summary_messages.DeliverBody(token=1, point=big, hashed=big)
    with pytest.raises(LocalProtocolError, match=r"^frame of \d+ bytes exceeds 67108864"):
        encode(make(body))
    with pytest.raises(LocalProtocolError, match=r"summary\.validation\.g_validation: shape"):
        summary_messages.ValidationBody(g_validation=np.zeros(MAX_ARRAY_BYTES // 8 + 1))


# ------------------------------------------------------------------------------ replay guard
def frames(*pairs: tuple[int, int], sender: str = "owner-1") -> list[bytes]:
    """Frames with the given (round, seq) pairs on one stream."""
    return [
        encode(make(summary_messages.AskBody(token=1), seq=s, round_=r, sender=sender))
        for r, s in pairs
    ]


def test_guard_accepts_increasing_and_refuses_replays() -> None:
    guard = ReplayGuard()
    first, second, third = frames((0, 0), (0, 5), (1, 6))
    decode(first, guard)
    decode(second, guard)
    with pytest.raises(RemoteProtocolError, match=r"^seq: 5 from owner-1 is replayed"):
        decode(second, guard)
    with pytest.raises(RemoteProtocolError, match=r"^seq: 0 .* out of order \(last 5\)"):
        decode(first, guard)
    decode(third, guard)
    (older,) = frames((0, 7))
    with pytest.raises(RemoteProtocolError, match=r"^round: 0 from owner-1 is older than round 1"):
        decode(older, guard)


def test_guard_refusal_leaves_state_untouched() -> None:
    guard = ReplayGuard()
    start, replay, older, nxt = frames((2, 10), (2, 10), (1, 11), (2, 11))
    decode(start, guard)
    before = copy.deepcopy(guard)
    for bad in (replay, older):
        with pytest.raises(RemoteProtocolError):
            decode(bad, guard)
        assert guard == before
    bad_body = wire(make(summary_messages.AskBody(token=1), seq=11, round_=2))
    bad_body["body"]["token"] = "x"
    with pytest.raises(RemoteProtocolError):
        decode(pack(bad_body), guard)
    assert guard == before
    assert decode(nxt, guard).seq == 11
    assert guard != before


def test_guard_streams_are_independent() -> None:
    guard = ReplayGuard()
    decode(frames((3, 9), sender="a")[0], guard)
    decode(frames((0, 0), sender="b")[0], guard)  # another sender starts from scratch
    other_run = wire(make(summary_messages.AskBody(token=1), seq=0))
    other_run["run"] = "run-2"
    decode(pack(other_run), guard)
    other_recipient = wire(make(summary_messages.AskBody(token=1), seq=0))
    other_recipient["to"] = "owner-9"
    decode(pack(other_recipient), guard)
    with pytest.raises(RemoteProtocolError, match=r"^seq"):
        decode(frames((3, 9), sender="a")[0], guard)


# ----------------------------------------------------------------------- local construction
LOCAL_MISUSE: list[tuple[Callable[[], object], str]] = [
    (
        lambda: summary_messages.BidBody(token="1", bid=0.5),
        r"summary\.bid\.token: expected an integer",
    ),  # type: ignore[arg-type]
    (
        lambda: summary_messages.BidBody(token=2**64, bid=0.5),
        r"summary\.bid\.token: integer .* 64-bit",
    ),
    (
        lambda: summary_messages.BidBody(token=1, bid=10**400),
        r"summary\.bid\.bid: integer .* 64-bit",
    ),
    (
        lambda: summary_messages.BidBody(token=1, bid=float("nan")),
        r"summary\.bid\.bid: must be finite",
    ),
    (
        lambda: summary_messages.SetupBody(1, 1, 0.5, 1, 1, less_trusted=1),
        r"less_trusted: expected a",
    ),  # type: ignore[arg-type]
    (lambda: summary_messages.PassBody(reason="\ud800"), r"summary\.pass\.reason: not encodable"),
    (
        lambda: summary_messages.ValidationBody(np.zeros(2, dtype=object)),
        r"dtype \|O is not allowed",
    ),
    (
        lambda: summary_messages.ValidationBody(np.zeros(2, dtype=">f8")),
        r"dtype >f8 is not allowed",
    ),
    (lambda: summary_messages.ValidationBody(np.zeros((1,) * 5)), r"5 dimensions, at most 4"),
    (lambda: summary_messages.ValidationBody([1.0]), r"expected a numpy array, got list"),  # type: ignore[arg-type]
    (lambda: make(summary_messages.AskBody(token=1), seq=-1), r"^seq: -1 outside"),
    (lambda: make(summary_messages.AskBody(token=1), sender="x" * 257), r"^sender: length 257"),
    (lambda: make(summary_messages.AskBody(token=1), sender="\udcff"), r"^sender: not encodable"),
    (lambda: Message("r", 0, "a", "b", 0, body="x"), r"^body: str is not a registered"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("build", "match"), LOCAL_MISUSE)
def test_local_misuse_raises_local_error(build: Callable[[], object], match: str) -> None:
    with pytest.raises(LocalProtocolError, match=match) as info:
        build()
    assert not isinstance(info.value, RemoteProtocolError)


def test_encode_rechecks_mutated_arrays() -> None:
    arr = np.zeros(3)
    msg = make(summary_messages.ValidationBody(g_validation=arr))
    arr[1] = np.inf  # the body keeps the caller's array; encode must notice
    with pytest.raises(LocalProtocolError, match=r"g_validation: contains NaN"):
        encode(msg)


def test_encode_all_equals_encode_for_shared_and_distinct_bodies() -> None:
    shared = summary_messages.ValidationBody(g_validation=np.arange(3.0))
    msgs = [make(shared, seq=i, sender=f"owner-{i}") for i in range(3)]
    msgs.insert(1, make(EXAMPLES[0], seq=9))
    assert encode_all(msgs) == [encode(m) for m in msgs]
    assert encode_all([]) == []


def test_encode_all_rechecks_mutated_arrays_and_refuses_non_messages() -> None:
    arr = np.zeros(3)
    msg = make(summary_messages.ValidationBody(g_validation=arr))
    arr[0] = np.nan
    with pytest.raises(LocalProtocolError, match=r"g_validation: contains NaN"):
        encode_all([msg, msg])
    with pytest.raises(LocalProtocolError, match="expected a Message"):
        encode_all([msg.body])  # type: ignore[list-item]


def test_int_is_widened_to_float() -> None:
    body = summary_messages.BidBody(token=1, bid=3)
    assert type(body.bid) is float
    raw = frame_of(summary_messages.BidBody(token=1, bid=0.5))
    raw["body"]["bid"] = 7
    assert type(decode(pack(raw)).body.bid) is float  # type: ignore[attr-defined]


def test_register_refuses_duplicates_and_unsupported_types() -> None:
    @dataclasses.dataclass(frozen=True)
    class Twice(Body):
        token: int

    @dataclasses.dataclass(frozen=True)
    class Mapping(Body):
        table: dict[str, int]

    @dataclasses.dataclass
    class Mutable(Body):  # encode re-checks only arrays: every other field must be frozen
        token: int

    before = body_kinds()
    with pytest.raises(ValueError, match="already registered"):
        register("summary.bid")(Twice)
    with pytest.raises(ValueError, match="Mutable must be a frozen dataclass"):
        register("test.mutable")(Mutable)
    with pytest.raises(ValueError, match=r"Mapping\.table: unsupported field type"):
        register("test.mapping")(Mapping)
    assert body_kinds() == before
    assert issubclass(LocalProtocolError, ProtocolError)


# --------------------------------------------------------------------- decoded immutability
def test_decoded_arrays_are_read_only_and_own_their_bytes() -> None:
    point = np.arange(6, dtype="<f8")
    buffer = bytearray(encode(make(summary_messages.DeliverBody(token=1, point=point))))
    msg = decode(buffer)
    decoded = msg.body.point  # type: ignore[attr-defined]
    assert not decoded.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        decoded[0] = 99.0
    buffer[:] = b"\xff" * len(buffer)  # the caller reuses its receive buffer
    assert np.array_equal(decoded, point)
    with pytest.raises(ValueError):
        decoded.setflags(write=True)

"""Record decoders: schema checks, each format, policies, incremental decoding and fuzzing.

The fuzz invariant (as h11's): any bytes give a valid batch plus rejects, never an exception;
decoding in chunks gives the same records, offsets and reject reasons as decoding at once; the
compiled number scanner and the msgpack fixed-layout path agree exactly with the general paths.
"""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dpmarket.streams.records.files import (
    ARITY,
    MALFORMED,
    NON_FINITE,
    NON_NUMERIC,
    OUT_OF_BOUNDS,
    TOO_LONG,
    TRUNCATED,
    ChunkDecoder,
    CsvDecoder,
    JsonlDecoder,
    MsgpackDecoder,
    RecordBatch,
    RejectsWriter,
    Schema,
    SchemaError,
    _scan_numbers,
    decode_npy,
    decoder_for,
    format_of,
    iter_records,
    probe,
    read_rejects,
)
from dpmarket.streams.records.text import _compiled_scanner

# The compiled scanner is taken once numba is loaded in the process (or once it pays:
# streams/records/text.py); loaded here, so that every comparison below of a decoder with its
# jit=False twin compares the compiled scanner with the general path.
try:
    import numba
except ImportError:  # an install without numba: both sides take the general path
    numba = None

SCHEMA = Schema.box(3, -10.0, 10.0, label_column=3)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reasons(batch: RecordBatch) -> list[tuple[int, str]]:
    return [(r.offset, r.reason) for r in batch.rejects]


def check_batch(batch: RecordBatch, schema: Schema, size: int) -> None:
    """The invariants every decoded batch satisfies, whatever the input."""
    n = len(batch)
    assert batch.features.dtype == np.float32 and batch.features.shape == (n, schema.n_features)
    assert np.isfinite(batch.features).all()
    lo, hi = schema.lo.astype(np.float32), schema.hi.astype(np.float32)
    assert (batch.features >= lo).all() and (batch.features <= hi).all()
    if schema.label_column is None:
        assert batch.labels is None
    else:
        assert batch.labels is not None and batch.labels.shape == (n,)
        assert np.isfinite(batch.labels).all()
    assert batch.offsets.dtype == np.int64 and (np.diff(batch.offsets) > 0).all()
    assert 0 <= batch.start <= batch.end <= size
    points = [*batch.offsets.tolist(), *(r.offset for r in batch.rejects)]
    assert all(batch.start <= p < max(batch.end, batch.start + 1) for p in points)


def decode_in_chunks(decoder: ChunkDecoder, data: bytes, cuts: list[int]) -> RecordBatch:
    """Feed ``data`` through ``decode`` split at ``cuts``, as the tailer does."""
    batches, remainder, offset, mid = [], b"", 0, False
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for a, b in itertools.pairwise(bounds):
        out = decoder.decode(remainder + data[a:b], offset, mid_record=mid)
        batches.append(out.batch)
        remainder, offset, mid = out.remainder, out.batch.end, out.mid_record
    batches.append(decoder.decode(remainder, offset, final=True, mid_record=mid).batch)
    return RecordBatch.concat(batches, decoder.schema)


def same_records(a: RecordBatch, b: RecordBatch) -> None:
    assert np.array_equal(a.features, b.features)
    assert np.array_equal(a.offsets, b.offsets)
    assert (a.labels is None) == (b.labels is None)
    if a.labels is not None and b.labels is not None:
        assert np.array_equal(a.labels, b.labels)
    assert reasons(a) == reasons(b)
    assert a.n_clipped == b.n_clipped


# ------------------------------------------------------------------------------ schema
@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"n_features": 0, "lower": (), "upper": ()}, "n_features"),
        ({"n_features": 2, "lower": (0.0,), "upper": (1.0, 1.0)}, "lower and upper"),
        ({"n_features": 1, "lower": (2.0,), "upper": (1.0,)}, "bounds"),
        ({"n_features": 1, "lower": (float("nan"),), "upper": (1.0,)}, "bounds"),
        ({"n_features": 1, "lower": (0.0,), "upper": (1.0,), "label_column": 2}, "label_column"),
        ({"n_features": 1, "lower": (0.0,), "upper": (1.0,), "policy": "drop"}, "policy"),
        ({"n_features": 1, "lower": ("a",), "upper": (1.0,)}, "lower/upper"),
    ],
)
def test_unusable_schema_raises_schema_error_naming_the_argument(
    kwargs: dict[str, object], word: str
) -> None:
    with pytest.raises(SchemaError, match=word):
        Schema(**kwargs)  # type: ignore[arg-type]


def test_decoder_options_are_checked() -> None:
    with pytest.raises(SchemaError, match="delimiter"):
        CsvDecoder(SCHEMA, delimiter="1")
    with pytest.raises(SchemaError, match="max_record_bytes"):
        JsonlDecoder(SCHEMA, max_record_bytes=3)
    with pytest.raises(ValueError, match="suffix"):
        format_of("data.parquet")
    with pytest.raises(ValueError, match="fmt"):
        decoder_for("npy", SCHEMA)


def test_bounds_are_rounded_to_float32() -> None:
    schema = Schema.box(2, -0.1, 0.1)
    assert schema.lower == (float(np.float32(-0.1)),) * 2
    assert schema.n_columns == 2 and SCHEMA.n_columns == 4


# --------------------------------------------------------------------------------- CSV
CSV = b"1,2,3,0\n4,5,6,1\nx,1,2,3\n1,2\n\n# note\n1,2,100,1\r\n1,nan,1,1\n-1e999,0,0,0\n7,8,9,1"


def test_csv_records_labels_offsets_and_rejects() -> None:
    out = CsvDecoder(SCHEMA).decode(CSV)
    batch = out.batch
    assert batch.features.tolist() == [[1, 2, 3], [4, 5, 6], [1, 2, 10]]
    assert batch.labels is not None and batch.labels.tolist() == [0, 1, 1]
    assert batch.offsets.tolist() == [0, 8, 36]
    assert batch.n_clipped == 1
    assert reasons(batch) == [(16, NON_NUMERIC), (24, ARITY), (47, NON_FINITE), (57, NON_FINITE)]
    assert out.remainder == b"7,8,9,1" and batch.end == len(CSV) - 7
    assert batch.rejects[0].raw == b"x,1,2,3" and batch.rejects[0].length == 7


def test_csv_final_takes_the_last_line_and_reject_policy_rejects_out_of_bounds() -> None:
    schema = Schema.box(3, -10.0, 10.0, label_column=3, policy="reject")
    batch = CsvDecoder(schema).decode_all(CSV)
    assert batch.offsets.tolist() == [0, 8, 70]
    assert (36, OUT_OF_BOUNDS) in reasons(batch) and batch.n_clipped == 0
    assert batch.end == len(CSV)


def test_csv_header_delimiter_whitespace_and_label_in_front() -> None:
    schema = Schema(2, (-1.0, 0.0), (1.0, 5.0), label_column=0)
    data = b"label;a;b\n 7 ; 0.5; 4\n8;-3;1e0\n"
    batch = CsvDecoder(schema, delimiter=";", header=True).decode_all(data)
    assert batch.labels is not None and batch.labels.tolist() == [7, 8]
    assert batch.features.tolist() == [[0.5, 4], [-1, 1]]
    assert batch.n_clipped == 1 and not batch.rejects


@pytest.mark.parametrize("delimiter", [",", "\t", ";", " "])
def test_any_delimiter_gives_the_same_records_compiled_or_not(delimiter: str) -> None:
    rows = [["1.5", "2", "3e0", "4"], ["1", "2", "", "4"], ["-0.25", "+7", "nan", "1"]]
    data = "\n".join(delimiter.join(row) for row in rows).encode() + b"\n1  2 3 4\n"
    fast = CsvDecoder(SCHEMA, delimiter=delimiter).decode_all(data)
    same_records(fast, CsvDecoder(SCHEMA, delimiter=delimiter, jit=False).decode_all(data))
    assert fast.features.tolist() == [[1.5, 2, 3]] and len(fast.rejects) == 3


@FUZZ
@given(
    st.lists(
        st.one_of(
            st.floats(allow_nan=False, allow_infinity=False, width=64),
            st.integers(-(10**20), 10**20),
        ),
        min_size=1,
        max_size=60,
    ),
    st.sampled_from(["{!r}", "{:.6g}", "{:.17g}", "{:e}", " {:.3f} ", "{:+.2E}", "{:.0f}."]),
)
def test_compiled_scanner_agrees_exactly_with_float(values: list[float], style: str) -> None:
    fields = [style.format(v) for v in values]
    buf = ("\n".join(fields) + "\n").encode()
    ends = np.flatnonzero(np.frombuffer(buf, np.uint8) == 10).astype(np.int64)
    starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
    out, ok = np.zeros((len(fields), 1)), np.zeros(len(fields), dtype=np.bool_)
    # the pure-Python kernel wants int64 bytes (numpy uint8 scalars would wrap)
    _scan_numbers(np.frombuffer(buf, np.uint8).astype(np.int64), starts, ends, 44, out, ok)
    for text, value, taken in zip(fields, out[:, 0], ok, strict=True):
        if taken:
            assert value == float(text) and np.signbit(value) == np.signbit(float(text)), text
    schema = Schema.box(1, -3e38, 3e38)
    fast = CsvDecoder(schema).decode_all(buf)
    slow = CsvDecoder(schema, jit=False).decode_all(buf)
    same_records(fast, slow)
    parsed = np.array([float(f) for f in fields])
    expected = np.clip(parsed[np.isfinite(parsed)], schema.lo[0], schema.hi[0])
    assert np.array_equal(fast.features[:, 0], expected.astype(np.float32))


def test_the_decoders_here_use_the_compiled_scanner_where_numba_is_installed() -> None:
    assert (_compiled_scanner() is not None) == (numba is not None)


def test_compiled_scanner_takes_plain_decimals() -> None:
    buf = b"0.25,-3,1.5e3\n1e23,0.1,2\n"
    ends = np.array([13, 24], dtype=np.int64)
    out, ok = np.zeros((2, 3)), np.zeros(2, dtype=np.bool_)
    _scan_numbers(
        np.frombuffer(buf, np.uint8).astype(np.int64), np.array([0, 14]), ends, 44, out, ok
    )
    assert ok.tolist() == [True, False]  # 1e23 is outside the exact fast path
    assert out[0].tolist() == [0.25, -3.0, 1500.0]


# ------------------------------------------------------------------------------- JSONL
def test_jsonl_arrays_objects_and_bad_lines() -> None:
    data = (
        b'[1,2,3,0]\n{"x":[1,2,3],"y":5}\n[1, "a", 2, 3]\n[[1],2,3,4]\nnot json\n'
        b'[1,2,3]\n[]\n  [1, 2, 3, 4] \n[true,1,2,3]\n{"x":[1,2,3]}\n7\n'
    )
    batch = JsonlDecoder(SCHEMA).decode_all(data)
    assert batch.features.tolist() == [[1, 2, 3]] * 3
    assert batch.labels is not None and batch.labels.tolist() == [0, 5, 4]
    assert batch.offsets.tolist() == [0, 10, 77]
    assert [r for _, r in reasons(batch)] == [
        NON_NUMERIC, NON_NUMERIC, MALFORMED, ARITY, ARITY, NON_NUMERIC, ARITY, MALFORMED,
    ]  # fmt: skip
    assert batch.rejects[3].raw == b"[1,2,3]" and batch.rejects[3].offset == 66


# ----------------------------------------------------------------------------- msgpack
def test_msgpack_fixed_layouts_maps_garbage_and_partial_tail() -> None:
    records = [[1.0, 2.0, 3.0, 1], [1.5, 2.5, 3.5, 2], [1, -2, 3, 4], {"x": [1, 2, 3], "y": 7}]
    records += ["junk", [1.0, 2.0, 3.0, 200], [1.0, 2.0, 30.0, -1]]
    data = b"".join(msgpack.packb(r) for r in records) + b"\xc1\xc1"
    data += msgpack.packb([0.5, 0.5, 0.5, 0]) + msgpack.packb([1.0, 2.0, 3.0, 1])[:-3]
    out = MsgpackDecoder(SCHEMA).decode(data)
    batch = out.batch
    expected = [[1, 2, 3], [1.5, 2.5, 3.5], [1, -2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 10]]
    assert batch.features.tolist() == [*expected, [0.5, 0.5, 0.5]]
    assert batch.labels is not None and batch.labels.tolist() == [1, 2, 4, 7, 200, -1, 0]
    assert [r.reason for r in batch.rejects] == [MALFORMED, MALFORMED]
    assert batch.rejects[1].raw == b"\xc1\xc1" and batch.n_clipped == 1
    assert out.remainder == msgpack.packb([1.0, 2.0, 3.0, 1])[:-3]
    same_records(batch, MsgpackDecoder(SCHEMA, fast=False).decode(data).batch)
    final = MsgpackDecoder(SCHEMA).decode_all(data)
    assert len(final) == 7 and final.end == len(data) and len(final.rejects) > 2


def test_msgpack_float32_and_array16_records_use_the_same_values() -> None:
    schema = Schema.box(17, -1e6, 1e6)
    rows = np.arange(17 * 40, dtype=np.float32).reshape(40, 17)
    packer = msgpack.Packer(use_single_float=True)
    data = b"".join(packer.pack(r) for r in rows.tolist())
    batch = MsgpackDecoder(schema).decode_all(data)
    assert np.array_equal(batch.features, rows) and not batch.rejects


# --------------------------------------------------------------------------------- npy
def npy_bytes(array: np.ndarray) -> bytes:
    stream = io.BytesIO()
    np.save(stream, array)
    return stream.getvalue()


@pytest.mark.parametrize("fortran", [False, True])
def test_npy_c_and_fortran_order(fortran: bool) -> None:
    values = np.arange(40.0).reshape(10, 4) - 20
    values = np.asfortranarray(values) if fortran else values
    batch = decode_npy(npy_bytes(values), SCHEMA, rows_per_batch=3)
    assert np.array_equal(batch.features, np.clip(values[:, :3], -10, 10))
    assert batch.labels is not None and np.array_equal(batch.labels, values[:, 3])
    assert len(np.unique(batch.offsets)) == 10 and not batch.rejects


def test_npy_unusable_files_are_one_reject_and_truncation_keeps_complete_rows() -> None:
    good = npy_bytes(np.ones((5, 4), dtype=np.float32))
    assert reasons(decode_npy(good[:-6], SCHEMA))[-1][1] == TRUNCATED
    assert len(decode_npy(good[:-6], SCHEMA)) == 4
    for bad, reason in [
        (b"not an npy file", MALFORMED),
        (npy_bytes(np.ones((5, 3))), ARITY),
        (npy_bytes(np.array(["a", "b"])), MALFORMED),
        (npy_bytes(np.array(3.0)), ARITY),
        (npy_bytes(np.ones((2, 4), dtype=np.complex64)), MALFORMED),
        (npy_bytes(np.ones((2, 4), dtype=object)), MALFORMED),
        (good + b"extra", MALFORMED),
    ]:
        batch = decode_npy(bad, SCHEMA)
        assert batch.rejects[-1].reason == reason, bad[:20]
    assert len(decode_npy(npy_bytes(np.arange(3.0)), Schema.box(1, 0, 5))) == 3


# ----------------------------------------------------------------------- incremental/fuzz
def sample_files(rng: np.random.Generator) -> dict[str, bytes]:
    rows = rng.normal(0.0, 6.0, size=(30, 4)).round(3)
    rows[::7, 1] = np.nan
    csv = "".join(",".join(str(v) for v in row) + "\n" for row in rows).encode()
    jsonl = "".join(json.dumps(row.tolist()) + "\n" for row in rows).replace("NaN", "1e999")
    jsonl += '{"x": [1, 2, 3], "y": 1}\n'
    packed = b"".join(msgpack.packb(row.tolist()) for row in rows) + msgpack.packb({"x": [1]})
    return {"csv": csv, "jsonl": jsonl.encode(), "msgpack": packed, "npy": npy_bytes(rows)}


def decode_whole(fmt: str, data: bytes) -> RecordBatch:
    if fmt == "npy":
        return decode_npy(data, SCHEMA)
    return decoder_for(fmt, SCHEMA).decode(data, final=True).batch


FILES = sample_files(np.random.default_rng(7))


@FUZZ
@given(st.sampled_from(sorted(FILES)), st.binary(max_size=400))
def test_random_bytes_never_raise(fmt: str, data: bytes) -> None:
    batch = decode_whole(fmt, data)
    check_batch(batch, SCHEMA, len(data))
    assert batch.end == len(data)


@FUZZ
@given(
    st.sampled_from(sorted(FILES)),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255), st.integers(0, 2)), max_size=8),
)
def test_mutated_valid_files_never_raise(fmt: str, edits: list[tuple[int, int, int]]) -> None:
    data = bytearray(FILES[fmt])
    for where, byte, kind in edits:
        i = where % (len(data) + 1)
        if kind == 0 and i < len(data):
            data[i] = byte
        elif kind == 1:
            data.insert(i, byte)
        elif i < len(data):
            del data[i]
    batch = decode_whole(fmt, bytes(data))
    check_batch(batch, SCHEMA, len(data))


@FUZZ
@given(
    st.sampled_from(["csv", "jsonl", "msgpack"]),
    st.lists(st.integers(0, 10**6), max_size=6),
    st.binary(max_size=40),
    st.integers(0, 10**6),
)
def test_chunked_decoding_equals_decoding_at_once(
    fmt: str, cuts: list[int], garbage: bytes, where: int
) -> None:
    data = FILES[fmt]
    i = where % (len(data) + 1)
    data = data[:i] + garbage + data[i:]
    whole = decoder_for(fmt, SCHEMA).decode(data, final=True).batch
    same_records(decode_in_chunks(decoder_for(fmt, SCHEMA), data, cuts), whole)
    check_batch(whole, SCHEMA, len(data))


@FUZZ
@given(st.binary(max_size=300), st.lists(st.integers(0, 400), max_size=4))
@example(b"\x00\x00\x00\x00\xdc\x81\x00", [])  # a skipped run ending in a partial value
def test_msgpack_fast_path_equals_general_path(data: bytes, cuts: list[int]) -> None:
    prefix = FILES["msgpack"][:200]
    fast = decode_in_chunks(MsgpackDecoder(SCHEMA), prefix + data, cuts)
    same_records(fast, MsgpackDecoder(SCHEMA, fast=False).decode_all(prefix + data))


@FUZZ
@given(st.sampled_from(["csv", "jsonl"]), st.binary(max_size=60), st.integers(0, 10**6))
def test_compiled_scanner_equals_general_path_on_any_bytes(
    fmt: str, garbage: bytes, where: int
) -> None:
    data = FILES[fmt]
    i = where % (len(data) + 1)
    data = data[:i] + garbage + data[i:]
    kind = CsvDecoder if fmt == "csv" else JsonlDecoder
    same_records(kind(SCHEMA).decode_all(data), kind(SCHEMA, jit=False).decode_all(data))


def test_too_long_lines_are_rejected_and_skipped_in_any_chunking() -> None:
    data = b"1,2,3,4\n" + b"5," * 40 + b"\n9,9,9,9\n"
    decoder = CsvDecoder(SCHEMA, max_record_bytes=32)
    whole = decoder.decode_all(data)
    assert whole.offsets.tolist() == [0, 89] and reasons(whole) == [(8, TOO_LONG)]
    chunked = decode_in_chunks(decoder, data, [20, 45, 70, 80])
    assert chunked.offsets.tolist() == [0, 89] and reasons(chunked) == [(8, TOO_LONG)]


# --------------------------------------------------------------------- files and rejects
def test_iter_records_over_files_with_rejects_file(tmp_path: Path) -> None:
    rejects_path = tmp_path / "rejects.jsonl"
    with RejectsWriter(rejects_path) as rejects:
        for fmt, data in FILES.items():
            path = tmp_path / f"data.{fmt}"
            path.write_bytes(data)
            batches = list(iter_records(path, SCHEMA, rejects=rejects, chunk_size=37))
            same_records(RecordBatch.concat(batches, SCHEMA), decode_whole(fmt, data))
    entries = read_rejects(rejects_path)
    expected = sum(len(decode_whole(fmt, data).rejects) for fmt, data in FILES.items())
    assert len(entries) == expected > 0
    first = entries[0]
    assert first["source"] == str(tmp_path / "data.csv") and first["reason"] == NON_FINITE
    assert set(first) == {"source", "offset", "reason", "detail", "length", "raw"}
    assert isinstance(first["offset"], int) and "nan" in str(first["raw"])


def test_rejects_raw_text_is_truncated_and_escaped(tmp_path: Path) -> None:
    data = b"\xff" + b"x" * 1000 + b"\n"
    batch = CsvDecoder(SCHEMA).decode_all(data)
    path = tmp_path / "r.jsonl"
    writer = RejectsWriter(path, fsync=True)
    assert writer.write("src", batch.rejects) == 1
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.write("src", batch.rejects)
    (entry,) = read_rejects(path)
    assert entry["length"] == 1001 and str(entry["raw"]).startswith("\\xffxxx")
    assert len(str(entry["raw"])) < 300


def test_probe_reads_a_bounded_prefix_with_lines_and_a_detected_header(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_bytes(b"x,y,label\n# comment\n1,2,0\n\n3,oops,1\n5,6\n" + b"7,8,1\n" * 1000)
    schema = Schema.box(2, 0.0, 10.0, label_column=2)
    found = probe(path, schema, max_rows=4, max_bytes=200)
    assert (found.rows, found.valid, found.columns) == (4, 2, 3)
    assert found.header and found.header_detected
    assert [(line, r.reason) for line, r in found.rejects] == [(5, "non_numeric"), (6, "arity")]
    cut = probe(path, schema, max_rows=1000, max_bytes=60)  # a cut prefix: whole lines only
    assert cut.rows == 6 and cut.size == path.stat().st_size  # 3 lines, then 3 of 6 bytes
    plain = probe(path, schema, header=False, max_rows=2)
    assert not plain.header and plain.rejects[0][0] == 1 and plain.valid == 1

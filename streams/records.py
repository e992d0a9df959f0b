"""Record decoders: CSV, JSONL, msgpack streams and ``.npy`` files into float32 batches.

A :class:`Schema` names the feature count, an optional label column and the public per-feature
bounds (DESIGN "The run", step 2: every valid record is clipped to the public bounds, which is
what bounds the sensitivity of every later release). Decoders turn bytes into a
:class:`RecordBatch`: ``features`` float32 ``(n, k)``, ``labels`` float64 ``(n,)`` or ``None``,
and the absolute byte offset of each record in its source.

Guarantees, for any input bytes whatsoever:

* no exception: bad input becomes :class:`Reject` entries (offset, reason, raw bytes); only an
  unusable schema or decoder option raises :class:`SchemaError` (at construction);
* every returned feature is finite and inside ``[lower, upper]`` (the bounds as float32): finite
  out-of-bounds values are clipped (``policy="clip"``) or rejected (``policy="reject"``); wrong
  arity, non-numeric, NaN and +-Inf values are always rejected; labels must be finite;
* incremental use is exact: ``decode(chunk)`` decodes the complete records and returns a
  partial trailing record as ``remainder``; feeding ``remainder + more`` continues the stream and
  yields the same records, offsets and reject reasons as decoding everything at once (a record
  longer than ``max_record_bytes`` is rejected as ``too_long`` either way).

Speed without per-record Python: line positions come from numpy over the byte buffer; a compiled
scanner (numba) parses lines of plain decimals exactly as ``float()`` does; the other lines are
converted in bulk by ``np.array(fields, float64)``, bisecting a failing block down to its bad
lines; msgpack arrays of fixed layout are read through a structured numpy view. Only bad or
unusual records take a per-record path, and every fast path equals its general path bit for bit.
"""

from __future__ import annotations

import io
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final, Literal, NamedTuple

import msgpack
import numpy as np
import numpy.typing as npt

__all__ = [
    "ARITY", "FORMATS", "MALFORMED", "NON_FINITE", "NON_NUMERIC", "OUT_OF_BOUNDS", "RAW_LIMIT",
    "TOO_LONG", "TRUNCATED", "ChunkDecoder", "CsvDecoder", "Decoded", "JsonlDecoder",
    "MsgpackDecoder", "RecordBatch", "Reject", "RejectsWriter", "Schema", "SchemaError",
    "decode_npy", "decoder_for", "format_of", "iter_records", "read_rejects",
]  # fmt: skip

Float32Array = npt.NDArray[np.float32]
Float64Array = npt.NDArray[np.float64]
Int64Array = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Policy = Literal["clip", "reject"]

ARITY: Final = "arity"
NON_NUMERIC: Final = "non_numeric"
NON_FINITE: Final = "non_finite"
OUT_OF_BOUNDS: Final = "out_of_bounds"
MALFORMED: Final = "malformed"
TOO_LONG: Final = "too_long"
TRUNCATED: Final = "truncated"
FORMATS: Final = ("csv", "jsonl", "msgpack", "npy")
RAW_LIMIT: Final = 256
_SUFFIXES: Final = {
    ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".msgpack": "msgpack",
    ".mpk": "msgpack", ".npy": "npy",
}  # fmt: skip
_EMPTY: Final = np.zeros(0, dtype=np.int64)


class SchemaError(ValueError):
    """The schema or a decoder option is unusable; the only error the decoders raise."""


@dataclass(frozen=True)
class Schema:
    """Feature count, optional label column, public bounds and the out-of-bounds policy.

    A raw record has ``n_columns`` values: the features in order, with the label (if any)
    inserted at index ``label_column`` (``0 <= label_column <= n_features``). Bounds are public
    (data-independent) and rounded to float32; they bound each feature of every accepted record.
    """

    n_features: int
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    label_column: int | None = None
    policy: Policy = "clip"
    lo: Float64Array = field(init=False, repr=False, compare=False)
    hi: Float64Array = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        k = self.n_features
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise SchemaError(f"n_features must be a positive int, got {k!r}")
        try:
            with np.errstate(over="ignore"):
                lo = np.asarray(self.lower, dtype=np.float32).astype(np.float64)
                hi = np.asarray(self.upper, dtype=np.float32).astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise SchemaError(f"lower/upper must be sequences of numbers ({exc})") from None
        if lo.shape != (k,) or hi.shape != (k,):
            raise SchemaError(f"lower and upper need {k} values, got {lo.shape} and {hi.shape}")
        if not (np.isfinite(lo).all() and np.isfinite(hi).all() and (lo <= hi).all()):
            raise SchemaError(
                f"bounds must be finite with lower <= upper: {self.lower}, {self.upper}"
            )
        label = self.label_column
        if label is not None and (isinstance(label, bool) or label not in range(k + 1)):
            raise SchemaError(f"label_column must be None or in 0..{k}, got {label!r}")
        if self.policy not in ("clip", "reject"):
            raise SchemaError(f"policy must be 'clip' or 'reject', got {self.policy!r}")
        object.__setattr__(self, "lower", tuple(float(v) for v in lo))
        object.__setattr__(self, "upper", tuple(float(v) for v in hi))
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)

    @classmethod
    def box(
        cls,
        n_features: int,
        low: float,
        high: float,
        *,
        label_column: int | None = None,
        policy: Policy = "clip",
    ) -> Schema:
        """The schema with the same bounds ``[low, high]`` for every feature."""
        if isinstance(n_features, bool) or not isinstance(n_features, int) or n_features < 1:
            raise SchemaError(f"n_features must be a positive int, got {n_features!r}")
        return cls(n_features, (low,) * n_features, (high,) * n_features, label_column, policy)

    @property
    def n_columns(self) -> int:
        """Values per raw record: the features plus the label column, if any."""
        return self.n_features + (self.label_column is not None)


@dataclass(frozen=True, slots=True)
class Reject:
    """One refused record: absolute byte ``offset``, ``reason`` code, detail and raw bytes.

    ``raw`` holds at most ``RAW_LIMIT`` bytes of the record; ``length`` is its full length.
    """

    offset: int
    reason: str
    detail: str
    raw: bytes
    length: int


def _reject(data: bytes, start: int, end: int, base: int, reason: str, detail: str) -> Reject:
    return Reject(
        base + start, reason, detail, data[start : min(end, start + RAW_LIMIT)], end - start
    )


def _rejects(
    data: bytes,
    spans: tuple[Int64Array, Int64Array],
    which: BoolArray,
    base: int,
    why: str,
    detail: str,
) -> list[Reject]:
    """Rejects of the spans ``[starts[i], ends[i])`` selected by ``which``."""
    starts, ends = spans
    return [
        _reject(data, int(starts[i]), int(ends[i]), base, why, detail)
        for i in np.flatnonzero(which)
    ]


@dataclass(frozen=True, eq=False)
class RecordBatch:
    """Decoded records of one span ``[start, end)`` of a source, plus the rejects of that span.

    ``features`` is float32 ``(n, k)`` within the schema bounds; ``labels`` float64 ``(n,)`` or
    ``None``; ``offsets`` int64 ``(n,)`` the absolute byte offset of each record (increasing);
    ``n_clipped`` counts accepted records that had at least one value clipped.
    """

    features: Float32Array
    labels: Float64Array | None
    offsets: Int64Array
    rejects: tuple[Reject, ...] = ()
    n_clipped: int = 0
    start: int = 0
    end: int = 0

    def __len__(self) -> int:
        return int(self.features.shape[0])

    @classmethod
    def empty(
        cls, schema: Schema, start: int = 0, end: int = 0, rejects: tuple[Reject, ...] = ()
    ) -> RecordBatch:
        """No records (only ``rejects``, if any) over the span ``[start, end)``."""
        labels = np.zeros(0) if schema.label_column is not None else None
        features = np.zeros((0, schema.n_features), dtype=np.float32)
        return cls(features, labels, _EMPTY, rejects, 0, start, end)

    @classmethod
    def concat(cls, batches: Sequence[RecordBatch], schema: Schema) -> RecordBatch:
        """All records and rejects of ``batches`` in order, spanning their union."""
        if not batches:
            return cls.empty(schema)
        labels = [b.labels for b in batches if b.labels is not None]
        return cls(
            np.concatenate([b.features for b in batches]),
            np.concatenate(labels) if schema.label_column is not None else None,
            np.concatenate([b.offsets for b in batches]),
            tuple(r for b in batches for r in b.rejects),
            sum(b.n_clipped for b in batches),
            batches[0].start,
            batches[-1].end,
        )


class Decoded(NamedTuple):
    """Result of an incremental decode: the batch, the undecoded tail and the resume flag."""

    batch: RecordBatch
    remainder: bytes
    mid_record: bool


def _finish(
    schema: Schema,
    values: Float64Array,
    starts: Int64Array,
    ends: Int64Array,
    data: bytes,
    base: int,
    rejects: list[Reject],
    start: int,
    end: int,
) -> RecordBatch:
    """Validate parsed rows (finite, bounds, policy) and assemble the batch."""
    label = schema.label_column
    cols = [j for j in range(schema.n_columns) if j != label]
    feats = values[:, cols]
    finite: BoolArray = np.logical_and.reduce(np.isfinite(values), axis=1)
    outside = ((feats < schema.lo) | (feats > schema.hi)).any(axis=1) & finite
    keep = finite & ~outside if schema.policy == "reject" else finite
    rejects += _rejects(data, (starts, ends), ~finite, base, NON_FINITE, "NaN or infinite value")
    rejects += _rejects(data, (starts, ends), finite & ~keep, base, OUT_OF_BOUNDS, "policy=reject")
    rejects.sort(key=lambda r: r.offset)
    features = np.clip(feats[keep], schema.lo, schema.hi).astype(np.float32)
    return RecordBatch(
        features,
        values[keep, label] if label is not None else None,
        (starts[keep] + base).astype(np.int64),
        tuple(rejects),
        int(np.count_nonzero(outside & keep)),
        start,
        end,
    )


# ------------------------------------------------------------------------- text (CSV, JSONL)
class _Lines(NamedTuple):
    buf: bytes  # data, plus a final b"\n" when a last line without newline was taken
    starts: Int64Array
    ends: Int64Array  # exclusive, without the newline and a trailing carriage return
    consumed: int
    mid_record: bool
    rejects: list[Reject]


def _split_lines(data: bytes, base: int, final: bool, mid_record: bool, max_bytes: int) -> _Lines:
    """Complete lines of ``data``; an over-long line is rejected and skipped to its newline."""
    nl = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    begin, rejects, too_long = 0, list[Reject](), f"> {max_bytes} bytes"
    if mid_record:
        if nl.size == 0:
            return _Lines(data, _EMPTY, _EMPTY, len(data), not final, rejects)
        begin, nl = int(nl[0]) + 1, nl[1:]
    consumed, buf, mid = (int(nl[-1]) + 1 if nl.size else begin), data, False
    if consumed < len(data) and final:
        buf, nl, consumed = data + b"\n", np.append(nl, len(data)), len(data)
    elif len(data) - consumed > max_bytes:
        rejects.append(_reject(data, consumed, len(data), base, TOO_LONG, too_long))
        consumed, mid = len(data), True
    starts = np.concatenate(([begin], nl[:-1] + 1)).astype(np.int64) if nl.size else _EMPTY
    ends = nl.astype(np.int64)
    arr = np.frombuffer(buf, dtype=np.uint8)
    ends = ends - ((ends > starts) & (arr[np.maximum(ends - 1, 0)] == 13))
    long = ends - starts > max_bytes
    rejects += _rejects(buf, (starts, ends), long, base, TOO_LONG, too_long)
    return _Lines(buf, starts[~long], ends[~long], consumed, mid, rejects)


def _count_in(positions: Int64Array, starts: Int64Array, ends: Int64Array) -> Int64Array:
    """How many of the sorted ``positions`` fall in each ``[start, end)``."""
    return np.searchsorted(positions, ends) - np.searchsorted(positions, starts)


_POW10 = np.array([10.0**i for i in range(23)])


def _scan_numbers(
    buf: npt.NDArray[np.uint8],
    starts: Int64Array,
    ends: Int64Array,
    delim: int,
    out: Float64Array,
    ok: BoolArray,
) -> None:  # the numba-compiled form is _scan_numbers_jit
    """Plain decimal fields, exactly as ``float()`` rounds them, for the easy lines.

    A field is taken only when it is ``[+-]digits[.digits][(e|E)[+-]digits]`` with at most
    15 significant digits and a decimal exponent within +-22 (spaces/tabs around it allowed
    unless they are the delimiter):
    then ``w * 10**e`` (or ``w / 10**-e``) is one correctly rounded IEEE operation on exact
    operands (Clinger's fast path), equal to ``float(field)``. A line with any other field, or
    with the wrong number of fields, gets ``ok[i] = False`` and is left to the general path.
    """
    kt = out.shape[1]
    for i in range(starts.size):
        p, end, j, good = starts[i], ends[i], 0, True
        while good:
            while p < end and (buf[p] == 32 or buf[p] == 9) and buf[p] != delim:
                p += 1
            neg = p < end and buf[p] == 45
            if p < end and (buf[p] == 45 or buf[p] == 43):
                p += 1
            w, sig, digits, frac, dot = 0, 0, 0, 0, False
            while p < end:
                c = buf[p]
                if 48 <= c <= 57:
                    digits += 1
                    if dot:
                        frac += 1
                    if w or c != 48:
                        sig += 1
                        w = w * 10 + (c - 48) if sig <= 15 else w
                elif c == 46 and not dot:
                    dot = True
                else:
                    break
                p += 1
            e, edigits = 0, 1
            if p < end and (buf[p] == 101 or buf[p] == 69):
                p, eneg, edigits = p + 1, False, 0
                if p < end and (buf[p] == 45 or buf[p] == 43):
                    p, eneg = p + 1, buf[p] == 45
                while p < end and 48 <= buf[p] <= 57:
                    e, edigits, p = min(e * 10 + buf[p] - 48, 1000), edigits + 1, p + 1
                e = -e if eneg else e
            while p < end and (buf[p] == 32 or buf[p] == 9) and buf[p] != delim:
                p += 1
            e -= frac
            if digits == 0 or edigits == 0 or sig > 15 or j == kt or (p < end and buf[p] != delim):
                good = False
            elif w == 0:
                out[i, j] = -0.0 if neg else 0.0
            elif -22 <= e <= 22:
                v = w * _POW10[e] if e >= 0 else w / _POW10[-e]
                out[i, j] = -v if neg else v
            else:
                good = False
            j += 1
            if p >= end:
                break
            p += 1
        ok[i] = good and j == kt


_scan_numbers_jit: Callable[..., None] | None
try:
    import numba

    _scan_numbers_jit = numba.njit(cache=True, nogil=True)(_scan_numbers)
except ImportError:  # pragma: no cover - numba is a declared dependency
    _scan_numbers_jit = None


def _parse_fields(fields: list[str], kt: int, n: int) -> tuple[Float64Array, BoolArray]:
    """Convert ``n`` rows of ``kt`` string fields; bisect failing blocks down to single rows."""
    out, ok = np.zeros((n, kt)), np.ones(n, dtype=np.bool_)
    stack = [(0, n)] if n else []
    while stack:
        lo, hi = stack.pop()
        try:
            block = fields if hi - lo == n else fields[lo * kt : hi * kt]
            out[lo:hi] = np.array(block, dtype=np.float64).reshape(hi - lo, kt)
        except (ValueError, OverflowError, TypeError):
            if hi - lo == 1:
                ok[lo] = False
            else:
                mid = (lo + hi) // 2
                stack += [(mid, hi), (lo, mid)]
    return out, ok


class _Rows(NamedTuple):
    values: Float64Array
    starts: Int64Array  # record spans, relative to the buffer
    ends: Int64Array
    rejects: list[Reject]


def _general(
    buf: bytes, starts: Int64Array, ends: Int64Array, delim: int, kt: int, base: int, pad: int
) -> _Rows:
    """Lines ``[starts, ends)`` of ``kt`` fields by ``float()`` semantics (any numeric text)."""
    if not starts.size:
        return _Rows(np.zeros((0, kt)), _EMPTY, _EMPTY, [])
    arr = np.frombuffer(buf, dtype=np.uint8)
    arity = _count_in(np.flatnonzero(arr == delim), starts, ends) + 1
    arity[starts == ends] = 0
    spans = (starts - pad, ends + pad)
    rejects = _rejects(buf, spans, arity != kt, base, ARITY, f"not {kt} fields")
    good = arity == kt
    starts, ends, spans = starts[good], ends[good], (spans[0][good], spans[1][good])
    size = len(buf) + 1
    marks = np.bincount(starts, minlength=size) - np.bincount(ends + 1, minlength=size)
    text = arr.copy()
    text[ends] = delim  # each line ends in a delimiter: one split gives all fields
    fields = text[np.cumsum(marks[:-1]) > 0].tobytes().decode("latin-1").split(chr(delim))
    values, ok = _parse_fields(fields[:-1], kt, int(starts.size))
    rejects += _rejects(buf, spans, ~ok, base, NON_NUMERIC, "a field is not a number")
    return _Rows(values[ok], spans[0][ok], spans[1][ok], rejects)


def _delimited(
    buf: bytes,
    starts: Int64Array,
    ends: Int64Array,
    delim: int,
    kt: int,
    base: int,
    pad: int,
    jit: bool,
) -> _Rows:
    """Parse lines ``[starts, ends)``: easy lines compiled, the rest by :func:`_general`."""
    values, easy = np.empty((starts.size, kt)), np.zeros(starts.size, dtype=np.bool_)
    if jit and _scan_numbers_jit is not None and starts.size:
        _scan_numbers_jit(np.frombuffer(buf, dtype=np.uint8), starts, ends, delim, values, easy)
    hard = _general(buf, starts[~easy], ends[~easy], delim, kt, base, pad)
    if not hard.values.size:
        return _Rows(values[easy], starts[easy] - pad, ends[easy] + pad, hard.rejects)
    all_starts = np.concatenate([starts[easy] - pad, hard.starts])
    order = np.argsort(all_starts, kind="stable")
    return _Rows(
        np.concatenate([values[easy], hard.values])[order],
        all_starts[order],
        np.concatenate([ends[easy] + pad, hard.ends])[order],
        hard.rejects,
    )


class ChunkDecoder(ABC):
    """Incremental decoder of a byte stream against a schema (what the tailer drives).

    ``decode`` may be fed any split of a stream, carrying ``remainder`` and ``mid_record``
    forward; the result equals decoding the whole stream at once. It never raises on data.
    """

    def __init__(self, schema: Schema, max_record_bytes: int) -> None:
        if not isinstance(schema, Schema):
            raise SchemaError(f"schema must be a Schema, got {type(schema).__name__}")
        if isinstance(max_record_bytes, bool) or not isinstance(max_record_bytes, int):
            raise SchemaError(f"max_record_bytes must be an int, got {max_record_bytes!r}")
        if max_record_bytes < 16:
            raise SchemaError(f"max_record_bytes must be >= 16, got {max_record_bytes}")
        self.schema, self.max_record_bytes = schema, max_record_bytes

    @abstractmethod
    def decode(
        self, data: bytes, base_offset: int = 0, *, final: bool = False, mid_record: bool = False
    ) -> Decoded:
        """Decode the complete records of ``data``, which starts at byte ``base_offset``.

        The undecoded tail is returned as ``remainder`` (unless ``final``: then everything is
        decoded or rejected). Pass ``mid_record`` back in with the next call.
        """

    def decode_all(self, data: bytes, base_offset: int = 0) -> RecordBatch:
        """Decode ``data`` as a whole file (a last record without terminator is decoded)."""
        return self.decode(data, base_offset, final=True).batch


class CsvDecoder(ChunkDecoder):
    """Delimited text, one record per line; blank lines and ``#`` comment lines are skipped.

    ``header=True`` skips the line at offset 0. Fields are parsed as :func:`float` parses them
    (surrounding whitespace allowed, no quoting). ``jit=False`` skips the compiled scanner of
    plain decimal lines; results are identical either way.
    """

    def __init__(
        self,
        schema: Schema,
        *,
        delimiter: str = ",",
        header: bool = False,
        max_record_bytes: int = 1 << 20,
        jit: bool = True,
    ) -> None:
        if len(delimiter) != 1 or not delimiter.isascii() or delimiter in "\r\n#0123456789.+-eE":
            raise SchemaError(f"delimiter must be one ASCII separator character, got {delimiter!r}")
        super().__init__(schema, max_record_bytes)
        self.delimiter, self.header, self.jit = delimiter, header, jit

    def decode(
        self, data: bytes, base_offset: int = 0, *, final: bool = False, mid_record: bool = False
    ) -> Decoded:
        """Decode complete lines; the partial last line is the remainder (unless ``final``)."""
        lines = _split_lines(data, base_offset, final, mid_record, self.max_record_bytes)
        arr = np.frombuffer(lines.buf, dtype=np.uint8)
        starts, ends = lines.starts, lines.ends
        keep = (ends > starts) & (arr[np.minimum(starts, len(arr) - 1)] != ord("#"))
        if self.header and base_offset == 0:
            keep &= starts != 0
        kt = self.schema.n_columns
        rows = _delimited(
            lines.buf, starts[keep], ends[keep], ord(self.delimiter), kt, base_offset, 0, self.jit
        )
        return _decoded(self.schema, lines, data, base_offset, [rows])


def _decoded(schema: Schema, lines: _Lines, data: bytes, base: int, parts: list[_Rows]) -> Decoded:
    """Merge row sets of one text chunk (in offset order) into the decode result."""
    starts = np.concatenate([r.starts for r in parts])
    order = np.argsort(starts, kind="stable")
    batch = _finish(
        schema,
        np.concatenate([r.values for r in parts])[order],
        starts[order],
        np.concatenate([r.ends for r in parts])[order],
        lines.buf,
        base,
        lines.rejects + [x for r in parts for x in r.rejects],
        base,
        base + lines.consumed,
    )
    return Decoded(batch, data[lines.consumed :], lines.mid_record)


def _row(obj: object, schema: Schema) -> tuple[list[float] | None, str, str]:
    """One decoded JSON/msgpack object as raw column values, or ``None`` and why not."""
    label = schema.label_column
    if isinstance(obj, dict):
        x = obj.get("x")
        if not isinstance(x, list | tuple):
            return None, MALFORMED, "a map record needs an array 'x'"
        if len(x) != schema.n_features:
            return None, ARITY, f"'x' has {len(x)} values, not {schema.n_features}"
        if label is not None and "y" not in obj:
            return None, ARITY, "missing label 'y'"
        items = list(x) if label is None else [*x[:label], obj["y"], *x[label:]]
    elif isinstance(obj, list | tuple):
        items = list(obj)
    else:
        return None, MALFORMED, f"not an array or map record ({type(obj).__name__})"
    if len(items) != schema.n_columns:
        return None, ARITY, f"{len(items)} values, not {schema.n_columns}"
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in items):
        return None, NON_NUMERIC, "a value is not a number"
    try:
        return [float(v) for v in items], "", ""
    except OverflowError:
        return [np.inf] * len(items), "", ""


def _object_rows(
    schema: Schema, objects: list[tuple[object, int, int]], data: bytes, base: int
) -> _Rows:
    """Rows of decoded objects ``(obj, start, end)``; bad ones become rejects."""
    rows: list[list[float]] = []
    starts: list[int] = []
    ends: list[int] = []
    rejects: list[Reject] = []
    for obj, s, e in objects:
        row, reason, detail = _row(obj, schema)
        if row is None:
            rejects.append(_reject(data, s, e, base, reason, detail))
        else:
            rows.append(row)
            starts.append(s)
            ends.append(e)
    values = np.array(rows, dtype=np.float64).reshape(len(rows), schema.n_columns)
    return _Rows(values, np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64), rejects)


class JsonlDecoder(ChunkDecoder):
    """One JSON value per line: an array of ``n_columns`` numbers, or ``{"x": [...], "y": v}``.

    Lines of the form ``[n, n, ...]`` (no strings, maps or nested arrays) take the vectorised
    CSV path; every other line is parsed with :func:`json.loads`. Booleans are not numbers.
    """

    def __init__(
        self, schema: Schema, *, max_record_bytes: int = 1 << 20, jit: bool = True
    ) -> None:
        super().__init__(schema, max_record_bytes)
        self.jit = jit

    def decode(
        self, data: bytes, base_offset: int = 0, *, final: bool = False, mid_record: bool = False
    ) -> Decoded:
        """Decode complete lines; the partial last line is the remainder (unless ``final``)."""
        lines = _split_lines(data, base_offset, final, mid_record, self.max_record_bytes)
        buf, starts, ends = lines.buf, lines.starts, lines.ends
        arr = np.frombuffer(buf, dtype=np.uint8)
        flat = (ends - starts >= 2) & (arr[np.minimum(starts, len(arr) - 1)] == ord("["))
        flat &= arr[np.maximum(ends - 1, 0)] == ord("]")
        for special, count in ((b"[", 1), (b"]", 1), (b"{", 0), (b'"', 0)):
            flat &= _count_in(np.flatnonzero(arr == special[0]), starts, ends) == count
        kt = self.schema.n_columns
        fast = _delimited(
            buf, starts[flat] + 1, ends[flat] - 1, ord(","), kt, base_offset, 1, self.jit
        )
        objects, bad = [], []
        for i in np.flatnonzero(~flat & (ends > starts)):
            a, b = int(starts[i]), int(ends[i])
            try:
                objects.append((json.loads(buf[a:b]), a, b))
            except (ValueError, RecursionError):
                bad.append(_reject(buf, a, b, base_offset, MALFORMED, "not valid JSON"))
        slow = _object_rows(self.schema, objects, buf, base_offset)
        slow.rejects.extend(bad)
        return _decoded(self.schema, lines, data, base_offset, [fast, slow])


# --------------------------------------------------------------------------------- msgpack
_TYPED: Final = {  # msgpack type byte -> big-endian payload of a fixed-size number
    0xCA: ">f4", 0xCB: ">f8", 0xCC: "u1", 0xCD: ">u2", 0xCE: ">u4", 0xCF: ">u8",
    0xD0: "i1", 0xD1: ">i2", 0xD2: ">i4", 0xD3: ">i8",
}  # fmt: skip
_PARTIAL, _BAD = "partial", "bad"


@dataclass(frozen=True)
class _Layout:
    """A fixed msgpack byte layout of one array record: exact bytes, fixint bytes, value dtype."""

    stride: int
    exact_cols: Int64Array
    exact_vals: npt.NDArray[np.uint8]
    fixint_cols: Int64Array
    dtype: np.dtype[np.void]


def _layout_at(data: bytes, p: int, kt: int) -> _Layout | None:
    """The layout of the array record at ``p`` if all its values are fixed-size numbers."""
    head = data[p]
    if head == 0x90 | kt and kt < 16:
        pos = 1
    elif head == 0xDC and data[p + 1 : p + 3] == kt.to_bytes(2, "big"):
        pos = 3
    else:
        return None
    exact, fixint, offsets = list(range(pos)), list[int](), list[int]()
    names: list[str] = []
    formats: list[str] = []
    for j in range(kt):
        if p + pos >= len(data):
            return None
        kind = data[p + pos]
        fmt = _TYPED.get(kind)
        if kind < 0x80 or kind >= 0xE0:
            fixint.append(pos)
            names, formats, offsets = [*names, f"v{j}"], [*formats, "i1"], [*offsets, pos]
            pos += 1
            continue
        if fmt is None:
            return None
        exact.append(pos)
        names, formats, offsets = [*names, f"v{j}"], [*formats, fmt], [*offsets, pos + 1]
        pos += 1 + np.dtype(fmt).itemsize
    if p + pos > len(data):
        return None
    dtype = np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": pos})
    return _Layout(
        pos,
        np.array(exact, dtype=np.int64),
        np.frombuffer(data, dtype=np.uint8, count=pos, offset=p)[exact].copy(),
        np.array(fixint, dtype=np.int64),
        dtype,
    )


def _run(data: bytes, p: int, layout: _Layout, limit: int) -> Float64Array:
    """Values of the longest run (at most ``limit``) of records at ``p`` matching ``layout``."""
    m = min(limit, (len(data) - p) // layout.stride)
    view = np.frombuffer(data, dtype=np.uint8, count=m * layout.stride, offset=p)
    view = view.reshape(m, layout.stride)
    good = (view[:, layout.exact_cols] == layout.exact_vals).all(axis=1)
    fix = view[:, layout.fixint_cols]
    good &= ((fix < 0x80) | (fix >= 0xE0)).all(axis=1)
    r = m if good.all() else int(np.argmin(good))
    records = np.frombuffer(data, dtype=layout.dtype, count=r, offset=p)
    names = layout.dtype.names or ()
    values = np.empty((r, len(names)), dtype=np.float64)
    for j, name in enumerate(names):
        values[:, j] = records[name]
    return values


class MsgpackDecoder(ChunkDecoder):
    """A stream of msgpack values, each an array of ``n_columns`` numbers or a map
    ``{"x": [...], "y": v}``.

    Arrays whose values are all fixed-size numbers (floats, sized ints, fixints) are read in
    runs through a structured numpy view (``fast=True``; results are identical either way).
    Bytes that are not msgpack are skipped one at a time and reported as one ``malformed``
    reject per run; a value that would need more than ``max_record_bytes`` is ``too_long``.
    """

    def __init__(
        self, schema: Schema, *, max_record_bytes: int = 1 << 16, fast: bool = True
    ) -> None:
        super().__init__(schema, max_record_bytes)
        self.fast = fast

    def _unpack_one(self, data: bytes, p: int, final: bool) -> tuple[object, int]:
        """The value at ``p`` and its end, or ``(_PARTIAL | _BAD | TOO_LONG, p)``."""
        window = 4096
        while True:
            end = min(len(data), p + window)
            unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=window)
            unpacker.feed(data[p:end])
            try:
                obj = unpacker.unpack()
            except msgpack.OutOfData:
                if end < len(data) and window < self.max_record_bytes:
                    window *= 4
                    continue
                if end - p >= self.max_record_bytes:
                    return TOO_LONG, p
                return (_BAD if final else _PARTIAL), p
            except Exception:  # msgpack raises many types for garbage; all mean "not msgpack"
                return _BAD, p
            return obj, p + int(unpacker.tell())

    def decode(
        self, data: bytes, base_offset: int = 0, *, final: bool = False, mid_record: bool = False
    ) -> Decoded:
        """Decode complete values; a partial last value is the remainder (unless ``final``).

        ``mid_record`` is accepted for the :class:`ChunkDecoder` protocol and has no effect:
        msgpack resynchronises byte by byte.
        """
        kt, p, window, skip = self.schema.n_columns, 0, 64, -1
        blocks: list[tuple[Float64Array, Int64Array, Int64Array]] = []
        objects: list[tuple[object, int, int]] = []
        rejects: list[Reject] = []
        while p < len(data):
            layout = _layout_at(data, p, kt) if self.fast else None
            fits = layout is not None and len(data) - p >= layout.stride
            obj, q = (None, p) if fits else self._unpack_one(data, p, final)
            if obj is _PARTIAL:
                if skip >= 0 and p - skip <= self.max_record_bytes:
                    p, skip = skip, -1  # decide the skipped run with the rest, as at once
                break
            if obj is _BAD or obj is TOO_LONG:
                skip, p = (p if skip < 0 else skip), p + 1
                continue
            if skip >= 0:
                rejects.append(_reject(data, skip, p, base_offset, MALFORMED, "not msgpack"))
                skip = -1
            if layout is not None and fits:
                values = _run(data, p, layout, window)
                ends = p + layout.stride * np.arange(1, len(values) + 1, dtype=np.int64)
                blocks.append((values, ends - layout.stride, ends))
                window = min(window * 2, 1 << 16) if len(values) == window else 64
                p = int(ends[-1])
            else:
                objects.append((obj, p, q))
                p = q
        if skip >= 0:
            rejects.append(_reject(data, skip, p, base_offset, MALFORMED, "not msgpack"))
        rows = _object_rows(self.schema, objects, data, base_offset)
        values = np.concatenate([b[0] for b in blocks] + [rows.values])
        starts = np.concatenate([b[1] for b in blocks] + [rows.starts])
        ends_all = np.concatenate([b[2] for b in blocks] + [rows.ends])
        order = np.argsort(starts, kind="stable")
        batch = _finish(
            self.schema, values[order], starts[order], ends_all[order], data, base_offset,
            rejects + rows.rejects, base_offset, base_offset + p,
        )  # fmt: skip
        return Decoded(batch, data[p:], False)


# ------------------------------------------------------------------------------------- npy
def _npy_header(fp: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype[np.generic]]:
    """Shape, Fortran order and dtype of a ``.npy`` stream positioned at its start."""
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(fp)
    return np.lib.format.read_array_header_2_0(fp)


def _npy_batches(
    fp: IO[bytes], size: int, schema: Schema, rows_per_batch: int
) -> Iterator[RecordBatch]:
    """Batches of a ``.npy`` stream of ``size`` bytes; an unusable file is one reject."""
    kt, head = schema.n_columns, fp.read(RAW_LIMIT)
    fp.seek(0)
    try:
        shape, fortran, dtype = _npy_header(fp)
    except Exception as exc:  # numpy raises several types for a bad header
        reject = Reject(0, MALFORMED, f"not a .npy file ({type(exc).__name__})", head, size)
        yield RecordBatch.empty(schema, 0, size, (reject,) if size else ())
        return
    start, numeric = fp.tell(), dtype.kind in "biuf"
    columns = 1 if len(shape) == 1 else shape[-1] if len(shape) == 2 else -1
    row_bytes = kt * dtype.itemsize
    n_rows = min(shape[0], (size - start) // row_bytes) if numeric and columns == kt else 0
    if not numeric or columns != kt or (fortran and kt > 1 and n_rows < shape[0]):
        reason = MALFORMED if not numeric else ARITY if columns != kt else TRUNCATED
        detail = f"array {shape} of {dtype}, fortran_order={fortran}"
        yield RecordBatch.empty(schema, 0, size, (Reject(0, reason, detail, head, size),))
        return
    if fortran and kt > 1:  # column-major: all rows at once
        values = np.frombuffer(fp.read(n_rows * row_bytes), dtype=dtype).reshape(kt, n_rows).T
        rel = np.arange(n_rows, dtype=np.int64) * dtype.itemsize
        end = start + n_rows * row_bytes
        yield _finish(schema, values.astype(np.float64), rel, rel, b"", start, [], start, end)
    else:
        for first in range(0, n_rows, rows_per_batch):
            count = min(rows_per_batch, n_rows - first)
            raw = fp.read(count * row_bytes)
            values = np.frombuffer(raw, dtype=dtype).reshape(count, kt).astype(np.float64)
            rel = np.arange(count, dtype=np.int64) * row_bytes
            base = start + first * row_bytes
            yield _finish(
                schema, values, rel, rel + row_bytes, raw, base, [], base, base + len(raw)
            )
    tail = start + n_rows * row_bytes
    if tail < size:
        reason, detail = (
            (TRUNCATED, "partial last row")
            if n_rows < shape[0]
            else (MALFORMED, "bytes after the array")
        )
        fp.seek(tail)
        reject = Reject(tail, reason, detail, fp.read(RAW_LIMIT), size - tail)
        yield RecordBatch.empty(schema, tail, size, (reject,))


def decode_npy(data: bytes, schema: Schema, *, rows_per_batch: int = 1 << 16) -> RecordBatch:
    """Decode the bytes of a whole ``.npy`` file: a numeric ``(n, n_columns)`` array (or
    ``(n,)`` when ``n_columns == 1``); anything else is rejected, never raised."""
    batches = list(_npy_batches(io.BytesIO(data), len(data), schema, rows_per_batch))
    return RecordBatch.concat(batches, schema)


# ----------------------------------------------------------------------- files and rejects
def format_of(path: str | Path) -> str:
    """The record format of ``path`` by its suffix (``.csv``, ``.jsonl``/``.ndjson``,
    ``.msgpack``/``.mpk``, ``.npy``); raises ``ValueError`` for any other suffix."""
    suffix = Path(path).suffix.lower()
    found = _SUFFIXES.get(suffix)
    if found is None:
        raise ValueError(f"path {str(path)!r}: unknown record format suffix {suffix!r}")
    return found


def decoder_for(fmt: str, schema: Schema) -> ChunkDecoder:
    """The incremental decoder of a stream format: ``csv``, ``jsonl`` or ``msgpack``."""
    if fmt == "csv":
        return CsvDecoder(schema)
    if fmt == "jsonl":
        return JsonlDecoder(schema)
    if fmt == "msgpack":
        return MsgpackDecoder(schema)
    raise ValueError(f"fmt must be one of 'csv', 'jsonl', 'msgpack' for streaming, got {fmt!r}")


def iter_records(
    path: str | Path,
    schema: Schema,
    *,
    decoder: ChunkDecoder | None = None,
    rejects: RejectsWriter | None = None,
    chunk_size: int = 1 << 22,
) -> Iterator[RecordBatch]:
    """Batches of a whole file in one pass (format from the suffix unless ``decoder`` is given).

    Rejects are written to ``rejects`` (if given) as each batch is produced; batches that
    carry neither records nor rejects are skipped.
    """
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    source = str(path)
    for batch in _file_batches(Path(path), schema, decoder, chunk_size):
        if rejects is not None and batch.rejects:
            rejects.write(source, batch.rejects)
        if len(batch) or batch.rejects:
            yield batch


def _file_batches(
    path: Path, schema: Schema, decoder: ChunkDecoder | None, chunk_size: int
) -> Iterator[RecordBatch]:
    if decoder is None and format_of(path) == "npy":
        with path.open("rb") as fp:
            size = path.stat().st_size
            yield from _npy_batches(fp, size, schema, max(1, chunk_size // 64))
        return
    decoder = decoder or decoder_for(format_of(path), schema)
    remainder, offset, mid = b"", 0, False
    with path.open("rb") as fp:
        while True:
            chunk = fp.read(chunk_size)
            data = remainder + chunk
            batch, remainder, mid = decoder.decode(data, offset, final=not chunk, mid_record=mid)
            offset = batch.end
            yield batch
            if not chunk:
                return


def _entry(source: str, reject: Reject) -> dict[str, object]:
    raw = reject.raw.decode("utf-8", "backslashreplace")
    return {"source": source, "offset": reject.offset, "reason": reject.reason,
            "detail": reject.detail, "length": reject.length, "raw": raw}  # fmt: skip


class RejectsWriter:
    """Appends rejects to a JSONL file: one object per reject with ``source`` (path),
    ``offset``, ``reason``, ``detail``, ``length`` (bytes) and ``raw`` (the first bytes of the
    record as text, undecodable bytes backslash-escaped). ``fsync=True`` makes each
    :meth:`write` durable before it returns."""

    def __init__(self, path: str | Path, *, fsync: bool = False) -> None:
        self.path, self.fsync = Path(path), fsync
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")

    def write(self, source: str, rejects: Iterable[Reject]) -> int:
        """Append ``rejects`` of ``source``; returns how many were written."""
        if self._file is None:
            raise ValueError(f"RejectsWriter for {str(self.path)!r} is closed")
        lines = [json.dumps(_entry(source, r)) + "\n" for r in rejects]
        if lines:
            self._file.write("".join(lines))
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
        return len(lines)

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> RejectsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_rejects(path: str | Path) -> list[dict[str, object]]:
    """All reject entries of a rejects file, in order."""
    text = Path(path).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line]

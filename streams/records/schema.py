"""Records against a schema: the schema and its policy, batches, rejects and the decoder contract.

A :class:`Schema` names the feature count, an optional label column and the public per-feature
bounds (DESIGN "The run", step 2: every valid record is clipped to the public bounds, which is
what bounds the sensitivity of every later release). Every decoder parses raw column values and
hands them to :func:`finish_rows`, the one place the policy is applied: values must be finite
(NaN and +-Inf are rejected), finite out-of-bounds features are clipped (``policy="clip"``) or
rejected (``policy="reject"``). A refused record becomes a :class:`Reject` with its absolute
byte offset, a reason code and its first ``RAW_LIMIT`` bytes; only an unusable schema or decoder
option raises (:class:`SchemaError`, at construction).

:class:`ChunkDecoder` is the incremental contract the tailer drives; the decoders live in
:mod:`~dpmarket.streams.records.text` (CSV, JSONL), :mod:`~dpmarket.streams.records.msgpack_stream`
and
:mod:`~dpmarket.streams.records.files` (``.npy`` and files). :func:`object_rows` is the shared
arity/type policy of records decoded to Python objects (JSON, msgpack).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = [
    "ARITY", "EMPTY_INDEX", "FORMATS", "MALFORMED", "NON_FINITE", "NON_NUMERIC", "OUT_OF_BOUNDS",
    "RAW_LIMIT", "TOO_LONG", "TRUNCATED", "BoolArray", "ChunkDecoder", "Decoded", "Float32Array",
    "Float64Array", "Int64Array", "Policy", "RecordBatch", "Reject", "Rows", "Schema",
    "SchemaError", "finish_rows", "object_rows", "reject_span", "reject_spans",
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
EMPTY_INDEX: Final = np.zeros(0, dtype=np.int64)


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


def reject_span(data: bytes, start: int, end: int, base: int, reason: str, detail: str) -> Reject:
    """The reject of ``data[start:end]``, a record at absolute offset ``base + start``."""
    return Reject(
        base + start, reason, detail, data[start : min(end, start + RAW_LIMIT)], end - start
    )


def reject_spans(
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
        reject_span(data, int(starts[i]), int(ends[i]), base, why, detail)
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
        return cls(features, labels, EMPTY_INDEX, rejects, 0, start, end)

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


def finish_rows(
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
    spans = (starts, ends)
    rejects += reject_spans(data, spans, ~finite, base, NON_FINITE, "NaN or infinite value")
    rejects += reject_spans(data, spans, finite & ~keep, base, OUT_OF_BOUNDS, "policy=reject")
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


class Rows(NamedTuple):
    """Parsed raw column values of records not yet checked against the schema's policy."""

    values: Float64Array
    starts: Int64Array  # record spans, relative to the buffer
    ends: Int64Array
    rejects: list[Reject]


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


def object_rows(
    schema: Schema, objects: list[tuple[object, int, int]], data: bytes, base: int
) -> Rows:
    """Rows of decoded objects ``(obj, start, end)``; bad ones become rejects."""
    rows: list[list[float]] = []
    starts: list[int] = []
    ends: list[int] = []
    rejects: list[Reject] = []
    for obj, s, e in objects:
        row, reason, detail = _row(obj, schema)
        if row is None:
            rejects.append(reject_span(data, s, e, base, reason, detail))
        else:
            rows.append(row)
            starts.append(s)
            ends.append(e)
    values = np.array(rows, dtype=np.float64).reshape(len(rows), schema.n_columns)
    return Rows(values, np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64), rejects)


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

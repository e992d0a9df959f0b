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

This module holds what touches files: the ``.npy`` reader, :func:`iter_records` over a whole
file and the rejects file (:class:`RejectsWriter`, :func:`read_rejects`); the tailer's state
file lives in :mod:`~dpmarket.streams.records.position`. The schema, policy,
batches and rejects live in :mod:`~dpmarket.streams.records.schema`, the text decoders in
:mod:`~dpmarket.streams.records.text` and the msgpack decoder in
:mod:`~dpmarket.streams.records.msgpack_stream`; every public name is re-exported here.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

import numpy as np

from dpmarket.streams.records.msgpack_stream import MsgpackDecoder
from dpmarket.streams.records.schema import (
    ARITY,
    FORMATS,
    MALFORMED,
    NON_FINITE,
    NON_NUMERIC,
    OUT_OF_BOUNDS,
    RAW_LIMIT,
    TOO_LONG,
    TRUNCATED,
    ChunkDecoder,
    Decoded,
    RecordBatch,
    Reject,
    Schema,
    SchemaError,
    finish_rows,
)
from dpmarket.streams.records.schema import Float32Array as Float32Array
from dpmarket.streams.records.text import CsvDecoder, JsonlDecoder
from dpmarket.streams.records.text import _scan_numbers as _scan_numbers

__all__ = [
    "ARITY", "FORMATS", "MALFORMED", "NON_FINITE", "NON_NUMERIC", "OUT_OF_BOUNDS", "RAW_LIMIT",
    "TOO_LONG", "TRUNCATED", "ChunkDecoder", "CsvDecoder", "Decoded", "JsonlDecoder",
    "MsgpackDecoder", "Probe", "RecordBatch", "Reject", "RejectsWriter", "Schema",
    "SchemaError", "decode_npy", "decoder_for", "format_of", "iter_records", "probe",
    "read_rejects",
]  # fmt: skip

_SUFFIXES: Final = {
    ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".msgpack": "msgpack",
    ".mpk": "msgpack", ".npy": "npy",
}  # fmt: skip


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
        yield finish_rows(schema, values.astype(np.float64), rel, rel, b"", start, [], start, end)
    else:
        for first in range(0, n_rows, rows_per_batch):
            count = min(rows_per_batch, n_rows - first)
            raw = fp.read(count * row_bytes)
            values = np.frombuffer(raw, dtype=dtype).reshape(count, kt).astype(np.float64)
            rel = np.arange(count, dtype=np.int64) * row_bytes
            base = start + first * row_bytes
            yield finish_rows(
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


def _entry(source: str, reject: Reject, seq: int | None) -> dict[str, object]:
    raw = reject.raw.decode("utf-8", "backslashreplace")
    entry: dict[str, object] = {"source": source, "offset": reject.offset, "reason": reject.reason,
            "detail": reject.detail, "length": reject.length, "raw": raw}  # fmt: skip
    if seq is not None:
        entry["seq"] = seq
    return entry


class RejectsWriter:
    """Appends rejects to a JSONL file: one object per reject with ``source`` (path),
    ``offset``, ``reason``, ``detail``, ``length`` (bytes) and ``raw`` (the first bytes of the
    record as text, undecodable bytes backslash-escaped) and, when written with ``first_seq``,
    ``seq`` (the tailer's running count). ``fsync=True`` makes each :meth:`write` durable
    before it returns."""

    def __init__(self, path: str | Path, *, fsync: bool = False) -> None:
        self.path, self.fsync = Path(path), fsync
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")

    def write(self, source: str, rejects: Iterable[Reject], first_seq: int | None = None) -> int:
        """Append ``rejects`` of ``source`` (numbered from ``first_seq`` if given); returns how
        many were written."""
        if self._file is None:
            raise ValueError(f"RejectsWriter for {str(self.path)!r} is closed")
        lines = [
            json.dumps(_entry(source, r, None if first_seq is None else first_seq + i)) + "\n"
            for i, r in enumerate(rejects)
        ]
        if lines:
            self._file.write("".join(lines))
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
        return len(lines)

    @property
    def size(self) -> int:
        """The rejects file's length in bytes (everything written so far is flushed)."""
        if self._file is None:
            raise ValueError(f"RejectsWriter for {str(self.path)!r} is closed")
        return os.fstat(self._file.fileno()).st_size

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


# ----------------------------------------------------------- a bounded look at a file
@dataclass(frozen=True)
class Probe:
    """The first rows of a record file (:func:`probe`): ``rejects`` with their 1-based line
    (0 for binary formats), ``columns`` on the first data line of a CSV file, and whether the
    first line was skipped as a header (``header``), detected rather than configured, or
    configured although that line is all numbers (``header_numeric``: a record lost); the
    probed valid records' ``features`` (after the policy) and ``labels``, at most ``max_rows``."""

    path: str
    format: str
    size: int
    rows: int
    valid: int
    rejects: tuple[tuple[int, Reject], ...]
    columns: int | None = None
    header: bool = False
    header_detected: bool = False
    header_numeric: bool = False
    features: tuple[tuple[float, ...], ...] = ()
    labels: tuple[float, ...] = ()


def _numbers(line: bytes) -> bool:
    try:
        return bool([float(v) for v in line.split(b",")]) and bool(line.strip())
    except ValueError:
        return False


def probe(
    path: str | Path, schema: Schema, *, header: bool | None = None, max_bytes: int = 1 << 16,
    max_rows: int = 50,
) -> Probe:  # fmt: skip
    """Decode the first ``max_rows`` records within the first ``max_bytes`` bytes of ``path``.

    ``header`` (CSV): ``True`` skips the first line, ``False`` never, ``None`` when detected
    (its fields are not all numbers, the next line's are). Raises ``OSError`` for a file that
    cannot be read, ``ValueError`` for an unknown suffix; bad records are rejects.
    """
    path, detected, columns, numeric = Path(path), False, None, False
    fmt = format_of(path)
    with path.open("rb") as fp:
        size = os.fstat(fp.fileno()).st_size
        if fmt == "npy":
            first = next(_npy_batches(fp, size, schema, max_rows), RecordBatch.empty(schema))
            rejects = tuple((0, r) for r in first.rejects)
            return Probe(str(path), fmt, size, len(first) + len(rejects), len(first), rejects)
        prefix = fp.read(max_bytes)
    final = len(prefix) >= size
    if fmt in ("csv", "jsonl"):  # complete, non-blank, non-comment lines only
        parts = prefix.split(b"\n")
        starts = np.cumsum([0] + [len(p) + 1 for p in parts])
        lines = [
            (int(o), p.rstrip(b"\r"))
            for o, p in zip(starts, parts if final else parts[:-1], strict=False)
            if p.strip() and not p.startswith(b"#")
        ]
        if fmt == "csv" and header is None and len(lines) > 1 and lines[0][0] == 0:
            header = detected = not _numbers(lines[0][1]) and _numbers(lines[1][1])
        elif fmt == "csv" and header and lines and lines[0][0] == 0:
            numeric = _numbers(lines[0][1])
        skip = 1 if fmt == "csv" and header and lines and lines[0][0] == 0 else 0
        columns = len(lines[skip][1].split(b",")) if fmt == "csv" and lines[skip:] else None
        keep = lines[: max_rows + skip]
        prefix, final = (prefix[: keep[-1][0] + len(keep[-1][1])] if keep else b""), True
    decoder = CsvDecoder(schema, header=bool(header)) if fmt == "csv" else decoder_for(fmt, schema)
    batch = decoder.decode(prefix, 0, final=final).batch
    text = fmt in ("csv", "jsonl")
    located = tuple((prefix.count(b"\n", 0, r.offset) + 1 if text else 0, r) for r in batch.rejects)
    n = len(batch) + len(located)
    skipped = bool(header) and fmt == "csv"
    features = tuple(tuple(float(v) for v in row) for row in batch.features)
    labels = () if batch.labels is None else tuple(float(v) for v in batch.labels)
    return Probe(
        str(path), fmt, size, n, len(batch), located, columns, skipped, detected, numeric,
        features, labels,
    )  # fmt: skip

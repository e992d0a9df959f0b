"""Text record decoders: CSV and JSONL lines into float32 batches (see :mod:`records_schema`).

Speed without per-record Python: line positions come from numpy over the byte buffer; a compiled
scanner (numba, when installed) parses lines of plain decimals exactly as ``float()`` does, once
it pays: numba is imported when it is already loaded in the process or once this process has
decoded :data:`JIT_FROM_BYTES` without it (about what importing numba costs in numpy time; a
process that reads a few small files never loads it); the other lines are converted in bulk by
``np.array(fields, float64)``, bisecting a failing block down to its bad lines. JSONL lines that
are flat arrays of numbers take the CSV path, the others :func:`json.loads`. Every fast path
equals its general path bit for bit, and incremental use is exact: a partial last line is
returned as the remainder, and an over-long line is rejected as ``too_long`` however the stream
is split.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from dpmarket.streams.records.schema import (
    ARITY,
    EMPTY_INDEX,
    MALFORMED,
    NON_NUMERIC,
    TOO_LONG,
    BoolArray,
    ChunkDecoder,
    Decoded,
    Float64Array,
    Int64Array,
    Reject,
    Rows,
    Schema,
    SchemaError,
    finish_rows,
    object_rows,
    reject_span,
    reject_spans,
)

__all__ = ["CsvDecoder", "JsonlDecoder"]


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
            return _Lines(data, EMPTY_INDEX, EMPTY_INDEX, len(data), not final, rejects)
        begin, nl = int(nl[0]) + 1, nl[1:]
    consumed, buf, mid = (int(nl[-1]) + 1 if nl.size else begin), data, False
    if consumed < len(data) and final:
        buf, nl, consumed = data + b"\n", np.append(nl, len(data)), len(data)
    elif len(data) - consumed > max_bytes:
        rejects.append(reject_span(data, consumed, len(data), base, TOO_LONG, too_long))
        consumed, mid = len(data), True
    starts = np.concatenate(([begin], nl[:-1] + 1)).astype(np.int64) if nl.size else EMPTY_INDEX
    ends = nl.astype(np.int64)
    arr = np.frombuffer(buf, dtype=np.uint8)
    ends = ends - ((ends > starts) & (arr[np.maximum(ends - 1, 0)] == 13))
    long = ends - starts > max_bytes
    rejects += reject_spans(buf, (starts, ends), long, base, TOO_LONG, too_long)
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
) -> None:  # the numba-compiled form is _compiled_scanner
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


_scanner: list[Callable[..., None] | None] = []  # once looked for: the compiled scanner or None
# bytes decoded without the compiled scanner before numba is imported for it (module docstring):
# the general path runs at about 13 MB/s on this project's machine, so about as long as
# importing numba and loading the cached scanner
JIT_FROM_BYTES = 8 << 20
_general_bytes = [0]  # bytes this process decoded by the general path while numba was unloaded


def _compiled_scanner(size: int = 0) -> Callable[..., None] | None:
    """The compiled scanner for a buffer of ``size`` bytes, or None: the general path, for
    every line in an agent installed without numba (numba is never imported at import), and
    until it pays here (module docstring; ``size`` counts towards it)."""
    if not _scanner:
        if sys.modules.get("numba") is None and _general_bytes[0] + size < JIT_FROM_BYTES:
            _general_bytes[0] += size
            return None
        try:
            import numba
        except ImportError:
            _scanner.append(None)
        else:
            _scanner.append(numba.njit(cache=True, nogil=True)(_scan_numbers))
    return _scanner[0]


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


def _general(
    buf: bytes, starts: Int64Array, ends: Int64Array, delim: int, kt: int, base: int, pad: int
) -> Rows:
    """Lines ``[starts, ends)`` of ``kt`` fields by ``float()`` semantics (any numeric text)."""
    if not starts.size:
        return Rows(np.zeros((0, kt)), EMPTY_INDEX, EMPTY_INDEX, [])
    arr = np.frombuffer(buf, dtype=np.uint8)
    arity = _count_in(np.flatnonzero(arr == delim), starts, ends) + 1
    arity[starts == ends] = 0
    spans = (starts - pad, ends + pad)
    rejects = reject_spans(buf, spans, arity != kt, base, ARITY, f"not {kt} fields")
    good = arity == kt
    starts, ends, spans = starts[good], ends[good], (spans[0][good], spans[1][good])
    size = len(buf) + 1
    marks = np.bincount(starts, minlength=size) - np.bincount(ends + 1, minlength=size)
    text = arr.copy()
    text[ends] = delim  # each line ends in a delimiter: one split gives all fields
    fields = text[np.cumsum(marks[:-1]) > 0].tobytes().decode("latin-1").split(chr(delim))
    values, ok = _parse_fields(fields[:-1], kt, int(starts.size))
    rejects += reject_spans(buf, spans, ~ok, base, NON_NUMERIC, "a field is not a number")
    return Rows(values[ok], spans[0][ok], spans[1][ok], rejects)


def _delimited(
    buf: bytes,
    starts: Int64Array,
    ends: Int64Array,
    delim: int,
    kt: int,
    base: int,
    pad: int,
    jit: bool,
) -> Rows:
    """Parse lines ``[starts, ends)``: easy lines compiled, the rest by :func:`_general`."""
    values, easy = np.empty((starts.size, kt)), np.zeros(starts.size, dtype=np.bool_)
    scan = _compiled_scanner(len(buf)) if jit and starts.size else None
    if scan is not None:
        scan(np.frombuffer(buf, dtype=np.uint8), starts, ends, delim, values, easy)
    hard = _general(buf, starts[~easy], ends[~easy], delim, kt, base, pad)
    if not hard.values.size:
        return Rows(values[easy], starts[easy] - pad, ends[easy] + pad, hard.rejects)
    all_starts = np.concatenate([starts[easy] - pad, hard.starts])
    order = np.argsort(all_starts, kind="stable")
    return Rows(
        np.concatenate([values[easy], hard.values])[order],
        all_starts[order],
        np.concatenate([ends[easy] + pad, hard.ends])[order],
        hard.rejects,
    )


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


def _decoded(schema: Schema, lines: _Lines, data: bytes, base: int, parts: list[Rows]) -> Decoded:
    """Merge row sets of one text chunk (in offset order) into the decode result."""
    starts = np.concatenate([r.starts for r in parts])
    order = np.argsort(starts, kind="stable")
    batch = finish_rows(
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
                bad.append(reject_span(buf, a, b, base_offset, MALFORMED, "not valid JSON"))
        slow = object_rows(self.schema, objects, buf, base_offset)
        slow.rejects.extend(bad)
        return _decoded(self.schema, lines, data, base_offset, [fast, slow])

"""The msgpack record decoder: a stream of msgpack values into float32 batches.

Arrays whose values are all fixed-size numbers are read in runs through a structured numpy view;
every other value is unpacked one at a time and checked by the shared object-record policy
(:func:`~dpmarket.streams.records.schema.object_rows`); results are identical either way. Bytes
that are not msgpack are skipped and reported as one ``malformed`` reject per run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgpack
import numpy as np
import numpy.typing as npt

from dpmarket.streams.records.schema import (
    MALFORMED,
    TOO_LONG,
    ChunkDecoder,
    Decoded,
    Float64Array,
    Int64Array,
    Reject,
    Schema,
    finish_rows,
    object_rows,
    reject_span,
)

__all__ = ["MsgpackDecoder"]

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
                rejects.append(reject_span(data, skip, p, base_offset, MALFORMED, "not msgpack"))
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
            rejects.append(reject_span(data, skip, p, base_offset, MALFORMED, "not msgpack"))
        rows = object_rows(self.schema, objects, data, base_offset)
        values = np.concatenate([b[0] for b in blocks] + [rows.values])
        starts = np.concatenate([b[1] for b in blocks] + [rows.starts])
        ends_all = np.concatenate([b[2] for b in blocks] + [rows.ends])
        order = np.argsort(starts, kind="stable")
        batch = finish_rows(
            self.schema, values[order], starts[order], ends_all[order], data, base_offset,
            rejects + rows.rejects, base_offset, base_offset + p,
        )  # fmt: skip
        return Decoded(batch, data[p:], False)

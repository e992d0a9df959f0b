"""Each record's counter column in every row of a RACE sketch, kept as records arrive.

A RACE sketch adds a record x to counter ``(r, l_r(x) mod W)`` of every row r
(:mod:`~dpmarket.streams.race.sketch`). That column depends only on x and the sketch's public
parameters (family, seed, rows, width), so an owner whose records arrive over time can hash
each record once, when it arrives, and count any subset of its records later (a round's live
records, the records added since a base round) without hashing them again:
:class:`SketchColumns`. Its counters are those of ``RaceSketch.update`` over the same records,
bit for bit: the codes are :meth:`LshFamily.hash`'s, which the compiled kernels equal
(tests/streams/race/test_columns.py).

Nothing here is released: the columns stay with the records' owner, and what a secure-sum
round sends is the counter vector, as before (actors/parties/dcaowner.py). Memory: ``rows``
columns of 2 bytes per record for widths up to 2^16 (4 bytes above).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from dpmarket.streams.race.lsh import LshFamily, as_points
from dpmarket.streams.race.queries import check_width

__all__ = ["SketchColumns"]

_COUNT_CHUNK = 1 << 20  # column entries counted per pass: the index temporaries stay small
_HASH_CHUNK = 1 << 14  # records hashed per pass: their int32 codes stay a few MB


class SketchColumns:
    """The columns of records ``0 .. n - 1`` of one owner in a sketch of ``family`` and
    ``width``; :meth:`extend` appends the next records' (records only grow at the end)."""

    def __init__(self, family: LshFamily, width: int) -> None:
        if not isinstance(family, LshFamily):
            raise ValueError(f"family must be an LshFamily, got {type(family).__name__}")
        self.family, self.width = family, check_width(width)
        self._dtype = np.uint16 if self.width <= 1 << 16 else np.int32
        self._parts: list[NDArray[np.generic]] = []
        self._last: NDArray[np.float32] | None = None  # the last record hashed
        self.n = 0

    def extend(self, X: npt.ArrayLike) -> None:
        """Hash the next records (``[m, dim]``, converted to float32 as ``RaceSketch.update``
        does) and keep their columns."""
        points = as_points(np.asarray(X, dtype=np.float32), self.family.dim)
        if not points.shape[0]:
            return
        kept = np.empty((points.shape[0], self.family.rows), dtype=self._dtype)
        for start in range(0, points.shape[0], _HASH_CHUNK):  # small temporaries per chunk
            codes = self.family.hash(points[start : start + _HASH_CHUNK])
            kept[start : start + _HASH_CHUNK] = np.mod(codes, self.width, out=codes)
        self._parts.append(kept)
        self._last = points[-1].copy()
        self.n += points.shape[0]

    def holds(self, X: npt.ArrayLike) -> bool:
        """Whether ``X`` still begins with the records hashed here, as far as a cheap check
        sees: at least ``n`` of them, the ``n``-th equal to the last one hashed."""
        records = np.asarray(X)
        if self.n == 0 or self._last is None:
            return True
        if len(records) < self.n:
            return False
        return bool(np.array_equal(records[self.n - 1].astype(np.float32), self._last))

    def columns(self) -> NDArray[np.generic]:
        """Every kept column, ``[n, rows]``."""
        if len(self._parts) != 1:
            empty = np.zeros((0, self.family.rows), dtype=self._dtype)
            self._parts = [np.concatenate(self._parts) if self._parts else empty]
        return self._parts[0]

    def counters(
        self, start: int = 0, live: npt.NDArray[np.bool_] | None = None
    ) -> NDArray[np.int64]:
        """The flat ``int64[rows * width]`` counters (``RaceSketch.counter_vector``) of the
        records ``start .. n - 1``, of those where ``live`` (``[n]``) is True when given."""
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= self.n:
            raise ValueError(f"start: expected an integer in [0, {self.n}], got {start!r}")
        if live is not None and np.shape(live) != (self.n,):
            raise ValueError(f"live: expected shape ({self.n},), got {np.shape(live)}")
        chosen = self.columns()[start:]
        if live is not None:
            chosen = chosen[np.asarray(live, dtype=np.bool_)[start:]]
        rows = self.family.rows
        offsets = np.arange(rows, dtype=np.intp) * self.width
        out = np.zeros(rows * self.width, dtype=np.int64)
        step = max(1, _COUNT_CHUNK // rows)
        for first in range(0, len(chosen), step):
            index = chosen[first : first + step].astype(np.intp) + offsets
            out += np.bincount(index.ravel(), minlength=rows * self.width)
        return out

"""Sketch columns kept as records arrive (streams/race/columns.py): counted, they give the
counters of a RACE sketch of the same records, bit for bit, for any start and live subset."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpmarket.streams.race.columns import SketchColumns
from dpmarket.streams.race.lsh import MAX_ABS_INPUT, LshFamily, make_family
from dpmarket.streams.race.sketch import RaceSketch

FAMILIES = [
    (make_family("l2", 3, 5, 11, bandwidth=0.7), 16),
    (make_family("srp", 3, 4, 12, bits=3), 8),
    (make_family("l2", 3, 2, 13, bandwidth=0.05), 70_000),  # above 2^16: 4-byte columns
]


def _records(n: int, seed: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    return np.random.default_rng(seed).normal(size=(n, 3))


@pytest.mark.parametrize(("family", "width"), FAMILIES)
def test_counted_columns_are_the_sketch_of_the_same_records(family: LshFamily, width: int) -> None:
    X = _records(900, 1)
    columns = SketchColumns(family, width)
    for part in np.array_split(X, [1, 250, 250, 600]):  # arrivals of 1, 249, 0, 350, 300
        columns.extend(part)
    assert columns.n == len(X)
    live = np.random.default_rng(2).random(len(X)) < 0.6
    backends = ["numpy"] + (["numba"] if _numba() else [])
    for start, mask in [(0, None), (0, live), (333, None), (333, live), (900, None)]:
        chosen = X[start:] if mask is None else X[start:][mask[start:]]
        for backend in backends:
            sketch = RaceSketch(family, width, backend=backend)
            sketch.update(chosen.astype(np.float32))
            got = columns.counters(start, mask)
            assert got.dtype == np.int64
            np.testing.assert_array_equal(got, sketch.counter_vector())
    assert columns.counters().sum() == family.rows * len(X)  # one counter per row per record


def test_columns_refuse_bad_arguments_by_name() -> None:
    family, width = FAMILIES[0]
    columns = SketchColumns(family, width)
    columns.extend(_records(10, 3))
    with pytest.raises(ValueError, match=r"start: expected an integer in \[0, 10\], got 11"):
        columns.counters(11)
    with pytest.raises(ValueError, match=r"live: expected shape \(10,\), got \(9,\)"):
        columns.counters(0, np.ones(9, dtype=bool))
    with pytest.raises(ValueError, match="family must be an LshFamily"):
        SketchColumns("l2", 8)  # type: ignore[arg-type]
    bad = _records(2, 4)
    bad[1, 0] = np.nan
    with pytest.raises(ValueError, match="NaN or infinity"):
        columns.extend(bad)
    with pytest.raises(ValueError, match="above"):
        columns.extend(np.full((1, 3), 2 * MAX_ABS_INPUT))
    assert columns.n == 10  # a refused batch keeps nothing


def test_holds_sees_a_replaced_prefix() -> None:
    family, width = FAMILIES[0]
    X = _records(20, 5)
    columns = SketchColumns(family, width)
    assert columns.holds(X[:0])
    columns.extend(X[:12])
    assert columns.holds(X) and columns.holds(X[:12])
    assert not columns.holds(X[:11])  # fewer records than hashed
    changed = X.copy()
    changed[11, 2] += 1.0
    assert not columns.holds(changed)


def _numba() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def test_records_hashed_in_chunks_keep_the_same_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch longer than a hashing chunk is hashed chunk by chunk into the same columns."""
    from dpmarket.streams.race import columns as module

    family, width = FAMILIES[0]
    X = _records(1000, 9)
    whole = SketchColumns(family, width)
    whole.extend(X)
    monkeypatch.setattr(module, "_HASH_CHUNK", 64)  # 1000 records: 16 chunks, the last short
    chunked = SketchColumns(family, width)
    chunked.extend(X)
    np.testing.assert_array_equal(chunked.columns(), whole.columns())
    np.testing.assert_array_equal(chunked.counters(), whole.counters())

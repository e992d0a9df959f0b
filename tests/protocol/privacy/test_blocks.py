"""Time-window blocks as a pure function of the arrival times the caller passes in."""

from __future__ import annotations

import numpy as np
import pytest

from dpmarket.protocol.privacy.blocks import WindowBlocks


def test_batches_are_grouped_by_their_arrival_window() -> None:
    blocks = WindowBlocks(10.0)
    assert blocks.arrive(0, 3, at=100.0) == (10, 0)  # window floor(100 / 10) = 10
    assert blocks.arrive(3, 2, at=109.9) is None  # the same window: block 10 grows
    assert blocks.arrive(5, 4, at=125.0) == (12, 5)  # window 11 saw nothing: no block 11
    assert blocks.arrive(9, 0, at=200.0) is None  # nothing arrived: no block
    assert blocks.arrive(9, 1, at=121.0) is None  # a clock that went back: the last block
    assert blocks.of(10).tolist() == [10] * 5 + [12] * 5
    assert blocks.seen == 10


def test_positions_keep_their_blocks_when_delivered_again() -> None:
    """A later run re-reads the same append-only inputs: positions already assigned keep their
    blocks whatever the new arrival time; only new positions go to the new window."""
    first = WindowBlocks(60.0)
    first.arrive(0, 50, at=0.0)
    first.arrive(50, 30, at=70.0)
    later = WindowBlocks(60.0, list(first.starts), first.seen)  # as the store records them
    assert later.arrive(0, 100, at=3600.0) == (60, 80)  # 80 re-read, 20 new
    assert later.of(100).tolist() == [0] * 50 + [1] * 30 + [60] * 20
    np.testing.assert_array_equal(later.of(80), first.of(80))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        WindowBlocks(0.0)
    blocks = WindowBlocks(1.0)
    with pytest.raises(ValueError, match="arrival"):
        blocks.arrive(0, 1, at=float("nan"))
    blocks.arrive(0, 2, at=0.5)
    with pytest.raises(ValueError, match="3 asked, 2 arrived"):
        blocks.of(3)
    assert blocks.of(0).tolist() == []

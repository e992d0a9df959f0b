"""Blocks of arriving records, as a pure function of the arrivals the caller passes in: time
windows and record counts, each record's block fixed once whatever later groupings say."""

from __future__ import annotations

import numpy as np
import pytest

from dpmarket.protocol.privacy.blocks import Blocks, Grouping

WINDOW_10 = Grouping("seconds", 10.0)


def test_batches_are_grouped_by_their_arrival_window() -> None:
    blocks = Blocks()
    [opened] = blocks.arrive(0, 3, 100.0, WINDOW_10)  # window floor(100 / 10) = 10
    assert (opened.block, opened.first, opened.key) == (0, 0, 10)
    assert blocks.arrive(3, 2, 109.9, WINDOW_10) == []  # the same window: block 0 grows
    [opened] = blocks.arrive(5, 4, 125.0, WINDOW_10)  # window 11 saw nothing: no block for it
    assert (opened.block, opened.first, opened.key) == (1, 5, 12)
    assert blocks.arrive(9, 0, 200.0, WINDOW_10) == []  # nothing arrived: no block
    assert blocks.arrive(9, 1, 121.0, WINDOW_10) == []  # a clock that went back: the last block
    assert blocks.of(10).tolist() == [0] * 5 + [1] * 5
    assert blocks.seen == 10


def test_records_are_grouped_by_count_and_the_last_block_fills_up() -> None:
    blocks, four = Blocks(), Grouping("records", 4)
    assert [s.first for s in blocks.arrive(0, 10, 0.0, four)] == [0, 4, 8]
    assert blocks.arrive(10, 2, 0.0, four) == []  # block 2 had room for two more
    assert [s.first for s in blocks.arrive(12, 1, 0.0, four)] == [12]
    assert blocks.of(13).tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [3]


def test_positions_keep_their_blocks_when_delivered_again() -> None:
    """A later run re-reads the same append-only inputs: positions already assigned keep their
    blocks whatever the new arrival time; only new positions go to the new window."""
    minute = Grouping("seconds", 60.0)
    first = Blocks()
    first.arrive(0, 50, 0.0, minute)
    first.arrive(50, 30, 70.0, minute)
    later = Blocks(list(first.starts), first.seen)  # as the store records them
    [opened] = later.arrive(0, 100, 3600.0, minute)  # 80 re-read, 20 new
    assert (opened.block, opened.first, opened.key) == (2, 80, 60)
    assert later.of(100).tolist() == [0] * 50 + [1] * 30 + [2] * 20
    np.testing.assert_array_equal(later.of(80), first.of(80))


def test_a_new_grouping_regroups_nobody() -> None:
    """Issue 24: blocks of 1000, then of 10, then windows: the records of the first grouping
    keep their block (and so its budget); only records arriving later are grouped anew, into
    blocks with ids never used before."""
    blocks = Blocks()
    blocks.arrive(0, 1500, 0.0, Grouping("records", 1000))
    before = blocks.of(1500).copy()
    assert blocks.arrive(0, 1500, 5.0, Grouping("records", 10)) == []  # re-read: nothing new
    opened = blocks.arrive(1500, 25, 5.0, Grouping("records", 10))
    # block 1 (records 1000-1499) was opened for 1000 records: another size does not fill it
    assert [(s.block, s.first) for s in opened] == [(2, 1500), (3, 1510), (4, 1520)]
    [window] = blocks.arrive(1525, 5, 7.0, Grouping("seconds", 2.0))
    assert (window.block, window.first, window.key) == (5, 1525, 3)
    np.testing.assert_array_equal(blocks.of(1500), before)
    assert len(set(blocks.of(1530).tolist())) == 6


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="size > 0"):
        Grouping("seconds", 0.0)
    with pytest.raises(ValueError, match="whole number"):
        Grouping("records", 2.5)
    with pytest.raises(ValueError, match="expected one of"):
        Grouping("bytes", 2.0)
    blocks = Blocks()
    with pytest.raises(ValueError, match="arrival"):
        blocks.arrive(0, 1, float("nan"), WINDOW_10)
    blocks.arrive(0, 2, 0.5, WINDOW_10)
    with pytest.raises(ValueError, match="positions up to 2 assigned"):
        blocks.arrive(5, 1, 0.5, WINDOW_10)  # a gap: positions 2-4 never arrived
    with pytest.raises(ValueError, match="3 asked, 2 assigned"):
        blocks.of(3)
    assert blocks.of(0).tolist() == []

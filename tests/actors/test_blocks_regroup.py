"""A record's block is fixed once in its owner's store; a later configuration never gives it a
fresh budget (issue 24, part 1). The hole it closes: blocks were recomputed from each run's
``block_records`` as ``position // N``, so a run with another N (or blocks switched on after
runs without them) met records that had paid under one block id in a block id with a full
budget. tests/actors/test_blocks_property.py drives random sequences of runs; these are the
named cases, the refusals (exit 2 before Ray starts, naming the store and the key), the
schema-1 migration and ``dpmarket budget``'s per-record figures."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from dpmarket.actors.budgets.gate import BudgetGate, OwnerBudget, OwnerGate
from dpmarket.actors.budgets.store import LedgerStore, StoreError
from dpmarket.actors.commands.budget import budget_summary
from dpmarket.actors.commands.main import main
from dpmarket.actors.config.market import ConfigError, load_market_config
from dpmarket.protocol.privacy.blocks import Grouping
from dpmarket.protocol.privacy.filter import RenyiFilter
from dpmarket.protocol.privacy.ledger import ADD_REMOVE, MechanismEvent
from dpmarket.protocol.securesum.spec import RoundSpec
from tests.actors.schema1 import charge_block, create_schema_1

DELTA = 1e-5
ROOT = Path(__file__).resolve().parents[2]
EVENT = MechanismEvent("gaussian", (("sigma", 2.0),), 1.0)


def _gate(store: Path, run: str, cap: float, records: int = 0, seconds: float = 0.0) -> OwnerGate:
    budget = OwnerBudget(str(store), cap, DELTA, records, seconds)
    return OwnerGate("owner-1", BudgetGate(budget, run, (), records, seconds))


def _round(gate: OwnerGate, rnd: int, n: int) -> np.ndarray:
    live = gate.secure_round(RoundSpec(rnd, 4, 2.0, 1.0, "scan", ADD_REMOVE), "s", n)
    assert live is not None
    return live


def test_a_new_block_size_keeps_every_record_in_its_paid_block(tmp_path: Path) -> None:
    """The issue's reproduction in the gate: two runs with blocks of 1000 spend the first
    block's budget on 1500 records; runs with 999 and then 10 read none of those records
    again (their blocks are retired, whatever the new size says), and only the records that
    arrive under the new size are read, in blocks with budgets of their own."""
    store = tmp_path / "owner-1.sqlite"
    cap = RenyiFilter(9.0, DELTA).spent([EVENT] * 2) * 1.001  # each block pays two rounds
    for run in ("run-1", "run-2"):
        gate = _gate(store, run, cap, records=1000)
        gate.arrived(0, 1500, 0.0)
        assert _round(gate, 1, 1500).all()
        gate.store.close()
    for run, size in (("run-3", 999), ("run-4", 10)):
        gate = _gate(store, run, cap, records=size)
        gate.arrived(0, 1500, 0.0)  # the same files, read again
        gate.arrived(1500, 20, 0.0)  # and twenty new records
        live = _round(gate, 1, 1520)
        assert not live[:1500].any() and live[1500:].all()
        spent = gate.view()["spent"]
        gate.store.close()
        assert spent <= cap
    assert budget_summary(store)["owners"]["owner-1"]["spent"] == pytest.approx(spent)


def test_blocks_switched_on_after_runs_without_them_pay_the_earlier_charges(
    tmp_path: Path,
) -> None:
    store = tmp_path / "owner-1.sqlite"
    cap = RenyiFilter(9.0, DELTA).spent([EVENT] * 2) * 1.001
    gate = _gate(store, "run-1", cap)
    gate.arrived(0, 30, 0.0)  # nothing to record without blocks
    for rnd in (1, 2):
        assert gate.secure_round(RoundSpec(rnd, 4, 2.0, 1.0, "scan", ADD_REMOVE), "s", 30) is None
    gate.store.close()
    gate = _gate(store, "run-2", cap, records=10)
    gate.arrived(0, 40, 1.0)
    assert not _round(gate, 1, 40).any()  # every block, new ones too, paid the two rounds
    assert gate.view()["spent"] <= cap


def test_a_run_without_blocks_on_a_store_with_block_charges_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "owner-1.sqlite"
    gate = _gate(store, "run-1", 5.0, records=10)
    gate.arrived(0, 20, 0.0)
    _round(gate, 1, 20)
    gate.store.close()
    with pytest.raises(StoreError, match=r"owner-1\.sqlite.*\[privacy\]\.block_records"):
        _gate(store, "run-2", 5.0)  # the owner actor opening the store (e.g. on its own node)
    lone = LedgerStore(store, "owner-1", RenyiFilter(5.0, DELTA))
    with pytest.raises(StoreError, match="holds charges to blocks"):
        lone.charge("r", "run-2", EVENT)  # the store itself refuses too
    lone.close()
    _gate(store, "run-3", 5.0, seconds=30.0).store.close()  # windows now: fine, nothing regrouped


def _demo(tmp_path: Path, privacy: str) -> Path:
    text = (ROOT / "configs" / "demo.toml").read_text()
    path = tmp_path / "m.toml"
    path.write_text(text.replace("[privacy]\n", "[privacy]\n" + privacy + "\n"))
    return path


def test_the_config_check_refuses_it_before_ray_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = 'ledger_dir = "stores"\nowner_budget = 2'
    store = tmp_path / "stores" / "owner-1.sqlite"
    gate = _gate(store, "run-1", 5.0, records=1000)
    gate.arrived(0, 5, 0.0)
    assert _round(gate, 1, 5).all()
    gate.store.close()
    assert load_market_config(_demo(tmp_path, base + "\nblock_records = 10")).budgets
    assert load_market_config(_demo(tmp_path, base + "\nblock_seconds = 5")).budgets
    with pytest.raises(ConfigError, match=rf"{store}.*holds charges to blocks"):
        load_market_config(_demo(tmp_path, base))
    out = tmp_path / "out"
    assert main(["run", str(_demo(tmp_path, base)), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(store) in err and "[privacy].block_records" in err


def _schema_1(
    path: Path, block_rows: list[tuple[str, int]], windows: list[tuple[int, int]]
) -> None:
    """A store as schema 1 wrote it: charges keyed by block id, windows in ``arrivals``."""
    with sqlite3.connect(path) as conn:
        create_schema_1(conn, "owner-1")
        for release, block in block_rows:
            charge_block(conn, release, block, EVENT)
        for block, first in windows:
            conn.execute("INSERT INTO arrivals VALUES (?, ?, 0.0)", (block, first))
        if windows:
            conn.execute("INSERT INTO meta VALUES ('seen', '20')")


def test_a_schema_1_store_keeps_its_windows_and_counts_lost_groupings_against_everyone(
    tmp_path: Path,
) -> None:
    windows = tmp_path / "w.sqlite"  # time windows 100 and 101: their records are known
    _schema_1(windows, [("a", 100), ("a", 101), ("b", 101)], [(100, 0), (101, 10)])
    store = LedgerStore(windows, "owner-1", RenyiFilter(2.0, DELTA))
    assert [s.block for s in store.blocks().starts] == [100, 101]
    assert store.history() == [] and len(store.record_events(101)) == 2
    [opened] = store.blocks().arrive(20, 5, 9e9, Grouping("seconds", 1.0))
    assert opened.block == 102  # ids go on after the old windows
    store.close()
    counts = tmp_path / "c.sqlite"  # blocks of an unknown N: which records paid is lost
    _schema_1(counts, [("a", 0), ("a", 1), ("b", 3)], [])
    with sqlite3.connect(counts) as conn:
        conn.execute("INSERT INTO retired VALUES (3, 'old', 0.0)")
    spent = RenyiFilter(2.0, DELTA).spent([EVENT] * 2)  # each release once, for every record
    assert budget_summary(counts)["owners"]["owner-1"]["spent"] == pytest.approx(spent)  # as read
    cap = spent * 1.0001  # what the two old releases spent is the whole cap
    gate = _gate(counts, "run-2", cap, records=10)  # opening it migrates it
    with sqlite3.connect(counts) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0] == "2"
        assert conn.execute("SELECT COUNT(*) FROM retired").fetchone()[0] == 0
    assert len(gate.store.history()) == 2
    gate.arrived(0, 1500, 0.0)  # blocks of 10 from id 0: they pay the history too
    assert not _round(gate, 1, 1500).any()  # nothing fits after what every record paid
    assert gate.view()["spent"] <= cap
    gate.store.close()
    assert budget_summary(counts)["owners"]["owner-1"]["spent"] == pytest.approx(spent)


def test_a_run_that_reads_other_records_at_known_positions_is_refused(tmp_path: Path) -> None:
    """Issue 24 review: blocks are runs of arrival positions, so a later run whose inputs
    changed (a file list reordered, a line edited, a schema that now accepts a line it
    rejected) would put records in blocks that have not paid for them. The store keeps a
    digest per position: the same records again are fine; other records at a known position
    are refused before anything is assigned or read."""
    store = tmp_path / "owner-1.sqlite"
    X = np.random.default_rng(4).normal(size=(30, 3))
    gate = _gate(store, "run-1", 5.0, records=10)
    gate.arrived(0, 20, 0.0, X[:20])
    assert _round(gate, 1, 20).all()
    gate.store.close()
    again = _gate(store, "run-2", 5.0, records=10)
    again.arrived(0, 20, 1.0, X[:20])  # the same records re-read: fine
    again.arrived(20, 10, 1.0, X[20:])  # and new ones
    again.store.close()
    shifted = np.concatenate([X[5:10], X[:5], X[10:]])  # two files read in the other order
    later = _gate(store, "run-3", 5.0, records=10)
    with pytest.raises(StoreError, match=r"arrival position 0 is not the one this store gave"):
        later.arrived(0, 30, 2.0, shifted)
    edited = X.copy()
    edited[25, 1] += 1.0
    with pytest.raises(StoreError, match="arrival position 25"):
        later.arrived(0, 30, 2.0, edited)
    later.arrived(0, 30, 2.0, X)  # the inputs as they were read: fine
    assert later.store.blocks().seen == 30

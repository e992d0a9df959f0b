"""The owner's durable ledger: written before sent, never applied twice, serialised, capped."""

from __future__ import annotations

import multiprocessing
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from dpmarket.actors.budgets.reading import read_store
from dpmarket.actors.budgets.store import LedgerStore, StoreError
from dpmarket.protocol.privacy.filter import RenyiFilter
from dpmarket.protocol.privacy.ledger import MechanismEvent, PrivacyLedger

DELTA = 1e-5


def gauss(sigma: float = 10.0, label: str = "scan (secure sum)") -> MechanismEvent:
    return MechanismEvent("gaussian", (("sigma", sigma),), 1.0, label=label)


def cap_for(n: int, sigma: float = 10.0) -> float:
    """A cap that admits exactly n charges of gauss(sigma) (halfway to the (n+1)-th)."""
    f = RenyiFilter(100.0, DELTA)
    lo, hi = f.spent([gauss(sigma)] * n), f.spent([gauss(sigma)] * (n + 1))
    return (lo + hi) / 2


def test_charge_persists_and_replays_without_charging_twice(tmp_path: Path) -> None:
    path = tmp_path / "owner-1.sqlite"
    store = LedgerStore(path, "owner-1", RenyiFilter(5.0, DELTA))
    store.begin_run("r1")
    first = store.charge("r1:s:1", "r1", gauss())
    assert first.admitted and not first.replayed and first.spent > 0
    store.close()
    again = LedgerStore(path, "owner-1", RenyiFilter(5.0, DELTA))
    replay = again.charge("r1:s:1", "r1", gauss())
    assert replay.replayed and replay.admitted and replay.spent == first.spent
    assert len(again.events()) == 1


def test_a_store_whose_writer_died_mid_transaction_is_read_as_last_committed(
    tmp_path: Path,
) -> None:
    """A process holding the store's write transaction (pages already spilled to the file)
    is SIGKILLed: the hot journal it leaves cannot be rolled back by a read-only connection
    (before: read_store said "not a ledger store (attempt to write a readonly database)",
    seen when a run's owner actors were killed while recording arrivals). read_store rolls it
    back and reads the last committed state: the committed charge, not the dead one's rows."""
    path = tmp_path / "owner-1.sqlite"
    store = LedgerStore(path, "owner-1", RenyiFilter(5.0, DELTA))
    store.begin_run("r1")
    assert store.charge("r1:s:1", "r1", gauss()).admitted
    store.close()
    script = textwrap.dedent(
        f"""
        import sqlite3
        conn = sqlite3.connect({str(path)!r}, isolation_level=None)
        conn.execute("PRAGMA cache_size = 1")  # spill: the file changes inside the transaction
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DELETE FROM charges")
        conn.execute("CREATE TABLE filler (x BLOB)")
        for _ in range(200):
            conn.execute("INSERT INTO filler VALUES (randomblob(4000))")
        print("holding", flush=True)
        import time
        time.sleep(600)
        """
    )
    writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline().strip() == "holding"
    writer.kill()
    writer.wait(timeout=30)
    assert (tmp_path / "owner-1.sqlite-journal").exists()  # a hot journal is left
    with pytest.raises(sqlite3.OperationalError, match="readonly"):  # what a plain ro read meets
        sqlite3.connect(f"file:{path}?mode=ro", uri=True).execute("SELECT * FROM meta").fetchall()
    read = read_store(path)
    assert [r["release"] for r in read["rows"]] == ["r1:s:1"]
    assert not (tmp_path / "owner-1.sqlite-journal").exists()  # rolled back
    with sqlite3.connect(path) as conn:  # nothing of the dead transaction is left
        tables = {t for (t,) in conn.execute("SELECT name FROM sqlite_master")}
    assert "filler" not in tables


def test_store_of_another_owner_refused(tmp_path: Path) -> None:
    LedgerStore(tmp_path / "s.sqlite", "owner-1", RenyiFilter(1.0, DELTA)).close()
    with pytest.raises(StoreError, match="owner-1"):
        LedgerStore(tmp_path / "s.sqlite", "owner-2", RenyiFilter(1.0, DELTA))
    (tmp_path / "junk.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match=r"junk\.sqlite"):
        LedgerStore(tmp_path / "junk.sqlite", "owner-1", RenyiFilter(1.0, DELTA))


def test_crash_between_write_and_send(tmp_path: Path) -> None:
    """A process charges, then dies (os._exit, no clean-up) before it sends the frame. The
    charge is in the store; the same release asked again is a replay and charges nothing."""
    path, sent = tmp_path / "owner-1.sqlite", tmp_path / "sent"
    script = textwrap.dedent(
        f"""
        import os
        from dpmarket.actors.budgets.store import LedgerStore
        from dpmarket.protocol.privacy.filter import RenyiFilter
        from dpmarket.protocol.privacy.ledger import MechanismEvent
        store = LedgerStore({str(path)!r}, "owner-1", RenyiFilter(5.0, {DELTA}))
        decision = store.charge(
            "run:sess:2", "run", MechanismEvent("gaussian", (("sigma", 10.0),), 1.0)
        )
        assert decision.admitted
        os._exit(9)  # the crash: before the frame is sent
        open({str(sent)!r}, "w").write("frame")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, check=False)
    assert proc.returncode == 9, proc.stderr.decode()
    assert not sent.exists()
    store = LedgerStore(path, "owner-1", RenyiFilter(5.0, DELTA))
    assert len(store.events()) == 1  # the charge survived the crash
    replay = store.charge("run:sess:2", "run", gauss())
    assert replay.replayed and len(store.events()) == 1  # and is never applied twice


def test_cap_never_exceeded_over_a_sequence_of_runs(tmp_path: Path) -> None:
    path, cap = tmp_path / "owner-1.sqlite", 1.5
    admitted = declined = 0
    for run in range(8):  # each run a fresh process's view: a new store object
        store = LedgerStore(path, "owner-1", RenyiFilter(cap, DELTA))
        store.begin_run(f"run-{run}")
        for rnd in range(6):
            d = store.charge(f"run-{run}:s:{rnd}", f"run-{run}", gauss(8.0 + rnd))
            admitted += d.admitted
            declined += not d.admitted
            assert d.spent <= cap
        store.close()
    assert admitted > 0 and declined > 0
    final = LedgerStore(path, "owner-1", RenyiFilter(cap, DELTA))
    assert RenyiFilter(cap, DELTA).spent(final.events()) <= cap
    assert PrivacyLedger("owner-1", final.events()).epsilon(DELTA) <= cap
    contents = read_store(path)
    assert len(contents["runs"]) == 8 and len(contents["rows"]) == 48
    assert sum(r["state"] == "declined" for r in contents["rows"]) == declined


def test_a_spender_waits_for_another_runs_transaction(tmp_path: Path) -> None:
    """Another run holds the store's write transaction and spends the last budget in it; a
    charge started meanwhile must wait and then see that spending (declined), not read the
    old state and spend the same budget again."""
    path = tmp_path / "owner-1.sqlite"
    cap = cap_for(1)
    store = LedgerStore(path, "owner-1", RenyiFilter(cap, DELTA))
    other = LedgerStore(path, "owner-1", RenyiFilter(cap, DELTA))
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    result: list[bool] = []
    waiter = threading.Thread(
        target=lambda: result.append(store.charge("b", "rb", gauss()).admitted)
    )
    waiter.start()
    waiter.join(timeout=0.5)
    assert waiter.is_alive()  # blocked on the other run's transaction
    conn.execute("ROLLBACK")
    conn.close()
    assert other.charge("a", "ra", gauss()).admitted  # the other run spends the last budget
    waiter.join()
    assert result == [False]


def _race(path: str, release: str, barrier: object, out: object) -> None:
    store = LedgerStore(path, "owner-1", RenyiFilter(cap_for(1), DELTA))
    barrier.wait()  # type: ignore[attr-defined]
    out.put(store.charge(release, release, gauss()).admitted)  # type: ignore[attr-defined]


def test_concurrent_runs_cannot_both_spend_the_last_budget(tmp_path: Path) -> None:
    path = str(tmp_path / "owner-1.sqlite")
    ctx = multiprocessing.get_context("spawn")
    for attempt in range(3):
        p = f"{path}.{attempt}"
        LedgerStore(p, "owner-1", RenyiFilter(cap_for(1), DELTA)).close()
        barrier, out = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_race, args=(p, f"r{i}", barrier, out)) for i in range(2)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        assert sorted(out.get() for _ in procs) == [False, True]
        assert len(read_store(p)["rows"]) == 2

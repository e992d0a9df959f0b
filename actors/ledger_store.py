"""An owner's durable ledger: every charge in SQLite before the frame it pays for is sent.

One store per owner (a SQLite file at ``[owners.NAME].ledger`` on the owner's node, or
``[privacy].ledger_dir/NAME.sqlite``), read and written only by that owner's actor and by
``dpmarket budget``. It outlives runs: a second ``dpmarket run`` on the same store continues
from it, and the owner's :class:`~dpmarket.protocol.privacy.filter.RenyiFilter` decides over
every charge the store holds, whichever run made it.

Guarantees (what a data-protection officer signs off):

- **Written before sent.** :meth:`LedgerStore.charge` commits the charge (``synchronous =
  FULL``) and only then returns "admitted"; the caller sends its frames after that. A crash
  between the commit and the send leaves the charge in the store (an over-count for a release
  that never happened, never an under-count).
- **Never applied twice.** A charge is keyed by its release id (the run, the secure-sum
  session's pinned key fingerprints and the round); asking again for a release id the store
  holds returns the recorded decision and charges nothing.
- **Serialised.** The check and the insert run in one ``BEGIN IMMEDIATE`` transaction, so two
  runs sharing an owner (two processes on one store) cannot both spend its last budget: the
  second waits for the first and sees its charge.
- **Time-window blocks** (``arrivals``): where each block of arrival time starts, and how many
  record positions have a block (``meta.seen``), written before any release reads them.
- **Declines are recorded** (state ``declined``, nothing charged), and so is a release that
  reads none of a blocked owner's records (state ``unread``), so that the end-of-run
  comparison with the curator's view can tell them from a missing charge.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpmarket.protocol.privacy.blocks import WindowBlocks
from dpmarket.protocol.privacy.filter import RenyiFilter
from dpmarket.protocol.privacy.ledger import MechanismEvent

__all__ = ["ChargeDecision", "LedgerStore", "StoreError", "read_store"]

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run TEXT PRIMARY KEY, started REAL NOT NULL, cap_epsilon REAL NOT NULL, delta REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS charges (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    release TEXT NOT NULL,
    block INTEGER NOT NULL DEFAULT -1,
    run TEXT NOT NULL,
    label TEXT NOT NULL,
    event TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('charged', 'declined', 'unread')),
    at REAL NOT NULL,
    spent_after REAL NOT NULL,
    UNIQUE (release, block)
);
CREATE TABLE IF NOT EXISTS retired (block INTEGER PRIMARY KEY, run TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS arrivals (
    block INTEGER PRIMARY KEY, first INTEGER NOT NULL, at REAL NOT NULL
);
"""


class StoreError(RuntimeError):
    """A ledger store that cannot be used (another owner's, a newer schema, unreadable)."""


@dataclass(frozen=True)
class ChargeDecision:
    """The store's answer for one release: admitted (charged) or declined, the epsilon spent at
    the cap's delta after it, and whether the answer was recorded earlier (a replay)."""

    release: str
    admitted: bool
    spent: float
    replayed: bool = False


def _connect(path: Path) -> sqlite3.Connection:
    # isolation_level=None: transactions are ours (BEGIN IMMEDIATE ... COMMIT)
    conn = sqlite3.connect(str(path), timeout=60.0, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA synchronous = FULL")
    except sqlite3.Error:
        conn.close()
        raise
    return conn


class LedgerStore:
    """One owner's persistent ledger and filter (module docstring: the guarantees)."""

    def __init__(self, path: str | Path, owner: str, cap: RenyiFilter) -> None:
        self.path, self.owner, self.filter = Path(path), owner, cap
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # one owner's calls, whichever thread of its actor
        try:
            self._conn = _connect(self.path)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: not a usable ledger store ({exc})") from None
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            for statement in filter(None, (s.strip() for s in _SCHEMA.split(";"))):
                self._conn.execute(statement)
            meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
            if not meta:
                self._conn.executemany(
                    "INSERT INTO meta VALUES (?, ?)",
                    [("owner", owner), ("schema", str(SCHEMA_VERSION))],
                )
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._conn.close()
            raise StoreError(f"{self.path}: not a usable ledger store ({exc})") from None
        if meta and meta.get("owner") != owner:
            self._conn.close()
            raise StoreError(f"{self.path}: the ledger of {meta.get('owner')!r}, not {owner!r}")
        if meta and int(meta.get("schema", "0")) > SCHEMA_VERSION:
            self._conn.close()
            raise StoreError(f"{self.path}: ledger schema {meta['schema']} is newer than this")

    def close(self) -> None:
        self._conn.close()

    def begin_run(self, run: str) -> None:
        """Register a run (idempotent) with the cap it runs under, for ``dpmarket budget``."""
        self._conn.execute(
            "INSERT OR IGNORE INTO runs VALUES (?, ?, ?, ?)",
            (run, time.time(), self.filter.epsilon, self.filter.delta),
        )

    def _events(self, block: int = -1) -> list[MechanismEvent]:
        rows = self._conn.execute(
            "SELECT event FROM charges WHERE state = 'charged' AND block = ? ORDER BY seq",
            (block,),
        ).fetchall()
        return [MechanismEvent.from_dict(e) for r in rows for e in json.loads(r[0])]

    def events(self, block: int = -1) -> list[MechanismEvent]:
        """Every charged event (of the whole store, or of one block), oldest first."""
        return self._events(block)

    def retired(self) -> set[int]:
        """The blocks whose budget is spent: never read again."""
        return {int(r[0]) for r in self._conn.execute("SELECT block FROM retired")}

    def window_blocks(self, window: float) -> WindowBlocks:
        """The owner's time-window blocks as recorded (``[privacy].block_seconds``)."""
        starts = self._conn.execute("SELECT block, first FROM arrivals ORDER BY block").fetchall()
        seen = self._conn.execute("SELECT value FROM meta WHERE key = 'seen'").fetchone()
        return WindowBlocks(
            window, [(int(b), int(f)) for b, f in starts], int(seen[0]) if seen else 0
        )

    def arrive(self, first: int, count: int, at: float, window: float) -> WindowBlocks:
        """Record that positions ``first .. first + count - 1`` arrived at ``at`` (the owner
        actor's clock), in one transaction, before any release reads them: a position's block
        is fixed once (protocol/privacy/blocks.py). Returns the blocks after it."""
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                blocks = self.window_blocks(window)
                opened = blocks.arrive(first, count, at)
                if opened is not None:
                    conn.execute("INSERT INTO arrivals VALUES (?, ?, ?)", (*opened, at))
                conn.execute("INSERT OR REPLACE INTO meta VALUES ('seen', ?)", (str(blocks.seen),))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return blocks

    def charge_blocks(
        self, release: str, run: str, events: Sequence[MechanismEvent], blocks: Sequence[int]
    ) -> list[int]:
        """Charge ``events`` to every live block of ``blocks`` whose filter admits them, in one
        transaction, and retire each live block whose filter does not (it is never read again,
        by this release or any later one). Returns the blocks the release may read. A release
        id seen before returns the blocks it was charged to and charges nothing again."""
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                read = self._charge_blocks(release, run, list(events), blocks)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return read

    def _charge_blocks(
        self, release: str, run: str, events: list[MechanismEvent], blocks: Sequence[int]
    ) -> list[int]:
        retired, read, now = self.retired(), [], time.time()
        label = "; ".join(sorted({e.label for e in events}))
        body = json.dumps([e.to_dict() for e in events], sort_keys=True)
        if not blocks:  # the release reads none of the owner's records: recorded, not charged
            self._conn.execute(
                "INSERT OR IGNORE INTO charges "
                "(release, block, run, label, event, state, at, spent_after) "
                "VALUES (?, -2, ?, ?, ?, 'unread', ?, 0.0)",
                (release, run, label, body, now),
            )
        for block in blocks:
            row = self._conn.execute(
                "SELECT state FROM charges WHERE release = ? AND block = ?", (release, block)
            ).fetchone()
            if row is not None or block in retired:
                read += [block] if row is not None and row[0] == "charged" else []
                continue
            past = self._events(block)
            spent = self.filter.spent([*past, *events])
            admitted = spent <= self.filter.epsilon
            self._conn.execute(
                "INSERT INTO charges (release, block, run, label, event, state, at, spent_after) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    release, block, run, label, body, "charged" if admitted else "declined",
                    now, spent if admitted else self.filter.spent(past),
                ),
            )  # fmt: skip
            if admitted:
                read.append(block)
            else:
                self._conn.execute("INSERT INTO retired VALUES (?, ?, ?)", (block, run, now))
        return read

    def charge(
        self, release: str, run: str, event: MechanismEvent | Sequence[MechanismEvent]
    ) -> ChargeDecision:
        """Charge ``event`` (or several events, one release) for ``release`` if the filter
        admits all of it, durably, before the caller sends anything; a release id seen before
        returns its recorded decision and charges nothing."""
        events = [event] if isinstance(event, MechanismEvent) else list(event)
        if not events:
            raise ValueError(f"{release}: a charge needs at least one event")
        with self._lock:
            return self._charge(release, run, events)

    def _charge(self, release: str, run: str, events: list[MechanismEvent]) -> ChargeDecision:
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")  # one spender at a time on this store
        try:
            row = conn.execute(
                "SELECT state, spent_after FROM charges WHERE release = ? AND block = -1",
                (release,),
            ).fetchone()
            if row is not None:
                conn.execute("COMMIT")
                return ChargeDecision(release, row[0] == "charged", float(row[1]), True)
            past = self._events()
            spent = self.filter.spent([*past, *events])  # inf if one is not accountable
            admitted = spent <= self.filter.epsilon
            spent = spent if admitted else self.filter.spent(past)
            conn.execute(
                "INSERT INTO charges (release, run, label, event, state, at, spent_after) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    release,
                    run,
                    "; ".join(sorted({e.label for e in events})),
                    json.dumps([e.to_dict() for e in events], sort_keys=True),
                    "charged" if admitted else "declined",
                    time.time(),
                    spent,
                ),
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return ChargeDecision(release, admitted, spent)

    def rows(self, run: str | None = None) -> list[dict[str, Any]]:
        """Every recorded decision (of one run, or all), oldest first."""
        sql = "SELECT release, run, label, event, state, at, spent_after, block FROM charges"
        args: tuple[str, ...] = ()
        if run is not None:
            sql, args = sql + " WHERE run = ?", (run,)
        out = []
        for release, run_, label, event, state, at, spent, block in self._conn.execute(
            sql + " ORDER BY seq", args
        ):
            out.append(
                {
                    "release": release,
                    "run": run_,
                    "label": label,
                    "events": json.loads(event),
                    "state": state,
                    "at": at,
                    "spent_after": spent,
                    "block": block,
                }
            )
        return out


def read_store(path: str | Path) -> dict[str, Any]:
    """A store's contents for reporting (read-only; no filter needed): owner, runs, rows."""
    p = Path(path)
    if not p.is_file():
        raise StoreError(f"{p}: no ledger store")
    conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True, timeout=60.0)
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        runs = [
            {"run": r, "started": s, "cap_epsilon": c, "delta": d}
            for r, s, c, d in conn.execute("SELECT * FROM runs ORDER BY started")
        ]
        rows = [
            {
                "release": r,
                "label": lab,
                "events": json.loads(e),
                "state": st,
                "at": at,
                "spent_after": sp,
                "block": b,
            }
            for r, lab, e, st, at, sp, b in conn.execute(
                "SELECT release, label, event, state, at, spent_after, block FROM charges "
                "ORDER BY seq"
            )
        ]
        retired = [int(r[0]) for r in conn.execute("SELECT block FROM retired ORDER BY block")]
    except sqlite3.Error as exc:
        raise StoreError(f"{p}: not a ledger store ({exc})") from None
    finally:
        conn.close()
    return {"owner": meta.get("owner", p.stem), "runs": runs, "rows": rows, "retired": retired}

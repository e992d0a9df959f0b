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
- **A record's block is fixed once** (``blocks``, protocol/privacy/blocks.py): where each block
  starts, the grouping it was opened under, and how many record positions have a block
  (``meta.seen``), written when the records arrive, before any release reads them. Block ids are
  the store's own (0, 1, 2, ...), so a later configuration (another ``block_records``, windows
  instead of counts) groups only records that arrive after it and never gives records that
  paid a fresh budget.
- **Per record.** A record's loss is what its block was charged plus the store's whole-store
  charges (``block = -1``: releases made without blocks, which read every record; every block
  pays them, records that arrived later included: an over-count). A store that holds charges
  to blocks refuses a charge without blocks (:class:`StoreError`): that charge would be checked
  against the whole-store history alone, not against what each record's block paid.
- **Declines are recorded** (state ``declined``, nothing charged), and so is a release that
  reads none of a blocked owner's records (state ``unread``: it reads no block, or only
  retired ones), so that the end-of-run
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

from dpmarket.protocol.privacy.blocks import Blocks, BlockStart, Grouping
from dpmarket.protocol.privacy.filter import RenyiFilter
from dpmarket.protocol.privacy.ledger import MechanismEvent

__all__ = ["BLOCKS_KEY", "ChargeDecision", "LedgerStore", "StoreError"]

SCHEMA_VERSION = 2  # 2: ``blocks`` (store-assigned block ids) replaces ``arrivals``
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
CREATE TABLE IF NOT EXISTS blocks (
    block INTEGER PRIMARY KEY,
    first INTEGER NOT NULL UNIQUE,
    grouping TEXT NOT NULL,
    key INTEGER NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS records (position INTEGER PRIMARY KEY, digest BLOB NOT NULL);
"""
# schema 1 kept time windows in ``arrivals`` (block id = the window number) and grouped by
# ``block_records`` with block id i // N recomputed from each run's N, never stored. Opening
# such a store migrates it once, in one transaction: its windows become blocks under their old
# ids (a grouping no later run continues); its charges to count blocks, whose records cannot be
# recovered, become whole-store charges (``block = -1``, one row per release: every record paid
# each such release at most once, so counting it against every record is an over-count), and
# those blocks' retirements are dropped (new blocks get new ids from 0 on, and pay the history).
_LEGACY_WINDOWS = "legacy-window"
_LEGACY_COUNT_ROWS = "block >= 0 AND block NOT IN (SELECT block FROM arrivals)"
_HISTORY = "SELECT event FROM charges WHERE state = 'charged' AND block = -1 ORDER BY seq"
BLOCKS_KEY = "[privacy].block_records / [privacy].block_seconds"


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
            elif meta.get("owner") == owner and meta.get("schema") == "1":
                self._migrate_from_1()
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

    def _migrate_from_1(self) -> None:
        """Schema 1 -> 2, inside the opening transaction (the comment at ``_LEGACY_WINDOWS``)."""
        conn = self._conn
        conn.execute(
            "INSERT OR IGNORE INTO blocks SELECT block, first, ?, block, at FROM arrivals",
            (_LEGACY_WINDOWS,),
        )
        conn.execute(
            "INSERT OR IGNORE INTO charges "
            "(release, block, run, label, event, state, at, spent_after) "
            "SELECT release, -1, run, label, event, 'charged', MIN(at), MAX(spent_after) "
            f"FROM charges WHERE state = 'charged' AND {_LEGACY_COUNT_ROWS} GROUP BY release"
        )
        conn.execute(f"DELETE FROM charges WHERE {_LEGACY_COUNT_ROWS}")
        conn.execute("DELETE FROM retired WHERE block NOT IN (SELECT block FROM arrivals)")
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA_VERSION),))

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
        """The events charged to one block (-1: the charges made without blocks), oldest
        first; what a record of ``block`` has paid is :meth:`record_events`."""
        return self._events(block)

    def history(self) -> list[MechanismEvent]:
        """The whole-store charges every record has paid (module docstring, "Per record"):
        releases made without blocks (and a schema-1 store's charges to count blocks)."""
        rows = self._conn.execute(_HISTORY).fetchall()
        return [MechanismEvent.from_dict(e) for r in rows for e in json.loads(r[0])]

    def record_events(self, block: int) -> list[MechanismEvent]:
        """Everything a record of ``block`` has paid: the whole-store history, then its block's."""
        return [*self.history(), *self._events(block)]

    def block_charges(self) -> int:
        """How many charges were made to blocks (a store with any refuses unblocked charges)."""
        row = self._conn.execute(
            "SELECT COUNT(*) FROM charges WHERE state = 'charged' AND block >= 0"
        ).fetchone()
        return int(row[0])

    def retired(self) -> set[int]:
        """The blocks whose budget is spent: never read again."""
        return {int(r[0]) for r in self._conn.execute("SELECT block FROM retired")}

    def blocks(self) -> Blocks:
        """Every record's block as recorded (protocol/privacy/blocks.py)."""
        starts = self._conn.execute(
            "SELECT block, first, grouping, key FROM blocks ORDER BY block"
        ).fetchall()
        seen = self._conn.execute("SELECT value FROM meta WHERE key = 'seen'").fetchone()
        return Blocks(
            [BlockStart(int(b), int(f), str(g), int(k)) for b, f, g, k in starts],
            int(seen[0]) if seen else 0,
        )

    def assign(
        self,
        first: int,
        count: int,
        at: float,
        grouping: Grouping,
        digests: Sequence[bytes] | None = None,
    ) -> Blocks:
        """Record that positions ``first .. first + count - 1`` arrived at ``at`` (the owner
        actor's clock), in one transaction, before any release reads them: a position not yet
        assigned gets its block under ``grouping``, one assigned before keeps its block
        (protocol/privacy/blocks.py). With ``digests`` (one per position,
        :func:`~dpmarket.protocol.privacy.blocks.record_digests`) a position is tied to its
        record: a position seen before must hold the same record again, else
        :class:`StoreError` and nothing is assigned (the inputs changed: the record there may
        belong to a block that has not paid for it). Returns the blocks after it."""
        if digests is not None and len(digests) != count:
            raise ValueError(f"digests: {len(digests)} for {count} positions")
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                if digests is not None:
                    self._check_records(first, digests)
                blocks = self.blocks()
                for start in blocks.arrive(first, count, at, grouping):
                    conn.execute(
                        "INSERT INTO blocks VALUES (?, ?, ?, ?, ?)",
                        (start.block, start.first, start.grouping, start.key, at),
                    )
                conn.execute("INSERT OR REPLACE INTO meta VALUES ('seen', ?)", (str(blocks.seen),))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return blocks

    def _check_records(self, first: int, digests: Sequence[bytes]) -> None:
        """Compare re-delivered positions with the records they held; store new ones."""
        end = first + len(digests)
        held = dict(
            self._conn.execute(
                "SELECT position, digest FROM records WHERE position >= ? AND position < ?",
                (first, end),
            ).fetchall()
        )
        for offset, digest in enumerate(digests):
            position = first + offset
            if position in held and bytes(held[position]) != digest:
                raise StoreError(
                    f"{self.path}: {self.owner}'s record at arrival position {position} is not "
                    "the one this store gave a block: its inputs changed (a reordered or edited "
                    "file, another file list, a schema or reject policy that accepts other "
                    "lines), so records would land in blocks that have not paid for them; "
                    "restore the inputs as they were read"
                )
        self._conn.executemany(
            "INSERT OR IGNORE INTO records VALUES (?, ?)",
            [(first + i, d) for i, d in enumerate(digests) if first + i not in held],
        )

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
        if not set(blocks) - retired:  # it reads none of the owner's records (none, or all
            self._conn.execute(  # retired): recorded, not charged
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
            past = self.record_events(block)  # what each of its records has paid
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
            if self.block_charges():
                raise StoreError(
                    f"{self.path}: holds charges to blocks of {self.owner}'s records; a release "
                    f"without blocks would be checked against the whole-store charges alone, not "
                    f"what each record's block paid: set {BLOCKS_KEY} again (any size: records "
                    "keep their blocks) or use another store"
                )
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

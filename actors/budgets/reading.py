"""An owner's ledger store read for reporting: read-only, no filter, any schema version.

``dpmarket budget`` and the config check read stores through :func:`read_store` (a SQLite
connection in read-only mode, so reading never migrates or locks a store for writing; a store
whose writer died inside a transaction has a hot journal, which only a writable connection can
roll back, so such a store is opened writable once, with ``query_only``: SQLite restores its
last committed state, as the owner's own next open would, and nothing else is written);
:func:`spending` applies the per-record rule of actors/budgets/store.py to its rows. A
schema-1 store is read as its migration will write it (:func:`_as_schema_2`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dpmarket.actors.budgets.store import StoreError
from dpmarket.protocol.privacy.ledger import MechanismEvent

__all__ = ["read_store", "spending"]


def read_store(path: str | Path) -> dict[str, Any]:
    """A store's contents for reporting (read-only; no filter needed): owner, runs, rows."""
    p = Path(path)
    if not p.is_file():
        raise StoreError(f"{p}: no ledger store")
    try:
        return _read(p, sqlite3.connect(f"file:{p}?mode=ro", uri=True, timeout=60.0))
    except _HotJournal:  # its writer died mid-transaction: roll it back (module docstring)
        conn = sqlite3.connect(str(p), timeout=60.0)
        conn.execute("PRAGMA query_only = ON")
        return _read(p, conn)


class _HotJournal(Exception):
    """A read-only connection met a hot journal it may not roll back."""


def _read(p: Path, conn: sqlite3.Connection) -> dict[str, Any]:
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
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        table = "blocks" if "blocks" in tables else "arrivals"  # schema 1: its windows
        blocks = [int(r[0]) for r in conn.execute(f"SELECT block FROM {table} ORDER BY block")]
        if table == "arrivals":  # read as the migration will write it (``_LEGACY_WINDOWS``)
            rows, retired = _as_schema_2(rows, retired, set(blocks))
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorname", "") == "SQLITE_READONLY_ROLLBACK":
            raise _HotJournal from None
        raise StoreError(f"{p}: not a ledger store ({exc})") from None
    finally:
        conn.close()
    return {
        "owner": meta.get("owner", p.stem),
        "runs": runs,
        "rows": rows,
        "retired": retired,
        "blocks": blocks,
    }


def _as_schema_2(
    rows: list[dict[str, Any]], retired: list[int], windows: set[int]
) -> tuple[list[dict[str, Any]], list[int]]:
    """A schema-1 store's rows as its migration turns them: charges to count blocks (not
    windows) become one whole-store row per release, and those blocks' retirements go."""
    out: list[dict[str, Any]] = []
    whole = {r["release"] for r in rows if r["block"] == -1}
    for row in rows:
        if row["block"] < 0 or row["block"] in windows:
            out.append(row)
        elif row["state"] == "charged" and row["release"] not in whole:
            whole.add(row["release"])
            out.append(row | {"block": -1})
    return out, [b for b in retired if b in windows]


def spending(
    rows: Sequence[dict[str, Any]], blocks: Sequence[int]
) -> tuple[list[MechanismEvent], dict[int, list[MechanismEvent]]]:
    """From a store's rows (:func:`read_store`): the whole-store history every record paid and,
    per block (each of ``blocks`` and each charged), what that block's records paid besides
    (module docstring, "Per record"); the rule of :meth:`LedgerStore.history` and
    :meth:`LedgerStore.record_events`."""
    history: list[MechanismEvent] = []
    per: dict[int, list[MechanismEvent]] = {b: [] for b in blocks}
    for row in rows:
        if row["state"] != "charged" or row["block"] < -1:
            continue
        events = [MechanismEvent.from_dict(e) for e in row["events"]]
        if row["block"] == -1:
            history += events
        else:
            per.setdefault(row["block"], []).extend(events)
    return history, per

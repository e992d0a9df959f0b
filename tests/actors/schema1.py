"""A ledger store as schema 1 wrote it (before block ids were stored), for migration tests."""

from __future__ import annotations

import json
import sqlite3

from dpmarket.protocol.privacy.ledger import MechanismEvent

SCHEMA_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (run TEXT PRIMARY KEY, started REAL NOT NULL,
                   cap_epsilon REAL NOT NULL, delta REAL NOT NULL);
CREATE TABLE charges (seq INTEGER PRIMARY KEY AUTOINCREMENT, release TEXT NOT NULL,
    block INTEGER NOT NULL DEFAULT -1, run TEXT NOT NULL, label TEXT NOT NULL,
    event TEXT NOT NULL, state TEXT NOT NULL, at REAL NOT NULL,
    spent_after REAL NOT NULL, UNIQUE (release, block));
CREATE TABLE retired (block INTEGER PRIMARY KEY, run TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE arrivals (block INTEGER PRIMARY KEY, first INTEGER NOT NULL, at REAL NOT NULL);
"""


def create_schema_1(conn: sqlite3.Connection, owner: str) -> None:
    """The tables and meta rows of a schema-1 store of ``owner``, with one run ``old``."""
    conn.executescript(SCHEMA_1)
    conn.executemany("INSERT INTO meta VALUES (?, ?)", [("owner", owner), ("schema", "1")])
    conn.execute("INSERT INTO runs VALUES ('old', 0.0, 2.0, 1e-5)")


def charge_block(conn: sqlite3.Connection, release: str, block: int, event: MechanismEvent) -> None:
    """A schema-1 charge of ``event`` to ``block`` (a block id of the old rule)."""
    conn.execute(
        "INSERT INTO charges (release, block, run, label, event, state, at, spent_after) "
        "VALUES (?, ?, 'old', 'scan', ?, 'charged', 0.0, 0.0)",
        (release, block, json.dumps([event.to_dict()])),
    )

"""Snapshot and restore of a Curator, so a crashed or refused run resumes without new noise.

A snapshot is a JSON-safe dict holding everything the curator has decided or released: the
parameters, the releases (g_tilde and the open epoch's g_l), the summary with provenance, the
auction state of the open epoch, the bookkeeping, the privacy ledgers and the MWEM state. It
never holds the noise generator's state (the key of a secure generator must not reach a disk):
``rng`` is written as null, and the restored curator draws the noise of the releases still to
come from the generator the caller passes in. Restoring it and calling :meth:`Curator.resume`
re-sends the journaled releases instead of drawing fresh noise, and reuses an auction that
already ran, so a crash or a refusal never spends privacy budget twice. The validation and seed
sets are not journaled: the caller supplies them again (they are the consumer's and the
public's data, not run state).

Arrays are stored as base64 of their little-endian bytes with dtype and shape, so a restore is
bit-exact. The snapshot is the curator's private state (it holds the summary points); it must be
stored where only the curator can read it.

Version 2 adds the purchased pool of protocol/summary/selection.py, inline or (for long runs) as
rows
the caller appends to a file of its own (:func:`pool_rows`), so a checkpoint does not rewrite
every point bought so far. Version 1 journals restore with a pool seeded from the summary.

Version 3 is written from the start of a run, before the first secure-sum round opens (state
"new": nothing released by the curator yet, ledgers empty), and adds ``secure_phases``: the
runtime's record of the secure-sum rounds (actors/parties/securephase_journal.py: which rounds
opened,
their released values and the finished phases' summary; DP outputs, curator-private like the
rest of the snapshot). This module stores it as given (:func:`secure_record` reads it back);
version 1 and 2 journals restore with an empty record (they were written after the secure
phases, whose charges their ledgers hold). The bid and delivery counts per (owner, token), which
grow with owners x epochs, are written as three columns (``owner``, ``token``, ``count``);
journals that wrote them as ``[owner, token, count]`` rows still restore.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.summary.auction import TransferCounter
from dpmarket.protocol.summary.curator import Curator, CuratorParams
from dpmarket.protocol.summary.messages import (
    BidBody,
    DeliverBody,
)
from dpmarket.protocol.summary.selection import PoolEntry, PurchasedPool
from dpmarket.protocol.summary.state import Provenance, _Epoch

__all__ = ["JOURNAL_VERSION", "pool_rows", "restore_curator", "secure_record", "snapshot_curator"]

JOURNAL_VERSION = 3
"""Version 2 adds the purchased pool, version 3 the secure phases' record and snapshots from
state "new"; version 1 and 2 journals still restore (module docstring)."""
READABLE_VERSIONS = (1, 2, 3)


def _arr(a: npt.NDArray[Any] | None) -> dict[str, Any] | None:
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    return {
        "dtype": a.dtype.str,
        "shape": list(a.shape),
        "b64": base64.b64encode(a.tobytes()).decode("ascii"),
    }


def _unarr(d: dict[str, Any] | None) -> npt.NDArray[Any] | None:
    if d is None:
        return None
    raw = base64.b64decode(d["b64"])
    return np.frombuffer(raw, dtype=np.dtype(d["dtype"])).reshape(d["shape"]).copy()


def _need(d: dict[str, Any] | None) -> npt.NDArray[Any]:
    out = _unarr(d)
    if out is None:
        raise ValueError("journal: a required array is missing")
    return out


def _counts(counts: dict[tuple[str, int], int]) -> dict[str, list[Any]]:
    """A count per (owner, token) as three columns, in the curator's order. These mappings grow
    with owners x epochs and a checkpoint comes twice an epoch: columns are built and encoded
    without a list per entry (journals before this wrote ``[owner, token, count]`` rows)."""
    owners, tokens = zip(*counts, strict=True) if counts else ((), ())
    return {"owner": list(owners), "token": list(tokens), "count": list(counts.values())}


def _uncounts(saved: dict[str, list[Any]] | list[list[Any]]) -> dict[tuple[str, int], int]:
    """Inverse of :func:`_counts`; also reads the ``[owner, token, count]`` rows of older
    journals."""
    if isinstance(saved, dict):
        columns = saved["owner"], saved["token"], saved["count"]
        if len({len(col) for col in columns}) != 1:
            raise ValueError("journal: count columns of different lengths")
        rows: Any = zip(*columns, strict=True)
    else:
        rows = saved
    return {(str(o), int(t)): int(n) for o, t, n in rows}


def _epoch_state(ep: _Epoch) -> dict[str, Any]:
    return {
        "number": ep.number,
        "g_summary": _arr(ep.g_summary),
        "q": ep.q,
        "bids": {o: [b.token, b.bid] for o, b in ep.bids.items()},
        "passed": sorted(ep.passed),
        "asked": sorted(ep.asked),
        "answered": sorted(ep.answered),
        "decided": ep.decided,
        "verified": {
            o: {
                "bid": bid,
                "token": body.token,
                "point": _arr(body.point),
                "hashed": _arr(body.hashed),
                "label": body.label,
            }
            for o, (bid, body) in ep.verified.items()
        },
    }


def _restore_epoch(d: dict[str, Any]) -> _Epoch:
    ep = _Epoch(d["number"], _need(d["g_summary"]), d["q"])
    ep.bids = {o: BidBody(int(t), float(b)) for o, (t, b) in d["bids"].items()}
    ep.passed, ep.asked, ep.answered = set(d["passed"]), set(d["asked"]), set(d["answered"])
    ep.decided = bool(d["decided"])
    for o, v in d["verified"].items():
        body = DeliverBody(v["token"], _unarr(v["point"]), _unarr(v["hashed"]), v["label"])
        ep.verified[o] = (float(v["bid"]), body)
    return ep


def snapshot_curator(
    c: Curator, pool_inline: bool = True, secure_phases: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Everything needed to continue ``c`` exactly where it stands (JSON-safe).

    ``pool_inline=False`` records only how many pool rows the snapshot covers; the caller keeps
    the rows (:func:`pool_rows`) elsewhere and hands them to :func:`restore_curator`.
    ``secure_phases``: the secure-sum rounds' record (JSON-safe; stored as given, a copy).
    """
    mwem = c._h2
    return {
        "journal_version": JOURNAL_VERSION,
        "run": c.run,
        "owners": list(c.owners),
        "params": dataclasses.asdict(c.params),
        "state": c.state,
        "reason": c.reason,
        "refusal": dict(c.refusal),
        "lost": dict(c.lost),
        "returns": dict(c.returns),  # optional: a journal without it took nobody back
        "live": sorted(c.live),
        "seq": c._out._seq,
        "rng": None,  # kept for readers of version 2; the generator's key is never journaled
        "g_validation": _arr(c._g_validation),
        "summary_H": [_arr(h) for h in c._summary_H],
        "summary_X": [_arr(x) for x in c._summary_X],
        "labels": list(c._labels),
        "members": sorted([o, t] for o, t in c._members),
        "provenance": [dataclasses.asdict(p) for p in c.provenance],
        "pool": {"count": len(c.pool), **({"rows": pool_rows(c)} if pool_inline else {})},
        "times_bid": _counts(c._times_bid),
        "deliveries": _counts(c.transfers.deliveries),
        "value": dict(c.value),
        "dropped": [list(x) for x in c.dropped],
        "rejected": [list(x) for x in c.rejected],
        "late_frames": c.late_frames,
        "epoch": _epoch_state(c.epoch),
        "ledgers": {k: v.to_dict() for k, v in c.ledgers.items()},
        "mwem_logp": _arr(mwem._logp),
        "allocation": {  # allocate-select (protocol/summary/allocate.py)
            "profiles": {o: _arr(g) for o, g in sorted(c.profiles.items())},
            "records": dict(sorted(c.records.items())),
            "quotas": None if c.quotas is None else dict(sorted(c.quotas.items())),
            "random_quotas": dict(sorted(c.random_quotas.items())),  # absent before: {}
        },
        "secure_phases": copy.deepcopy(secure_phases or {}),
    }


def secure_record(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The secure phases' record of a snapshot (a copy; empty before version 3)."""
    return copy.deepcopy(snapshot.get("secure_phases") or {})


def pool_rows(c: Curator, start: int = 0) -> list[dict[str, Any]]:
    """JSON-safe rows of the purchased pool from entry ``start`` on, in purchase order. A row
    holds the hash only when it has no point (h1 recomputes it on restore). Entries are never
    changed once bought, so a journal may keep the rows in an append-only file
    (``snapshot_curator(c, pool_inline=False)``) instead of rewriting them at every checkpoint."""
    return [
        {
            "owner": e.owner,
            "token": e.token,
            "epoch": e.epoch,
            "bid": e.bid,
            "label": e.label,
            "point": _arr(e.point),
            "hashed": _arr(e.hashed) if e.point is None else None,
        }
        for e in c.pool.entries[start:]
    ]


def _restore_pool(
    c: Curator, state: dict[str, Any] | None, rows: list[dict[str, Any]] | None
) -> PurchasedPool:
    """The journaled pool; a journal written before pools existed (version 1) gets one seeded
    with the summary's winners, every purchase it still knows of."""
    pool = PurchasedPool()
    if state is None:
        for i, prov in enumerate(c.provenance):
            point = c._summary_X[i] if i < len(c._summary_X) else None
            entry = PoolEntry(prov.owner, prov.token, prov.epoch, prov.bid, point,
                              c._summary_H[i], c._labels[i])  # fmt: skip
            pool.add(entry)
        return pool
    count = int(state["count"])
    kept = state.get("rows", rows)
    if kept is None or len(kept) < count:
        have = "none" if kept is None else len(kept)
        raise ValueError(f"journal: the snapshot covers {count} pool rows, {have} given")
    for row in kept[:count]:  # rows appended after the snapshot are not part of it
        point = _unarr(row["point"])
        hashed = c.h1(point) if point is not None else _need(row["hashed"])
        pool.add(PoolEntry(str(row["owner"]), int(row["token"]), int(row["epoch"]),
                           float(row["bid"]), point, np.asarray(hashed, dtype=np.float32),
                           float(row["label"])))  # fmt: skip
    if len(pool) != count:
        raise ValueError(f"journal: {count} pool rows hold only {len(pool)} distinct points")
    return pool


def restore_curator(
    snapshot: dict[str, Any],
    validation: npt.ArrayLike,
    seed_set: npt.ArrayLike,
    rows: list[dict[str, Any]] | None = None,
    *,
    rng: np.random.Generator,
) -> Curator:
    """Rebuild the curator of ``snapshot``; call :meth:`Curator.resume` to continue the run.

    ``rows``: the pool rows kept outside a ``pool_inline=False`` snapshot (at least as many as
    it covers; later ones are ignored). ``rng``: the noise generator for the releases still to
    come (a fresh secure one in a deployment; a journaled generator state is ignored)."""
    if snapshot.get("journal_version") not in READABLE_VERSIONS:
        raise ValueError(f"journal: unsupported version {snapshot.get('journal_version')!r}")
    params = CuratorParams(**snapshot["params"])
    c = Curator(snapshot["run"], list(snapshot["owners"]), validation, seed_set, params, rng)
    c.state, c.reason = snapshot["state"], snapshot["reason"]
    c.refusal, c.lost = dict(snapshot["refusal"]), dict(snapshot["lost"])
    c.live = set(snapshot["live"])
    c.returns = {str(o): int(n) for o, n in (snapshot.get("returns") or {}).items()}
    c._out._seq = int(snapshot["seq"])
    c._g_validation = _need(snapshot["g_validation"])
    c._summary_H = [_need(h) for h in snapshot["summary_H"]]
    c._summary_X = [_need(x) for x in snapshot["summary_X"]]
    c._labels = [float(v) for v in snapshot["labels"]]
    c._members = {(o, int(t)) for o, t in snapshot["members"]}
    c.provenance = [Provenance(**p) for p in snapshot["provenance"]]
    c.pool = _restore_pool(c, snapshot.get("pool"), rows)
    c._times_bid = _uncounts(snapshot["times_bid"])
    c.transfers = TransferCounter(_uncounts(snapshot["deliveries"]))
    c.value = {k: float(v) for k, v in snapshot["value"].items()}
    c.dropped = [(int(e), o, ph) for e, o, ph in snapshot["dropped"]]
    c.rejected = [(int(e), o, why) for e, o, why in snapshot["rejected"]]
    c.late_frames = int(snapshot["late_frames"])
    c.epoch = _restore_epoch(snapshot["epoch"])
    c.ledgers = {k: PrivacyLedger.from_dict(v) for k, v in snapshot["ledgers"].items()}
    c._h2._logp = _unarr(snapshot["mwem_logp"])
    allocation = snapshot.get("allocation") or {}
    c.profiles = {str(o): _need(g) for o, g in (allocation.get("profiles") or {}).items()}
    c.records = {str(o): int(n) for o, n in (allocation.get("records") or {}).items()}
    saved = allocation.get("quotas")
    c.quotas = None if saved is None else {str(o): int(k) for o, k in saved.items()}
    hedge = allocation.get("random_quotas") or {}
    c.random_quotas = {str(o): int(k) for o, k in hedge.items()}
    c.checkpoint_due = False
    return c

"""Questions to owner actors after the summary, answered by whoever is still alive.

Once the curator has finished (or refused because more than T owners were lost), the driver
asks every owner actor it still believes alive for its status and ingest counters. A node may
have died in between, or may die while it is being asked: Ray then raises ``ActorDiedError``,
``ActorUnavailableError`` (a node unreachable for now), another ``RayActorError``, or
``GetTimeoutError`` (no answer before the deadline). None of these may turn a finished run or
a refusal into a crash: an owner that does not answer is reported as unreachable and left out,
so a refusal always exits 3 and a finished run 0.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from dpmarket.actors.cluster.connect import UNREACHABLE_ERRORS

__all__ = ["ask_owners", "owner_reports", "survivor_reports"]

STATUS_TIMEOUT = 30.0  # seconds for all the questions together


def _ray_get(ref: Any, timeout: float) -> Any:
    import ray

    return ray.get(ref, timeout=timeout)


def ask_owners(
    owners: dict[str, Any],
    method: str,
    timeout: float = STATUS_TIMEOUT,
    get: Callable[[Any, float], Any] = _ray_get,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Call ``method(owner)`` on every owner's actor, all at once; wait at most ``timeout``
    seconds in total. Returns (answers by owner, why each unreachable owner did not answer)."""
    refs: dict[str, Any] = {}
    missing: dict[str, str] = {}
    for owner, handle in owners.items():
        try:
            refs[owner] = getattr(handle, method).remote(owner)
        except UNREACHABLE_ERRORS as exc:
            missing[owner] = type(exc).__name__
    deadline = clock() + timeout
    answers: dict[str, Any] = {}
    for owner, ref in refs.items():
        try:
            answers[owner] = get(ref, max(0.0, deadline - clock()))
        except UNREACHABLE_ERRORS as exc:
            missing[owner] = type(exc).__name__
    return answers, missing


def owner_reports(
    owners: dict[str, Any],
    timeout: float = STATUS_TIMEOUT,
    get: Callable[[Any, float], Any] = _ray_get,
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Each reachable owner's status with its ingest counters (``ingested``,
    ``rejected_records``, ``ingest_gaps``: places in its files where records may have been lost,
    streams/records/tail.py "Limits"), and the owners that could not be asked (name -> Ray's
    error)."""
    statuses, lost = ask_owners(owners, "status", timeout, get)
    ingest, lost_ingest = ask_owners(
        {o: h for o, h in owners.items() if o in statuses}, "ingest_status", timeout, get
    )
    lost |= lost_ingest
    reports = {
        o: statuses[o]
        | {
            "ingested": ing["records"],
            "rejected_records": ing["rejected"],
            "ingest_gaps": ing["gaps"],
        }
        for o, ing in ingest.items()
    }
    return reports, lost


def survivor_reports(owners: dict[str, Any], dead: list[str]) -> dict[str, dict[str, Any]]:
    """:func:`owner_reports` of the owners not in ``dead`` (the transport's lost owners); each
    one that does not answer is named on stderr and left out (a refusal stays exit 3)."""
    reports, unreachable = owner_reports({o: h for o, h in owners.items() if o not in dead})
    for owner, error in unreachable.items():
        print(f"dpmarket: {owner} did not answer after the summary ({error})", file=sys.stderr)
    return reports

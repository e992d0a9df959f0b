"""Owners asked after the summary: dead or unreachable actors are left out, never a crash."""

from __future__ import annotations

from typing import Any

import pytest
import ray.exceptions as rex

from dpmarket.actors.run.survivors import ask_owners, owner_reports


class _Ref:
    def __init__(self, owner: str, method: str) -> None:
        self.owner, self.method = owner, method


class _Method:
    def __init__(self, name: str) -> None:
        self.name = name

    def remote(self, owner: str) -> _Ref:
        return _Ref(owner, self.name)


class _Handle:
    """A fake actor handle: ``handle.status.remote(owner)`` returns a reference."""

    def __getattr__(self, name: str) -> _Method:
        return _Method(name)


def _errors() -> dict[str, BaseException]:
    return {
        "owner-2": rex.ActorDiedError(),
        "owner-3": rex.ActorUnavailableError("node unreachable", None),
        "owner-4": rex.RayActorError(),
        "owner-5": rex.GetTimeoutError("no answer"),
    }


def _get_with(errors: dict[str, BaseException], seen: list[float]) -> Any:
    def get(ref: _Ref, timeout: float) -> dict[str, Any]:
        seen.append(timeout)
        if ref.owner in errors:
            raise errors[ref.owner]
        if ref.method == "status":
            return {"name": ref.owner, "state": "done"}
        return {"records": 10, "rejected": 1, "gaps": 2}

    return get


def test_every_dead_actor_error_is_tolerated_and_named() -> None:
    owners = {f"owner-{k}": _Handle() for k in range(1, 6)}
    seen: list[float] = []
    reports, lost = owner_reports(owners, timeout=5.0, get=_get_with(_errors(), seen))
    assert list(reports) == ["owner-1"]
    assert reports["owner-1"] == {
        "name": "owner-1",
        "state": "done",
        "ingested": 10,
        "rejected_records": 1,
        "ingest_gaps": 2,
    }
    assert lost == {
        "owner-2": "ActorDiedError",
        "owner-3": "ActorUnavailableError",
        "owner-4": "RayActorError",
        "owner-5": "GetTimeoutError",
    }
    assert all(0.0 <= t <= 5.0 for t in seen)


def test_an_owner_lost_between_the_two_questions_is_left_out() -> None:
    owners = {"owner-1": _Handle(), "owner-2": _Handle()}

    def get(ref: _Ref, timeout: float) -> dict[str, Any]:
        if ref.owner == "owner-2" and ref.method == "ingest_status":
            raise rex.ActorDiedError()
        return (
            {"name": ref.owner}
            if ref.method == "status"
            else {"records": 3, "rejected": 0, "gaps": 0}
        )

    reports, lost = owner_reports(owners, get=get)
    assert list(reports) == ["owner-1"] and lost == {"owner-2": "ActorDiedError"}


def test_the_deadline_is_shared_by_all_questions() -> None:
    now = [0.0]
    seen: list[float] = []

    def get(ref: _Ref, timeout: float) -> dict[str, Any]:
        seen.append(timeout)
        now[0] += 4.0  # every answer takes 4 s
        return {}

    answers, lost = ask_owners(
        {f"owner-{k}": _Handle() for k in range(3)}, "status", 10.0, get, lambda: now[0]
    )
    assert seen == [10.0, 6.0, 2.0] and len(answers) == 3 and not lost


def test_other_errors_are_not_swallowed() -> None:
    def get(ref: _Ref, timeout: float) -> dict[str, Any]:
        raise KeyError("owner 'owner-9' is not hosted here")

    with pytest.raises(KeyError):
        owner_reports({"owner-9": _Handle()}, get=get)

"""T-tolerance refusal, journal snapshots and resume without spending budget twice."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpmarket.actors.parties.transport import FaultPlan, LoopbackTransport
from dpmarket.protocol.summary.curator import Curator, CuratorParams
from dpmarket.protocol.summary.journal import restore_curator, snapshot_curator
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.wire.errors import LocalProtocolError
from dpmarket.streams.synthetic import Scenario
from tests.small import small_curator, small_params, small_scenario

RUN = "journal-run"


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return small_scenario(11)


def _params(scenario: Scenario, **kw: object) -> CuratorParams:
    return small_params(scenario, **({"max_lost": 1} | kw))


def _owners(scenario: Scenario) -> list[Owner]:
    return [
        Owner(n, RUN, X, y) for n, (X, y) in zip(scenario.owner_names, scenario.owners, strict=True)
    ]


def _run(curator: Curator, owners: list[Owner], faults: FaultPlan | None, first: list) -> None:
    transport = LoopbackTransport([curator, *owners], faults=faults)
    transport.send(first)
    transport.run_until(lambda: curator.state in ("done", "refused"))


def _counts(curator: Curator, party: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in curator.ledgers[party].events:
        out[e.label] = out.get(e.label, 0) + e.count
    return out


def test_losing_up_to_t_owners_is_tolerated(scenario: Scenario) -> None:
    curator = small_curator(RUN, scenario, _params(scenario), 0)
    faults = FaultPlan(kill_at={scenario.owner_names[0]: 2})
    _run(curator, _owners(scenario), faults, curator.start())
    assert curator.state == "done" and len(curator.provenance) == 10
    assert list(curator.lost) == [scenario.owner_names[0]]


def test_refusal_above_t_then_resume_without_new_noise(scenario: Scenario) -> None:
    names = list(scenario.owner_names)
    curator = small_curator(RUN, scenario, _params(scenario), 1)
    faults = FaultPlan(kill_at={names[0]: 4, names[1]: 4})
    _run(curator, _owners(scenario), faults, curator.start())
    assert curator.state == "refused"
    assert "2 owner(s) lost" in curator.reason and names[0] in curator.reason
    assert curator.refusal["epoch"] == 4
    refused_at = len(curator.provenance)
    before = _counts(curator, names[2])
    g_open = curator.epoch.g_summary.copy()

    snap = json.loads(json.dumps(snapshot_curator(curator)))  # through JSON, as on disk
    resumed = restore_curator(
        snap, scenario.validation, scenario.seed_set, rng=np.random.default_rng(0)
    )
    assert resumed.state == "refused" and len(resumed.provenance) == refused_at
    np.testing.assert_array_equal(resumed.epoch.g_summary, g_open)
    assert _counts(resumed, names[2]) == before  # ledger restored, not re-charged

    first = resumed.resume()
    epoch_bodies = [m.body for m in first if m.kind == "summary.epoch"]
    assert all(np.array_equal(b.g_summary, g_open) for b in epoch_bodies)  # re-sent as journaled
    assert _counts(resumed, names[2]) == before  # resuming drew no noise
    _run(resumed, _owners(scenario), None, first)
    assert resumed.state == "done" and len(resumed.provenance) == 10
    after = _counts(resumed, names[2])
    releases = len(resumed.provenance) - 1
    assert after["h2(summary) measure"] == releases * 10  # one charge per release, in total
    assert after["auction step"] == resumed.epoch.number  # one charge per epoch's auction
    val = _counts(resumed, "validation")
    assert val["h2(validation) measure"] == 200  # the validation release was never redrawn


def test_snapshot_round_trip_is_exact(scenario: Scenario) -> None:
    curator = small_curator(RUN, scenario, _params(scenario, p=4), 2)
    _run(curator, _owners(scenario), None, curator.start())
    snap = snapshot_curator(curator)
    again = snapshot_curator(
        restore_curator(
            json.loads(json.dumps(snap)),
            scenario.validation,
            scenario.seed_set,
            rng=np.random.default_rng(0),
        )
    )
    assert again == snap


def test_count_rows_of_older_journals_restore(scenario: Scenario) -> None:
    """The bid and delivery counts, now journaled as columns, also restore from the
    ``[owner, token, count]`` rows earlier journals wrote; unequal columns are refused."""
    curator = small_curator(RUN, scenario, _params(scenario, p=4), 4)
    _run(curator, _owners(scenario), None, curator.start())
    snap = json.loads(json.dumps(snapshot_curator(curator)))
    assert curator._times_bid and curator.transfers.deliveries  # the run bid and delivered
    old = dict(snap)
    for key in ("times_bid", "deliveries"):
        cols = snap[key]
        rows = zip(cols["owner"], cols["token"], cols["count"], strict=True)
        old[key] = sorted([o, t, n] for o, t, n in rows)
    restored = restore_curator(
        old, scenario.validation, scenario.seed_set, rng=np.random.default_rng(0)
    )
    assert restored._times_bid == curator._times_bid
    assert restored.transfers.deliveries == curator.transfers.deliveries
    torn = dict(snap, deliveries=dict(snap["deliveries"], count=snap["deliveries"]["count"][:-1]))
    with pytest.raises(ValueError, match="count columns"):
        restore_curator(torn, scenario.validation, scenario.seed_set, rng=np.random.default_rng(0))


def test_resume_refuses_a_finished_run(scenario: Scenario) -> None:
    curator = small_curator(RUN, scenario, _params(scenario, p=2), 3)
    _run(curator, _owners(scenario), None, curator.start())
    with pytest.raises(LocalProtocolError, match="nothing to resume"):
        curator.resume()


def test_bad_journal_version_is_refused(scenario: Scenario) -> None:
    with pytest.raises(ValueError, match="unsupported version"):
        restore_curator(
            {"journal_version": 99},
            scenario.validation,
            scenario.seed_set,
            rng=np.random.default_rng(0),
        )


def test_snapshot_keeps_the_standardisation(scenario: Scenario) -> None:
    curator = small_curator(RUN, scenario, _params(scenario, p=3), 4)
    k = scenario.validation.shape[1]
    curator.standardize(np.full(k, 0.5), np.full(k, 2.0), 0.25)
    _run(curator, _owners(scenario), None, curator.start())
    snap = json.loads(json.dumps(snapshot_curator(curator)))
    restored = restore_curator(
        snap, scenario.validation, scenario.seed_set, rng=np.random.default_rng(0)
    )
    assert restored.h1 == curator.h1 and restored.params.gamma == 0.25
    assert restored.params.scale == (2.0,) * k


def test_a_new_curator_journals_its_secure_phases_record_and_v2_still_restores(
    scenario: Scenario,
) -> None:
    """Version 3: a snapshot before the first secure-sum round (state "new", no release yet)
    carries the runtime's secure-phase record through JSON and back, and the restored curator
    starts as a fresh one would; a version 2 journal (no such key) still restores."""
    from dpmarket.protocol.summary.journal import JOURNAL_VERSION, secure_record

    record = {
        "seq": 3,
        "rounds": {
            "normalise": {"state": "released", "result": {"value": [1.5, 0.1 + 0.2, 1e-300]}},
            "scan": {"state": "opened"},
        },
    }
    curator = small_curator(RUN, scenario, _params(scenario), 2)
    snap = json.loads(json.dumps(snapshot_curator(curator, secure_phases=record)))
    assert snap["journal_version"] == JOURNAL_VERSION == 3 and snap["state"] == "new"
    assert secure_record(snap) == record  # floats exact through JSON
    assert all(not ledger.events for ledger in curator.ledgers.values())
    restored = restore_curator(
        snap, scenario.validation, scenario.seed_set, rng=np.random.default_rng(2)
    )
    assert restored.state == "new"
    _run(restored, _owners(scenario), None, restored.start())  # a "new" journal starts the run
    fresh = small_curator(RUN, scenario, _params(scenario), 2)
    _run(fresh, _owners(scenario), None, fresh.start())
    assert restored.state == fresh.state == "done"
    assert _counts(restored, "validation") == _counts(fresh, "validation") != {}
    # a journal written by version 2 (after the secure phases, no record) still restores
    old = json.loads(json.dumps(snapshot_curator(restored)))
    old.pop("secure_phases")
    old["journal_version"] = 2
    again = restore_curator(
        old, scenario.validation, scenario.seed_set, rng=np.random.default_rng(3)
    )
    assert again.state == "done" and secure_record(old) == {}
    assert [p.token for p in again.provenance] == [p.token for p in restored.provenance]

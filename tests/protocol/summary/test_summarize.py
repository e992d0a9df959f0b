"""Owner and Curator state machines (Algorithm 3) driven in-process over the LoopbackTransport."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpmarket.actors.harness.inprocess import run_inprocess
from dpmarket.actors.parties.transport import FaultPlan, LoopbackTransport
from dpmarket.protocol.summary.curator import Curator, CuratorParams
from dpmarket.protocol.summary.h1 import RandomFourierFeatures
from dpmarket.protocol.summary.messages import (
    AskBody,
    BidBody,
    EpochBody,
    PassBody,
    SetupBody,
    ValidationBody,
)
from dpmarket.protocol.summary.objective import hashed_bids
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.wire.codec import Message
from dpmarket.protocol.wire.errors import LocalProtocolError, RemoteProtocolError
from dpmarket.streams.synthetic import Scenario
from tests.small import small_params, small_scenario

RUN = "test-run"


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return small_scenario(7, n_points=1200, dim=5, n_validation=60, n_test=200)


def params(scenario: Scenario, **kw: object) -> CuratorParams:
    base = {"p": 12, "d": 64, "h1_seed": 3, "validation_iterations": 300,
            "seed_iterations": 300, "summary_iterations": 20}  # fmt: skip
    return small_params(scenario, **(base | kw))


def test_run_completes_with_provenance_and_bookkeeping(scenario: Scenario) -> None:
    run = run_inprocess(scenario, params(scenario), np.random.default_rng(0), run_id=RUN)
    res = run.result
    assert res.reason == "complete"
    assert len(res.provenance) == 12 and res.points is not None and res.points.shape == (12, 5)
    keys = {(p.owner, p.token) for p in res.provenance}
    assert len(keys) == 12  # no point twice
    for prov, point in zip(res.provenance, res.points, strict=True):
        owner_index = scenario.owner_names.index(prov.owner)
        np.testing.assert_array_equal(point, scenario.owners[owner_index][0][prov.token])
    assert res.transfers.distinct_points <= res.transfers.total_transfers
    assert res.transfers.distinct_points >= 12
    total_value = sum(res.value.values())
    assert total_value == pytest.approx(sum(p.gain for p in res.provenance))
    assert not run.transport.errors


def test_ledger_counts_what_ran(scenario: Scenario) -> None:
    pr = params(scenario)
    res = run_inprocess(scenario, pr, np.random.default_rng(1), run_id=RUN).result
    val = {e.mechanism: e.count for e in res.ledgers["validation"].events}
    assert val == {"exponential": 300, "laplace": 300}
    owner = res.ledgers[scenario.owner_names[0]]
    counts: dict[str, int] = {}
    for e in owner.events:
        counts[e.mechanism] = counts.get(e.mechanism, 0) + e.count
    releases = len(res.provenance) - 1  # a release follows every addition but the last
    assert counts["exponential"] == counts["laplace"] == releases * 20
    assert counts["auction"] == res.epochs
    # the paper's count sees only the Laplace steps; the ledger's PLD sees more
    assert owner.epsilon(1e-5, "pld") > owner.epsilon(1e-5, "paper")


def test_same_seeds_same_summary(scenario: Scenario) -> None:
    runs = [
        run_inprocess(scenario, params(scenario), np.random.default_rng(5), run_id=RUN).result
        for _ in range(2)
    ]
    assert runs[0].provenance == runs[1].provenance
    np.testing.assert_array_equal(runs[0].hashed, runs[1].hashed)


def test_less_trusted_curator_gets_hashes_and_labels_only(scenario: Scenario) -> None:
    res = run_inprocess(
        scenario, params(scenario, less_trusted=True), np.random.default_rng(2), run_id=RUN
    ).result
    assert res.reason == "complete" and res.points is None
    assert res.hashed.shape == (12, 64) and res.labels.shape == (12,)
    h1 = RandomFourierFeatures(5, 64, scenario.gamma, 3)
    for prov, h in zip(res.provenance, res.hashed, strict=True):
        X = scenario.owners[scenario.owner_names.index(prov.owner)][0]
        np.testing.assert_allclose(h, h1(X[prov.token]), atol=1e-6)


class InflatingOwner(Owner):
    """An owner that claims a higher bid than its point is worth."""

    def receive(self, msg: Message) -> list[Message]:
        out = super().receive(msg)
        return [
            dataclasses.replace(m, body=BidBody(m.body.token, m.body.bid + 0.5))
            if isinstance(m.body, BidBody)
            else m
            for m in out
        ]


def test_curator_rejects_a_point_that_does_not_match_its_bid(scenario: Scenario) -> None:
    pr = params(scenario, p=5)
    names = scenario.owner_names
    owners: list[Owner] = [
        (InflatingOwner if i == 0 else Owner)(n, RUN, X, y)
        for i, (n, (X, y)) in enumerate(zip(names, scenario.owners, strict=True))
    ]
    curator = Curator(
        RUN, list(names), scenario.validation, scenario.seed_set, pr, np.random.default_rng(3)
    )
    transport = LoopbackTransport([curator, *owners])
    transport.send(curator.start())
    transport.run_until(lambda: curator.done)
    res = curator.result()
    cheats = [r for r in res.rejected if r[1] == names[0]]
    assert cheats and all("does not match" in why for _, _, why in cheats)
    assert all(p.owner != names[0] for p in res.provenance)
    assert len(res.provenance) == 5


def test_killed_owner_is_dropped_and_the_run_goes_on(scenario: Scenario) -> None:
    victim = scenario.owner_names[1]
    faults = FaultPlan(kill_at={victim: 3})
    run = run_inprocess(
        scenario, params(scenario), np.random.default_rng(4), faults=faults, run_id=RUN
    )
    res = run.result
    assert res.reason == "complete"
    dropped = [(e, o) for e, o, _ in res.dropped]
    assert dropped and all(o == victim and e >= 3 for e, o in dropped)
    assert all(p.epoch < 3 for p in res.provenance if p.owner == victim)


def test_slow_owner_misses_deadlines_and_its_late_frames_are_ignored(scenario: Scenario) -> None:
    slow = scenario.owner_names[2]
    faults = FaultPlan(delay={slow: 7.0})  # longer than the 5 s phase timeout
    res = run_inprocess(
        scenario, params(scenario), np.random.default_rng(6), faults=faults, run_id=RUN
    ).result
    assert res.reason == "complete"
    assert [o for _, o, _ in res.dropped] == [slow]  # lost once, then the run goes on without it
    assert all(p.owner != slow for p in res.provenance)


def test_frames_of_a_closed_epoch_are_counted_late_not_refused(scenario: Scenario) -> None:
    names = list(scenario.owner_names)
    curator = Curator(
        RUN,
        names,
        scenario.validation,
        scenario.seed_set,
        params(scenario),
        np.random.default_rng(0),
    )
    curator.start()
    for seq, owner in enumerate(names, start=1):
        curator.receive(Message(RUN, 1, owner, "curator", seq, PassBody()))
    # every owner passed: the run finished; a straggler's bid is late, not an error
    assert curator.done
    assert curator.receive(Message(RUN, 1, names[0], "curator", 9, BidBody(0, 1.0))) == []
    assert curator.late_frames == 1


def _setup_owner(X: np.ndarray, d: int = 16) -> tuple[Owner, RandomFourierFeatures]:
    owner = Owner("owner-1", RUN, X, np.arange(len(X), dtype=np.float64))
    owner.receive(Message(RUN, 0, "curator", "owner-1", 1, SetupBody(X.shape[1], d, 0.5, 9, 2)))
    h1 = RandomFourierFeatures(X.shape[1], d, 0.5, 9)
    return owner, h1


def test_owner_bids_its_best_point_by_the_corrected_bid() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 3))
    owner, h1 = _setup_owner(X)
    g_v = h1(rng.normal(size=(10, 3))).mean(axis=0).astype(np.float64)
    g_s = h1(rng.normal(size=(4, 3))).mean(axis=0).astype(np.float64)
    owner.receive(Message(RUN, 0, "curator", "owner-1", 2, ValidationBody(g_v)))
    (bid,) = owner.receive(Message(RUN, 1, "curator", "owner-1", 3, EpochBody(g_s, 4)))
    expected = hashed_bids(h1(X), g_v, g_s, 4)
    assert isinstance(bid.body, BidBody)
    assert bid.body.token == int(np.argmax(expected))
    assert bid.body.bid == pytest.approx(float(expected.max()), abs=1e-6)


def test_owner_refuses_illegal_transitions_and_keeps_its_state() -> None:
    X = np.random.default_rng(1).normal(size=(5, 3))
    owner = Owner("owner-1", RUN, X)
    epoch = Message(RUN, 1, "curator", "owner-1", 1, EpochBody(np.zeros(16), 0))
    with pytest.raises(RemoteProtocolError, match="not expected"):
        owner.receive(epoch)
    assert owner.state == "new"
    owner, _ = _setup_owner(X)
    owner.receive(Message(RUN, 0, "curator", "owner-1", 2, ValidationBody(np.zeros(16))))
    (bid,) = owner.receive(Message(RUN, 1, "curator", "owner-1", 3, EpochBody(np.zeros(16), 0)))
    assert isinstance(bid.body, BidBody)
    wrong = (bid.body.token + 1) % 5
    with pytest.raises(RemoteProtocolError, match="was not bid"):
        owner.receive(Message(RUN, 1, "curator", "owner-1", 4, AskBody(wrong)))
    assert owner.state == "bidding" and owner.asks == 0
    with pytest.raises(RemoteProtocolError, match="run"):
        owner.receive(Message("other", 1, "curator", "owner-1", 5, AskBody(bid.body.token)))
    with pytest.raises(RemoteProtocolError, match="shape"):
        owner.receive(Message(RUN, 2, "curator", "owner-1", 6, EpochBody(np.zeros(3), 0)))


def test_new_records_become_biddable_at_the_next_epoch() -> None:
    rng = np.random.default_rng(2)
    X = rng.normal(size=(30, 3)) + 5.0  # far from the validation set
    owner, h1 = _setup_owner(X)
    V = rng.normal(size=(20, 3))
    g_v = h1(V).mean(axis=0).astype(np.float64)
    owner.receive(Message(RUN, 0, "curator", "owner-1", 2, ValidationBody(g_v)))
    owner.add_records(V[:1], [99.0])
    assert owner.n_records == 31
    (bid,) = owner.receive(Message(RUN, 1, "curator", "owner-1", 3, EpochBody(np.zeros(16), 0)))
    assert isinstance(bid.body, BidBody) and bid.body.token == 30
    with pytest.raises(ValueError, match="expected shape"):
        owner.add_records(np.zeros((2, 4)))


def test_owner_withdraws_a_point_after_max_deliveries() -> None:
    X = np.random.default_rng(3).normal(size=(4, 3))
    owner, _ = _setup_owner(X)  # max_deliveries defaults to 3
    owner.receive(Message(RUN, 0, "curator", "owner-1", 2, ValidationBody(np.full(16, 0.1))))
    tokens = []
    seq = 3
    for epoch in range(1, 5):
        (bid,) = owner.receive(
            Message(RUN, epoch, "curator", "owner-1", seq, EpochBody(np.zeros(16), 0))
        )
        assert isinstance(bid.body, BidBody)
        tokens.append(bid.body.token)
        owner.receive(Message(RUN, epoch, "curator", "owner-1", seq + 1, AskBody(bid.body.token)))
        seq += 2
    assert tokens[0] == tokens[1] == tokens[2] != tokens[3]


def test_curator_refuses_strangers_and_future_rounds(scenario: Scenario) -> None:
    curator = Curator(
        RUN,
        list(scenario.owner_names),
        scenario.validation,
        scenario.seed_set,
        params(scenario),
        np.random.default_rng(0),
    )
    curator.start()
    with pytest.raises(RemoteProtocolError, match="not an owner"):
        curator.receive(Message(RUN, 1, "mallory", "curator", 1, BidBody(0, 1.0)))
    owner = scenario.owner_names[0]
    with pytest.raises(RemoteProtocolError, match="open epoch"):
        curator.receive(Message(RUN, 9, owner, "curator", 1, BidBody(0, 1.0)))
    curator.receive(Message(RUN, 1, owner, "curator", 2, BidBody(0, 1.0)))
    with pytest.raises(RemoteProtocolError, match="already answered"):
        curator.receive(Message(RUN, 1, owner, "curator", 3, BidBody(1, 2.0)))
    assert curator.epoch.bids[owner].token == 0 and curator.state == "bidding"


def test_bad_parameters_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="eps_summary"):
        CuratorParams(p=5, eps_summary=0.0)
    with pytest.raises(ValueError, match="auction_variant"):
        CuratorParams(p=5, auction_variant="secret")


def test_dropped_asks_fire_the_asking_deadline(scenario: Scenario) -> None:
    victim = scenario.owner_names[0]
    faults = FaultPlan(drop=lambda m: isinstance(m.body, AskBody) and m.recipient == victim)
    run = run_inprocess(
        scenario, params(scenario), np.random.default_rng(8), faults=faults, run_id=RUN
    )
    res = run.result
    assert res.reason == "complete"
    assert any(o == victim and phase == "asking" for _, o, phase in res.dropped)
    assert all(p.owner != victim for p in res.provenance)
    assert run.transport.dropped_frames > 0


def test_standardised_run_hashes_the_same_features_on_both_sides(scenario: Scenario) -> None:
    # features on wildly different scales: standardising by public means and spreads fixes
    # the kernel; owners must hash exactly what the curator verifies against
    scale_up = np.array([1.0, 100.0, 0.01, 5.0, 1000.0])
    shifted = dataclasses.replace(
        scenario,
        owners=[(X * scale_up + 3.0, y) for X, y in scenario.owners],
        validation=scenario.validation * scale_up + 3.0,
        seed_set=scenario.seed_set * scale_up + 3.0,
    )
    owners = {
        name: Owner(name, RUN, X, y)
        for name, (X, y) in zip(shifted.owner_names, shifted.owners, strict=True)
    }
    curator = Curator(
        RUN,
        list(owners),
        shifted.validation,
        shifted.seed_set,
        params(scenario),
        np.random.default_rng(3),
    )
    pooled = np.concatenate([X for X, _ in shifted.owners])
    curator.standardize(pooled.mean(axis=0), pooled.std(axis=0), scenario.gamma)
    transport = LoopbackTransport([curator, *owners.values()])
    transport.send(curator.start())
    transport.run_until(lambda: curator.done)
    res = curator.result()
    assert res.reason == "complete" and not transport.errors
    assert all(why == "point is already in the summary" for _, _, why in res.rejected)
    for owner in owners.values():
        assert owner._h1 == curator.h1  # same map, standardisation included
    with pytest.raises(LocalProtocolError, match="before start"):
        curator.standardize(np.zeros(5), np.ones(5), 1.0)
    assert curator.params.center == tuple(pooled.mean(axis=0))


def test_standardize_refuses_bad_vectors_and_keeps_the_curator(scenario: Scenario) -> None:
    curator = Curator(
        RUN,
        scenario.owner_names,
        scenario.validation,
        scenario.seed_set,
        params(scenario),
        np.random.default_rng(3),
    )
    before = curator.h1
    with pytest.raises(ValueError, match="scale"):
        curator.standardize(np.zeros(5), np.zeros(5), 1.0)
    assert curator.h1 == before and curator.params.center is None

"""Oversample, then select (protocol/selection.py): exploration epochs, the purchased pool and
the curator's exact final selection, which must never reach an owner."""

from __future__ import annotations

import dataclasses
import json

import msgpack
import numpy as np
import pytest
from scipy import stats

from dpmarket.actors.runner import run_inprocess
from dpmarket.actors.transport import FaultPlan, LoopbackTransport
from dpmarket.protocol.curator import Curator, CuratorParams
from dpmarket.protocol.journal import restore_curator, snapshot_curator
from dpmarket.protocol.messages import Message, decode, encode
from dpmarket.protocol.objective import greedy_exact, greedy_hashed, objective_j
from dpmarket.protocol.release_plan import plan_releases
from dpmarket.protocol.selection import (
    PoolEntry,
    PurchasedPool,
    exploration_generator,
    prefix_gains,
)
from dpmarket.protocol.summarize import Owner
from dpmarket.protocol.summary_messages import EpochBody
from dpmarket.streams.synthetic import Scenario
from tests.small import small_curator, small_params, small_scenario

RUN = "select-run"


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return small_scenario(5, n_points=900, dim=4, n_validation=40)


def _select(scenario: Scenario, **kw: object) -> CuratorParams:
    base = {"p": 8, "tau": 1, "final_selection": "exact", "explore_share": 1.0}
    return small_params(scenario, **(base | kw))


def _owners(scenario: Scenario) -> list[Owner]:
    return [
        Owner(n, RUN, X, y) for n, (X, y) in zip(scenario.owner_names, scenario.owners, strict=True)
    ]


def _drive(curator: Curator, owners: list[Owner], seen: list[Message] | None = None) -> None:
    def record(msg: Message) -> bool:
        if seen is not None and msg.recipient != "curator":
            seen.append(msg)
        return False

    transport = LoopbackTransport([curator, *owners], faults=FaultPlan(drop=record))
    transport.send(curator.start())
    transport.run_until(lambda: curator.done)
    assert not transport.errors


def _entry(owner: str, token: int, x: list[float]) -> PoolEntry:
    point = np.asarray(x, dtype=np.float64)
    return PoolEntry(owner, token, 1, 0.5, point, point.astype(np.float32), 1.0)


# ------------------------------------------------------------------------------- the pool
def test_pool_keeps_each_owner_token_once_and_round_trips_through_json() -> None:
    pool = PurchasedPool()
    assert pool.add(_entry("owner-1", 3, [0.0, 1.0]))
    assert not pool.add(_entry("owner-1", 3, [9.0, 9.0]))  # the same point, delivered again
    assert pool.add(_entry("owner-2", 3, [1.0, 0.0]))
    assert len(pool) == 2
    again = PurchasedPool.from_json(json.loads(json.dumps(pool.to_json())))
    assert [(e.owner, e.token) for e in again.entries] == [("owner-1", 3), ("owner-2", 3)]
    np.testing.assert_array_equal(again.entries[0].point, [0.0, 1.0])


def test_select_is_exact_greedy_over_the_pool_in_both_trust_modes() -> None:
    rng = np.random.default_rng(0)
    X, V = rng.normal(size=(60, 3)), rng.normal(0.5, 0.5, size=(15, 3))
    pool = PurchasedPool()
    for i, x in enumerate(X):
        pool.add(_entry(f"owner-{i % 3}", i, list(x)))
    order, gains = pool.select(7, V, V, 0.4)
    np.testing.assert_array_equal(order, greedy_exact(X, V, 7, 0.4))
    assert gains.sum() == pytest.approx(objective_j(X[order], V, 0.4))
    center, scale = np.array([0.1, -0.2, 0.3]), np.array([2.0, 0.5, 1.5])
    standard, _ = pool.select(7, V, V, 0.4, (center, scale))
    np.testing.assert_array_equal(
        standard, greedy_exact((X - center) / scale, (V - center) / scale, 7, 0.4)
    )
    hashed = PurchasedPool()  # less trusted: hashes only
    H = rng.normal(size=(60, 8)).astype(np.float32)
    for i, h in enumerate(H):
        hashed.add(PoolEntry("owner-1", i, 1, 0.0, None, h, 0.0))
    HV = rng.normal(size=(5, 8)).astype(np.float32)
    np.testing.assert_array_equal(hashed.select(4, V, HV, 0.4)[0], greedy_hashed(H, HV, 4))
    assert len(pool.select(500, V, V, 0.4)[0]) == 60  # never more than the pool holds
    with pytest.raises(ValueError, match="p must be >= 1"):
        pool.select(0, V, V, 0.4)


def test_prefix_gains_are_the_marginal_gains_of_eq_3() -> None:
    rng = np.random.default_rng(1)
    S, V = rng.normal(size=(6, 2)), rng.normal(size=(9, 2))
    gains = prefix_gains(S, V, 0.7)
    brute = [objective_j(S[: i + 1], V, 0.7) - (objective_j(S[:i], V, 0.7) if i else 0.0)
             for i in range(6)]  # fmt: skip
    np.testing.assert_allclose(gains, brute, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------- exploration
def test_exploration_generator_is_public_and_deterministic() -> None:
    a = exploration_generator(3, 5, "owner-1").integers(1 << 30, size=4)
    np.testing.assert_array_equal(
        a, exploration_generator(3, 5, "owner-1").integers(1 << 30, size=4)
    )
    for other in ((3, 6, "owner-1"), (3, 5, "owner-2"), (4, 5, "owner-1")):
        assert not np.array_equal(a, exploration_generator(*other).integers(1 << 30, size=4))


def test_exploration_draws_are_uniform_over_an_owners_records() -> None:
    """Chi-square over 4,000 exploration epochs of one owner with 20 records (fixed seeds):
    a draw that preferred high-scoring records would fail it by far."""
    scenario = small_scenario(2, n_points=80)
    X, y = scenario.owners[0][0][:20], scenario.owners[0][1][:20]
    owner = Owner("owner-1", RUN, X, y)
    params = small_params(scenario, d=16)
    curator = small_curator(RUN, scenario, params, 0)
    for msg in curator.start():
        if msg.recipient == "owner-1" and msg.kind != "summary.epoch":
            owner.receive(decode(encode(msg)))
    tokens = []
    g = np.linspace(-1, 1, 16)
    for epoch in range(1, 4001):
        body = EpochBody(g, 0, explore=True)
        msg = Message(RUN, epoch, "curator", "owner-1", epoch, body)
        [bid] = owner.receive(msg)
        tokens.append(bid.body.token)
    counts = np.bincount(tokens, minlength=20)
    assert stats.chisquare(counts).pvalue > 1e-4
    best = int(np.argmax(np.linspace(-1, 1, 16).astype(np.float32) @ owner._store.HT))
    assert counts[best] < 2 * 4000 / 20  # the argmax is not favoured


def test_exploration_epochs_ask_everybody_and_charge_nothing(scenario: Scenario) -> None:
    params = _select(scenario)
    curator = small_curator(RUN, scenario, params, 3)
    _drive(curator, _owners(scenario))
    explore = params.explore_epochs(len(scenario.owners))
    assert explore == 2  # ceil(1.0 * 8 / 4)
    explored = [e for e in curator.pool.entries if e.epoch <= explore]
    assert len(explored) == explore * len(scenario.owners)  # every owner asked, every epoch
    assert all(p.epoch > explore for p in curator.provenance)  # winners only in steering epochs
    steering = curator.epoch.number - explore
    for owner in scenario.owner_names:
        steps = [e for e in curator.ledgers[owner].events if e.label == "auction step"]
        assert sum(e.count for e in steps) == steering  # no auction charged while exploring


# ---------------------------------------------------------------------- final selection
def test_final_selection_is_exact_greedy_over_every_purchased_point(scenario: Scenario) -> None:
    run = run_inprocess(scenario, _select(scenario), np.random.default_rng(4))
    res, curator = run.result, run.transport.parties["curator"]
    assert isinstance(curator, Curator) and res.points is not None
    pool = curator.pool
    assert len(pool) == res.transfers.distinct_points > 8
    X = np.array([e.point for e in pool.entries])
    expected = greedy_exact(X, scenario.validation, 8, scenario.gamma)
    np.testing.assert_array_equal(res.points, X[expected])
    for prov, i in zip(res.provenance, expected, strict=True):
        entry = pool.entries[i]
        assert (prov.owner, prov.token) == (entry.owner, entry.token)
        owner_index = scenario.owner_names.index(prov.owner)
        np.testing.assert_array_equal(X[i], scenario.owners[owner_index][0][prov.token])
    assert sum(res.value.values()) == pytest.approx(
        objective_j(res.points, scenario.validation, scenario.gamma)
    )
    assert curator.result() is curator.result()  # computed once the run is done


def test_owners_receive_the_same_bytes_with_or_without_the_final_selection(
    scenario: Scenario,
) -> None:
    """The selection reads D_v exactly; its privacy rests on owners never seeing it."""
    runs = []
    for final in ("none", "exact"):
        seen: list[Message] = []
        curator = small_curator(RUN, scenario, _select(scenario, final_selection=final), 6)
        _drive(curator, _owners(scenario), seen)
        runs.append(([encode(m) for m in seen], curator))
    assert runs[0][0] == runs[1][0]
    plain, selected = runs[0][1].result(), runs[1][1].result()
    assert [e.to_dict() for e in plain.ledgers["validation"].events] == [
        e.to_dict() for e in selected.ledgers["validation"].events
    ]
    assert {(p.owner, p.token) for p in plain.provenance} != {
        (p.owner, p.token) for p in selected.provenance
    }


def test_journal_keeps_the_pool_and_a_resumed_run_selects_the_same(scenario: Scenario) -> None:
    names = list(scenario.owner_names)
    params = _select(scenario, max_lost=1)
    reference = small_curator(RUN, scenario, params, 8)
    _drive(reference, _owners(scenario))

    curator = small_curator(RUN, scenario, params, 8)
    transport = LoopbackTransport(
        [curator, *_owners(scenario)], faults=FaultPlan(kill_at={names[0]: 5, names[1]: 5})
    )
    transport.send(curator.start())
    transport.run_until(lambda: curator.state in ("done", "refused"))
    assert curator.state == "refused" and len(curator.pool) > 0
    snap = json.loads(json.dumps(snapshot_curator(curator)))
    resumed = restore_curator(snap, scenario.validation, scenario.seed_set)
    assert [(e.owner, e.token) for e in resumed.pool.entries] == [
        (e.owner, e.token) for e in curator.pool.entries
    ]
    transport = LoopbackTransport([resumed, *_owners(scenario)])
    transport.send(resumed.resume())
    transport.run_until(lambda: resumed.done)
    assert resumed.result().points is not None and len(resumed.result().provenance) == 8
    snap.pop("pool")  # a journal written before the pool existed still restores
    assert len(restore_curator(snap, scenario.validation, scenario.seed_set).pool) == 0


# ------------------------------------------------------------------------ bad input, plan
@pytest.mark.parametrize(
    ("field", "value"),
    [("final_selection", "greedy"), ("explore_share", -1.0), ("explore_share", float("nan"))],
)
def test_bad_selection_parameters_are_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        CuratorParams(p=5, **{field: value})  # type: ignore[arg-type]


def test_an_epoch_body_without_the_explore_field_decodes_as_a_steering_epoch() -> None:
    frame = msgpack.unpackb(
        encode(Message(RUN, 1, "curator", "owner-1", 1, EpochBody(np.zeros(4), 2, explore=True)))
    )
    del frame["body"]["explore"]  # as an older curator sends it
    msg = decode(msgpack.packb(frame, use_bin_type=True))
    assert isinstance(msg.body, EpochBody) and msg.body.explore is False


def test_plan_with_select_adds_exploration_epochs_but_no_owner_event() -> None:
    plain = plan_releases(100, 32, 5)
    selected = plan_releases(100, 32, 5, select=True)
    assert selected.final_selection == "exact" and selected.explore_share == 1.0
    assert selected.max_epochs == plain.max_epochs + 20  # ceil(100 / 5) exploration epochs
    assert dataclasses.replace(selected, final_selection="none", explore_share=0.0,
                               max_epochs=plain.max_epochs) == plain  # fmt: skip
    with pytest.raises(ValueError, match="explore_share"):
        plan_releases(100, 32, 5, select=True, explore_share=-0.5)

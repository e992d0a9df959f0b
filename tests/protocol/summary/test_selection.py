"""Oversample, then select (protocol/summary/selection.py): exploration epochs, the purchased pool
and
the curator's exact final selection, which must never reach an owner."""

from __future__ import annotations

import dataclasses
import json
import zlib
from pathlib import Path

import msgpack
import numpy as np
import pytest
from scipy import stats

from dpmarket.actors.config.market import ConfigError
from dpmarket.actors.harness.inprocess import run_inprocess
from dpmarket.actors.parties.curator import (
    append_pool_rows,
    pool_file,
    read_pool_rows,
    rewrite_pool_rows,
)
from dpmarket.actors.parties.transport import FaultPlan, LoopbackTransport
from dpmarket.actors.run.market import resume_market
from dpmarket.protocol.summary.curator import Curator, CuratorParams
from dpmarket.protocol.summary.journal import pool_rows, restore_curator, snapshot_curator
from dpmarket.protocol.summary.messages import EpochBody
from dpmarket.protocol.summary.objective import greedy_exact, greedy_hashed, objective_j
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.summary.plan import plan_releases
from dpmarket.protocol.summary.selection import (
    PoolEntry,
    PurchasedPool,
    prefix_gains,
)
from dpmarket.protocol.wire.codec import Message, decode, encode
from dpmarket.protocol.wire.errors import LocalProtocolError
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
    """The scenario's owners, each with its secret generator (fixed seeds: a test)."""
    pairs = zip(scenario.owner_names, scenario.owners, strict=True)
    return [Owner(n, RUN, X, y, rng=np.random.default_rng([7, i])) for i, (n, (X, y)) in
            enumerate(pairs)]  # fmt: skip


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
def test_pool_keeps_each_owner_token_once() -> None:
    pool = PurchasedPool()
    assert pool.add(_entry("owner-1", 3, [0.0, 1.0]))
    assert not pool.add(_entry("owner-1", 3, [9.0, 9.0]))  # the same point, delivered again
    assert pool.add(_entry("owner-2", 3, [1.0, 0.0]))
    assert [(e.owner, e.token) for e in pool.entries] == [("owner-1", 3), ("owner-2", 3)]
    np.testing.assert_array_equal(pool.entries[0].point, [0.0, 1.0])


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
def _explorer(n: int, rng: np.random.Generator) -> tuple[Owner, int]:
    """Owner "owner-1" holding the first ``n`` records of a fixed data set, set up by a curator
    (same public values for every n); returns it and h1's public seed."""
    scenario = small_scenario(2, n_points=160)
    X, y = scenario.owners[0]
    owner = Owner("owner-1", RUN, X[:n], y[:n], rng=rng)
    curator = small_curator(RUN, scenario, small_params(scenario, d=16), 0)
    for msg in curator.start():
        if msg.recipient == "owner-1" and msg.kind != "summary.epoch":
            owner.receive(decode(encode(msg)))
    assert owner._setup is not None
    return owner, owner._setup.h1_seed


def _explore(owner: Owner, epochs: range) -> list[int]:
    """The tokens the curator receives from ``owner`` in exploration epochs ``epochs``."""
    tokens = []
    for epoch in epochs:
        body = EpochBody(np.linspace(-1, 1, 16), 0, explore=True)
        [bid] = owner.receive(Message(RUN, epoch, "curator", owner.name, epoch, body))
        tokens.append(bid.body.token)
    return tokens


def _public_draw(h1_seed: int, epoch: int, owner: str) -> np.random.Generator:
    """How exploration was drawn before issue 24: from public values only."""
    return np.random.default_rng([h1_seed & (2**63 - 1), epoch, zlib.crc32(owner.encode())])


def test_exploration_tokens_do_not_give_the_curator_an_owners_count() -> None:
    """The curator's exact-count attack: knowing the public seeds, try every count k and keep
    those whose public draws match the received tokens. Against a public draw it finds the
    owner's n exactly; against the owner's secret draws no k fits, for 51 or 63 records with
    everything else the same (selection.py's docstring: what the tokens still bound)."""
    epochs = range(1, 13)

    def counts_fitting(tokens: list[int], h1_seed: int) -> set[int]:
        return {
            k for k in range(1, 400)
            if all(int(_public_draw(h1_seed, e, "owner-1").choice(k)) == t
                   for e, t in zip(epochs, tokens, strict=True))
        }  # fmt: skip

    for n in (51, 63):
        owner, h1_seed = _explorer(n, np.random.default_rng(5))
        public = [int(_public_draw(h1_seed, e, "owner-1").choice(n)) for e in epochs]
        assert counts_fitting(public, h1_seed) == {n}  # the attack works on a public draw
        tokens = _explore(owner, epochs)
        assert all(0 <= t < n for t in tokens)
        assert counts_fitting(tokens, h1_seed) == set()


def test_exploration_draws_are_secret_reproducible_and_kept_for_a_resumed_epoch() -> None:
    """Same records and public values, other secret generator: other tokens. Same generator
    seed: the same tokens (a test's seed in, the same output out). An epoch sent again (a
    curator's resume) gets the draw the party already made."""
    a = _explore(_explorer(63, np.random.default_rng(1))[0], range(1, 9))
    assert a == _explore(_explorer(63, np.random.default_rng(1))[0], range(1, 9))
    assert a != _explore(_explorer(63, np.random.default_rng(2))[0], range(1, 9))
    owner, _ = _explorer(63, np.random.default_rng(3))
    first = _explore(owner, range(1, 4))
    assert _explore(owner, range(1, 4)) == first  # the same party
    again, _ = _explorer(63, np.random.default_rng(3))  # a party restarted with the same key
    assert _explore(again, range(3, 4)) == first[2:]
    silent, _ = _explorer(63, None)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="no secret generator"):
        _explore(silent, range(1, 2))


def test_exploration_draws_are_uniform_over_an_owners_records() -> None:
    """Chi-square over 4,000 exploration epochs of one owner with 20 records (fixed seeds):
    a draw that preferred high-scoring records would fail it by far."""
    scenario = small_scenario(2, n_points=80)
    X, y = scenario.owners[0][0][:20], scenario.owners[0][1][:20]
    owner = Owner("owner-1", RUN, X, y, rng=np.random.default_rng(1))
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
    params = _select(scenario, tau=2)  # steering epochs ask at most about two owners
    curator = small_curator(RUN, scenario, params, 3)
    _drive(curator, _owners(scenario))
    steering_epochs = range(3, curator.epoch.number + 1)
    asked = [len({e.owner for e in curator.pool.entries if e.epoch == n}) for n in steering_epochs]
    assert np.mean(asked) < len(scenario.owners) - 1  # the auction usually asks fewer than all
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


def test_final_selection_uses_the_standardised_coordinates_h1_hashes(scenario: Scenario) -> None:
    X_all = np.concatenate([X for X, _ in scenario.owners])
    center, scale = X_all.mean(axis=0), 2.0 * X_all.std(axis=0)
    curator = small_curator(RUN, scenario, _select(scenario), 5)
    curator.standardize(center, scale, 0.3)
    _drive(curator, _owners(scenario))
    res = curator.result()
    X = np.array([e.point for e in curator.pool.entries])
    V = (scenario.validation - center) / scale
    expected = greedy_exact((X - center) / scale, V, 8, 0.3)
    np.testing.assert_array_equal(res.points, X[expected])
    assert not np.array_equal(expected, greedy_exact(X, scenario.validation, 8, 0.3))


def test_owner_frames_do_not_depend_on_d_v_beyond_the_release(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The selection reads D_v exactly; its privacy rests on owners never seeing it. With the
    one release g_tilde held fixed, two different validation sets give owners byte-identical
    frames and ledgers, and different summaries."""
    from dpmarket.protocol.summary import curator as curator_module

    def fixed_release(H: object, params: CuratorParams, ledger: object, rng: object) -> object:
        ledger.gaussian(1.0, 1.0, label="gaussian(validation mean)")  # type: ignore[attr-defined]
        return np.full(params.d, 0.1)

    monkeypatch.setattr(curator_module, "release_validation", fixed_release)
    params = _select(scenario, tau=2)
    runs = []
    for validation in (scenario.validation, scenario.test_X[:40]):
        seen: list[Message] = []
        curator = Curator(RUN, list(scenario.owner_names), validation, scenario.seed_set,
                          params, np.random.default_rng(6))  # fmt: skip
        _drive(curator, _owners(scenario), seen)
        owners = {o: curator.ledgers[o].to_dict() for o in scenario.owner_names}
        runs.append(([encode(m) for m in seen], owners, curator.result()))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == runs[1][1]
    assert [(p.owner, p.token) for p in runs[0][2].provenance] != [
        (p.owner, p.token) for p in runs[1][2].provenance
    ]


def test_a_refused_run_reports_its_selection_so_far_and_the_resumed_one_its_final(
    scenario: Scenario,
) -> None:
    names = list(scenario.owner_names)
    curator = small_curator(RUN, scenario, _select(scenario, max_lost=1), 9)
    transport = LoopbackTransport(
        [curator, *_owners(scenario)], faults=FaultPlan(kill_at={names[0]: 4, names[1]: 4})
    )
    transport.send(curator.start())
    transport.run_until(lambda: curator.state in ("done", "refused"))
    early = curator.result()
    assert curator.state == "refused" and "refused" in early.reason
    transport = LoopbackTransport([curator, *_owners(scenario)])
    transport.send(curator.resume())
    transport.run_until(lambda: curator.done)
    final = curator.result()
    assert final.reason == "complete" and final.epochs > early.epochs
    assert len(final.provenance) == 8


def test_a_run_refused_while_exploring_resumes_from_its_journal(scenario: Scenario) -> None:
    names = list(scenario.owner_names)
    params = _select(scenario, max_lost=1, p=12)  # ceil(12 / 4) = 3 exploration epochs
    curator = small_curator(RUN, scenario, params, 8)
    transport = LoopbackTransport(
        [curator, *_owners(scenario)], faults=FaultPlan(kill_at={names[0]: 2, names[1]: 2})
    )
    transport.send(curator.start())
    transport.run_until(lambda: curator.state in ("done", "refused"))
    assert curator.state == "refused" and curator.epoch.number == 2  # mid-exploration
    before = [(e.owner, e.token) for e in curator.pool.entries]
    assert len(before) == len(names)  # epoch 1: one uniform draw from every owner
    snap = json.loads(json.dumps(snapshot_curator(curator)))
    assert all(r["hashed"] is None and r["point"] for r in snap["pool"]["rows"])  # h1 redoes them
    resumed = restore_curator(
        snap, scenario.validation, scenario.seed_set, rng=np.random.default_rng(0)
    )
    assert [(e.owner, e.token) for e in resumed.pool.entries] == before
    for old, new in zip(curator.pool.entries, resumed.pool.entries, strict=True):
        np.testing.assert_array_equal(old.hashed, new.hashed)
    transport = LoopbackTransport([resumed, *_owners(scenario)])
    transport.send(resumed.resume())
    transport.run_until(lambda: resumed.done)
    res = resumed.result()
    assert res.reason == "complete" and len(res.provenance) == 12
    keys = [(e.owner, e.token) for e in resumed.pool.entries]
    assert keys[: len(before)] == before  # nothing bought before the refusal was lost
    assert {e.epoch for e in resumed.pool.entries if e.epoch <= 3} == {1, 2, 3}
    X = np.array([e.point for e in resumed.pool.entries])
    np.testing.assert_array_equal(res.points, X[greedy_exact(X, scenario.validation, 12,
                                                             scenario.gamma)])  # fmt: skip
    for owner in names:
        steps = [e for e in resumed.ledgers[owner].events if e.label == "auction step"]
        assert sum(e.count for e in steps) == resumed.epoch.number - 3


def test_a_snapshot_can_leave_the_pool_rows_to_an_append_only_file(scenario: Scenario) -> None:
    curator = small_curator(RUN, scenario, _select(scenario), 11)
    _drive(curator, _owners(scenario))
    snap = json.loads(json.dumps(snapshot_curator(curator, pool_inline=False)))
    assert snap["pool"] == {"count": len(curator.pool)}
    rows = json.loads(json.dumps(pool_rows(curator)))
    assert pool_rows(curator, len(curator.pool) - 2) == rows[-2:]
    extra = [*rows, {**rows[0], "token": 10**6}]  # appended after the snapshot: not covered
    restored = restore_curator(
        snap, scenario.validation, scenario.seed_set, extra, rng=np.random.default_rng(0)
    )
    assert [(e.owner, e.token) for e in restored.pool.entries] == [
        (e.owner, e.token) for e in curator.pool.entries
    ]
    np.testing.assert_array_equal(restored.result().points, curator.result().points)
    with pytest.raises(ValueError, match=f"covers {len(rows)} pool rows, 3 given"):
        restore_curator(
            snap, scenario.validation, scenario.seed_set, rows[:3], rng=np.random.default_rng(0)
        )
    with pytest.raises(ValueError, match="none given"):
        restore_curator(snap, scenario.validation, scenario.seed_set, rng=np.random.default_rng(0))


def test_a_version_1_journal_seeds_the_pool_with_the_summary(scenario: Scenario) -> None:
    curator = small_curator(RUN, scenario, _select(scenario), 10)
    _drive(curator, _owners(scenario))
    snap = json.loads(json.dumps(snapshot_curator(curator)))
    snap.pop("pool")
    snap["journal_version"] = 1  # written before the pool existed
    restored = restore_curator(
        snap, scenario.validation, scenario.seed_set, rng=np.random.default_rng(0)
    )
    assert [(e.owner, e.token) for e in restored.pool.entries] == [
        (p.owner, p.token) for p in curator.provenance
    ]
    snap["journal_version"] = 4  # a version this reader does not know
    with pytest.raises(ValueError, match="unsupported version 4"):
        restore_curator(snap, scenario.validation, scenario.seed_set, rng=np.random.default_rng(0))


# ------------------------------------------------------------------------ bad input, plan
@pytest.mark.parametrize(
    ("field", "value"),
    [("final_selection", "greedy"), ("explore_share", -1.0), ("explore_share", float("nan"))],
)
def test_bad_selection_parameters_are_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        CuratorParams(p=5, **({"final_selection": "exact", field: value}))  # type: ignore[arg-type]


def test_exploration_without_the_final_selection_is_refused() -> None:
    """Exploration points are bought to be selected from; without the selection they would be
    paid for and never used."""
    with pytest.raises(ValueError, match="explore_share"):
        CuratorParams(p=5, explore_share=1.0)


def test_an_epoch_body_without_the_explore_field_decodes_as_a_steering_epoch() -> None:
    frame = msgpack.unpackb(
        encode(Message(RUN, 1, "curator", "owner-1", 1, EpochBody(np.zeros(4), 2, explore=True)))
    )
    del frame["body"]["explore"]  # as an older curator sends it
    msg = decode(msgpack.packb(frame, use_bin_type=True))
    assert isinstance(msg.body, EpochBody) and msg.body.explore is False


def test_a_steering_epoch_frame_carries_no_explore_key_for_older_owners() -> None:
    """Defaults are omitted on the wire (messages.py rule 5): an owner built before the field
    existed, which refuses unknown keys, still reads every steering epoch."""

    def frame(body: EpochBody) -> dict[str, object]:
        body_map = msgpack.unpackb(encode(Message(RUN, 4, "curator", "owner-1", 4, body)))["body"]
        assert isinstance(body_map, dict)
        return body_map

    assert set(frame(EpochBody(np.zeros(4), 2))) == {"g_summary", "summary_size"}
    assert frame(EpochBody(np.zeros(4), 0, explore=True))["explore"] is True


@pytest.mark.parametrize(("summary", "auction"), [("herding", "all"), ("gaussian", "pure")])
def test_plan_with_select_changes_no_owner_event(summary: str, auction: str) -> None:
    plain = plan_releases(100, 32, 5, summary=summary, auction=auction)
    selected = plan_releases(100, 32, 5, summary=summary, auction=auction, select=True)
    assert selected.final_selection == "exact" and selected.explore_share == 1.0
    assert dataclasses.replace(selected, final_selection="none", explore_share=0.0) == plain
    params = CuratorParams(p=100, **selected.overrides())
    assert params.explore_epochs(5) == 20 and params.epoch_limit == plain.max_epochs
    with pytest.raises(ValueError, match="explore_share"):
        plan_releases(100, 32, 5, select=True, explore_share=-0.5)


def test_the_pool_file_keeps_whole_rows_and_drops_a_torn_last_line(tmp_path: Path) -> None:
    path = pool_file(tmp_path / "journal.json")
    assert path.name == "journal.pool.jsonl" and read_pool_rows(path) == []
    end = append_pool_rows(path, [{"token": 1}, {"token": 2}], 0)
    end = append_pool_rows(path, [{"token": 3}], end)
    assert end == path.stat().st_size
    with path.open("a", encoding="utf-8") as fh:
        fh.write('{"token": 4, "po')  # a crash in the middle of an append
    assert read_pool_rows(path) == [{"token": 1}, {"token": 2}, {"token": 3}]
    append_pool_rows(path, [{"token": 4}], end)  # the retry cuts the fragment first
    assert read_pool_rows(path) == [{"token": i} for i in (1, 2, 3, 4)]
    rewrite_pool_rows(path, [{"token": 1}])
    assert read_pool_rows(path) == [{"token": 1}]


def test_a_pool_file_with_repeated_rows_is_refused_not_shortened(scenario: Scenario) -> None:
    curator = small_curator(RUN, scenario, _select(scenario), 12)
    _drive(curator, _owners(scenario))
    snap = json.loads(json.dumps(snapshot_curator(curator, pool_inline=False)))
    rows = json.loads(json.dumps(pool_rows(curator)))
    with pytest.raises(ValueError, match="distinct points"):
        restore_curator(
            snap,
            scenario.validation,
            scenario.seed_set,
            [rows[0], *rows],
            rng=np.random.default_rng(0),
        )


def test_resume_refuses_a_journal_whose_pool_file_lost_rows(tmp_path: Path) -> None:
    journal = tmp_path / ".journal"
    journal.mkdir()
    config = Path(__file__).resolve().parents[3] / "configs" / "demo.toml"
    (journal / "config_path").write_text(str(config))
    snapshot = {"journal_version": 2, "state": "refused", "pool": {"count": 3}}
    (journal / "journal.json").write_text(json.dumps(snapshot))
    append_pool_rows(pool_file(journal / "journal.json"), [{"token": 1}], 0)
    with pytest.raises(ConfigError, match="covers 3 purchased points but its pool file holds 1"):
        resume_market(tmp_path)

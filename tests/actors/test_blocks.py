"""Blocks of arriving records with their own budgets (Sage-style), in the owner's gate.

Parallel composition: record i belongs to block i // N only (its arrival position: public
metadata, fixed when it arrives), and a release that reads a set of blocks is charged to each
of them; so the privacy loss of any one record is the composition of the releases charged to
its block, which that block's filter keeps within the cap. A block that cannot pay is retired
and never read again; new blocks arrive with full budgets. These tests check the accounting,
and spy on the two paths that read records: the secure-sum sketch and the owner's bids.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpmarket.actors.budgets.gate import BudgetGate, OwnerBudget, OwnerGate
from dpmarket.actors.budgets.reading import read_store
from dpmarket.actors.budgets.store import LedgerStore
from dpmarket.actors.parties.dcaowner import gated_contribute
from dpmarket.protocol.privacy.filter import RenyiFilter
from dpmarket.protocol.privacy.ledger import ADD_REMOVE, MechanismEvent
from dpmarket.protocol.securesum.spec import RoundSpec
from dpmarket.protocol.summary.messages import AskBody, EpochBody
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.wire.codec import Message, decode, encode
from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.streams.race.columns import SketchColumns
from dpmarket.streams.race.lsh import make_family
from dpmarket.streams.race.sketch import RaceSketch
from tests.actors.test_dcaowner import SKETCH, _session, _set_up
from tests.small import small_curator, small_params, small_scenario

DELTA = 1e-5


def _gate(tmp_path: Path, cap: float, size: int, run: str = "run-1") -> OwnerGate:
    budget = OwnerBudget(str(tmp_path / "o.sqlite"), cap, DELTA, size)
    return OwnerGate("owner-0", BudgetGate(budget, run, block_records=size))


def _spec(rnd: int, sigma: float = 6.0) -> RoundSpec:
    return RoundSpec(rnd, 4, sigma, 1.0, "refresh", ADD_REMOVE)


def test_old_blocks_retire_new_blocks_arrive_with_full_budgets(tmp_path: Path) -> None:
    cap = RenyiFilter(100.0, DELTA).spent([MechanismEvent("gaussian", (("sigma", 6.0),), 1.0)] * 3)
    gate = _gate(tmp_path, cap * 1.001, size=10)  # each block pays for exactly 3 such rounds
    n, reads = 0, []
    for rnd in range(1, 9):
        gate.arrived(n, 5, 0.0)  # five records arrive before every round; each round reads
        n += 5  # every live block
        live = gate.secure_round(_spec(rnd), "s", n)
        assert live is not None
        reads.append(sorted({int(b) for b in (np.arange(n) // 10)[live]}))
    # block 0 (records 0-9) paid rounds 1-3 and retired at round 4; block 1 paid 3-5 and
    # retired at round 6; block 2 arrived at round 5 with a full budget ...
    assert reads[:6] == [[0], [0], [0, 1], [1], [1, 2], [2]]
    retired = read_store(tmp_path / "o.sqlite")["retired"]
    assert retired[:2] == [0, 1] and 3 not in retired
    store = gate.store
    for block in range(4):  # parallel composition: every block within the cap
        assert store.filter.spent(store.events(block)) <= store.filter.epsilon
    assert gate.view()["spent"] <= store.filter.epsilon


def test_every_block_spent_reads_nothing_and_a_replay_reads_the_same(tmp_path: Path) -> None:
    """With blocks an owner never declines (a decline would reveal its record count): with
    every block spent it reads no record, and a retired block stays retired."""
    gate = _gate(tmp_path, 0.5, size=4)
    gate.arrived(0, 8, 0.0)
    live = gate.secure_round(_spec(1, sigma=1.0), "s", 8)
    assert live is not None and not live.any() and gate.declines == []
    assert read_store(tmp_path / "o.sqlite")["retired"] == [0, 1]
    live = gate.secure_round(_spec(2, sigma=1e3), "s", 8)  # retired for good, even if cheap
    assert live is not None and not live.any()
    summary = gate.summary_gate(8)
    assert summary is not None and not summary.any()  # the owner passes: nothing to bid
    gate.arrived(8, 4, 0.0)
    live = gate.secure_round(_spec(3, sigma=1e3), "s", 12)  # a new block arrives: it is read
    assert live is not None and list(np.flatnonzero(live)) == [8, 9, 10, 11]
    again = gate.secure_round(_spec(3, sigma=1e3), "s", 12)  # the same release: no new charge
    assert again is not None and (again == live).all()
    assert len(gate.store.events(2)) == 1


def test_sketch_path_never_counts_a_retired_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records are hashed as they arrive, retired or not (streams/race/columns.py), but the
    counters a round sends are those of the live records alone: the sketch of the 15 records
    outside the retired block, none of the block's marker records."""
    config, nodes, owners = _session()
    _set_up(config, nodes, owners)
    owner = owners["owner-0"]
    records = np.random.default_rng(3).uniform(-3, 3, (20, 2))
    records[:5] = 2.5  # block 0: a marker no other record has
    gate = _gate(tmp_path, 3.0, size=5)
    gate.arrived(0, 20, 0.0)
    spent = MechanismEvent("gaussian", (("sigma", 0.2),), 1.0)
    gate.store.charge_blocks("earlier", "earlier", [spent], [0])  # block 0 cannot pay: retired
    counted = spy_counters(monkeypatch)
    spec = owner.trust.plan.spec("scan", 2)
    frames = gated_contribute(owner, gate, records, spec, "sketch", SKETCH)
    assert frames and len(counted) == 1
    np.testing.assert_array_equal(counted[0], sketch_of(records[5:]))
    assert counted[0].sum() == 15 * SKETCH["rows"]  # the block's 5 records counted nowhere
    rows = gate.store.rows("run-1")
    assert sorted(r["block"] for r in rows if r["state"] == "charged") == [1, 2, 3]


def spy_counters(monkeypatch: pytest.MonkeyPatch) -> list[np.ndarray]:
    """Every counter vector an owner's sketch contribution counts, as it is counted
    (``SketchColumns.counters``)."""
    counted: list[np.ndarray] = []
    real_counters = SketchColumns.counters

    def spy(self: SketchColumns, start: int = 0, live: np.ndarray | None = None) -> np.ndarray:
        counted.append(real_counters(self, start, live))
        return counted[-1]

    monkeypatch.setattr(SketchColumns, "counters", spy)
    return counted


def sketch_of(records: np.ndarray) -> np.ndarray:
    """The counters of a RACE sketch (SKETCH's parameters) of exactly ``records``."""
    family = make_family("l2", 2, SKETCH["rows"], SKETCH["seed"], bandwidth=SKETCH["bandwidth"])
    sketch = RaceSketch(family, SKETCH["width"], backend="numpy")
    sketch.update(records.astype(np.float32))
    return sketch.counter_vector()


def test_bid_path_never_offers_a_retired_record() -> None:
    scenario = small_scenario(2, n_points=80)
    X, y = scenario.owners[0][0][:20], scenario.owners[0][1][:20]
    owner = Owner("owner-1", "run", X, y, rng=np.random.default_rng(0))  # exploration key
    params = small_params(scenario, d=16)
    curator = small_curator("run", scenario, params, 0)
    for msg in curator.start():
        if msg.recipient == "owner-1" and msg.kind != "summary.epoch":
            owner.receive(decode(encode(msg)))
    g = np.linspace(-1, 1, 16)
    best = int(np.argmax(g.astype(np.float32) @ owner._store.HT))
    retired = np.zeros(20, dtype=bool)
    retired[(best // 5) * 5 : (best // 5) * 5 + 5] = True  # the best record's block
    owner.retire(retired)
    tokens = set()
    for epoch in range(1, 301):
        explore = epoch % 2 == 0
        msg = Message("run", epoch, "curator", "owner-1", epoch, EpochBody(g, 0, explore=explore))
        [bid] = owner.receive(msg)
        tokens.add(bid.body.token)
    assert tokens and not any(retired[t] for t in tokens)
    ask = Message("run", 301, "curator", "owner-1", 301, AskBody(best))
    with pytest.raises(RemoteProtocolError):
        owner.receive(ask)


def test_a_store_without_blocks_is_unchanged_by_them(tmp_path: Path) -> None:
    store = LedgerStore(tmp_path / "s.sqlite", "owner-0", RenyiFilter(1.0, DELTA))
    event = MechanismEvent("gaussian", (("sigma", 10.0),), 1.0)
    assert store.charge("r", "run", event).admitted
    assert store.charge_blocks("r", "run", [event], [0, 1]) == [0, 1]  # blocks: own ledgers
    assert len(store.events()) == 1 and len(store.events(0)) == len(store.events(1)) == 1


def test_a_release_reading_nothing_is_recorded_not_charged(tmp_path: Path) -> None:
    """A refresh with no new records reads no block: nothing is charged, but the store records
    the release ('unread'), so it covers the curator's (conservative) charge of it."""
    from dpmarket.actors.run.budgets import reconcile
    from dpmarket.protocol.privacy.ledger import PrivacyLedger

    gate = _gate(tmp_path, 3.0, size=10)
    gate.arrived(0, 20, 0.0)
    live = gate.secure_round(_spec(1), "s", 20, start=20)
    assert live is not None and not live.any()
    [row] = gate.store.rows("run-1")
    assert row["state"] == "unread" and gate.store.events(-2) == []
    curator = PrivacyLedger("owner-0")
    curator.gaussian(6.0, 1.0, label="scan refresh (secure sum)", neighbouring=ADD_REMOVE)
    out = reconcile({"owner-0": curator.to_dict()}, {"owner-0": gate.view()})
    assert out["errors"] == []


def test_a_release_reading_only_retired_blocks_is_recorded_not_charged(tmp_path: Path) -> None:
    """The second purchase on a store whose every block is spent: its rounds read nothing and
    are recorded 'unread', so the store covers the curator's (conservative) charges and the
    report's budgets has no error."""
    from dpmarket.actors.run.budgets import reconcile
    from dpmarket.protocol.privacy.ledger import PrivacyLedger

    gate = _gate(tmp_path, 0.5, size=10)
    gate.arrived(0, 20, 0.0)
    live = gate.secure_round(_spec(1, sigma=1.0), "s", 20)  # too dear: both blocks retire
    assert live is not None and not live.any()
    gate.store.close()
    gate = _gate(tmp_path, 0.5, size=10, run="run-2")
    gate.arrived(0, 20, 0.0)
    live = gate.secure_round(_spec(1), "s", 20)
    assert live is not None and not live.any()
    [row] = gate.store.rows("run-2")
    assert row["state"] == "unread" and row["block"] == -2
    curator = PrivacyLedger("owner-0")
    curator.gaussian(6.0, 1.0, label="scan refresh (secure sum)", neighbouring=ADD_REMOVE)
    assert reconcile({"owner-0": curator.to_dict()}, {"owner-0": gate.view()})["errors"] == []

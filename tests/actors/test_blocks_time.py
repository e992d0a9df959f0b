"""Blocks by arrival-time window ([privacy].block_seconds) in the owner's gate, with an injected
clock: records grouped by the window they arrived in, each release charged to the blocks it
reads, a block's window fixed in the owner's store across runs, and a retired block never
read by the sketch or bid paths (the spies of tests/actors/test_blocks.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpmarket.actors.budgets.gate import BudgetGate, OwnerBudget, OwnerGate
from dpmarket.actors.budgets.reading import read_store
from dpmarket.actors.config.market import ConfigError, load_market_config
from dpmarket.actors.parties.dcaowner import gated_contribute
from dpmarket.protocol.privacy.filter import RenyiFilter
from dpmarket.protocol.privacy.ledger import ADD_REMOVE, MechanismEvent
from dpmarket.protocol.securesum.spec import RoundSpec
from tests.actors.test_blocks import sketch_of, spy_counters
from tests.actors.test_dcaowner import SKETCH, _session, _set_up

DELTA = 1e-5
ROOT = Path(__file__).resolve().parents[2]


def _gate(tmp_path: Path, cap: float, window: float, run: str = "run-1") -> OwnerGate:
    budget = OwnerBudget(str(tmp_path / "o.sqlite"), cap, DELTA, 0, window)
    return OwnerGate("owner-0", BudgetGate(budget, run, block_seconds=window))


def _spec(rnd: int, sigma: float = 6.0) -> RoundSpec:
    return RoundSpec(rnd, 4, sigma, 1.0, "refresh", ADD_REMOVE)


def _charged(gate: OwnerGate, release: str) -> list[int]:
    rows = gate.store.rows()
    return sorted(
        r["block"] for r in rows if r["release"].endswith(release) and r["state"] == "charged"
    )


def test_records_are_grouped_by_window_and_charged_per_block(tmp_path: Path) -> None:
    gate = _gate(tmp_path, 5.0, window=10.0)
    gate.arrived(0, 4, at=3.0)  # window 0
    gate.arrived(4, 3, at=9.5)  # window 0
    gate.arrived(7, 5, at=14.0)  # window 1
    live = gate.secure_round(_spec(1), "s", 12)
    assert live is not None and live.all()
    assert _charged(gate, ":s:1") == [0, 1]  # one release, charged to both blocks it read
    gate.arrived(12, 6, at=47.0)  # window 4 (2 and 3 saw nothing): the store's block 2
    live = gate.secure_round(_spec(2), "s", 18, start=12)  # a delta: only the new records
    assert live is not None and list(np.flatnonzero(live)) == list(range(12, 18))
    assert _charged(gate, ":s:2") == [2]
    store = gate.store
    assert [len(store.events(b)) for b in (0, 1, 2)] == [1, 1, 1]
    assert [s.key for s in store.blocks().starts] == [0, 1, 4]  # the windows they hold
    summary = gate.summary_gate(18)  # the plan is empty here: every live block may be bid
    assert summary is not None and summary.all()


def test_a_records_window_is_fixed_in_the_store_across_runs(tmp_path: Path) -> None:
    first = _gate(tmp_path, 5.0, window=60.0)
    first.arrived(0, 10, at=0.0)
    first.arrived(10, 10, at=61.0)
    first.store.close()
    # a later run re-reads the same files an hour later: the 20 known records keep blocks 0, 1
    later = _gate(tmp_path, 5.0, window=60.0, run="run-2")
    later.arrived(0, 25, at=3600.0)
    assert later._of(25).tolist() == [0] * 10 + [1] * 10 + [2] * 5  # block 2: window 60
    later.secure_round(_spec(1), "s", 25)
    assert _charged(later, ":s:1") == [0, 1, 2]


def test_a_spent_window_retires_and_new_windows_arrive_with_full_budgets(tmp_path: Path) -> None:
    cap = RenyiFilter(100.0, DELTA).spent([MechanismEvent("gaussian", (("sigma", 6.0),), 1.0)] * 2)
    gate = _gate(tmp_path, cap * 1.001, window=1.0)  # each window pays for exactly 2 rounds
    reads, n = [], 0
    for rnd in range(1, 6):
        gate.arrived(n, 3, at=float(rnd))  # three records per second, one round per second
        n += 3
        live = gate.secure_round(_spec(rnd), "s", n)
        assert live is not None
        reads.append(sorted({int(b) for b in gate._of(n)[live]}))
    # window 1 (block 0) pays rounds 1 and 2 and is retired at round 3; window 2 (block 1) pays
    # rounds 2 and 3 ...
    assert reads == [[0], [0, 1], [1, 2], [2, 3], [3, 4]]
    assert read_store(tmp_path / "o.sqlite")["retired"] == [0, 1, 2]
    for block in range(5):  # parallel composition: every window within the cap
        assert gate.store.filter.spent(gate.store.events(block)) <= gate.store.filter.epsilon


def test_sketch_and_bid_paths_never_count_a_retired_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sketch a round sends counts the 14 records of the live window alone (all 20 were
    hashed when they arrived); the party bids none of the retired window's records."""
    config, nodes, owners = _session()
    _set_up(config, nodes, owners)
    owner = owners["owner-0"]
    records = np.random.default_rng(3).uniform(-3, 3, (20, 2))
    records[:6] = 2.5  # the first window's records: a marker no other record has
    gate = _gate(tmp_path, 3.0, window=30.0)
    gate.arrived(0, 6, at=10.0)  # window 0
    gate.arrived(6, 14, at=40.0)  # window 1
    spent = MechanismEvent("gaussian", (("sigma", 0.2),), 1.0)
    gate.store.charge_blocks("earlier", "earlier", [spent], [0])  # window 0 cannot pay: retired
    counted = spy_counters(monkeypatch)
    frames = gated_contribute(
        owner, gate, records, owner.trust.plan.spec("scan", 2), "sketch", SKETCH
    )
    assert frames and len(counted) == 1
    np.testing.assert_array_equal(counted[0], sketch_of(records[6:]))
    assert counted[0].sum() == 14 * SKETCH["rows"]  # the first window's 6 counted nowhere
    assert _charged(gate, "") == [1]
    live = gate.summary_gate(20)  # what the owner actor lets the party bid (Owner.retire(~live))
    assert live is not None and not live[:6].any() and live[6:].all()


def _demo(tmp_path: Path, privacy: str) -> Path:
    text = (ROOT / "configs" / "demo.toml").read_text()
    path = tmp_path / "m.toml"
    path.write_text(text.replace("[privacy]\n", "[privacy]\n" + privacy + "\n"))
    return path


def test_block_seconds_in_a_config(tmp_path: Path) -> None:
    base = 'ledger_dir = "s"\nowner_budget = 2'
    budgets = load_market_config(_demo(tmp_path, base + "\nblock_seconds = 30")).budgets
    assert budgets["owner-1"].block_seconds == 30.0 and budgets["owner-1"].block_records == 0
    both = base + "\nblock_seconds = 30\nblock_records = 100"
    with pytest.raises(ConfigError, match=r"block_seconds: .*not both"):
        load_market_config(_demo(tmp_path, both))
    with pytest.raises(ConfigError, match=r"\[privacy\].block_seconds: expected a finite"):
        load_market_config(_demo(tmp_path, base + "\nblock_seconds = -1"))
    with pytest.raises(ConfigError, match=r"block_seconds: blocks need owners' stores"):
        load_market_config(_demo(tmp_path, "block_seconds = 30"))

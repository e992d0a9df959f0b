"""``dpmarket budget DIR``: table, ``--json`` shape, plot, and refusals (no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpmarket.actors.budgets.store import LedgerStore
from dpmarket.actors.commands.main import main
from dpmarket.protocol.privacy.filter import RenyiFilter
from dpmarket.protocol.privacy.ledger import MechanismEvent


def _stores(tmp_path: Path) -> Path:
    directory = tmp_path / "stores"
    for owner, cap, runs in (("owner-1", 2.0, 3), ("owner-2", 0.2, 1)):
        store = LedgerStore(directory / f"{owner}.sqlite", owner, RenyiFilter(cap, 1e-5))
        for run in range(runs):
            store.begin_run(f"r{run}")
            event = MechanismEvent("gaussian", (("sigma", 10.0),), 1.0, label="scan (secure sum)")
            store.charge(f"r{run}:s:1", f"r{run}", event)
        store.close()
    return directory


def test_budget_json_table_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = _stores(tmp_path)
    assert main(["budget", str(directory), "--json"]) == 0
    owners = json.loads(capsys.readouterr().out)["owners"]
    one, two = owners["owner-1"], owners["owner-2"]
    assert {"spent", "cap", "delta", "runs"} <= set(one)
    assert (one["cap"], one["delta"], one["runs"], one["declined"]) == (2.0, 1e-5, 3, 0)
    expected = RenyiFilter(2.0, 1e-5).spent(
        [MechanismEvent("gaussian", (("sigma", 10.0),), 1.0, count=3)]
    )
    assert one["spent"] == pytest.approx(expected)
    assert one["mechanisms"] == {"scan (secure sum)": 3}
    assert (two["runs"], two["declined"], two["spent"]) == (1, 1, 0.0)  # its one charge declined
    plot = tmp_path / "budget.png"
    assert main(["budget", str(directory), "--plot", str(plot)]) == 0
    table = capsys.readouterr().out
    assert "owner-1" in table and "3 x scan (secure sum)" in table
    assert plot.stat().st_size > 0


def test_budget_refuses_a_missing_or_empty_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["budget", str(tmp_path / "none")]) == 2
    assert "no such ledger directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["budget", str(tmp_path / "empty")]) == 2
    assert "no ledger stores" in capsys.readouterr().err


def test_budget_shows_blocks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = LedgerStore(tmp_path / "owner-3.sqlite", "owner-3", RenyiFilter(1.0, 1e-5))
    store.begin_run("r0")
    cheap = MechanismEvent("gaussian", (("sigma", 20.0),), 1.0, label="refresh")
    dear = MechanismEvent("gaussian", (("sigma", 2.0),), 1.0, label="refresh")
    assert store.charge_blocks("a", "r0", [cheap], [0, 1]) == [0, 1]
    assert store.charge_blocks("b", "r0", [dear], [1]) == []  # block 1 cannot pay: retired
    store.close()
    assert main(["budget", str(tmp_path / "owner-3.sqlite"), "--json"]) == 0
    entry = json.loads(capsys.readouterr().out)["owners"]["owner-3"]
    one = RenyiFilter(1.0, 1e-5).spent([cheap])
    assert entry["blocks"]["0"] == {"spent": one, "left": 1.0 - one, "retired": False}
    assert entry["blocks"]["1"]["retired"] and entry["spent"] == one
    assert entry["mechanisms"] == {"refresh": 1} and entry["declined"] == 1
    assert main(["budget", str(tmp_path / "owner-3.sqlite")]) == 0
    assert "block    1: spent" in capsys.readouterr().out

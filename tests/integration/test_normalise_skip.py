"""A normalise round the plan predicts will be discarded is not run, and nobody pays for it
(issue 40): owners' stores, the curator's ledgers and report.json, with and without the skip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpmarket.actors.budgets.reading import read_store
from dpmarket.actors.commands.main import main

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

ROOT = Path(__file__).resolve().parents[2]
# 400 records against normalise noise sigma ~ 212: the DP count cannot clear 3 sigma
SMALL = [
    "--set", "market.summary_size=8", "--set", "data.n_points=400", "--set", "data.n_test=200",
    "--set", "run.deadline_seconds=2.0",
]  # fmt: skip
NORMALISE = "normalise (secure sum)"


def _charges(store: Path) -> dict[str, int]:
    labels: dict[str, int] = {}
    for row in read_store(store)["rows"]:
        if row["state"] == "charged":
            labels[row["label"]] = labels.get(row["label"], 0) + 1
    return labels


def test_owners_pay_nothing_for_a_skipped_normalise_round(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (ROOT / "configs" / "demo.toml").read_text(encoding="utf-8")
    config = tmp_path / "market.toml"
    config.write_text(text.replace("[privacy]\n", "[privacy]\nowner_budget = 10.0\n"))
    reports, charges = {}, {}
    for name, extra in (("skip", []), ("always", ["--set", 'privacy.normalise_round="always"'])):
        out = tmp_path / name
        sets = [*SMALL, *extra, "--set", f'privacy.ledger_dir="{tmp_path / name / "stores"}"']
        assert main(["run", str(config), "--out", str(out), *sets]) == 0
        reports[name] = json.loads((out / "report.json").read_text(encoding="utf-8"))
        charges[name] = _charges(out / "stores" / "owner-1.sqlite")
    assert "normalise round skipped, each owner saves eps 0.5" in capsys.readouterr().out
    skipped, spent = reports["skip"]["secure_phases"], reports["always"]["secure_phases"]
    assert skipped["normalise"]["status"] == "skipped"
    assert "no normalise round" in skipped["standardize"]["reason"]
    assert spent["normalise"]["status"] == "released"
    assert NORMALISE not in charges["skip"] and charges["always"][NORMALISE] == 1
    assert charges["skip"]["scan (secure sum)"] == charges["always"]["scan (secure sum)"] == 1
    for owner in ("owner-1", "owner-2", "owner-3", "owner-4"):  # the curator's view agrees
        eps = {n: r["privacy"]["parties"][owner]["pld"] for n, r in reports.items()}
        assert eps["skip"] < eps["always"] - 0.1, (owner, eps)
        stores = {n: r["budgets"]["owners"][owner] for n, r in reports.items()}
        assert stores["skip"]["status"] == stores["always"]["status"] == "ok"
        assert stores["skip"]["run_charged"] < stores["always"]["run_charged"]

"""Owners' persistent budgets without Ray: config keys, the owner's gate, the end-of-run
comparison with the curator's view."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpmarket.actors.budgets.gate import (
    ROUND_LABELS,
    BudgetDeclined,
    BudgetGate,
    OwnerBudget,
    OwnerGate,
)
from dpmarket.actors.budgets.reading import read_store
from dpmarket.actors.config.market import ConfigError, load_market_config
from dpmarket.actors.parties.refresh import REFRESH_LABEL
from dpmarket.actors.parties.securephase_journal import LABELS
from dpmarket.actors.run.budgets import reconcile
from dpmarket.protocol.privacy.ledger import ADD_REMOVE, MechanismEvent, PrivacyLedger
from dpmarket.protocol.securesum.spec import RoundSpec

ROOT = Path(__file__).resolve().parents[2]
DEMO = (ROOT / "configs" / "demo.toml").read_text()


def _config(tmp_path: Path, privacy: str = "", owners: str = "") -> Path:
    text = DEMO.replace("[privacy]\n", "[privacy]\n" + privacy + "\n") + "\n" + owners
    path = tmp_path / "market.toml"
    path.write_text(text)
    return path


def test_config_budgets_default_and_per_owner(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        'ledger_dir = "stores"\nowner_budget = 2.5',
        "[owners.owner-2]\nbudget = {epsilon = 1.0, delta = 1e-6}\n"
        '[owners.owner-3]\nledger = "/elsewhere/o3.sqlite"\n',
    )
    budgets = load_market_config(path).budgets
    assert budgets["owner-1"] == OwnerBudget(str(tmp_path / "stores" / "owner-1.sqlite"), 2.5, 1e-5)
    assert budgets["owner-2"] == OwnerBudget(str(tmp_path / "stores" / "owner-2.sqlite"), 1.0, 1e-6)
    assert budgets["owner-3"] == OwnerBudget("/elsewhere/o3.sqlite", 2.5, 1e-5)
    assert set(budgets) == {"owner-1", "owner-2", "owner-3", "owner-4"}
    public = load_market_config(path).public_record()["budgets"]  # report.json's run record
    assert public["owner-2"] == {
        "epsilon": 1.0,
        "delta": 1e-6,
        "block_records": 0,
        "block_seconds": 0.0,
    }
    assert "elsewhere" not in str(public)  # caps are public, stores' paths are not
    assert load_market_config(_config(tmp_path)).budgets == {}


def test_allocate_select_is_refused_with_blocks(tmp_path: Path) -> None:
    privacy = 'ledger_dir = "s"\nowner_budget = 2\nblock_records = 50'
    path = _config(tmp_path, privacy)
    assert load_market_config(path).budgets["owner-1"].block_records == 50
    path.write_text(path.read_text().replace("[summary]\n", "[summary]\nallocate = true\n"))
    with pytest.raises(ConfigError, match=r"\[summary\].allocate: .*block_records"):
        load_market_config(path)
    # a budget on points selects allocate-select too, so it is refused the same way ...
    budget = path.read_text().replace("allocate = true\n", "max_points = 60\n")
    path.write_text(budget)
    with pytest.raises(ConfigError, match=r"\[summary\].allocate: .*max_points.*block_records"):
        load_market_config(path)
    # ... unless the config keeps herding-select under that budget
    path.write_text(budget.replace("max_points = 60\n", "max_points = 60\nallocate = false\n"))
    config = load_market_config(path)
    params = config.curator_params(gamma=0.5, m=200)
    assert not params.allocate and params.max_points == 60


def test_an_owner_table_holds_its_budget_and_its_placement(tmp_path: Path) -> None:
    """[owners.NAME] is read by two parsers (budget_config, placement): each accepts the
    other's keys, and a key neither knows is refused naming both sets."""
    owners = "[owners.owner-2]\nbudget = {epsilon = 1.0, delta = 1e-6}\nresources = {site_b = 1}\n"
    config = load_market_config(_config(tmp_path, 'ledger_dir = "s"\nowner_budget = 2', owners))
    assert config.budgets["owner-2"].epsilon == 1.0
    assert dict(config.placement["owner-2"].resources) == {"site_b": 1.0}
    bad = owners + "colour = 'red'\n"
    with pytest.raises(ConfigError, match=r"unknown keys \['colour'\].*'budget'.*'resources'"):
        load_market_config(_config(tmp_path, 'ledger_dir = "s"\nowner_budget = 2', bad))


@pytest.mark.parametrize(
    "privacy,owners,message",
    [
        ("owner_budget = 2.0", "", r"\[owners.owner-1\]: a budget needs a store"),
        ('ledger_dir = "s"', "", r"\[owners.owner-1\]: a store needs a cap"),
        ('ledger_dir = "s"\nowner_budget = -1', "", r"\[privacy\].owner_budget"),
        ('ledger_dir = "s"\nowner_budget = 1', "[owners.owner-9]\nledger = 'x'", "owner-9"),
        ('ledger_dir = "s"\nowner_budget = 1', "[owners.owner-1]\nbudget = 3", "budget"),
        (
            'ledger_dir = "s"\nowner_budget = 1',
            "[owners.owner-1]\nbudget = {epsilon = 1, delta = 2}",
            r"\[owners.owner-1\].budget.delta",
        ),
        ('ledger_dir = "s"\nowner_budget = 1', "[owners.owner-1]\nstore = 'x'", "unknown keys"),
        (
            'ledger_dir = "s"\nowner_budget = 1',
            "[owners.owner-1]\nledger = 's/owner-2.sqlite'",
            "share one ledger",
        ),
    ],
)
def test_bad_budget_keys_are_named(tmp_path: Path, privacy: str, owners: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_market_config(_config(tmp_path, privacy, owners))


def test_round_labels_are_the_curators() -> None:
    assert ROUND_LABELS == LABELS | {"refresh": REFRESH_LABEL}


def _gate(tmp_path: Path, cap: float, run: str = "run-1") -> OwnerGate:
    summary = (MechanismEvent("auction", (("eps_auc", 1e-6),), count=30, variant="pure"),)
    return OwnerGate(
        "owner-1", BudgetGate(OwnerBudget(str(tmp_path / "o1.sqlite"), cap, 1e-5), run, summary)
    )


def _spec(rnd: int, sigma: float = 8.0, label: str = "normalise") -> RoundSpec:
    return RoundSpec(rnd, 4, sigma, 1.0, label, ADD_REMOVE)


def test_gate_charges_once_per_round_and_declines_beyond_the_cap(tmp_path: Path) -> None:
    gate = _gate(tmp_path, cap=1.0)
    gate.secure_round(_spec(1), "sess")
    gate.secure_round(_spec(1), "sess")  # the same release again (a retry): charged once
    assert len(gate.store.events()) == 1
    with pytest.raises(BudgetDeclined, match="no noise"):
        gate.secure_round(_spec(2, sigma=0.0), "sess")
    declined = 0
    for rnd in range(3, 40):
        try:
            gate.secure_round(_spec(rnd, label="scan"), "sess")
        except BudgetDeclined:
            declined += 1
    assert declined > 0 and gate.view()["spent"] <= 1.0
    first = gate.summary_admitted()  # 30 steps at 1e-6 may still fit: decided once
    assert gate.summary_admitted() is first
    rows = read_store(tmp_path / "o1.sqlite")["rows"]
    assert sum(r["release"] == "run-1:summary" for r in rows) == 1


def test_summary_phase_is_charged_once_across_a_resume(tmp_path: Path) -> None:
    assert _gate(tmp_path, cap=5.0).summary_admitted()
    again = _gate(tmp_path, cap=5.0)  # the resumed run: same ledger id
    assert again.summary_admitted()
    [row] = read_store(tmp_path / "o1.sqlite")["rows"]
    assert row["events"][0]["count"] == 30
    other = _gate(tmp_path, cap=5.0, run="run-2")  # a new purchase pays again
    assert other.summary_admitted() and len(other.store.events()) == 2
    assert len(read_store(tmp_path / "o1.sqlite")["runs"]) == 2


def test_reconcile_ok_and_mismatch(tmp_path: Path) -> None:
    gate = _gate(tmp_path, cap=5.0)
    gate.secure_round(_spec(1), "sess")
    gate.secure_round(_spec(2, label="scan"), "sess")
    assert gate.summary_admitted()
    curator = PrivacyLedger("owner-1")
    curator.gaussian(8.0, 1.0, label="normalise (secure sum)", neighbouring=ADD_REMOVE)
    curator.gaussian(8.0, 1.0, label="scan (secure sum)", neighbouring=ADD_REMOVE)
    curator.auction(1e-6, "pure", count=12, label="auction step")  # fewer epochs than planned
    out = reconcile({"owner-1": curator.to_dict()}, {"owner-1": gate.view(), "owner-2": None})
    assert out["errors"] == [] and out["owners"]["owner-1"]["status"] == "ok"
    assert set(out["owners"]) == {"owner-1"}
    # the curator released a refresh the owner never charged: a mismatch, by label and epsilon
    curator.gaussian(8.0, 1.0, label="scan refresh (secure sum)", neighbouring=ADD_REMOVE)
    out = reconcile({"owner-1": curator.to_dict()}, {"owner-1": gate.view()})
    assert out["owners"]["owner-1"]["status"] == "mismatch"
    assert any("scan refresh" in e for e in out["errors"])
    assert any("the store covers" in e for e in out["errors"])
    lost = reconcile({}, {"owner-1": {"unreachable": "gone"}})
    assert lost["owners"]["owner-1"]["status"] == "unreachable" and lost["errors"]


def test_a_declined_round_that_released_is_covered(tmp_path: Path) -> None:
    """Within T a round releases without a declining owner; the curator charges every owner
    (conservatively), and the store's recorded decline covers it: not a mismatch."""
    gate = _gate(tmp_path, cap=0.2)
    with pytest.raises(BudgetDeclined):
        gate.secure_round(_spec(1, sigma=2.0), "sess")
    curator = PrivacyLedger("owner-1")
    curator.gaussian(2.0, 1.0, label="normalise (secure sum)", neighbouring=ADD_REMOVE)
    out = reconcile({"owner-1": curator.to_dict()}, {"owner-1": gate.view()})
    assert out["errors"] == [] and out["owners"]["owner-1"]["declined"] == 1
    assert out["owners"]["owner-1"]["run_charged"] == 0.0


def test_an_existing_store_of_another_owner_is_refused_at_load(tmp_path: Path) -> None:
    from dpmarket.actors.budgets.store import LedgerStore
    from dpmarket.protocol.privacy.filter import RenyiFilter

    (tmp_path / "stores").mkdir()
    LedgerStore(tmp_path / "stores" / "owner-1.sqlite", "owner-3", RenyiFilter(1.0, 1e-5)).close()
    (tmp_path / "stores" / "owner-2.sqlite").write_bytes(b"garbage" * 200)
    path = _config(tmp_path, 'ledger_dir = "stores"\nowner_budget = 1.0')
    with pytest.raises(ConfigError, match=r"\[owners.owner-1\]: .* of 'owner-3', not 'owner-1'"):
        load_market_config(path)
    (tmp_path / "stores" / "owner-1.sqlite").unlink()
    with pytest.raises(ConfigError, match=r"\[owners.owner-2\]: .*not a ledger store"):
        load_market_config(path)


def test_consumer_budget_config(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        'ledger_dir = "stores"\nowner_budget = 2.0',
        "[consumer]\nbudget = {epsilon = 8.0, delta = 1e-6}\n",
    )
    config = load_market_config(path)
    assert config.consumer_budget == OwnerBudget(
        str(tmp_path / "stores" / "consumer.sqlite"), 8.0, 1e-6
    )
    assert len(config.budgets) == 4
    alone = _config(
        tmp_path, "", '[consumer]\nledger = "c.sqlite"\nbudget = {epsilon = 8.0, delta = 1e-6}'
    )
    assert load_market_config(alone).budgets == {}
    for privacy, consumer, message in (
        ("", "[consumer]\nbudget = {epsilon = 8.0, delta = 1e-6}", r"\[consumer\]: a budget needs"),
        ("", "[consumer]\nledger = 'c.sqlite'", r"\[consumer\].budget"),
        ("", "[consumer]\nledger = 'c'\nbudget = {epsilon = 0, delta = 1e-6}", "epsilon"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_market_config(_config(tmp_path, privacy, consumer))


def test_consumer_pays_each_purchase_once_and_is_refused_beyond_its_cap(tmp_path: Path) -> None:
    from dpmarket.actors.run.budgets import budget_report, consumer_refusal
    from dpmarket.protocol.summary.snr import planned_validation_ledger

    path = _config(
        tmp_path,
        "",
        '[consumer]\nledger = "stores/consumer.sqlite"\nbudget = {epsilon = 5.0, delta = 1e-5}',
    )
    config = load_market_config(path)
    params = config.curator_params(gamma=1.0, m=200)  # eps 3 by PLD, 4.14 by the filter
    assert consumer_refusal(config, params, "run-1") is None
    assert consumer_refusal(config, params, "run-1") is None  # a resume: nothing charged again
    refused = consumer_refusal(config, params, "run-2")
    assert refused is not None and refused["state"] == "refused"
    assert "consumer's budget" in refused["reason"]
    rows = read_store(tmp_path / "stores" / "consumer.sqlite")["rows"]
    assert [r["state"] for r in rows] == ["charged", "declined"]
    # the end-of-run comparison: the curator's validation ledger against the consumer's store
    curator = planned_validation_ledger(params)
    report = budget_report(config, "run-1", {}, [], {"validation": curator.to_dict()})
    assert report is not None and report["errors"] == []
    assert report["owners"]["consumer"]["status"] == "ok"
    relation = curator.relations()[0]  # the run's, as every event of the party
    curator.gaussian(1.0, 1.0, label="an extra release of D_v", neighbouring=relation)
    report = budget_report(config, "run-1", {}, [], {"validation": curator.to_dict()})
    assert report is not None and report["owners"]["consumer"]["status"] == "mismatch"


def test_the_default_charges_a_consumer_budget_nothing(tmp_path: Path) -> None:
    """random-select (a market without [summary], issue 30) makes no validation release: the
    consumer's store records the purchase with no row, any number of purchases is admitted,
    and the end-of-run comparison finds the store equal to the (empty) validation ledger."""
    from dpmarket.actors.run.budgets import budget_report, consumer_refusal
    from dpmarket.protocol.summary.snr import planned_validation_ledger

    text = DEMO[: DEMO.index("[summary]")]
    text += '[consumer]\nledger = "stores/consumer.sqlite"\n'
    text += "budget = {epsilon = 0.5, delta = 1e-5}\n"
    path = tmp_path / "market.toml"
    path.write_text(text)
    config = load_market_config(path)
    params = config.curator_params(gamma=1.0, m=200)
    assert params.mechanism == "random-select"
    for run in ("run-1", "run-2", "run-3"):  # a cap of 0.5 would refuse one herding purchase
        assert consumer_refusal(config, params, run) is None
    store = read_store(tmp_path / "stores" / "consumer.sqlite")
    assert store["rows"] == [] and {r["run"] for r in store["runs"]} == {"run-1", "run-2", "run-3"}
    empty = planned_validation_ledger(params).to_dict()
    report = budget_report(config, "run-1", {}, [], {"validation": empty})
    assert report is not None and report["errors"] == []
    assert report["owners"]["consumer"]["status"] == "ok"

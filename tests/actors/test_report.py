"""What leaves the curator (actors/run/report.py): a public report.json that may be handed to
owners,
and the consumer's report.private.json with everything computed from the validation set."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dpmarket.actors.budgets.gate import BudgetGate, OwnerBudget, OwnerGate
from dpmarket.actors.commands.market import print_report as _print_report
from dpmarket.actors.parties.curator import result_payload
from dpmarket.actors.parties.securephase_journal import (
    coverage_of as _coverage,
)
from dpmarket.actors.parties.securephase_journal import (
    moments_summary as _moments_summary,
)
from dpmarket.actors.parties.securephase_journal import (
    pool_release as _pool_release,
)
from dpmarket.actors.parties.securephase_journal import (
    scan_summary as _scan_summary,
)
from dpmarket.actors.parties.transport import FaultPlan, LoopbackTransport
from dpmarket.actors.run import report as report_module
from dpmarket.actors.run.budgets import reconcile
from dpmarket.actors.run.report import (
    CONSUMER_FIELDS,
    CONSUMER_REPORT,
    PUBLIC_FIELDS,
    PUBLIC_REPORT,
    Reports,
    consumer_report,
    privacy_section,
    public_report,
    split_secure_phases,
    write_outputs,
)
from dpmarket.protocol.privacy.filter import RenyiFilter
from dpmarket.protocol.privacy.ledger import REPLACE_ONE_RECORD
from dpmarket.protocol.securesum.spec import RoundResult
from dpmarket.protocol.summary.curator import Curator, CuratorParams
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.summary.snr import planned_owner_ledger
from dpmarket.protocol.wire.codec import Message
from dpmarket.streams.race.lsh import make_family
from dpmarket.streams.race.sketch import RaceSketch
from dpmarket.streams.synthetic import Scenario
from tests.small import small_params, small_scenario

RUN = "report-run"
SKETCH = {"family": "l2", "rows": 20, "width": 32, "seed": 3, "bandwidth": 2.0}
# the fields the issue names as derived from D_v or from owners' exact values
PRIVATE_KEYS = {"value", "utility", "owners", "selection"}


def _round(number: int, value: np.ndarray[Any, Any]) -> RoundResult:
    return RoundResult(number, "released", "", value, None, ("owner-1",), (), 0.5, 1.0)


def _secure_phases(scenario: Scenario, validation: np.ndarray[Any, Any]) -> dict[str, Any]:
    """Normalise, scan and one refresh from fixed noisy sums of the owners' records: the same
    releases for any validation set; only the coverage scores read ``validation``."""
    pool = np.vstack([X for X, _ in scenario.owners])
    k = pool.shape[1]
    noise = np.random.default_rng(11)
    moments = np.concatenate([pool.sum(0), (pool**2).sum(0), [len(pool)]])
    moments = moments + noise.normal(0, 0.5, 2 * k + 1)
    normalise = _moments_summary(_round(1, moments), k)
    family = make_family("l2", k, SKETCH["rows"], SKETCH["seed"], bandwidth=SKETCH["bandwidth"])
    sketch = RaceSketch(family, SKETCH["width"])
    sketch.update(pool.astype(np.float32))
    counters = sketch.counter_vector() + noise.normal(0, 0.5, sketch.counter_vector().shape)
    scan_round = _round(2, counters)
    release = _pool_release(scan_round, SKETCH, k, REPLACE_ONE_RECORD)
    refresh = {"epoch": 5, "round": 3, "status": "released", "records_estimate": 900.0,
               "coverage": _coverage(release, validation, 900.0), "releases": 2, "sigma": 0.5,
               "missing": []}  # fmt: skip
    return {
        "nodes": ["compute-1", "compute-2"],
        "normalise": normalise,
        "scan": _scan_summary(scan_round, release, validation, normalise),
        "refreshes": [refresh],
        "standardize": {"applied": False, "reason": "disabled"},
    }


def _owners(scenario: Scenario) -> list[Owner]:
    """The scenario's owners, each with its secret generator (fixed seeds: a test)."""
    pairs = zip(scenario.owner_names, scenario.owners, strict=True)
    return [Owner(n, RUN, X, y, rng=np.random.default_rng([3, i])) for i, (n, (X, y)) in
            enumerate(pairs)]  # fmt: skip


def _payload(
    scenario: Scenario,
    validation: np.ndarray[Any, Any],
    params: CuratorParams,
    gated: dict[str, Any] | None = None,
    releases: Scenario | None = None,
) -> dict[str, Any]:
    """An in-process run (LoopbackTransport) as the curator actor would hand it to the driver.
    ``gated``: ``parties`` to run instead of plain owners and their ``gates`` (budgets);
    ``releases``: the scenario whose records the secure phases' fixed releases are built from."""
    owners = _owners(scenario)
    curator = Curator(RUN, list(scenario.owner_names), validation, scenario.seed_set, params,
                      np.random.default_rng(6))  # fmt: skip
    transport = LoopbackTransport([curator, *(gated or {}).get("parties", owners)],
                                  faults=FaultPlan())  # fmt: skip
    transport.send(curator.start())
    transport.run_until(lambda: curator.done)
    assert not transport.errors and curator.state == "done"
    stats = SimpleNamespace(frames_sent=transport.frames_sent, bytes_sent=transport.bytes_sent,
                            calls=0, errors=[], dead=set(), refused={},
                            expelled=set())  # fmt: skip
    payload = result_payload(curator.result(), curator, stats)  # type: ignore[arg-type]
    payload["secure_phases"] = _secure_phases(releases or scenario, validation)
    payload["fault_verdicts"] = []
    parties = [getattr(o, "party", o) for o in (gated or {}).get("parties", owners)]
    payload["owners"] = {
        o.name: {"records": o.n_records, "asks": o.asks, "epochs_seen": o.epochs_seen}
        for o in parties
    }
    if gated is not None:  # as actors/run/budgets.py's budget_report builds it from the actors
        views = {name: gate.view() for name, gate in gated["gates"].items()}
        payload["budgets"] = reconcile(payload["ledgers"], views)
    return payload


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, Reports]]:
    """One release g_tilde held fixed, two validation sets: both runs' outputs."""
    from dpmarket.protocol.summary import curator as curator_module

    scenario = small_scenario(5, n_points=900, dim=4, n_validation=40)

    def fixed_release(H: object, params: CuratorParams, ledger: object, rng: object) -> object:
        ledger.gaussian(  # type: ignore[attr-defined]
            1.0, 1.0, label="gaussian(validation mean)", neighbouring=REPLACE_ONE_RECORD
        )
        return np.full(params.d, 0.1)

    params = small_params(scenario, p=8, tau=2, final_selection="exact", explore_share=1.0)
    run = {"name": RUN, "validation_size": 40, "gamma": scenario.gamma}
    timings = {"start": 1.0, "ingest_and_summarise": 2.0, "utility": 3.0}
    runs = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(curator_module, "release_validation", fixed_release)
        for i, validation in enumerate((scenario.validation, scenario.test_X[:40])):
            payload = _payload(scenario, validation, params)
            utility = {"private": {"mmd2": 0.01 * (i + 1), "svm_accuracy": 0.9}}
            out = tmp_path_factory.mktemp(f"run{i}")
            runs.append((out, write_outputs(out, run, payload, 1e-5, (), timings, utility)))
    return runs


def test_public_report_does_not_depend_on_the_validation_set(
    two_runs: list[tuple[Path, Reports]],
) -> None:
    """Same release, different D_v: report.json is byte-identical, the consumer's is not."""
    (out_a, a), (out_b, b) = two_runs
    assert (out_a / PUBLIC_REPORT).read_bytes() == (out_b / PUBLIC_REPORT).read_bytes()
    assert a.public == b.public
    assert a.consumer["secure_phases"] != b.consumer["secure_phases"]  # coverage reads D_v
    assert a.consumer["value"] != b.consumer["value"]  # exact gains against D_v
    assert (out_a / "summary.csv").read_bytes() != (out_b / "summary.csv").read_bytes()
    assert (out_a / CONSUMER_REPORT).read_bytes() != (out_b / CONSUMER_REPORT).read_bytes()


def test_every_key_of_each_report_is_placed_and_private_keys_stay_out_of_the_public_one(
    two_runs: list[tuple[Path, Reports]],
) -> None:
    for out, reports in two_runs:
        public = json.loads((out / PUBLIC_REPORT).read_text())
        consumer = json.loads((out / CONSUMER_REPORT).read_text())
        assert public == json.loads(json.dumps(reports.public))
        assert set(public) == set(PUBLIC_FIELDS)
        assert set(consumer) == set(CONSUMER_FIELDS)
        assert not PRIVATE_KEYS & set(public)
        secure = public["secure_phases"]
        assert "coverage" not in secure["scan"] and secure["scan"]["status"] == "released"
        assert all("coverage" not in r for r in secure["refreshes"])
        assert secure["normalise"]["mean"] and secure["normalise"]["count"] > 0  # a DP release
        assert set(public["timings"]) == {"start", "ingest_and_summarise"}
        withheld = consumer["secure_phases"]
        assert withheld["scan"]["coverage"] > 0 and withheld["refreshes"][0]["round"] == 3
        assert consumer["timings"] == {"utility": 3.0}
        assert sum(consumer["selection"]["kept_by_owner"].values()) == 8


def test_a_field_without_a_documented_side_is_refused(
    two_runs: list[tuple[Path, Reports]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, reports = two_runs[0]
    monkeypatch.delitem(report_module.PUBLIC_FIELDS, "outcome")
    payload = {"provenance": [], "state": "done", "reason": "", "epochs": 1,
               "distinct_points": 0, "total_transfers": 0, "lost": {}, "dropped": [],
               "late_frames": 0, "rejected": [], "transport": {}, "value": {}}  # fmt: skip
    with pytest.raises(ValueError, match=r"fields \['outcome'\] have no documented side"):
        public_report({}, payload, reports.public["privacy"], (), {})
    monkeypatch.delitem(report_module.CONSUMER_FIELDS, "owners")
    with pytest.raises(ValueError, match=r"fields \['owners'\] have no documented side"):
        consumer_report(payload, {}, None)


def test_secure_phase_keys_outside_the_allow_list_go_to_the_consumer() -> None:
    secure = {
        "scan": {"status": "released", "coverage": 0.3, "by_class": [0.1]},
        "refreshes": [{"epoch": 5, "round": 3, "sigma": 1.0, "coverage": 0.2}, {"epoch": 10}],
        "new_round": {"count": 4},
        "standardize": {"applied": False},
    }
    public, withheld = split_secure_phases(secure)
    assert public == {
        "scan": {"status": "released"},
        "refreshes": [{"epoch": 5, "round": 3, "sigma": 1.0}, {"epoch": 10}],
        "standardize": {"applied": False},
    }
    assert withheld == {
        "scan": {"coverage": 0.3, "by_class": [0.1]},
        "refreshes": [{"epoch": 5, "round": 3, "coverage": 0.2}],
        "new_round": {"count": 4},
    }


def test_the_module_docstring_names_every_field_under_its_report() -> None:
    doc = report_module.__doc__ or ""
    public_part = doc[doc.index("Public ``report.json``") : doc.index("Consumer's ``report")]
    consumer_part = doc[doc.index("Consumer's ``report") : doc.index("Aggregate counts.")]
    for key in PUBLIC_FIELDS:
        assert f"- ``{key}``" in public_part, key
    for key in CONSUMER_FIELDS:
        assert f"- ``{key}``" in consumer_part, key


def test_cli_prints_the_public_report_and_the_consumers_utility(
    two_runs: list[tuple[Path, Reports]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, reports = two_runs[0]
    _print_report(reports.public, reports.consumer)
    out = capsys.readouterr().out
    epochs = reports.public["outcome"]["epochs"]
    assert reports.public["parsimony"]["mechanism"] == "mwem-select"  # small_params' release
    assert f"state done after {epochs} epochs (mwem-select)" in out
    assert "summary 8 points" in out
    assert "owner-1" in out and "validation" in out
    assert "utility private  MMD^2 0.01000  LinearSVC 0.900" in out
    _print_report(reports.public)  # the public report alone prints without the utility
    assert "utility" not in capsys.readouterr().out


# ------------------------------------------------------------------ counts (issue 24)
class _GatedOwner:
    """An owner party behind its budget gate, as the owner actor runs it (actors/parties/owner.py):
    before every frame the gate charges the summary plan to blocks that have not paid it and
    the records of blocks that cannot pay are retired (never bid)."""

    def __init__(self, party: Owner, gate: OwnerGate) -> None:
        self.party, self.gate, self.name = party, gate, party.name

    def receive(self, msg: Message) -> list[Message]:
        live = self.gate.summary_gate(self.party.n_records)
        if live is None:
            return []
        self.party.retire(~live)
        return self.party.receive(msg)

    def expire(self, now: float) -> list[Message]:
        return self.party.expire(now)


@pytest.fixture(scope="module")
def two_sizes(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, Reports, list[int]]]:
    """owner-1 holds 51 records (blocks 0-5 of 10) or 63 (blocks 0-6), everything else equal.
    An earlier purchase spent blocks 5 and up (those that held records then), so they retire
    at the summary plan: records 0-49 bid in both runs, the releases are the same, and the
    gate's view differs (6 or 7 blocks, retired [5] or [5, 6], one decline per retired block
    before issue 24)."""
    scenario = small_scenario(5, n_points=900, dim=4, n_validation=40)
    params = small_params(scenario, p=8, tau=2, final_selection="exact", explore_share=1.0,
                          auction_variant="pure")  # fmt: skip
    plan = planned_owner_ledger(params).events
    cap = RenyiFilter(1.0, 1e-5).spent([*plan, *plan]) * (1 + 1e-6)  # two plans, not three
    run = {"name": RUN, "validation_size": 40, "gamma": scenario.gamma}
    timings = {"start": 1.0, "ingest_and_summarise": 2.0}
    X, y = scenario.owners[0]
    runs = []
    for n in (51, 63):
        sized = dataclasses.replace(scenario, owners=[(X[:n], y[:n]), *scenario.owners[1:]])
        out = tmp_path_factory.mktemp(f"n{n}")
        budget = OwnerBudget(str(out / "owner-1.sqlite"), cap, 1e-5, 10)
        gate = OwnerGate("owner-1", BudgetGate(budget, "this", tuple(plan), block_records=10))
        gate.arrived(0, n, 0.0)  # the owner actor gives arriving records their blocks
        spent = list(range(5, (n - 1) // 10 + 1))  # the blocks holding records 50 and up
        assert gate.store.charge_blocks("earlier", "earlier", [*plan, *plan], spent) == spent
        owners = _owners(sized)
        parties = [_GatedOwner(owners[0], gate), *owners[1:]]
        gated = {"parties": parties, "gates": {"owner-1": gate}}
        payload = _payload(sized, scenario.validation, params, gated, releases=scenario)
        reports = write_outputs(out, run, payload, 1e-5, (), timings, None)
        runs.append((out, reports, gate.view()["retired"]))
    return runs


def test_public_report_does_not_depend_on_an_owners_record_count(
    two_sizes: list[tuple[Path, Reports, list[int]]],
) -> None:
    """Issue 24: the same releases, owner-1 with 51 or 63 records (6 or 7 blocks of 10, one or
    two of them retired): report.json is byte-identical; the counts are the consumer's."""
    (out_a, a, retired_a), (out_b, b, retired_b) = two_sizes
    assert (retired_a, retired_b) == ([5], [5, 6])  # the gates did differ
    assert (out_a / PUBLIC_REPORT).read_bytes() == (out_b / PUBLIC_REPORT).read_bytes()
    assert a.public["budgets"]["owners"]["owner-1"] == {
        "status": "ok", "cap": a.public["budgets"]["owners"]["owner-1"]["cap"], "delta": 1e-5,
        "curator": a.public["budgets"]["owners"]["owner-1"]["curator"], "blocks": True,
    }  # fmt: skip
    assert a.public["budgets"]["errors"] == []
    assert [r["owners"]["owner-1"]["records"] for r in (a.consumer, b.consumer)] == [51, 63]
    assert [r["budgets"]["owners"]["owner-1"]["retired"] for r in (a.consumer, b.consumer)] == [
        [5], [5, 6]
    ]  # fmt: skip
    assert a.consumer["parsimony"]["distinct_points"] > 8  # exploration bought more than p


def test_the_public_report_states_the_runs_one_relation_once(
    two_runs: list[tuple[Path, Reports]],
) -> None:
    for _, reports in two_runs:
        privacy = reports.public["privacy"]
        assert privacy["neighbouring"] == REPLACE_ONE_RECORD  # every party's events share it
        assert "neighbouring" not in reports.public["run"]  # stated once, under privacy
    ledgers = {
        "owner-1": {"party": "owner-1", "events": [{"mechanism": "auction",
                    "parameters": {"eps_auc": 0.1}, "variant": "pure"}]},
        "validation": {"party": "validation", "events": [{"mechanism": "gaussian",
                       "parameters": {"sigma": 1.0}, "neighbouring": REPLACE_ONE_RECORD}]},
    }  # fmt: skip
    with pytest.raises(ValueError, match="mix relations"):
        privacy_section(ledgers, 1e-5, ())


def test_privacy_section_accounts_equal_ledgers_once_and_each_as_alone() -> None:
    """issue 29: K owners with the same events are accounted once (a PLD per owner cost
    ~0.3 s, minutes at K = 1024); every entry equals the one its ledger gets alone."""
    from dpmarket.protocol.privacy.epsilons import party_epsilons
    from dpmarket.protocol.privacy.ledger import PrivacyLedger

    def ledger(party: str, steps: int) -> dict[str, Any]:
        book = PrivacyLedger(party)
        book.gaussian(3.0, label="normalise (secure sum)", neighbouring=REPLACE_ONE_RECORD)
        book.auction(0.05, "pure", count=steps, label="auction step",
                     neighbouring=REPLACE_ONE_RECORD)  # fmt: skip
        return book.to_dict()

    ledgers = {f"owner-{i}": ledger(f"owner-{i}", 40) for i in range(1, 6)}
    ledgers["owner-6"] = ledger("owner-6", 7)  # lost at epoch 7: fewer auction steps
    section = privacy_section(ledgers, 1e-5, ("owner-5",))
    for party, raw in ledgers.items():
        alone = PrivacyLedger.from_dict(raw)
        entry = section["parties"][party]
        assert {k: entry[k] for k in ("pld", "theorem7", "paper")} == {
            k: party_epsilons(alone, 1e-5)[k] for k in ("pld", "theorem7", "paper")
        }
        assert entry["events"] == raw
        assert ("against_colluders" in entry) == (party != "owner-5")
    parties = section["parties"]
    assert parties["owner-6"]["pld"] < parties["owner-1"]["pld"]
    assert parties["owner-1"]["against_colluders"] == parties["owner-1"]["pld"]  # one colluder

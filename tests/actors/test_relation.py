"""One neighbouring relation per run (issue 24): every owner release, in every ledger.

A whole market in one process, as a deployed run charges it: the operator's round plan
(``prepare_secure``), the normalise and scan secure sums through the real client, node and
aggregator parties (``DcaSession``, as actors/studies/trial.py), each owner's persistent store
charged by its gate before it contributes (``OwnerGate``, as ``gated_contribute``) and for the
summary plan before its first answer, then the summary on a LoopbackTransport; for
allocate-select (``max_points`` set) and for herding-select. Every event of every party, in the
curator's ledgers and in the owners' stores, must carry one relation: the run's. Before issue
24 the secure sums were charged under add/remove, the histogram and the summary releases under
replace-one and the auction under a relation of its own, and this test fails on the first
of them (the ledger refuses a second relation).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpmarket.actors.budgets.gate import OwnerGate, session_id
from dpmarket.actors.budgets.reading import read_store
from dpmarket.actors.config.market import ConfigError, load_market_config
from dpmarket.actors.config.scenarios import make_market_scenario
from dpmarket.actors.parties.dca import record_for_owners
from dpmarket.actors.parties.dcaowner import contribution
from dpmarket.actors.parties.securephase_journal import LABELS
from dpmarket.actors.parties.transport import LoopbackTransport
from dpmarket.actors.run.budgets import owner_gates, reconcile
from dpmarket.actors.run.phases import prepare_secure
from dpmarket.actors.run.spawn import OwnerInputs
from dpmarket.protocol.privacy.ledger import REPLACE_ONE_RECORD, MechanismEvent, PrivacyLedger
from dpmarket.protocol.securesum.driver import DcaSession
from dpmarket.protocol.summary.curator import Curator
from dpmarket.protocol.summary.owner import Owner

ROOT = Path(__file__).resolve().parents[2]
SMALL = {
    "summary_size = 40\n": "summary_size = 12\n",
    "n_points = 4000\n": "n_points = 1500\n",
    "n_test = 1000\n": "n_test = 200\n",
    "[privacy]\n": '[privacy]\nledger_dir = "stores"\nowner_budget = 50.0\n',
}
MODES = {
    "allocate-select": "max_points = 30\n",
    "herding-select": "",  # the demo's plan: herding, every bidder asked, exact selection
}


def _config(tmp_path: Path, summary: str) -> Path:
    text = (ROOT / "configs" / "demo.toml").read_text()
    for old, new in SMALL.items():
        assert old in text
        text = text.replace(old, new, 1)
    text = text.replace("[summary]\n", "[summary]\n" + summary, 1)
    path = tmp_path / "market.toml"
    path.write_text(text)
    return path


def _run_market(path: Path) -> tuple[Curator, dict[str, OwnerGate], str]:
    config = load_market_config(path)
    scenario = make_market_scenario(config)
    params = config.curator_params(scenario.gamma, len(scenario.validation))
    run = "run-1"
    gates = {o: OwnerGate(o, g) for o, g in (owner_gates(config, params, run) or {}).items()}
    rng = np.random.default_rng(3)
    owners = {
        n: Owner(n, run, X, y, rng=np.random.default_rng(i), profile_floor=params.profile_floor)
        for i, (n, (X, y)) in enumerate(zip(scenario.owner_names, scenario.owners, strict=True))
    }
    curator = Curator(run, list(owners), scenario.validation, scenario.seed_set, params, rng)
    data = {n: X for n, (X, _) in zip(scenario.owner_names, scenario.owners, strict=True)}
    prep = prepare_secure(config, OwnerInputs.of(scenario), scenario.gamma, params, None)
    assert prep is not None
    rounds, session = (
        prep.plan["rounds"],
        DcaSession(prep.config, batch=1, plan=prep.plan["rounds"]),
    )
    name = session_id(prep.trust.pins)
    for number, (label, what) in enumerate((("normalise", "moments"), ("scan", "sketch")), 1):
        spec = rounds.spec(label, number)
        options = rounds.options(label)
        rows = []
        for o in prep.config.clients:
            gates[o].secure_round(spec, name)  # the owner pays before its frames leave
            rows.append(contribution(data[o], spec, what, options, o, {}))
        result = session.run_round(spec, np.stack(rows), rng, timeout=5.0).result
        assert result.status == "released"
        record_for_owners(curator.ledgers, result, LABELS[label], spec.neighbouring)
    for gate in gates.values():
        assert gate.summary_admitted()  # the summary plan, charged before the first answer
    transport = LoopbackTransport([curator, *owners.values()])
    transport.send(curator.start())
    transport.run_until(lambda: curator.done)
    assert curator.state == "done", curator.reason
    return curator, gates, run


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_owner_release_of_a_run_is_charged_under_one_relation(
    tmp_path: Path, mode: str
) -> None:
    curator, gates, _ = _run_market(_config(tmp_path, MODES[mode]))
    labels: set[str] = set()
    for party, ledger in curator.ledgers.items():
        assert ledger.relations() == (REPLACE_ONE_RECORD,), party
        labels |= {e.label for e in ledger.events}
    assert {"normalise (secure sum)", "scan (secure sum)"} <= labels
    if mode == "allocate-select":
        assert curator.params.allocate and any("histogram" in label for label in labels)
    else:
        assert not curator.params.allocate and "auction step" in labels
    views = {}
    for owner, gate in gates.items():
        rows = read_store(Path(gate.gate.budget.ledger))["rows"]
        events = [MechanismEvent.from_dict(e) for r in rows for e in r["events"]]
        assert {e.neighbouring for e in events} == {REPLACE_ONE_RECORD}, owner
        assert PrivacyLedger(owner, events).relations() == (REPLACE_ONE_RECORD,)
        views[owner] = gate.view()
    ledgers = {p: ledger.to_dict() for p, ledger in curator.ledgers.items()}
    report = reconcile(ledgers, views)  # and each store covers the curator's view
    assert report["errors"] == [], report["errors"]


def test_the_plan_and_the_ledger_use_the_replace_one_sensitivities(tmp_path: Path) -> None:
    """Every planned round states the run's relation, at its replace-one sensitivity, and
    calibrates sigma to the configured per-round epsilon at that sensitivity."""
    from dpmarket.protocol.privacy.dgauss import analytic_sigma
    from dpmarket.protocol.securesum.fixedpoint import grid_sensitivity
    from dpmarket.protocol.summary.snr import moments_sensitivity

    config = load_market_config(_config(tmp_path, MODES["allocate-select"]))
    scenario = make_market_scenario(config)
    params = config.curator_params(scenario.gamma, len(scenario.validation))
    prep = prepare_secure(config, OwnerInputs.of(scenario), scenario.gamma, params, None)
    assert prep is not None
    rounds, k = prep.plan["rounds"].rounds, scenario.validation.shape[1]
    rows, bound, f = int(config.secure["rows"]), float(config.data["bound"]), prep.config.frac_bits
    expected = {
        "normalise": (moments_sensitivity(k, bound, neighbouring="replace"), "eps_normalise"),
        "scan": (math.sqrt(2 * rows), "eps_scan"),
    }
    for label, (sens, key) in expected.items():
        planned = rounds[label]
        assert planned.neighbouring == REPLACE_ONE_RECORD
        assert planned.sensitivity == pytest.approx(sens)
        eps, delta = float(config.secure[key]), config.delta
        grid = grid_sensitivity(sens, planned.d, f)
        assert planned.sigma_floor == pytest.approx(analytic_sigma(eps, delta, grid), rel=1e-9)
        # the epsilon each round charges is the configured one (more noise, same epsilon)
        ledger = PrivacyLedger("owner")
        ledger.gaussian(planned.sigma_floor, grid, neighbouring=planned.neighbouring)
        assert ledger.epsilon(delta) == pytest.approx(eps, rel=2e-3)


@pytest.mark.parametrize(
    ("summary", "needle"),
    [
        ("neighbouring = 'add_remove'\nmax_points = 60\n", "allocate-select"),
        ("neighbouring = 'add_remove'\nallocate = true\nmax_points = 60\n", "allocate-select"),
        ("neighbouring = 'add_remove'\n", "exploration"),  # the demo's plan explores
    ],
)
def test_add_remove_is_refused_where_an_exact_count_reaches_the_curator(
    tmp_path: Path, summary: str, needle: str
) -> None:
    path = _config(tmp_path, summary)
    with pytest.raises(ConfigError, match=rf"\[summary\]\.neighbouring.*{needle}"):
        config = load_market_config(path)
        config.curator_params(1.0, 200)


def test_add_remove_without_exact_counts_charges_every_round_under_add_remove(
    tmp_path: Path,
) -> None:
    """The paper's relation stays selectable where no exact count is sent: then the secure
    sums follow it (sqrt(R) for the sketch), like the summary releases."""
    from dpmarket.protocol.privacy.ledger import ADD_REMOVE

    summary = "neighbouring = 'add_remove'\nexplore_share = 0.0\nfinal_selection = 'none'\n"
    config = load_market_config(_config(tmp_path, summary))
    scenario = make_market_scenario(config)
    params = config.curator_params(scenario.gamma, len(scenario.validation))
    prep = prepare_secure(config, OwnerInputs.of(scenario), scenario.gamma, params, None)
    assert prep is not None
    planned: Any = prep.plan["rounds"].rounds
    assert {p.neighbouring for p in planned.values()} == {ADD_REMOVE}
    assert planned["scan"].sensitivity == pytest.approx(math.sqrt(int(config.secure["rows"])))


def test_a_scan_round_releases_noise_at_the_replace_one_scale(tmp_path: Path) -> None:
    """Statistical: the scan round of a replace-one run, run through the real parties at the
    plan's floor, adds total noise of variance N sigma^2 / (N - T - 1) (Theorem 1) with sigma
    calibrated at sensitivity sqrt(2 R). d = R W = 12800 independent coordinates: the variance
    ratio has standard error sqrt(2 / d) = 1.25%, the window is 5 of them, and the add/remove
    calibration (sqrt(R): half the variance) or a sigma off by two falls far outside it."""
    from dpmarket.protocol.privacy.dgauss import analytic_sigma
    from dpmarket.protocol.securesum.fixedpoint import grid_sensitivity

    config = load_market_config(_config(tmp_path, MODES["herding-select"]))
    scenario = make_market_scenario(config)
    params = config.curator_params(scenario.gamma, len(scenario.validation))
    prep = prepare_secure(config, OwnerInputs.of(scenario), scenario.gamma, params, None)
    assert prep is not None
    rounds = prep.plan["rounds"]
    spec = rounds.spec("scan", 2)
    n, t = len(prep.config.clients), prep.config.tolerance
    rows, f = int(config.secure["rows"]), prep.config.frac_bits
    sigma = analytic_sigma(float(config.secure["eps_scan"]), config.delta,
                           grid_sensitivity(math.sqrt(2 * rows), spec.d, f))  # fmt: skip
    assert spec.sigma_std == pytest.approx(sigma, rel=1e-9)
    session = DcaSession(prep.config, batch=1, plan=rounds)
    session.run_round(rounds.spec("normalise", 1), np.zeros((n, rounds.rounds["normalise"].d)),
                      np.random.default_rng(0))  # fmt: skip
    values = np.zeros((n, spec.d))
    result = session.run_round(spec, values, np.random.default_rng(7)).result
    assert result.value is not None and spec.d == 12800
    ratio = float(np.mean(result.value**2)) / (n * sigma**2 / (n - t - 1))
    se = math.sqrt(2.0 / spec.d)
    assert abs(ratio - 1.0) < 5 * se
    add_remove = analytic_sigma(float(config.secure["eps_scan"]), config.delta,
                                grid_sensitivity(math.sqrt(rows), spec.d, f))  # fmt: skip
    assert (sigma / add_remove) ** 2 > 1.0 + 20 * se  # the old scale is excluded

"""Issue 36, item 4: what report.json shows of one owner's record count, mechanism by mechanism.

Each case runs a market's own parameters (configs/demo.toml's plan through
``MarketConfig.curator_params``) in-process twice, one owner's record count changed and
everything else fixed: the curator's and the owners' seeds, the secure sums' releases, every
owner's DP histogram (allocate-select). report.json is byte-identical, or the fields that
changed are exactly those actors/run/report.py ``COUNT_REVEALING_FIELDS`` lists for the
mechanism, which the guide's table (docs/guide/remote.md) names and an owner's
``count_exposure`` (protocol/summary/counts.py) declines."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dpmarket.actors.config.market import load_market_config
from dpmarket.actors.parties.curator import result_payload
from dpmarket.actors.parties.dca import record_for_owners
from dpmarket.actors.parties.refresh import REFRESH_LABEL, PoolRefresher
from dpmarket.actors.parties.transport import FaultPlan, LoopbackTransport
from dpmarket.actors.run.report import (
    COUNT_REVEALING_FIELDS,
    EPOCH_FIELDS,
    PUBLIC_REPORT,
    write_outputs,
)
from dpmarket.protocol.privacy.ledger import REPLACE_ONE_RECORD
from dpmarket.protocol.securesum.spec import RoundResult
from dpmarket.protocol.summary import owner as owner_module
from dpmarket.protocol.summary.allocate_rank import SCORE_EDGES
from dpmarket.protocol.summary.counts import (
    COUNT_REVEALING_MECHANISMS,
    count_exposure,
    mechanism_of,
)
from dpmarket.protocol.summary.curator import Curator, CuratorParams
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.summary.params import MARKET_MECHANISMS
from dpmarket.streams.synthetic import Scenario
from tests.actors.test_report import RUN, _secure_phases
from tests.small import small_scenario

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo.toml"
GUIDE = ROOT / "docs" / "guide" / "remote.md"
SECTION = "## What other parties learn about an owner's record count"
P = 8
# one refresh round every epoch (the refresher's own schedule), so that every change of the
# epochs shows in the refreshes and their charges
REFRESH_EVERY = 1
REFRESH = RoundResult(3, "released", "", np.zeros(1), None, ("owner-1",), (), 0.5, 1.0)
# every owner's DP score histogram held fixed (the same release whatever its records)
HISTOGRAM = np.array([60.0, 50.0, 40.0, 30.0, 20.0, 10.0, 5.0])
assert len(HISTOGRAM) == len(SCORE_EDGES) + 1

HERDING = '[summary]\nmechanism = "herding-select"\n'
# (case, [summary] of the market config, owner-1's two counts, the fields that change)
CASES = [
    ("herding-select", HERDING, (60, 200), COUNT_REVEALING_FIELDS["herding-select"]),
    ("herding-select, max_points", HERDING + "max_points = 24\n", (60, 200), frozenset()),
    ("herding-select, max_points, records run out", HERDING + "max_points = 24\n", (3, 60),
     EPOCH_FIELDS),
    ("allocate-select", '[summary]\nmechanism = "allocate-select"\n', (60, 200),
     COUNT_REVEALING_FIELDS["allocate-select"]),
    ("allocate-select, random_share = 0",
     '[summary]\nmechanism = "allocate-select"\nrandom_share = 0\n', (4, 200),
     COUNT_REVEALING_FIELDS["allocate-select"]),
    ("random-select (the default)", "", (60, 200), COUNT_REVEALING_FIELDS["random-select"]),
]  # fmt: skip


def _market_params(tmp_path: Path, summary: str, scenario: Scenario) -> CuratorParams:
    """The curator's parameters a market config with this ``[summary]`` gives (p = 8)."""
    text = DEMO.read_text(encoding="utf-8")
    path = tmp_path / "market.toml"
    path.write_text(text[: text.index("[summary]")] + summary, encoding="utf-8")
    config = load_market_config(path, [f"market.summary_size={P}"])
    return config.curator_params(scenario.gamma, len(scenario.validation))


def _refreshes(curator: Curator) -> list[dict[str, Any]]:
    """The refresh rounds the curator actor's refresher opens over this run's epochs
    (actors/parties/refresh.py ``due``), each released and charged to every owner as
    ``record_for_owners`` charges it; the same release every time."""
    plan = {"refresh_every": REFRESH_EVERY}
    refresher = PoolRefresher(None, plan, None, REFRESH, lambda r: r, lambda r, n: 0.0)  # type: ignore[arg-type]
    rounds = []
    for epoch in range(1, curator.epoch.number + 1):
        if refresher.due(epoch):
            record_for_owners(curator.ledgers, REFRESH, REFRESH_LABEL, REPLACE_ONE_RECORD)
            rounds.append({"epoch": epoch, "round": 2 + len(rounds) + 1, "status": "released",
                           "records_estimate": 900.0, "releases": 1 + len(rounds),
                           "sigma": REFRESH.sigma_std, "missing": []})  # fmt: skip
    return rounds


def _public_report(scenario: Scenario, params: CuratorParams, out: Path, fixed: Scenario) -> bytes:
    """One in-process run (LoopbackTransport) of ``scenario``'s owners; its report.json. The
    secure phases' releases are built from ``fixed``'s records (the same in both runs)."""
    pairs = zip(scenario.owner_names, scenario.owners, strict=True)
    owners = [Owner(n, RUN, X, y, rng=np.random.default_rng([3, i]),
                    profile_floor=params.profile_floor)
              for i, (n, (X, y)) in enumerate(pairs)]  # fmt: skip
    curator = Curator(RUN, list(scenario.owner_names), scenario.validation, scenario.seed_set,
                      params, np.random.default_rng(6))  # fmt: skip
    transport = LoopbackTransport([curator, *owners], faults=FaultPlan())
    transport.send(curator.start())
    transport.run_until(lambda: curator.done)
    assert not transport.errors and curator.state == "done"
    refreshes = _refreshes(curator)
    stats = SimpleNamespace(frames_sent=transport.frames_sent, bytes_sent=transport.bytes_sent,
                            calls=0, errors=[], dead=set(), refused={},
                            expelled=set())  # fmt: skip
    payload = result_payload(curator.result(), curator, stats)  # type: ignore[arg-type]
    payload["secure_phases"] = _secure_phases(fixed, fixed.validation) | {"refreshes": refreshes}
    payload["fault_verdicts"] = []
    payload["owners"] = {o.name: {"records": o.n_records, "asks": o.asks} for o in owners}
    run = {"name": RUN, "validation_size": len(scenario.validation), "gamma": scenario.gamma}
    write_outputs(out, run, payload, 1e-5, (), {"start": 1.0, "summarise": 2.0}, None)
    return (out / PUBLIC_REPORT).read_bytes()


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out |= _leaves(item, f"{path}.{key}" if path else str(key))
        return out
    return {path: value}


def changed_fields(a: bytes, b: bytes) -> set[str]:
    """The report.json fields (``key.key``) whose values differ between two reports."""
    left, right = _leaves(json.loads(a)), _leaves(json.loads(b))
    paths = {p for p in left.keys() | right.keys() if left.get(p) != right.get(p)}
    return {".".join(p.split(".")[:2]) for p in paths}


@pytest.fixture
def fixed_histograms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every owner's DP histogram the same release, whatever its records (allocate-select's
    only owner release): what changes then follows from the count alone."""
    monkeypatch.setattr(owner_module, "owner_histogram", lambda *args: HISTOGRAM.copy())


@pytest.mark.parametrize(("case", "summary", "counts", "fields"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.usefixtures("fixed_histograms")
def test_one_owners_count_changes_exactly_the_fields_its_mechanism_reveals(
    tmp_path: Path, case: str, summary: str, counts: tuple[int, int], fields: frozenset[str]
) -> None:
    scenario = small_scenario(5, n_points=900, dim=4, n_validation=40)
    params = _market_params(tmp_path, summary, scenario)
    mechanism = mechanism_of(params)
    assert case.startswith(mechanism) and mechanism in MARKET_MECHANISMS
    X, y = scenario.owners[0]
    reports = []
    for n in counts:
        sized = dataclasses.replace(scenario, owners=[(X[:n], y[:n]), *scenario.owners[1:]])
        reports.append(_public_report(sized, params, tmp_path / f"n{n}", scenario))
    changed = changed_fields(*reports)
    assert changed == fields, case
    assert (reports[0] == reports[1]) == (not fields)
    # an owner's policy (protocol/summary/counts.py) declines exactly where its count shows
    exposure = count_exposure(params, len(scenario.owners), min(counts))
    assert bool(exposure) == bool(fields) and (not fields or exposure.startswith(mechanism))
    assert (mechanism in COUNT_REVEALING_MECHANISMS) == bool(COUNT_REVEALING_FIELDS[mechanism])


def _guide_table() -> dict[str, dict[str, str]]:
    """The guide's table (docs/guide/remote.md), by the mechanism named in its first cell."""
    text = GUIDE.read_text(encoding="utf-8")
    section = text[text.index(SECTION) :].split("\n## ")[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        rows[re.findall(r"`([^`]+)`", cells[header[0]])[0]] = cells
    return rows


def test_the_guides_table_names_the_fields_and_the_declines_the_code_has() -> None:
    rows = _guide_table()
    assert set(rows) == set(MARKET_MECHANISMS) == set(COUNT_REVEALING_FIELDS)
    for mechanism, cells in rows.items():
        named = {f for f in re.findall(r"`([^`]+)`", cells["report.json"]) if "." in f}
        assert named == COUNT_REVEALING_FIELDS[mechanism], mechanism
        declined = cells["declined with `hide_count`"].lower()
        assert declined.startswith("yes" if mechanism in COUNT_REVEALING_MECHANISMS else "no")
    section = GUIDE.read_text(encoding="utf-8").split(SECTION)[1].split("\n## ")[0]
    exception = section[section.index("Under herding-select") :].split("\n\n")[0]
    assert set(re.findall(r"`(\w+\.\w+)`", exception)) == EPOCH_FIELDS

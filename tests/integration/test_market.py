"""`dpmarket run / simulate / resume / validate` end to end on a local Ray instance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpmarket.actors.commands.main import main
from dpmarket.actors.parties.curator import read_pool_rows
from dpmarket.protocol.privacy.ledger import REPLACE_ONE_RECORD

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "--set",
    "market.summary_size=12",
    "--set",
    "data.n_points=1500",
    "--set",
    "data.n_test=300",
    "--set",
    "summary.validation_iterations=300",
    "--set",
    "summary.seed_iterations=300",
    "--set",
    "run.deadline_seconds=2.0",
]


def _run(tmp_path: Path, name: str, *extra: str) -> tuple[int, Path]:
    out = tmp_path / name
    code = main(["run", str(ROOT / "configs" / "demo.toml"), "--out", str(out), *SMALL, *extra])
    return code, out


def test_run_writes_summary_report_and_plots(tmp_path: Path) -> None:
    stale = tmp_path / "ok" / ".journal"  # an earlier, refused run left its journal in OUT
    stale.mkdir(parents=True)
    (stale / "journal.json").write_text(json.dumps({"state": "refused", "pool": {"count": 1}}))
    (stale / "journal.pool.jsonl").write_text(json.dumps({"owner": "stale", "token": 0}) + "\n")
    code, out = _run(tmp_path, "ok")
    assert code == 0
    rows = read_pool_rows(stale / "journal.pool.jsonl")  # this run's purchases only
    assert rows and all(r["owner"] != "stale" for r in rows)
    report = json.loads((out / "report.json").read_text())  # public: may go to the owners
    consumer = json.loads((out / "report.private.json").read_text())
    assert report["schema"] == consumer["schema"] == 2 and report["outcome"]["state"] == "done"
    assert not {"value", "utility", "owners", "selection"} & set(report)
    assert report["parsimony"]["summary_size"] == 12 and report["parsimony"]["allocation"] is None
    assert set(report["privacy"]["parties"]) == {
        "owner-1",
        "owner-2",
        "owner-3",
        "owner-4",
        "validation",
    }
    assert {"private", "greedy", "uniform"} <= set(consumer["utility"])
    assert sum(consumer["selection"]["kept_by_owner"].values()) == 12
    assert set(consumer["value"]) == {"owner-1", "owner-2", "owner-3", "owner-4"}
    files = ("summary.csv", "summary.npz", "mmd_by_epoch.png", "privacy.png", "report.private.json")
    for name in files:
        assert (out / name).stat().st_size > 0
    assert len((out / "summary.csv").read_text().splitlines()) == 13
    secure = report["secure_phases"]
    normalise, scan = secure["normalise"], secure["scan"]
    assert normalise["status"] == scan["status"] == "released" and secure["shares"] == "derived"
    assert abs(normalise["count"] - 1500) < 6 * normalise["sigma"]  # DP count of the pool
    assert "coverage" not in scan  # reads D_v: the consumer's
    assert 0 < consumer["secure_phases"]["scan"]["coverage"] < 1
    events = report["privacy"]["parties"]["owner-2"]["events"]["events"]
    labels = {e["label"]: e["mechanism"] for e in events}
    assert labels["normalise (secure sum)"] == labels["scan (secure sum)"] == "gaussian"
    # one relation for the run, stated once (issue 24): the secure sums', the summary's, ...
    assert report["privacy"]["neighbouring"] == REPLACE_ONE_RECORD
    assert {e["neighbouring"] for e in events} == {REPLACE_ONE_RECORD}
    assert "neighbouring" not in report["run"]
    # h1 hashed the features standardised by the normalise round's DP means and spreads
    standard = secure["standardize"]
    assert standard["applied"] and standard["center"] == normalise["mean"]
    assert all(s >= 3e-3 for s in standard["scale"]) and standard["gamma"] > 0
    # per feature: its DP spread, or the public scale when that spread is within its noise
    assert len(standard["features"]) == len(standard["scale"]) == len(normalise["std"])
    assert set(standard["features"]) <= {"dp", "public", "seed floor"}
    assert main(["run", str(ROOT / "configs" / "demo.toml"), "--out", str(out)]) == 2


def test_up_to_t_owners_lost_is_tolerated(tmp_path: Path) -> None:
    code, out = _run(tmp_path, "t1", "--set", "faults.kill={owner-2 = 3}")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["faults"]["lost"] == {"owner-2": 3}
    [verdict] = report["faults"]["verdicts"]
    assert verdict["party"] == "owner-2" and verdict["verdict"] == "tolerated"
    assert verdict["t_used"] == "1 of T = 1"


def test_above_t_refuses_leaves_nothing_partial_and_resumes(tmp_path: Path) -> None:
    code, out = _run(tmp_path, "t2", "--set", "faults.kill={owner-2 = 3, owner-3 = 3}")
    assert code == 3
    # nothing partial: the journal and the stopped run's report (exit 3)
    assert sorted(p.name for p in out.iterdir()) == [".journal", "report.json"]
    assert json.loads((out / "report.json").read_text())["outcome"]["state"] == "refused"
    snapshot = json.loads((out / ".journal" / "journal.json").read_text())
    assert snapshot["state"] == "refused"
    assert main(["resume", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["outcome"]["state"] == "done" and report["parsimony"]["summary_size"] == 12
    # every release charged exactly once across the resume: one validation release, one
    # auction step per epoch but the exploration epochs (ceil(12 / 4), no auction)
    events = report["privacy"]["parties"]["owner-1"]["events"]["events"]
    steps = sum(e["count"] for e in events if e["label"] == "auction step")
    assert report["outcome"]["exploration_epochs"] == 3
    assert steps == report["outcome"]["epochs"] - 3
    assert report["parsimony"]["final_selection"] == "exact"
    accessed = json.loads((out / "report.private.json").read_text())["parsimony"]  # issue 24
    assert "purchased_pool" not in report["parsimony"]
    assert accessed["purchased_pool"] == accessed["distinct_points"]
    rows = read_pool_rows(out / ".journal" / "journal.pool.jsonl")  # each point journaled once
    assert len(rows) == accessed["purchased_pool"]
    assert len({(r["owner"], r["token"]) for r in rows}) == len(rows)
    events = report["privacy"]["parties"]["validation"]["events"]["events"]
    assert [(e["label"], e["count"]) for e in events] == [("gaussian(validation mean)", 1)]


def test_dead_compute_node_stops_the_purchase_before_any_release(tmp_path: Path) -> None:
    """A compute node missing when the secure sums must start (issue 38): exit 3 naming it,
    before any round opens; nobody charged; report.json says so (never "complete" without the
    secure phases)."""
    code, out = _run(tmp_path, "node", "--set", "faults.kill_compute=['compute-2']")
    assert code == 3
    report = json.loads((out / "report.json").read_text())
    assert report["outcome"]["state"] == "refused" and "compute-2" in report["outcome"]["reason"]
    assert report["outcome"]["phase"] == "secure sum: set-up"
    assert not report["outcome"]["resumable"] and not report["outcome"]["released_before"]
    assert {c["pld"] for c in report["charged"].values()} == {0.0}  # nothing released


def test_colluders_withhold_noise_and_the_sums_still_release(tmp_path: Path) -> None:
    """Also runs the sealed-seed shares (the issue's literal design) through the Ray market."""
    code, out = _run(
        tmp_path, "collude", "--set", "faults.colluders=['owner-4']", "--set", "market.tolerance=2",
        "--set", "market.dca_shares='sealed-seeds'",
    )  # fmt: skip
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["secure_phases"]["scan"]["status"] == "released"
    assert report["secure_phases"]["shares"] == "sealed-seeds"
    assert "against_colluders" in report["privacy"]["parties"]["owner-1"]
    [verdict] = report["faults"]["verdicts"]
    assert verdict["fault"] == "colluding owner" and verdict["party"] == "owner-4"


def test_curator_crash_is_resumed_from_the_journal(tmp_path: Path) -> None:
    code, out = _run(tmp_path, "crash", "--set", "faults.kill_curator_at=4")
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["parsimony"]["summary_size"] == 12
    events = report["privacy"]["parties"]["validation"]["events"]["events"]
    assert [(e["label"], e["count"]) for e in events] == [("gaussian(validation mean)", 1)]
    [verdict] = report["faults"]["verdicts"]
    assert verdict["verdict"] == "tolerated" and "resumed 1 time" in verdict["detail"]


def test_validate_and_bad_configs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(ROOT / "configs" / "demo.toml")]) == 0
    bad = tmp_path / "bad.toml"
    bad.write_text("[market]\nowners = 3\ntolerance = 3\n")
    assert main(["validate", str(bad)]) == 2
    assert "tolerance" in capsys.readouterr().err
    bad.write_text("[faults]\nkill = {owner-9 = 2}\n")
    assert main(["run", str(bad)]) == 2
    assert "unknown owners ['owner-9']" in capsys.readouterr().err


COLLUSION_SMALL = [
    "--set", "data.n_points=1500", "--set", "data.n_test=300", "--set", "market.summary_size=12",
    "--set", "summary.max_epochs=30", "--set", "run.deadline_seconds=2.0",
]  # fmt: skip


def test_colluders_above_t_refuse_before_any_secure_sum_is_charged(tmp_path: Path) -> None:
    """configs/collusion.toml with T = 1 < its two colluders: exit 3 before the normalise round
    releases (no secure-sum, validation or auction event in the journaled ledgers)."""
    out = tmp_path / "over"
    code = main(
        ["run", str(ROOT / "configs" / "collusion.toml"), "--out", str(out), *COLLUSION_SMALL,
         "--set", "market.tolerance=1"]
    )  # fmt: skip
    assert code == 3
    # nothing partial: the journal and the stopped run's report (exit 3)
    assert sorted(p.name for p in out.iterdir()) == [".journal", "report.json"]
    assert json.loads((out / "report.json").read_text())["outcome"]["state"] == "refused"
    snapshot = json.loads((out / ".journal" / "journal.json").read_text())
    assert snapshot["state"] == "refused" and snapshot["epoch"]["number"] == 0
    assert snapshot["refusal"]["phase"] == "secure sum: normalise"
    assert "owner-4, owner-6" in snapshot["reason"]
    for party, ledger in snapshot["ledgers"].items():
        assert ledger["events"] == [], party  # nothing released, nothing charged
    assert main(["resume", str(out)]) == 2  # nothing to resume: run again


def test_collusion_config_within_t_completes(tmp_path: Path) -> None:
    out = tmp_path / "within"
    code = main(
        ["run", str(ROOT / "configs" / "collusion.toml"), "--out", str(out), *COLLUSION_SMALL]
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    secure = report["secure_phases"]
    assert secure["normalise"]["status"] == secure["scan"]["status"] == "released"
    assert report["faults"]["lost"] == {"owner-1": 8}


def test_a_budget_buys_by_allocate_select_on_actors_and_a_curator_crash_keeps_it(
    tmp_path: Path,
) -> None:
    """Issue 18 on real actors: ``[summary].max_points`` alone selects allocate-select. The
    curator crashes mid-run and is resumed from its journal; the budget still holds (every
    delivery journaled once, never more than max_points) and every release is charged once:
    one score histogram per owner, no auction step, one validation release."""
    code, out = _run(
        tmp_path, "budget", "--set", "summary.max_points=18", "--set", "faults.kill_curator_at=4"
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    parsimony = report["parsimony"]
    assert parsimony["max_points"] == 18 and parsimony["summary_size"] == 12
    allocation = parsimony["allocation"]  # public: an owner rebuilds its score frame with it
    assert allocation["rule"] == "histogram" and allocation["ridge"] == 0.5
    assert allocation["random_share"] == pytest.approx(1 / 3) and allocation["floor"] == 0
    accessed = json.loads((out / "report.private.json").read_text())["parsimony"]
    assert 12 <= accessed["distinct_points"] <= 18
    rows = read_pool_rows(out / ".journal" / "journal.pool.jsonl")
    assert len(rows) == accessed["purchased_pool"] <= 18
    assert len({(r["owner"], r["token"]) for r in rows}) == len(rows)
    assert len((out / "summary.csv").read_text().splitlines()) == 13
    parties = report["privacy"]["parties"]
    for owner in ("owner-1", "owner-2", "owner-3", "owner-4"):
        events = parties[owner]["events"]["events"]
        histograms = [e for e in events if "score histogram" in e["label"]]
        assert [e["count"] for e in histograms] == [1], owner
        assert not any(e["label"] == "auction step" for e in events), owner
    validation = parties["validation"]["events"]["events"]
    assert [(e["label"], e["count"]) for e in validation] == [
        ("gaussian(validation mean) around the seed mean", 1)
    ]
    [verdict] = report["faults"]["verdicts"]
    assert verdict["verdict"] == "tolerated" and "resumed 1 time" in verdict["detail"]


def test_the_default_buys_at_random_on_actors_and_charges_only_the_secure_sums(
    tmp_path: Path,
) -> None:
    """Issue 30: demo.toml without its [summary] is the default, random-select at (K + 1) p
    points. On real actors the run buys exactly that many distinct points, releases nothing
    to the owners beyond the secure sums (their ledgers hold normalise and scan only, no auction
    step), makes no validation release, and report.json names the mechanism."""
    demo = (ROOT / "configs" / "demo.toml").read_text(encoding="utf-8")
    plain = tmp_path / "default.toml"
    plain.write_text(demo[: demo.index("[summary]")], encoding="utf-8")
    pairs = zip(SMALL[::2], SMALL[1::2], strict=True)  # ("--set", key=value)
    small = [a for flag, item in pairs if not item.startswith("summary.") for a in (flag, item)]
    out = tmp_path / "default"
    assert main(["run", str(plain), "--out", str(out), *small]) == 0
    report = json.loads((out / "report.json").read_text())
    parsimony = report["parsimony"]
    assert parsimony["mechanism"] == "random-select" and parsimony["max_points"] == 5 * 12
    accessed = json.loads((out / "report.private.json").read_text())["parsimony"]
    assert accessed["distinct_points"] == accessed["purchased_pool"] == 60
    assert len((out / "summary.csv").read_text().splitlines()) == 13
    parties = report["privacy"]["parties"]
    for owner in ("owner-1", "owner-2", "owner-3", "owner-4"):
        labels = {e["label"] for e in parties[owner]["events"]["events"]}
        assert labels == {"normalise (secure sum)", "scan (secure sum)"}, owner
    assert "validation" not in parties or not parties["validation"]["events"]["events"]

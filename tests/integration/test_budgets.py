"""Owners' persistent budgets end to end on Ray: two purchases on the same stores, a declining
owner within T, every owner declining above T (exit 3), and ``dpmarket budget``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpmarket.actors.budgets.reading import read_store
from dpmarket.actors.commands.main import main

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "--set", "market.summary_size=12", "--set", "data.n_points=1500", "--set", "data.n_test=300",
    "--set", "summary.validation_iterations=300", "--set", "summary.seed_iterations=300",
    "--set", "run.deadline_seconds=2.0",
]  # fmt: skip
# One demo purchase costs each contributing owner about 1.12 by its filter (normalise, scan,
# the summary plan); the next normalise would take it to about 1.36. A cap of 1.2 therefore
# admits exactly one purchase.
CAP = 1.2


def _config(tmp_path: Path, consumer_cap: float = 10.0) -> Path:
    text = (ROOT / "configs" / "demo.toml").read_text()
    text = text.replace("[privacy]\n", f'[privacy]\nledger_dir = "stores"\nowner_budget = {CAP}\n')
    text += "\n[owners.owner-2]\nbudget = {epsilon = 0.05, delta = 1e-5}\n"
    text += f"\n[consumer]\nbudget = {{epsilon = {consumer_cap:g}, delta = 1e-5}}\n"
    path = tmp_path / "market.toml"
    path.write_text(text)
    return path


def test_budgets_outlive_a_run_and_declines_count_against_t(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, stores = _config(tmp_path), tmp_path / "stores"
    # first purchase: owner-2's cap (0.05) admits neither secure sum nor the summary phase: it
    # declines all three, is absent from the sums and silent (lost) in the summary, 1 <= T:
    # the run completes
    assert main(["run", str(config), "--out", str(tmp_path / "first"), *SMALL]) == 0
    report = json.loads((tmp_path / "first" / "report.json").read_text())
    budgets = report["budgets"]
    assert budgets["errors"] == []
    assert {o: e["status"] for o, e in budgets["owners"].items()} == dict.fromkeys(
        ("owner-1", "owner-2", "owner-3", "owner-4", "consumer"), "ok"
    )
    assert budgets["owners"]["owner-2"]["declined"] == 3
    assert budgets["owners"]["owner-2"]["run_charged"] == 0.0
    assert list(report["faults"]["lost"]) == ["owner-2"]
    assert budgets["owners"]["owner-1"]["declined"] == 0
    assert 1.0 < budgets["owners"]["owner-1"]["spent"] <= CAP
    assert set(map(tuple, report["secure_phases"]["absent"].values())) == {("owner-2",)}
    first = {o: e["spent"] for o, e in budgets["owners"].items()}

    # second purchase on the same stores: every owner declines the normalise round (4 > T = 1)
    # and the run is refused before anything is released
    assert main(["run", str(config), "--out", str(tmp_path / "second"), *SMALL]) == 3
    stopped = json.loads((tmp_path / "second" / "report.json").read_text())  # exit 3's report
    assert stopped["outcome"]["state"] == "refused"
    assert all(c["pld"] == 0.0 for c in stopped["charged"].values())  # nothing released
    capsys.readouterr()
    assert main(["budget", str(stores), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["owners"]
    assert set(summary) == set(first)
    for owner, entry in summary.items():
        assert entry["runs"] == 2 and entry["spent"] <= entry["cap"]
        if owner != "consumer":  # the owners declined: the refused run charged them nothing
            assert entry["spent"] == pytest.approx(first[owner])
    # the consumer pays up front, before the owners decline (an over-count, never an under-
    # count): its cap (10) admitted the second validation release, 4.14 -> 6.00 by the filter
    assert summary["consumer"]["spent"] > first["consumer"] + 1.5
    rows = read_store(stores / "owner-1.sqlite")["rows"]
    declined = [r for r in rows if r["state"] == "declined"]
    assert [r["label"] for r in declined] == ["normalise (secure sum)"]


def test_a_consumer_over_its_cap_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """The consumer's store already holds a charge of about 4.1 by the filter; with a cap of 5
    it does not admit the demo's validation release (4.14 alone): exit 3, no report, no owner
    store touched."""
    from dpmarket.actors.budgets.store import LedgerStore
    from dpmarket.protocol.privacy.filter import RenyiFilter
    from dpmarket.protocol.privacy.ledger import MechanismEvent

    config = _config(tmp_path, consumer_cap=5.0)
    store = LedgerStore(tmp_path / "stores" / "consumer.sqlite", "consumer", RenyiFilter(5.0, 1e-5))
    store.charge("earlier", "earlier", MechanismEvent("gaussian", (("sigma", 1.4),), 1.0))
    store.close()
    assert main(["run", str(config), "--out", str(tmp_path / "out"), *SMALL]) == 3
    stopped = json.loads((tmp_path / "out" / "report.json").read_text())  # exit 3's report
    assert stopped["outcome"]["state"] == "refused"
    assert sorted(p.name for p in (tmp_path / "stores").iterdir()) == ["consumer.sqlite"]
    rows = read_store(tmp_path / "stores" / "consumer.sqlite")["rows"]
    assert [r["state"] for r in rows] == ["charged", "declined"]


class DriverDied(BaseException):
    """The driver dying (not an Exception: nothing in the run may catch it)."""


def test_a_rerun_after_a_warm_up_death_charges_the_consumer_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer pays its validation plan up front; the driver then dies before the
    curator's first snapshot (nothing released). Running the same command again into the
    same OUT keeps the purchase's ledger run: one validation charge in the consumer's store,
    and every owner's store the same as for one purchase."""
    from dpmarket.actors.run import market as market_module

    config, stores, out = _config(tmp_path), tmp_path / "stores", tmp_path / "out"
    args = ["run", str(config), "--out", str(out), *SMALL]

    def die(*a: object, **k: object) -> None:
        raise DriverDied

    with monkeypatch.context() as patch:
        patch.setattr(market_module, "secure_phases", die)  # after the consumer's charge
        with pytest.raises(DriverDied):
            main(args)
    assert not (out / ".journal" / "journal.json").exists()
    assert [r["state"] for r in read_store(stores / "consumer.sqlite")["rows"]] == ["charged"]
    assert main(args) == 0
    consumer = read_store(stores / "consumer.sqlite")
    assert len(consumer["runs"]) == 1
    assert [(r["release"].split(":")[-1], r["state"]) for r in consumer["rows"]] == [
        ("validation", "charged")
    ]
    report = json.loads((out / "report.json").read_text())
    assert report["outcome"]["state"] == "done" and report["budgets"]["errors"] == []
    assert len(read_store(stores / "owner-1.sqlite")["runs"]) == 1


def test_blocks_of_a_growing_stream_pay_only_for_what_reads_them(tmp_path: Path) -> None:
    """configs/stream.toml with blocks of 100 records: the first blocks (complete before the
    scan) pay normalise, scan and the summary plan but never a refresh, which reads only the
    records added since; every block stays within the cap; the store covers the curator."""
    text = (ROOT / "configs" / "stream.toml").read_text()
    text = text.replace(
        "[privacy]\n", '[privacy]\nledger_dir = "stores"\nowner_budget = 3.0\nblock_records = 100\n'
    )
    config = tmp_path / "stream.toml"
    config.write_text(text)
    extra = ["--set", "market.summary_size=16", "--set", "data.n_points=2000"]
    extra += ["--set", "data.n_test=300", "--set", "run.deadline_seconds=2.0"]
    assert main(["run", str(config), "--out", str(tmp_path / "out"), *extra]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["budgets"]["errors"] == []
    private = json.loads((tmp_path / "out" / "report.private.json").read_text())
    released = [r for r in report["secure_phases"]["refreshes"] if r["status"] == "released"]
    for owner in ("owner-1", "owner-2", "owner-3", "owner-4"):
        rows = read_store(tmp_path / "stores" / f"{owner}.sqlite")["rows"]
        charged = [r for r in rows if r["state"] == "charged"]
        assert {r["block"] for r in charged if r["label"] == "normalise (secure sum)"} >= {0, 1}
        refresh = [r for r in charged if r["label"] == "scan refresh (secure sum)"]
        assert 0 not in {r["block"] for r in refresh}  # complete before the scan: never re-read
        assert len({r["release"] for r in refresh}) <= len(released) + 1  # + one lost at most
        # A refresh reads the records added since its base: a contiguous run of blocks (how far
        # it reaches depends on how much had arrived when it ran; a later release, e.g. the
        # summary plan, may read a block no refresh saw yet).
        for release in {r["release"] for r in refresh}:
            blocks = sorted(r["block"] for r in refresh if r["release"] == release)
            assert blocks == list(range(blocks[0], blocks[-1] + 1))
        # with blocks, report.json says only whether the store covers the curator's view: the
        # largest block's spent and the retired blocks depend on the count (the consumer's)
        public = report["budgets"]["owners"][owner]
        assert set(public) == {"status", "cap", "delta", "curator", "blocks"}
        assert (public["status"], public["cap"], public["blocks"]) == ("ok", 3.0, True)
        assert private["budgets"]["owners"][owner]["spent"] <= 3.0


def test_time_window_blocks_of_a_growing_stream(tmp_path: Path) -> None:
    """configs/stream.toml with blocks of 0.25 s of arrival time: the owner actors stamp each
    batch their tailers take in, the stores record the windows before anything reads them, a
    refresh is charged only to the windows holding records added since its base round (never
    one the scan saw closed, so never the first: the writer appends 0.5 s apart), and the
    store covers the curator."""
    import sqlite3

    text = (ROOT / "configs" / "stream.toml").read_text()
    blocks = 'ledger_dir = "stores"\nowner_budget = 3.0\nblock_seconds = 0.25\n'
    text = text.replace("[privacy]\n", "[privacy]\n" + blocks)
    assert "interval = 0.5" in text  # the writer's pause, more than a window (see below)
    config = tmp_path / "stream.toml"
    config.write_text(text)
    extra = ["--set", "market.summary_size=16", "--set", "data.n_points=2000"]
    extra += ["--set", "data.n_test=300", "--set", "run.deadline_seconds=2.0"]
    assert main(["run", str(config), "--out", str(tmp_path / "out"), *extra]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["budgets"]["errors"] == []
    private = json.loads((tmp_path / "out" / "report.private.json").read_text())
    for owner in ("owner-1", "owner-2", "owner-3", "owner-4"):
        path = tmp_path / "stores" / f"{owner}.sqlite"
        with sqlite3.connect(path) as conn:
            windows = [b for (b,) in conn.execute("SELECT block FROM blocks ORDER BY block")]
            seen = int(conn.execute("SELECT value FROM meta WHERE key = 'seen'").fetchone()[0])
        assert len(windows) >= 2  # the stream kept arriving over several seconds
        assert seen >= private["owners"][owner]["ingested"] > 0  # every record has its window
        charged = [r for r in read_store(path)["rows"] if r["state"] == "charged"]
        assert {r["block"] for r in charged} <= set(windows)  # every charge to a window
        normalise = {r["block"] for r in charged if r["label"] == "normalise (secure sum)"}
        assert windows[0] in normalise
        scan = {r["block"] for r in charged if r["label"] == "scan (secure sum)"}
        refresh = {r["block"] for r in charged if r["label"] == "scan refresh (secure sum)"}
        assert windows[0] in scan
        # A refresh reads only records added since the scan: never a window the scan saw
        # closed; at most the scan's newest one, if records kept arriving in it after the scan.
        assert not refresh or min(refresh) >= max(scan), (sorted(scan), sorted(refresh))
        # The first window holds only the records there before the run (the writer's first
        # batch comes 0.5 s after they were stamped, more than a window later), all of which
        # the scan read, so no refresh reads it, however soon after the ingest the scan ran.
        assert windows[0] not in refresh, (sorted(scan), sorted(refresh))
        assert "spent" not in report["budgets"]["owners"][owner]  # depends on the windows
        assert private["budgets"]["owners"][owner]["spent"] <= 3.0

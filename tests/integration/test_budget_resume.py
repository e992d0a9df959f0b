"""A driver SIGKILLed mid-run with owners' persistent budgets: ``dpmarket resume`` finishes and
every release is charged to each owner's store exactly once (the resumed run continues the
same ledger run, so replayed release ids charge nothing; actors/run/budgets.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from dpmarket.actors.budgets.reading import read_store
from dpmarket.actors.budgets.store import StoreError
from dpmarket.actors.commands.main import main
from tests.integration.test_market import ROOT, SMALL
from tests.integration.test_secure_resume import _journal, _started_by

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

OWNERS = ("owner-1", "owner-2", "owner-3", "owner-4")
# owner-1 answers every summary frame 0.3 s late, so the epochs outlast the poll below (the
# resumed run drops simulated faults)
EXTRA = ["--set", "run.reproducible_noise=true", "--set", "faults.slow={owner-1 = 0.3}"]


def _config(tmp_path: Path) -> Path:
    text = (ROOT / "configs" / "demo.toml").read_text()
    text = text.replace("[privacy]\n", '[privacy]\nledger_dir = "stores"\nowner_budget = 10.0\n')
    text += "\n[consumer]\nbudget = {epsilon = 20.0, delta = 1e-5}\n"
    path = tmp_path / "market.toml"
    path.write_text(text)
    return path


def _summary_charged(store: Path) -> bool:
    try:
        return any(r["label"].startswith("summary plan") for r in read_store(store)["rows"])
    except StoreError:
        return False  # not created yet (or mid-creation)


def test_driver_sigkilled_mid_run_resumes_and_charges_each_release_once(tmp_path: Path) -> None:
    config, out, stores = _config(tmp_path), tmp_path / "out", tmp_path / "stores"
    ray_tmp = Path(tempfile.mkdtemp(prefix="dpb", dir="/tmp"))  # short: Ray's socket paths
    env = os.environ | {"RAY_TMPDIR": str(ray_tmp), "TMPDIR": str(ray_tmp)}
    env.pop("RAY_ADDRESS", None)
    args = ["run", str(config), "--out", str(out), *SMALL, *EXTRA]
    driver = subprocess.Popen(
        [sys.executable, "-m", "dpmarket.actors.commands.main", *args], env=env, cwd=ROOT,
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:  # killed once every owner has paid for the summary phase, during the epochs
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and driver.poll() is None:
            if all(_summary_charged(stores / f"{o}.sqlite") for o in OWNERS):
                break
            time.sleep(0.01)
        assert driver.poll() is None, "the driver ended before the summary phase was charged"
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        stop = time.monotonic() + 30
        while (left := _started_by(driver.pid, str(ray_tmp))) and time.monotonic() < stop:
            for pid in left:  # its Ray processes, and only those
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        if driver.poll() is None:
            driver.kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert _started_by(driver.pid, str(ray_tmp)) == []
    assert not (out / "report.json").exists() and _journal(out)  # killed mid-run, journaled
    before = {o: read_store(stores / f"{o}.sqlite")["rows"] for o in OWNERS}

    assert main(["resume", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["budgets"]["errors"] == []  # every store covers the curator's view
    run = (out / ".journal" / "ledger_run").read_text().strip()
    for owner in OWNERS:
        store = read_store(stores / f"{owner}.sqlite")
        assert [r["run"] for r in store["runs"]] == [run]  # the resume continued the same run
        charged = [r for r in store["rows"] if r["state"] == "charged"]
        # each release once: normalise, scan (journaled before the kill, not run again) and
        # the summary plan (its release id replayed by the resumed owner: nothing charged)
        assert Counter(r["release"] for r in charged).most_common(1)[0][1] == 1
        labels = sorted(r["label"].split(":")[0] for r in charged)
        assert labels == ["normalise (secure sum)", "scan (secure sum)", "summary plan"]
        assert store["rows"][: len(before[owner])] == before[owner]  # nothing rewritten
        spent = report["budgets"]["owners"][owner]["spent"]
        assert spent == pytest.approx(charged[-1]["spent_after"])
    consumer = read_store(stores / "consumer.sqlite")
    assert [r["state"] for r in consumer["rows"]] == ["charged"]  # the validation release once

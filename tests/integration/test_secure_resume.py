"""A crash during the secure-sum phases: the journal exists from the first round, resume
completes, and every secure-sum event is charged exactly once
(actors/parties/securephase_journal.py)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dpmarket.actors.commands.main import main
from dpmarket.actors.run import market as market_module
from tests.integration.test_market import ROOT, SMALL

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

SECURE = {"normalise (secure sum)", "scan (secure sum)"}
REPRO = ["--set", "run.reproducible_noise=true"]


def _run(out: Path, *extra: str) -> int:
    args = ["run", str(ROOT / "configs" / "demo.toml"), "--out", str(out), *SMALL, *REPRO]
    return main([*args, *extra])


def _events(report: dict[str, Any], party: str) -> list[tuple[str, int, float]]:
    return sorted(
        (e["label"], e["count"], e.get("sigma", 0.0))
        for e in report["privacy"]["parties"][party]["events"]["events"]
    )


def _secure_counts(report: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for party in report["privacy"]["parties"]:
        for e in report["privacy"]["parties"][party]["events"]["events"]:
            if e["label"] in SECURE:
                key = f"{party}:{e['label']}"
                counts[key] = counts.get(key, 0) + e["count"]
    return counts


def _journal(out: Path) -> dict[str, Any]:
    try:
        return json.loads((out / ".journal" / "journal.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def test_driver_crash_after_the_secure_sums_resumes_and_charges_them_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver dies after normalise and scan released and before the first epoch (the
    standardisation step raises): resume completes, and the ledgers equal an uninterrupted
    run's. Before the fix there was no journal yet: resume exited 2."""
    assert _run(tmp_path / "whole") == 0
    whole = json.loads((tmp_path / "whole" / "report.json").read_text())

    class DriverDied(BaseException):
        """The driver process dying (not an Exception: nothing in the run may catch it)."""

    def die(*args: Any, **kwargs: Any) -> Any:
        raise DriverDied

    out = tmp_path / "crash"
    with monkeypatch.context() as patch:
        patch.setattr(market_module, "standardize", die)
        with pytest.raises(DriverDied):
            _run(out)
    snapshot = _journal(out)
    assert snapshot["state"] == "new"
    assert {r["state"] for r in snapshot["secure_phases"]["rounds"].values()} == {"released"}
    assert main(["resume", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    counts = _secure_counts(report)
    assert counts and set(counts.values()) == {1}
    for party in whole["privacy"]["parties"]:
        assert _events(report, party) == _events(whole, party)
    assert report["secure_phases"]["normalise"] == whole["secure_phases"]["normalise"]


def test_resume_charges_the_scan_at_the_sigma_of_the_runs_own_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28 part 1: a run started with ``--set privacy.eps_scan=2.0`` dies after the scan
    released; resume charges the scan at the sigma it was released with (the override's), not
    at the config file's eps_scan = 0.5 (before the fix: sigma 49.7 instead of 14.1)."""

    class DriverDied(BaseException):
        """The driver process dying (nothing in the run may catch it)."""

    def die(*args: Any, **kwargs: Any) -> Any:
        raise DriverDied

    out = tmp_path / "crash"
    with monkeypatch.context() as patch:
        patch.setattr(market_module, "standardize", die)
        with pytest.raises(DriverDied):
            _run(out, "--set", "privacy.eps_scan=2.0")
    released = _journal(out)["secure_phases"]["rounds"]["scan"]
    assert released["state"] == "released"
    assert main(["resume", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["secure"]["eps_scan"] == 2.0
    sigma = released["result"]["sigma_std"]
    owners = [p for p in report["privacy"]["parties"] if p.startswith("owner-")]
    for party in owners:
        events = report["privacy"]["parties"][party]["events"]["events"]
        scans = [e for e in events if e["label"] == "scan (secure sum)"]
        assert [(e["count"], e["parameters"]["sigma"]) for e in scans] == [(1, sigma)]
    assert len(owners) == 4 and report["secure_phases"]["scan"]["sigma"] == sigma


def test_curator_killed_during_the_secure_sums_is_respawned_and_charges_once(
    tmp_path: Path,
) -> None:
    """The curator actor is killed from outside (ray.kill by its name) once the journal shows
    normalise released: the driver respawns it from the journal, the run completes, and every
    owner's ledger holds one normalise and one scan event. Before the fix: ActorDiedError."""
    import ray

    out = tmp_path / "kill"
    finished = threading.Event()
    killed: list[str] = []

    def killer() -> None:
        while not finished.is_set():
            rounds = _journal(out).get("secure_phases", {}).get("rounds", {})
            if rounds.get("normalise", {}).get("state") == "released":
                run = "demo"
                handle = ray.get_actor(f"dpmarket:{run}:curator", namespace=f"dpmarket-{run}")
                ray.kill(handle, no_restart=True)
                killed.append(str(rounds.get("scan", {}).get("state")))
                return
            time.sleep(0.01)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        code = _run(out)
    finally:
        finished.set()
        thread.join()
    assert killed, "the journal never showed the normalise round released"
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["secure_phases"]["curator_restarts"] == 1
    owners = [p for p in report["privacy"]["parties"] if p.startswith("owner-")]
    counts = _secure_counts(report)
    assert counts == {f"{o}:{label}": 1 for o in owners for label in SECURE}


def _started_by(session: int, marker: str) -> list[int]:
    """The processes a killed driver left: those in its session (it was started in a new one)
        or naming its own Ray temp dir on their command line, and their descendants; alive (a dead
    one left to the test process is reaped)."""
    found: dict[int, int] = {}  # pid -> parent pid
    chosen: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        pid, parent, sid = int(entry.name), int(stat[1]), int(stat[3])
        if stat[0] == "Z":  # dead, not yet reaped (by us, when the test process adopted it)
            if parent == os.getpid():
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            continue
        found[pid] = parent
        if sid == session or marker in cmdline:
            chosen.add(pid)
    grown = True
    while grown:  # descendants (a Ray worker renames itself: "ray::CuratorActor")
        more = {pid for pid, parent in found.items() if parent in chosen} - chosen
        chosen |= more
        grown = bool(more)
    return sorted(chosen)


def test_driver_killed_by_sigkill_mid_secure_sums_resumes_and_charges_once(tmp_path: Path) -> None:
    """A literal SIGKILL of the driver process once normalise is journaled ``released``: its
    own Ray instance (in its own temp dir) is then stopped, process by process, and ``dpmarket
    resume`` completes with every secure-sum event charged once per owner."""
    out = tmp_path / "killed"
    ray_tmp = Path(tempfile.mkdtemp(prefix="dpk", dir="/tmp"))  # short: Ray's socket paths
    env = os.environ | {"RAY_TMPDIR": str(ray_tmp), "TMPDIR": str(ray_tmp)}
    env.pop("RAY_ADDRESS", None)
    args = ["run", str(ROOT / "configs" / "demo.toml"), "--out", str(out), *SMALL, *REPRO]
    cmd = [sys.executable, "-m", "dpmarket.actors.commands.main", *args]
    driver = subprocess.Popen(
        cmd, env=env, cwd=ROOT, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and driver.poll() is None:
            rounds = _journal(out).get("secure_phases", {}).get("rounds", {})
            if rounds.get("normalise", {}).get("state") == "released":
                break
            time.sleep(0.01)
        assert driver.poll() is None, "the driver ended before normalise was journaled"
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
    assert _journal(out)["secure_phases"]["rounds"]["normalise"]["state"] == "released"
    assert main(["resume", str(out)]) == 0
    counts = _secure_counts(json.loads((out / "report.json").read_text()))
    owners = {key.split(":")[0] for key in counts}
    assert owners and set(counts.values()) == {1}
    assert len(counts) == 2 * len(owners)  # both rounds, once per owner

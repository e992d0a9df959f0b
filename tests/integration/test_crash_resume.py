"""Issue 28 part 2: a crash at any instant loses nothing.

A driver whose curator finished after it died (the journal says "done", no report written):
``resume`` writes the finished run's outputs without buying anything again, and a resume of a
complete OUT exits 0 (also when it died while writing the outputs). A curator lost before its
first journal snapshot (during the owners' warm-up) is respawned. ``kill -9`` of the driver's
process group in each phase (Ray started before any actor, the normalise and scan rounds,
early and late epochs):
``resume`` (or, before the first journal
snapshot, a rerun: README "Quick start" ... docs/guide/run-and-faults.md) ends with a complete
purchase whose every party's ledger equals an uninterrupted run's.
"""

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dpmarket.actors.commands.main import main
from dpmarket.actors.run import market as market_module
from dpmarket.actors.run import phases as phases_module
from dpmarket.actors.run import report as report_module
from tests.integration.test_market import ROOT, SMALL
from tests.integration.test_secure_resume import REPRO, _events, _journal, _started_by

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

WARM_UP = "owners: warming up"


def _args(out: Path) -> list[str]:
    return ["run", str(ROOT / "configs" / "demo.toml"), "--out", str(out), *SMALL, *REPRO]


def _report(out: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((out / "report.json").read_text(encoding="utf-8"))
    return report


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An uninterrupted run's public report: the ledgers every crashed run must end with."""
    out = tmp_path_factory.mktemp("whole") / "out"
    assert main(_args(out)) == 0
    return _report(out)


def _same_purchase(report: dict[str, Any], whole: dict[str, Any]) -> None:
    """A complete purchase, every party charged exactly as in the uninterrupted run."""
    assert report["outcome"]["state"] == "done"
    assert report["parsimony"]["summary_size"] == whole["parsimony"]["summary_size"]
    assert set(report["privacy"]["parties"]) == set(whole["privacy"]["parties"])
    for party in whole["privacy"]["parties"]:
        assert _events(report, party) == _events(whole, party), party


class DriverDied(BaseException):
    """The driver process dying (not an Exception: nothing in the run may catch it)."""


@pytest.mark.parametrize(
    ("module", "where"),
    [(market_module, "survivor_reports"), (report_module, "write_plots")],
    ids=["after-the-curator", "writing-the-report"],
)
def test_resume_of_a_run_whose_curator_finished_writes_its_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole: dict[str, Any], module: Any, where: str
) -> None:
    """The driver dies after the curator journaled "done": right after the curator's run,
    before any output was written (before the fix ``resume`` exited 2 "already finished" and
    the purchase was lost), or while the outputs were written (the summary files there, the
    reports not): a rerun into OUT is refused, ``resume`` writes the outputs, buys nothing,
    and a second ``resume`` exits 0 untouched."""

    def die(*args: Any, **kwargs: Any) -> Any:
        raise DriverDied

    out = tmp_path / "late"
    with monkeypatch.context() as patch:
        patch.setattr(module, where, die)
        with pytest.raises(DriverDied):
            main(_args(out))
    assert _journal(out)["state"] == "done"
    assert not (out / "report.json").exists()
    assert (out / "summary.csv").exists() == (where == "write_plots")
    assert main(_args(out)) == 2  # a rerun would buy it again: refused, resume named
    assert main(["resume", str(out)]) == 0
    report = _report(out)
    _same_purchase(report, whole)
    consumer = json.loads((out / "report.private.json").read_text(encoding="utf-8"))
    assert consumer["transport"]["frames_sent"] == 0  # nothing bought again
    for name in ("summary.csv", "summary.npz", "report.private.json", "privacy.png"):
        assert (out / name).exists(), name
    written = (out / "report.json").read_bytes()
    assert main(["resume", str(out)]) == 0  # finished: nothing runs, nothing is rewritten
    assert (out / "report.json").read_bytes() == written


def test_curator_lost_during_the_warm_up_is_respawned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole: dict[str, Any]
) -> None:
    """The curator actor is killed while the owners warm up, before it wrote any journal
    snapshot (before the fix: a traceback and exit 1): the driver spawns a fresh one, which
    has released nothing, and the run completes with the uninterrupted run's ledgers."""
    import ray

    killed: list[str] = []
    say = phases_module.progress

    def progress(line: str) -> None:
        say(line)
        if line == WARM_UP and not killed:
            assert not (tmp_path / "warm" / ".journal" / "journal.json").exists()
            handle = ray.get_actor("dpmarket:demo:curator", namespace="dpmarket-demo")
            ray.kill(handle, no_restart=True)
            killed.append(line)

    monkeypatch.setattr(phases_module, "progress", progress)
    assert main(_args(tmp_path / "warm")) == 0
    assert killed
    report = _report(tmp_path / "warm")
    assert report["secure_phases"]["curator_restarts"] == 1
    _same_purchase(report, whole)


def _epochs_begun(out: Path, text: str) -> bool:
    snapshot = _journal(out)
    return snapshot.get("state") in ("bidding", "asking") and snapshot["epoch"]["number"] >= 3


def _late_epochs(out: Path, text: str) -> bool:
    snapshot = _journal(out)
    return snapshot.get("state") in ("bidding", "asking") and snapshot["epoch"]["number"] >= 9


def _round_opened(name: str) -> Callable[[Path, str], bool]:
    def opened(out: Path, text: str) -> bool:
        rounds = _journal(out).get("secure_phases", {}).get("rounds", {})
        return rounds.get(name, {}).get("state") is not None

    return opened


PHASES: dict[str, Callable[[Path, str], bool]] = {
    # Ray started, no actor yet: deterministically before the curator's first snapshot (the
    # owners' warm-up, once long, now takes milliseconds: no window to aim a kill at)
    "started": lambda out, text: "Ray: local" in text,
    "normalise": _round_opened("normalise"),
    "scan": _round_opened("scan"),
    "epochs": _epochs_begun,
    "late-epochs": _late_epochs,
}
# A kill once the curator journaled "done" was a phase here until issue 37; the driver dying
# after that point (right after the curator's run, or while writing the outputs) is asserted by
# test_resume_of_a_run_whose_curator_finished_writes_its_outputs, the real process-group kill
# by the phases above.


@pytest.mark.parametrize("phase", list(PHASES))
def test_driver_process_group_killed_in_each_phase_loses_nothing(
    tmp_path: Path, phase: str, whole: dict[str, Any]
) -> None:
    """``kill -9`` of the driver's process group once ``phase`` shows (in its journal, or on
    its stderr for the start), its own Ray processes stopped; then ``resume``, or a rerun
    into the same OUT when no journal snapshot was written: a complete purchase with the
    uninterrupted run's ledgers."""
    out = tmp_path / "out"
    ray_tmp = Path(tempfile.mkdtemp(prefix="dpc", dir="/tmp"))  # short: Ray's socket paths
    env = os.environ | {"RAY_TMPDIR": str(ray_tmp), "TMPDIR": str(ray_tmp)}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "dpmarket.actors.commands.main", *_args(out)]
    driver = subprocess.Popen(
        cmd, env=env, cwd=ROOT, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    said: list[bytes] = []

    def read() -> None:
        assert driver.stderr is not None
        while chunk := os.read(driver.stderr.fileno(), 4096):
            said.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and driver.poll() is None:
            if PHASES[phase](out, b"".join(said).decode(errors="replace")):
                break
            time.sleep(0.01)
        assert driver.poll() is None, f"the driver ended before {phase}"
        os.killpg(driver.pid, signal.SIGKILL)  # the driver's process group (its session)
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
        reader.join(timeout=30)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert _started_by(driver.pid, str(ray_tmp)) == []
    assert not (out / "report.json").exists()
    if (out / ".journal" / "journal.json").exists():
        assert phase != "started"
        assert main(["resume", str(out)]) == 0
    else:  # nothing released yet: resume says so (exit 2), a rerun into OUT completes
        assert phase == "started"
        assert main(["resume", str(out)]) == 2
        assert main(_args(out)) == 0
    _same_purchase(_report(out), whole)

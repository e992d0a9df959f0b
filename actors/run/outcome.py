"""What a market run hands back and writes: its outcome, its inputs, its outputs.

:class:`MarketOutcome` is what ``run_market``, ``resume_market`` and ``run_requests`` return
(exit code, message, both reports, rejects per party); :func:`market_outcome` turns a finished
purchase's payload into the files in ``OUT`` (actors/run/report.py) or, for a refused one, into
exit 3 with what to do next. In simulation mode the summary is measured against the harness's
own baselines (never the curator's data: actors/run/outputs.py ``simulation_utility``).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpmarket.actors.config.market import MarketConfig
from dpmarket.actors.run.ingest import StreamWriter
from dpmarket.actors.run.outputs import simulation_utility
from dpmarket.actors.run.report import CONSUMER_REPORT, write_outputs
from dpmarket.actors.run.spawn import OwnerInputs
from dpmarket.actors.run.stopped import stopped_report, write_stopped_report
from dpmarket.streams.records.files import Schema
from dpmarket.streams.synthetic import Scenario

__all__ = [
    "EXIT_CONFIG",
    "EXIT_OK",
    "EXIT_REFUSED",
    "JOURNAL_DIR",
    "MarketInputs",
    "MarketOutcome",
    "market_outcome",
]

EXIT_OK, EXIT_CONFIG, EXIT_REFUSED = 0, 2, 3
JOURNAL_DIR = ".journal"


@dataclass
class MarketOutcome:
    exit_code: int
    message: str
    report: dict[str, Any] | None  # the public report.json
    consumer_report: dict[str, Any] | None = None  # report.private.json (actors/run/report.py)
    # party -> (records rejected, its rejects file) for every party that read files
    rejects: dict[str, tuple[int, str]] = dataclasses.field(default_factory=dict)
    requests: dict[str, MarketOutcome] = dataclasses.field(default_factory=dict)  # [[requests]]
    # wall-clock seconds of spawn, ingest, normalise, scan, epochs, report (benchmarks/)
    phase_seconds: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclass
class MarketInputs:
    """What the run starts from, by data source."""

    owners: OwnerInputs
    gamma: float
    scenario: Scenario | None = None  # simulation only: the harness keeps the test set
    schema: Schema | None = None
    files: dict[str, list[str]] | None = None
    writer: StreamWriter | None = None
    headers: tuple[str, ...] = ()  # CSV input files whose first line is a header
    consumer_rejects: dict[str, int] = dataclasses.field(default_factory=dict)


def market_outcome(
    config: MarketConfig,
    out: Path,
    inputs: MarketInputs,
    payload: Any,
    ray_info: dict[str, Any],
    timings: dict[str, float],
    attempt_dir: Path,
) -> MarketOutcome:
    """A finished purchase's outputs in ``out``: exit 3 and the stopped run's report.json
    (actors/run/stopped.py) when it was refused, else the reports, summary files and the
    rejects per party."""
    if payload["state"] == "refused":
        refusal = payload.get("refusal", {})
        if refusal.get("curator_lost"):  # actors/run/phases.py curator_lost
            after = (
                f"nothing was released: run it again with --out {out}"
                if refusal.get("before_start")
                else f"resume with `dpmarket resume {out}` once its node is sound"
            )
        elif refusal.get("before_start"):
            after = "nothing to resume: run again with at most T colluding or lost owners"
        else:
            after = f"resume with `dpmarket resume {out}` when the owners are back"
        report = stopped_report(
            config.public_record(), payload, list(inputs.owners.owners), config.delta,
            config.faults.colluders, after,
        )  # fmt: skip
        write_stopped_report(out, report)  # a stopped run's: never a finished one's
        message = f"dpmarket: {payload['reason']}; {after} (what happened: {out}/report.json)"
        return MarketOutcome(EXIT_REFUSED, message, report)
    utility: dict[str, Any] = {}
    curves: dict[str, Any] = {}
    if inputs.scenario is not None:
        tick = time.perf_counter()
        utility, curves = simulation_utility(inputs.scenario, payload, config.seed)
        timings["utility"] = time.perf_counter() - tick
    run = config.public_record() | {
        "noise": config.noise.describe(),
        "validation_size": len(inputs.owners.validation),
        "ray": {"address": ray_info["address"]},
        "gamma": inputs.gamma,
    }
    reports = write_outputs(
        out,
        run,
        payload,
        config.delta,
        config.faults.colluders,
        timings,
        utility or None,
        curves,
    )
    files = inputs.files or {}
    rejects = {  # one rejects file per input (rejects.jsonl, then rejects-KEY.jsonl)
        o: (
            int(st["rejected_records"]),
            str(
                attempt_dir
                / o
                / ("rejects*.jsonl" if len(files.get(o, [])) > 1 else "rejects.jsonl")
            ),
        )
        for o, st in payload["owners"].items()
        if inputs.files is not None and o in inputs.files  # a remote owner's are its own
    }
    rejects |= {
        key: (n, str(attempt_dir / key / "rejects.jsonl"))
        for key, n in inputs.consumer_rejects.items()
    }
    return MarketOutcome(
        EXIT_OK,
        f"dpmarket: run complete, outputs in {out} (report.json public; "
        f"{CONSUMER_REPORT} and summary.* the consumer's)",
        reports.public,
        reports.consumer,
        rejects,
    )

"""The Python API: what ``dpmarket run``, ``simulate`` and a notebook call (docs/guide/python.md).

Every function here is what the command line runs (actors/commands/market.py and study.py
print what these return), so a notebook and the CLI buy, refuse and write the same way. Errors
are the command's: :class:`ConfigError` (a configuration, input file or output directory that
cannot be used; exit 2), ``ValueError``/``OSError`` from bad input (exit 2). A purchase refused
by T-tolerance is not an exception: it returns a :class:`MarketResult` with ``refused`` true
and ``exit_code`` 3 (its report.json says what happened and how to resume).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.actors.config.market import ConfigError, MarketConfig, load_market_config
from dpmarket.actors.randomness import NOISE_WARNING
from dpmarket.actors.run.outcome import MarketOutcome
from dpmarket.actors.run.preflight import RunPlan, check_plan
from dpmarket.actors.run.report import CONSUMER_REPORT, PUBLIC_REPORT
from dpmarket.actors.studies.config import StudyConfig, is_study_file, load_study

__all__ = [
    "ConfigError",
    "MarketConfig",
    "MarketResult",
    "StudyConfig",
    "StudyResult",
    "load_config",
    "load_study",
    "read_report",
    "run_market",
    "simulate",
]

Overrides = Mapping[str, object] | Sequence[str]


def load_config(path: str | Path, overrides: Overrides = ()) -> MarketConfig:
    """A market config (TOML) parsed and checked once, with ``overrides`` on top: a mapping
    ``{"summary.max_points": 60}`` or the command's ``["summary.max_points=60"]`` (values in
    TOML syntax; a bare word is a string). :class:`ConfigError` names the file and the key."""
    if isinstance(overrides, Mapping):
        sets = [f"{key}={_toml(value)}" for key, value in overrides.items()]
    elif isinstance(overrides, str):
        raise ConfigError(
            f"overrides: a mapping or a list of 'section.key=value', got {overrides!r}"
        )
    else:
        sets = [str(item) for item in overrides]
    return load_market_config(path, sets)


def _toml(value: object) -> str:
    """A Python value as the TOML text of an override (strings quoted, booleans lower case)."""
    if isinstance(value, bool | int | float | str) or value is None:
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise ConfigError(f"override value {value!r}: expected a number, string, boolean or list")


@dataclass(frozen=True)
class Summary:
    """The purchased summary (the consumer's, from summary.npz): one row per kept point."""

    features: npt.NDArray[np.float64]  # (p, k) points, or (p, d) h1 hashes when ``hashed``
    labels: npt.NDArray[Any]
    owners: npt.NDArray[np.str_]  # who sold each point
    tokens: npt.NDArray[np.int64]
    epochs: npt.NDArray[np.int64]
    hashed: bool


@dataclass(frozen=True)
class MarketResult:
    """What one purchase returned and wrote (:func:`run_market`, :func:`read_report`).

    ``report`` is report.json (public: it may be handed to the owners), ``consumer_report``
    report.private.json (the consumer's), ``summary`` the purchase (None for a stopped run),
    ``epsilon`` each protected party's epsilon by the PLD accountant at ``report["privacy"]
    ["delta"]`` (a number, or "inf"/"n/a" with a note in the report), ``paths`` the files
    written, ``plan`` the preflight the run printed before it started (None when read back)."""

    exit_code: int
    message: str
    out: Path
    report: dict[str, Any]
    consumer_report: dict[str, Any] | None
    summary: Summary | None
    epsilon: dict[str, float | str]
    paths: dict[str, Path]
    plan: RunPlan | None = None
    requests: dict[str, MarketResult] = field(default_factory=dict)  # [[requests]]: by name
    rejects: dict[str, tuple[int, str]] = field(default_factory=dict)

    @property
    def outcome(self) -> dict[str, Any]:
        """report.json's ``outcome``: ``state`` ("done", "refused", ...), epochs, reason."""
        return dict(self.report.get("outcome", {}))

    @property
    def refused(self) -> bool:
        """The run stopped (T exceeded, a cap declined it): exit code 3."""
        return self.outcome.get("state") == "refused"

    @property
    def utility(self) -> dict[str, dict[str, float]]:
        """Simulations only: MMD^2 and LinearSVC accuracy of the private summary, a same-size
        random purchase, uniform sampling and exact greedy on the harness's test set."""
        return dict((self.consumer_report or {}).get("utility", {}))


def read_report(out: str | Path) -> MarketResult:
    """The result of the run whose outputs are in ``out`` (report.json, report.private.json,
    summary.npz), finished or stopped. :class:`ConfigError` when ``out`` holds no report."""
    where = Path(out)
    try:
        report = json.loads((where / PUBLIC_REPORT).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{where}: no {PUBLIC_REPORT} (not a finished or stopped run)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{where}: {PUBLIC_REPORT} is unreadable ({exc})") from None
    consumer = None
    if (where / CONSUMER_REPORT).is_file():
        consumer = json.loads((where / CONSUMER_REPORT).read_text(encoding="utf-8"))
    refused = report.get("outcome", {}).get("state") == "refused"
    return MarketResult(
        3 if refused else 0, "", where, report, consumer, _summary(where), _epsilon(report),
        _paths(where),
    )  # fmt: skip


def _summary(out: Path) -> Summary | None:
    if not (out / "summary.npz").is_file():
        return None
    with np.load(out / "summary.npz") as npz:
        return Summary(
            np.asarray(npz["features"], dtype=np.float64), npz["labels"], npz["owners"],
            npz["tokens"], npz["epochs"], bool(npz["hashed"]),
        )  # fmt: skip


def _epsilon(report: dict[str, Any]) -> dict[str, float | str]:
    """Each party's PLD epsilon: a finished run's ``privacy.parties``, a stopped run's
    ``charged`` (what each owner paid)."""
    parties = report.get("privacy", {}).get("parties") or report.get("charged") or {}
    return {party: entry["pld"] for party, entry in parties.items()}


def _paths(out: Path) -> dict[str, Path]:
    names = (PUBLIC_REPORT, CONSUMER_REPORT, "summary.csv", "summary.npz", "mmd_by_epoch.png",
             "privacy.png")  # fmt: skip
    return {name: out / name for name in names if (out / name).is_file()}


def run_market(
    config: MarketConfig | str | Path,
    out: str | Path | None = None,
    *,
    address: str | None = None,
    strict: bool = False,
    echo: bool = True,
    connected: Callable[[dict[str, Any]], None] | None = None,
) -> MarketResult:
    """Buy one summary (or each ``[[requests]]`` one after another) on Ray and return what it
    wrote into ``out`` (default ``[run].out``), as ``dpmarket run`` does.

    Before anything is spent the preflight is made (``MarketResult.plan``) and, with ``echo``,
    printed; with ``strict`` a warning refuses the run (:class:`ConfigError`, nothing started).
    ``address``: a Ray cluster (default: an embedded local instance).

    A :class:`MarketConfig` must be what its own text and overrides parse to: one changed in
    code (``dataclasses.replace``) is refused with :class:`ConfigError` naming the fields, since
    the refusals made at parse time (noise from a public seed, or add/remove neighbours, on
    private files) never saw it; give such values as ``load_config`` overrides. Noise from a
    public seed (``[run].reproducible_noise``) is warned about on stderr, as by the command."""
    from dpmarket.actors.config.journaled import check_as_parsed
    from dpmarket.actors.run.market import run_market as run_one
    from dpmarket.actors.run.requests import run_requests

    loaded = config if isinstance(config, MarketConfig) else load_config(config)
    check_as_parsed(loaded)  # before anything starts
    if loaded.reproducible_noise:
        print(f"dpmarket: WARNING: {NOISE_WARNING}", file=sys.stderr)
    seen: list[RunPlan] = []

    def before_start(plan: RunPlan) -> None:
        seen.append(plan)
        check_plan(strict, echo)(plan)

    # OUT resolved once, before the run: a job's working directory (where a relative OUT and
    # the stores' checks are resolved) may be gone by the time the run returns
    where = _out_of(loaded, out)
    buy = run_requests if loaded.requests else run_one
    outcome = buy(
        loaded, Path(out) if out is not None else None, address,
        before_start=before_start, connected=connected,
    )  # fmt: skip
    return _result(outcome, where, seen[0] if seen else None)


def _out_of(config: MarketConfig, out: str | Path | None) -> Path:
    from dpmarket.actors.config.validate import resolve_out

    return resolve_out(config, Path(out) if out is not None else None)


def _result(outcome: MarketOutcome, out: Path, plan: RunPlan | None) -> MarketResult:
    requests = {
        name: _result(each, out / "requests" / name, None)
        for name, each in outcome.requests.items()
    }
    if outcome.report is None:  # [[requests]]: the whole run has no report of its own
        return MarketResult(
            outcome.exit_code, outcome.message, out, {}, None, None, {}, {}, plan, requests,
            outcome.rejects,
        )  # fmt: skip
    return MarketResult(
        outcome.exit_code, outcome.message, out, outcome.report, outcome.consumer_report,
        _summary(out), _epsilon(outcome.report), _paths(out), plan, requests, outcome.rejects,
    )  # fmt: skip


@dataclass(frozen=True)
class StudyResult:
    """A study's results (:func:`simulate`): ``cells`` one row per cell of the grid (a list of
    flat dicts: ``pandas.DataFrame(result.cells)``), ``trials`` every trial's row as
    ``OUT/trials.jsonl`` holds it, ``smallest_t`` the least T that finishes with the target
    probability per setting, ``document`` study.json, ``paths`` the files written."""

    out: Path
    cells: list[dict[str, Any]]
    trials: list[dict[str, Any]]
    smallest_t: list[dict[str, Any]]
    document: dict[str, Any]
    paths: dict[str, Path]


def simulate(
    study: StudyConfig | str | Path,
    out: str | Path | None = None,
    *,
    trials: int | None = None,
    serial: bool = False,
    batch: int = 2,
    address: str | None = None,
    connected: Callable[[dict[str, Any]], None] | None = None,
) -> StudyResult:
    """Run a dropout and collusion study (a file with ``[study]``: docs/guide/studies.md) into
    ``out`` (default ``[study].out``) as ``dpmarket simulate STUDY`` does: the trials not yet
    in ``out`` (an interrupted study resumes), then study.csv, study.json, study.parquet and
    the plots. ``serial`` runs the trials in this process instead of as Ray tasks; ``trials``
    overrides ``[study].trials``."""
    from dpmarket.actors.studies.report import write_study
    from dpmarket.actors.studies.run import run_study

    if batch < 1 or (trials is not None and trials < 1):
        raise ConfigError(f"trials and batch must be >= 1, got {trials}, {batch}")
    if isinstance(study, StudyConfig):
        loaded = study if trials is None else load_study(study.path, trials)
    elif not is_study_file(str(study)):
        raise ConfigError(f"{study}: not a study (no [study] table): run a market with run_market")
    else:
        loaded = load_study(study, trials)
    where = Path(out) if out is not None else Path(loaded.out)
    results = run_study(loaded, where, address, serial=serial, batch=batch, connected=connected)
    document = write_study(loaded, results, where)
    paths = {name: where / name for name in document["files"]}
    return StudyResult(where, list(document["cells"]), results, list(document["smallest_t"]),
                       document, paths)  # fmt: skip

"""The market run on Ray: start -> summarise -> report, with faults, refusal and resume.

``run_market`` is what ``dpmarket run`` and ``dpmarket simulate`` call. In simulation mode the
harness generates the data (synthetic covariate shift or the digits split), keeps the test set
and the baselines to itself, and hands owners and curator only what they would hold. The
curator journals its state in ``OUT/.journal``; a refused run leaves only that journal (and the
copy of the configuration needed to resume) in ``OUT``, never a partial summary or report.

Exit codes: 0 complete, 2 bad configuration or input, 3 refused by T-tolerance.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpmarket.actors.cluster.connect import connect
from dpmarket.actors.cluster.placement import preflight_owners, require_placeable
from dpmarket.actors.config.journaled import (
    CONFIG_FILE,
    check_resumed_mechanism,
    journal_config,
    journaled_plan,
    restore_config,
    same_unreleased_start,
    stage_consumer_files,
)
from dpmarket.actors.config.market import ConfigError, FaultConfig, MarketConfig
from dpmarket.actors.config.scenarios import make_market_scenario
from dpmarket.actors.config.validate import check_inputs, resolve_out
from dpmarket.actors.parties.curator import pool_file, read_pool_rows
from dpmarket.actors.parties.faults import FaultPlan, fault_verdicts
from dpmarket.actors.remote.handles import is_remote
from dpmarket.actors.run.budgets import budget_report, consumer_refusal, ledger_run_id, owner_gates
from dpmarket.actors.run.ingest import file_inputs, stream_files, wait_for_ingest
from dpmarket.actors.run.outcome import (
    EXIT_OK,
    EXIT_REFUSED,
    JOURNAL_DIR,
    MarketInputs,
    MarketOutcome,
    market_outcome,
)
from dpmarket.actors.run.phases import (
    SecurePrep,
    prepare_secure,
    secure_phases,
    spawn_local_nodes,
    standardize,
    summarise,
)
from dpmarket.actors.run.preflight import RunPlan, plan_run
from dpmarket.actors.run.remote import (
    finish_remote,
    join_shortfall,
    offer_purchase,
    start_remote,
)
from dpmarket.actors.run.report import CONSUMER_REPORT, PUBLIC_REPORT
from dpmarket.actors.run.spawn import OwnerInputs, RayMarket, spawn_market
from dpmarket.actors.run.stopped import finished_report
from dpmarket.actors.run.survivors import survivor_reports

__all__ = [
    "EXIT_OK",
    "EXIT_REFUSED",
    "MarketOutcome",
    "make_market_scenario",
    "resume_market",
    "run_market",
]


def market_inputs(
    config: MarketConfig, out: Path, headers: dict[str, bool], attempt_dir: Path
) -> MarketInputs:
    if config.source == "files":
        f = file_inputs(config, headers, attempt_dir)
        with_header = tuple(p for p, h in f.headers.items() if h)
        return MarketInputs(
            f.owners, f.gamma, None, f.schema, f.files, None, with_header, f.rejects
        )
    scenario = make_market_scenario(config)
    if "stream" in config.data:
        owners, schema, files, writer = stream_files(config, scenario, out / "data")
        return MarketInputs(owners, scenario.gamma, scenario, schema, files, writer)
    return MarketInputs(OwnerInputs.of(scenario), scenario.gamma, scenario)


def _drive(
    config: MarketConfig,
    inputs: MarketInputs,
    run_plan: RunPlan,
    journal: Path,
    snapshot: Any,
    attempt_dir: Path,
    ledger_run: str = "",
    phases: dict[str, float] | None = None,
) -> Any:
    """Spawn the actors (with ``[remote]``: the gateway first, and the agents' stand-ins:
    actors/run/remote.py), ingest, run the curator, kill and resume it if the config says so."""

    faults = config.faults
    plan = FaultPlan(
        kill_at=dict(faults.kill), delay=dict(faults.slow), kill_actor_at=dict(faults.kill_actor)
    )
    remote = start_remote(config)  # agents dial in before anything else of the run exists
    payload: Any = None
    phases = {} if phases is None else phases
    tick = time.perf_counter()
    try:
        # the secure-sum session, node keys and round plan exist before any owner actor does
        prep = prepare_secure(
            config, inputs.owners, inputs.gamma, run_plan.params, snapshot,
            remote.node_keys if remote is not None else None, run_plan.normalise_skipped,
        )  # fmt: skip
        if (declined := consumer_refusal(config, run_plan.params, ledger_run)) is not None:
            payload = declined
            return declined  # the consumer's cap (actors/run/budgets.py): before any actor
        require_placeable(config.placement)  # refused now, not an actor never placed
        market = spawn_market(
            inputs.owners,
            run_plan.params,
            config.noise,
            plan,
            config.name,
            str(journal),
            snapshot,
            placement=config.placement,
            owners_per_actor=config.owners_per_actor,
            dca=prep.trust if prep is not None else None,
            budgets=owner_gates(config, run_plan.params, ledger_run),
            remote=remote.owners if remote is not None else None,
        )
        # started now, their start-up beside the owners': the owners' keys follow, from here
        market.compute_nodes = spawn_local_nodes(prep, market.run_id)
        if remote is not None:
            market.remote_nodes = dict(remote.nodes)
            offer_purchase(remote, config, run_plan.params, prep, inputs.schema, ledger_run)
            if snapshot is None:  # a resumed run's curator decides from its journal
                payload = join_shortfall(remote, config, prep is not None)
                if payload is not None:  # more than T gone before any round: stop, charge none
                    payload["remote"] = remote.public()
                    market.kill_all()
                    return payload
        phases["spawn"] = time.perf_counter() - tick
        payload = _ingest_and_buy(
            config, inputs, market, prep, plan, journal, snapshot, ledger_run, attempt_dir, phases
        )
        if remote is not None and isinstance(payload, dict):
            payload["remote"] = remote.public()
        return payload
    finally:
        done = isinstance(payload, dict) and payload.get("state") not in (None, "refused")
        reason = "complete" if done else str((payload or {}).get("reason", "the market stopped"))
        finish_remote(remote, done, reason)


def _ingest_and_buy(
    config: MarketConfig,
    inputs: MarketInputs,
    market: RayMarket,
    prep: SecurePrep | None,
    plan: FaultPlan,
    journal: Path,
    snapshot: Any,
    ledger_run: str,
    attempt_dir: Path,
    phases: dict[str, float],
) -> Any:
    """Local owners' files checked and followed, every owner caught up, then the purchase."""
    import ray

    tick = time.perf_counter()
    local = {o: h for o, h in market.owners.items() if not is_remote(h)}
    try:  # owners' files readable on their nodes, every actor's dpmarket the driver's: or exit 2
        preflight_owners(local | {"curator": market.curator}, inputs.files or {}, config.placement)
        if inputs.files is not None and inputs.schema is not None:
            ray.get(
                [
                    market.owners[o].start_ingest.remote(
                        o, paths, inputs.schema, str(attempt_dir / o), headers=inputs.headers
                    )
                    for o, paths in inputs.files.items()
                ]
            )
            wait_for_ingest(market.owners)
        if inputs.writer is not None:
            inputs.writer.start()
        phases["ingest"] = time.perf_counter() - tick
        return purchase(
            config, inputs.owners, market, prep, plan, journal, snapshot, ledger_run, phases
        )
    finally:
        if inputs.writer is not None:
            inputs.writer.stop()
        market.kill_all()


def purchase(
    config: MarketConfig,
    owners: OwnerInputs,
    market: RayMarket,
    prep: SecurePrep | None,
    plan: FaultPlan,
    journal: Path,
    snapshot: Any,
    ledger_run: str,
    phases: dict[str, float] | None = None,
) -> Any:
    """One purchase on spawned, ingesting actors: secure phases, summary, owners, budgets; the
    curator's payload (state "refused" when T was exceeded). Also each request of a config
    with ``[[requests]]`` (actors/run/requests.py), on the same owner actors. ``phases``
    receives the seconds of normalise (with the nodes' spawn and the session's set-up), scan
    and the epochs, and of the two parts of normalise that are the secure sum's own: the
    session's set-up (``secure_setup``) and the normalise round (``normalise_round``)."""
    phases = {} if phases is None else phases
    tick = time.perf_counter()
    secure = secure_phases(config, prep, market, snapshot, journal, phases)
    rounds = secure.get("seconds", {})
    phases["scan"] = float(rounds.get("scan", 0.0))
    phases["normalise"] = time.perf_counter() - tick - phases["scan"]
    phases["secure_setup"] = float(rounds.get("setup", 0.0))  # inside normalise, as is the round
    phases["normalise_round"] = float(rounds.get("normalise", 0.0))
    if "refused" in secure:  # a secure round short of T: nothing after it runs
        refused: dict[str, Any] = secure["refused"]
        return refused | {"unready": secure.get("unready", {})}
    standard = standardize(config, owners, market, secure, snapshot)
    payload = summarise(config, market, plan, journal, snapshot)
    phases["epochs"] = float(payload.get("run_seconds", 0.0))
    if payload.get("refusal", {}).get("curator_lost"):  # lost too often: nothing to report
        return payload
    payload["secure_phases"] = secure | {
        "standardize": standard,
        "refreshes": payload.pop("refreshes", []),
    }
    hosts = {
        o: [n for n, h in market.owners.items() if h == market.owners[o]]
        for o in config.faults.kill_actor
    }
    payload["fault_verdicts"] = fault_verdicts(config.faults, payload, config.tolerance, hosts)
    # a node may be gone by now: unreachable owners are named, never a crash (exit 3 stays 3)
    payload["owners"] = survivor_reports(market.owners, payload["transport"]["dead"])
    payload["budgets"] = budget_report(
        config, ledger_run, market.owners, list(payload["owners"]), payload["ledgers"]
    )  # a remote owner's store is in its agent, asked the same way (actors/run/remote.py)
    return payload


def run_market(
    config: MarketConfig,
    out: Path | None = None,
    address: str | None = None,
    snapshot: Any = None,
    before_start: Callable[[RunPlan], None] | None = None,
    connected: Callable[[dict[str, Any]], None] | None = None,
) -> MarketOutcome:
    """Run (or resume, given a journal ``snapshot``) one market; write outputs into ``out``
    (relative to the working directory). A files market's inputs are checked before Ray
    starts (actors/config/validate.py).

    ``before_start`` sees the :class:`RunPlan` (each release's signal, noise and cost) of a
    fresh run before Ray starts or anything is spent, and may refuse by raising
    ``ConfigError``; ``connected`` sees what Ray connected to.
    """
    if config.requests:  # several purchases: actors/run/requests.py run_requests
        raise ConfigError(f"{config.path}: [[requests]]: bought by run_requests, not run_market")
    out = resolve_out(config, out)
    checked = check_inputs(config) if config.source == "files" else None
    journal_dir = out / JOURNAL_DIR
    if snapshot is None and finished_report(out):
        raise ConfigError(f"{out}: already holds a finished run (report.json); choose --out")
    if snapshot is None and _journaled_state(journal_dir) == "done":  # never bought twice
        raise ConfigError(
            f"{out}: holds a finished purchase whose outputs were not written; "
            f"`dpmarket resume {out}` writes them"
        )
    if snapshot is None and checked is not None:  # the run reads the journaled copies
        config = stage_consumer_files(config, journal_dir)
        checked = check_inputs(config)
    headers = checked.headers if checked is not None else {}
    attempt = len(list((out / ".ingest").glob("attempt-*"))) if (out / ".ingest").exists() else 0
    attempt_dir = out / ".ingest" / f"attempt-{attempt}"
    inputs = market_inputs(config, out, headers, attempt_dir)
    # run again into the OUT of the same purchase stopped before it released anything (the
    # warm-up): its ledger run is kept, so its up-front charges are not paid twice
    rerun = snapshot is None and same_unreleased_start(journal_dir, config)
    run_plan = _plan(config, inputs, journal_dir, snapshot is not None or rerun)
    if checked is not None and checked.warnings:  # printed (or refused, --strict) before Ray
        run_plan = dataclasses.replace(run_plan, warnings=run_plan.warnings + checked.warnings)
    if before_start is not None and snapshot is None:
        before_start(run_plan)
    if snapshot is not None:
        check_resumed_mechanism(snapshot, run_plan.params, out)
    journal_dir.mkdir(parents=True, exist_ok=True)
    if rerun:
        print(
            f"dpmarket: {out} holds the start of this purchase, stopped before any release: "
            "its ledger run is kept (nothing charged for it is charged again)",
            file=sys.stderr,
        )
    # the ledger run first: a fresh run's new id is written before the earlier run's journal
    # goes, so a run interrupted in between (hashing large owner files below) leaves no
    # earlier id that a later start could take for its own (the earlier run's releases were
    # charged under it; spending under it again would find them already paid)
    ledger_run = ledger_run_id(journal_dir, snapshot is None and not rerun, config)
    if snapshot is None:  # a fresh run: no state of an earlier run in OUT may be resumed
        (journal_dir / "journal.json").unlink(missing_ok=True)  # first: then nothing to resume
        pool_file(journal_dir / "journal.json").unlink(missing_ok=True)
        (journal_dir / "config.toml").write_text(config.text, encoding="utf-8")  # for people
        (journal_dir / "config_path").write_text(str(Path(config.path).resolve()))
        decision = {"records": run_plan.records, "normalise_skipped": run_plan.normalise_skipped}
        journal_config(config, journal_dir, decision)  # what resume restores (journaled.py)
    timings: dict[str, float] = {}
    phases: dict[str, float] = {}
    start = time.perf_counter()
    ray_info = connect(address)
    if connected is not None:
        connected(ray_info)
    timings["start"] = time.perf_counter() - start
    tick = time.perf_counter()
    payload = _drive(
        config, inputs, run_plan, journal_dir / "journal.json", snapshot, attempt_dir,
        ledger_run, phases,
    )  # fmt: skip
    timings["ingest_and_summarise"] = time.perf_counter() - tick
    if isinstance(payload, dict) and "run_seconds" in payload:
        timings["summarise"] = float(payload["run_seconds"])  # the curator's run: the epochs
    tick = time.perf_counter()
    outcome = market_outcome(config, out, inputs, payload, ray_info, timings, attempt_dir)
    phases["spawn"] = phases.get("spawn", 0.0) + timings["start"]  # connecting to Ray too
    outcome.phase_seconds = phases | {"report": time.perf_counter() - tick}
    return outcome


def _plan(config: MarketConfig, inputs: MarketInputs, journal_dir: Path, again: bool) -> RunPlan:
    """The run's plan; ``again`` (a resume, or a rerun of the same unreleased start): with the
    record count and normalise decision the run journaled when it started, never recounted
    from owners' files that may have grown or rotated since (a flipped decision would open a
    charged round the run never planned, or report "skipped" over a round already charged).
    A journal from before decisions were journaled is planned afresh."""
    held = journaled_plan(journal_dir) if again else None
    if held is None:
        return plan_run(config, inputs.owners, inputs.gamma, inputs.files)
    plan = plan_run(config, inputs.owners, inputs.gamma, inputs.files, held["records"])
    return dataclasses.replace(plan, normalise_skipped=held["normalise_skipped"])


def _journaled_state(journal_dir: Path) -> str | None:
    """The state of the journal snapshot in ``journal_dir`` (None: none, or unreadable)."""
    try:
        state = json.loads((journal_dir / "journal.json").read_text(encoding="utf-8"))["state"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(state)


def _finished_outcome(out: Path) -> MarketOutcome | None:
    """A run whose outputs are all written (report.json is written last: actors/run/report.py):
    its reports, exit 0, nothing run again; None when ``out`` holds no finished run."""
    if not finished_report(out):  # none, or a stopped run's (exit 3): resume continues
        return None
    try:
        public = json.loads((out / PUBLIC_REPORT).read_text(encoding="utf-8"))
        consumer = json.loads((out / CONSUMER_REPORT).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{out}: a report of the finished run is unreadable ({exc})") from None
    message = f"dpmarket: the run already finished; outputs in {out} (nothing run again)"
    return MarketOutcome(EXIT_OK, message, public, consumer)


def resume_market(
    out: Path,
    address: str | None = None,
    connected: Callable[[dict[str, Any]], None] | None = None,
) -> MarketOutcome:
    """Continue a refused or crashed run from ``OUT/.journal`` (no new noise for journaled
    releases; the ledger is not charged twice), with the configuration the run journaled when
    it started (``.journal/config.json``: its text and every ``--set``), never the file.

    A journal in state "done" whose outputs were never written (the driver died after the
    curator finished, or while writing them) is resumed like any other: the restored curator
    buys nothing and returns its result, and the outputs are written. A run whose report.json
    exists is finished: its reports are returned with exit 0 and nothing runs again."""
    journal_dir = Path(out) / JOURNAL_DIR
    if (finished := _finished_outcome(Path(out))) is not None:
        return finished
    if (Path(out) / "requests.json").exists():  # [[requests]] (actors/run/requests.py)
        raise ConfigError(
            f"{out}: a run of [[requests]]: run its config again with --out {out} (the "
            "complete requests are not bought again)"
        )
    try:
        snapshot = json.loads((journal_dir / "journal.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        if (journal_dir / CONFIG_FILE).is_file():  # stopped before the curator's first snapshot
            raise ConfigError(
                f"{out}: the run stopped before its first journal snapshot: nothing was "
                f"released or bought; run it again with --out {out}"
            ) from None
        raise ConfigError(f"{out}: no resumable journal (no {journal_dir}/journal.json)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{out}: no resumable journal ({exc})") from None
    if (snapshot.get("refusal") or {}).get("before_start"):
        raise ConfigError(f"{out}: refused in a secure-sum phase before summarising; run again")
    pool = snapshot.get("pool") or {}
    if "count" in pool and "rows" not in pool:  # the rows live in the append-only pool file
        held = len(read_pool_rows(pool_file(journal_dir / "journal.json")))
        if held < int(pool["count"]):
            raise ConfigError(
                f"{out}: the journal covers {pool['count']} purchased points but its pool file "
                f"holds {held}; cannot resume without them"
            )
    # the run's own configuration, every --set included, never the file again; exit 2 if an
    # input file changed in a way that would change a release (actors/config/journaled.py)
    config = restore_config(journal_dir)
    # the simulated faults already happened; colluders still collude
    resumed = dataclasses.replace(config, faults=FaultConfig(colluders=config.faults.colluders))
    return run_market(resumed, out, address, snapshot=snapshot, connected=connected)

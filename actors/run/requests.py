"""Several consumers' requests, one after the other, on the same owner actors (``[[requests]]``).

``dpmarket run CONFIG`` with ``[[requests]]`` (actors/config/requests.py) comes here from
``run_market``. Before Ray starts, every request's inputs are checked and its plan printed
(each one may be refused by ``--strict``). Then the owner actors are spawned once and start
ingesting once; their tailers keep reading the growing files for the whole run. Each request
in turn, after every owner has read its files to their current end:

1. the operator's secure-sum session of the request (fresh node keys, round plan) and the
   consumer's store charged for the validation release (refused there: exit 3 for it, the
   owners untouched);
2. ``begin_request`` on every owner actor, called by the driver directly (the operator, never
   a curator): a fresh summary party holding every record taken in so far, the request's
   trust anchors and, per owner with a store, a gate on the same store under a new ledger run
   (actors/budgets/gate.py); so every owner's filter decides over the charges of all earlier
   requests, and an owner whose cap does not admit a release declines it (counted against T);
3. a new curator (run ``RUN.NAME``, its journal in ``OUT/requests/NAME/.journal``) and compute
   nodes, the purchase itself (``purchase`` in actors/run/market.py), both killed after it;
4. its outputs in ``OUT/requests/NAME`` exactly as a single run writes them in ``OUT``; a
   refused request writes its stopped report.json (what happened, who was absent, what each
   owner paid) and the next request still runs.

Running the config again into the same ``OUT`` (after a crash, or to retry refused requests)
buys only the requests not complete there; the complete ones keep their outputs and index
entries and are not charged again. A request interrupted by a crash is bought afresh: what it
had charged stays in the stores (an over-count, never an under-count).

``OUT/requests.json`` (public) lists each request's state, exit code and message, the owner
actors' Ray ids (of the latest run into OUT) and each request's owner processes. Exit code: 3
if any request was refused, else 0.
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
from dpmarket.actors.config.market import ConfigError, MarketConfig
from dpmarket.actors.config.validate import check_inputs, resolve_out
from dpmarket.actors.parties.faults import FaultPlan
from dpmarket.actors.remote.handles import is_remote
from dpmarket.actors.run.budgets import consumer_refusal, ledger_run_id, owner_gates
from dpmarket.actors.run.ingest import file_inputs, wait_for_ingest
from dpmarket.actors.run.market import market_inputs, purchase
from dpmarket.actors.run.outcome import (
    EXIT_OK,
    EXIT_REFUSED,
    JOURNAL_DIR,
    MarketInputs,
    MarketOutcome,
    market_outcome,
)
from dpmarket.actors.run.phases import gather_alive, prepare_secure, spawn_local_nodes
from dpmarket.actors.run.preflight import RunPlan, plan_run
from dpmarket.actors.run.remote import RemoteParties, finish_remote, offer_purchase, start_remote
from dpmarket.actors.run.spawn import RayMarket, curator_spawner, spawn_owners, unique_actors
from dpmarket.actors.run.stopped import finished_report

__all__ = ["INDEX", "run_requests"]

INDEX = "requests.json"


def _request_inputs(
    config: MarketConfig, base: MarketInputs, headers: dict[str, bool], rejects_dir: Path
) -> MarketInputs:
    """A request's inputs: the owners' side shared (``base``), the consumer's files its own."""
    if config.source != "files":
        return base  # a simulated source draws one validation set for every request
    f = file_inputs(config, headers, rejects_dir)
    owners = dataclasses.replace(
        base.owners, validation=f.owners.validation, seed_set=f.owners.seed_set
    )
    return dataclasses.replace(base, owners=owners, gamma=f.gamma, consumer_rejects=f.rejects)


def run_requests(
    config: MarketConfig,
    out: Path | None = None,
    address: str | None = None,
    before_start: Callable[[RunPlan], None] | None = None,
    connected: Callable[[dict[str, Any]], None] | None = None,
) -> MarketOutcome:
    """Buy every request of ``config`` in order (module docstring); outputs in ``out``."""
    out = resolve_out(config, out)
    earlier = _earlier(config, out)
    todo = [r for r in config.requests if r.name not in earlier]
    index: dict[str, Any] = {"schema": 1, "market": config.name, "owner_actors": {}}
    index["requests"] = [earlier[r.name] for r in config.requests if r.name in earlier]
    outcomes = {
        name: MarketOutcome(EXIT_OK, "complete in an earlier run into OUT: not bought again", None)
        for name in earlier
    }
    if not todo:
        return _summary(out, outcomes)
    configs = [config.for_request(r) for r in todo]
    headers: dict[str, bool] = {}
    for c in configs:  # every request's files, before Ray starts
        headers |= check_inputs(c).headers if c.source == "files" else {}
    ingest = out / ".ingest"
    attempt_dir = ingest / f"attempt-{len(list(ingest.glob('attempt-*')))}"
    base = market_inputs(configs[0], out, headers, attempt_dir)
    inputs, plans = [], []
    for r, c in zip(todo, configs, strict=True):
        own = _request_inputs(c, base, headers, out / "requests" / r.name / ".ingest")
        plan = plan_run(c, own.owners, own.gamma, own.files)
        if before_start is not None:
            print(f"request {r.name}:")
            before_start(plan)
        inputs.append(own)
        plans.append(plan)
    ray_info = connect(address)
    if connected is not None:
        connected(ray_info)
    require_placeable(config.placement)
    remote = start_remote(config)  # agents dial in once; each request is offered to them
    stand_ins: dict[str, Any] = dict(remote.owners) if remote is not None else {}
    local = dataclasses.replace(
        base.owners, owners={o: v for o, v in base.owners.owners.items() if o not in stand_ins}
    )
    owners = spawn_owners(
        local, None, config.noise, FaultPlan(), config.name, config.placement,
        config.owners_per_actor,
    ) if local.owners else {}  # fmt: skip
    index["owner_actors"] = {o: h._actor_id.hex() for o, h in owners.items()}  # this run's
    owners = {o: owners[o] if o in owners else stand_ins[o] for o in base.owners.owners}
    finished = False
    try:
        _start_ingest(owners, base, config, attempt_dir)
        for r, c, own, plan in zip(todo, configs, inputs, plans, strict=True):
            where = out / "requests" / r.name
            outcome, pids = _one_request(c, own, plan, owners, where, ray_info, attempt_dir, remote)
            outcome.rejects |= {
                key: (n, str(out / "requests" / r.name / ".ingest" / key / "rejects.jsonl"))
                for key, n in own.consumer_rejects.items()
            }
            outcomes[r.name] = outcome
            index["requests"].append(
                {
                    "name": r.name,
                    "run": c.name,
                    "state": "complete" if outcome.exit_code == EXIT_OK else "refused",
                    "exit_code": outcome.exit_code,
                    "message": outcome.message,
                    "outputs": f"requests/{r.name}",
                    "owner_pids": pids,
                }
            )
            (out / INDEX).write_text(json.dumps(index, indent=2), encoding="utf-8")
        finished = True
    finally:
        if base.writer is not None:
            base.writer.stop()
        for handle in unique_actors(owners):
            _kill(handle)
        finish_remote(remote, finished, "every request bought" if finished else "stopped")
    return _summary(out, outcomes)


def _earlier(config: MarketConfig, out: Path) -> dict[str, dict[str, Any]]:
    """The requests of ``config`` that an earlier run into ``out`` completed (their index
    entries): they are not bought again. A single run's outputs in ``out`` are refused."""
    if finished_report(out):
        raise ConfigError(f"{out}: already holds a finished run (report.json); choose --out")
    try:
        entries = json.loads((out / INDEX).read_text(encoding="utf-8"))["requests"]
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{out / INDEX}: unreadable ({exc}); choose --out") from None
    names = {r.name for r in config.requests}
    return {
        e["name"]: e
        for e in entries
        if e.get("name") in names
        and e.get("state") == "complete"
        and (out / "requests" / e["name"] / "report.json").exists()
    }


def _summary(out: Path, outcomes: dict[str, MarketOutcome]) -> MarketOutcome:
    refused = [n for n, o in outcomes.items() if o.exit_code != EXIT_OK]
    lines = [f"  {n}: {o.message.removeprefix('dpmarket: ')}" for n, o in outcomes.items()]
    head = (
        f"dpmarket: {len(refused)} of {len(outcomes)} requests refused ({', '.join(refused)})"
        if refused
        else f"dpmarket: {len(outcomes)} requests complete"
    )
    return MarketOutcome(
        EXIT_REFUSED if refused else EXIT_OK,
        "\n".join([f"{head}; outputs in {out}/requests/NAME, index {out / INDEX}", *lines]),
        None,
        requests=outcomes,
    )


def _kill(handle: Any) -> None:
    import ray

    if not is_remote(handle):  # a stand-in's agent is told by the gateway
        ray.kill(handle)


def _start_ingest(
    owners: dict[str, Any], base: MarketInputs, config: MarketConfig, attempt_dir: Path
) -> None:
    """Owners' files readable on their nodes, every actor's dpmarket the driver's (or exit 2);
    then the tailers start, once for every request, and a simulated stream starts writing."""
    import ray

    local = {o: h for o, h in owners.items() if not is_remote(h)}
    preflight_owners(local, base.files or {}, config.placement)
    if base.files is not None and base.schema is not None:
        ray.get(
            [
                owners[o].start_ingest.remote(
                    o, paths, base.schema, str(attempt_dir / o), headers=base.headers
                )
                for o, paths in base.files.items()
            ]
        )
        wait_for_ingest(owners)
    if base.writer is not None:
        base.writer.start()


def _one_request(
    config: MarketConfig,
    inputs: MarketInputs,
    plan: RunPlan,
    owners: dict[str, Any],
    out: Path,
    ray_info: dict[str, Any],
    attempt_dir: Path,
    remote: RemoteParties | None = None,
) -> tuple[MarketOutcome, dict[str, int]]:
    """One request on the running owner actors (module docstring, steps 1-4); remote owners
    are offered it (actors/run/remote.py) and decide by their own policies."""

    journal_dir = out / JOURNAL_DIR
    journal_dir.mkdir(parents=True, exist_ok=True)
    ledger_run = ledger_run_id(journal_dir, True, config)
    params, tick = plan.params, time.perf_counter()
    prep = prepare_secure(
        config, inputs.owners, inputs.gamma, params, None,
        remote.node_keys if remote is not None else None, plan.normalise_skipped,
    )  # fmt: skip
    pids: dict[str, int] = {}
    if (declined := consumer_refusal(config, params, ledger_run)) is not None:
        payload: Any = declined
    else:
        gates = owner_gates(config, params, ledger_run) or {}
        handles = [h for h in unique_actors(owners) if not is_remote(h)]
        replies = gather_alive(  # an owner actor lost earlier is absent (counts against T)
            [
                h.begin_request.remote(
                    config.name,
                    config.noise,
                    None if prep is None else prep.trust,
                    {n: g for n, g in gates.items() if owners[n] is h},
                    params.profile_floor,
                )
                for h in handles
            ]
        )
        pids = {o: reply["pid"] for h, reply in zip(handles, replies, strict=True)
                for o in owners if owners[o] is h and reply is not None}  # fmt: skip
        journal = journal_dir / "journal.json"
        spawn = curator_spawner(config.name, inputs.owners, params, config.noise, str(journal))
        if remote is not None:  # remote owners start reading with their first purchase
            offer_purchase(remote, config, params, prep, inputs.schema, ledger_run)
        if inputs.files is not None:
            wait_for_ingest(owners)  # every owner has read its files to their current end
        market = RayMarket(owners, spawn(None), spawn, run_id=config.name)
        market.compute_nodes = spawn_local_nodes(prep, config.name)  # beside the curator's
        if remote is not None:
            market.remote_nodes = dict(remote.nodes)
        try:
            preflight_owners({"curator": market.curator}, {}, {})
            payload = purchase(
                config, inputs.owners, market, prep, FaultPlan(), journal, None, ledger_run
            )
            if remote is not None and isinstance(payload, dict):
                payload["remote"] = remote.public()
        finally:  # the owners stay for the next request
            for handle in [market.curator, *market.compute_nodes.values()]:
                _kill(handle)
    timings = {"ingest_and_summarise": time.perf_counter() - tick}
    if payload["state"] == "refused":  # its stopped report (actors/run/stopped.py) in its OUT
        print(f"dpmarket: request {config.name}: refused: {payload['reason']}", file=sys.stderr)
        stopped = market_outcome(config, out, inputs, payload, ray_info, timings, attempt_dir)
        return MarketOutcome(EXIT_REFUSED, f"refused: {payload['reason']}", stopped.report), pids
    return market_outcome(config, out, inputs, payload, ray_info, timings, attempt_dir), pids

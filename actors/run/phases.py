"""The secure-sum phases of a market run (actors/run/market.py drives them before the epochs).

The operator's side of the DCA: the session and the compute nodes' keys, made before any owner
actor is spawned (each node's key handed to its actor only; its fingerprint given to the owner
actors at construction, owners' keys pinned at the nodes directly, never through the curator
that relays), the normalise and scan rounds through the curator's hub (actors/parties/dca.py),
and the standardisation h1 uses afterwards (post-processing of the normalise release).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpmarket.actors.config.market import MarketConfig
from dpmarket.actors.parties.dca import ask_owners, error_line, owner_answers
from dpmarket.actors.parties.dcaowner import OperatorTrust
from dpmarket.actors.parties.faults import FaultPlan
from dpmarket.actors.parties.securephase_journal import journaled_summary, secure_resumable
from dpmarket.actors.remote.handles import is_remote
from dpmarket.actors.run.preflight import expected_records
from dpmarket.actors.run.spawn import OwnerInputs, RayMarket, actor_options, unique_actors
from dpmarket.protocol.privacy.ledger import record_relation
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.securesum.spec import DcaConfig
from dpmarket.protocol.summary.params import CuratorParams
from dpmarket.protocol.summary.snr import contribution_sensitivity, standardisation_verdict
from dpmarket.protocol.summary.standardise import Standardisation, standardisation

__all__ = [
    "MAX_CURATOR_RESTARTS",
    "SecurePrep",
    "curator_lost",
    "prepare_secure",
    "progress",
    "respawn_curator",
    "secure_phases",
    "spawn_local_nodes",
    "standardisation_of",
    "standardize",
    "summarise",
]

MAX_CURATOR_RESTARTS = 3  # a curator lost more often than this refuses the run (exit 3)


def progress(line: str) -> None:
    print(f"\r{line:<78}", end="", file=sys.stderr, flush=True)


@dataclass
class SecurePrep:
    """The operator's secure-sum set-up, made before any owner actor exists: the session's
    configuration, each compute node's private key (kept here until its actor is spawned), the
    trust anchors every owner actor gets at construction, and the rounds' public parameters."""

    config: DcaConfig
    node_keys: dict[str, bytes]  # node -> raw X25519 private key (the operator's only)
    trust: OperatorTrust
    plan: dict[str, Any]


def prepare_secure(
    config: MarketConfig,
    inputs: OwnerInputs,
    gamma: float,
    params: CuratorParams,
    snapshot: Any,
    remote_nodes: dict[str, bytes | None] | None = None,
    normalise_skipped: str | None = None,
) -> SecurePrep | None:
    """The secure-sum session of a run, from the public config alone (None when the secure
    phases are off or the resumed journal holds them finished:
    actors/parties/securephase_journal.py;
    a journal written during them gets a new session for the rounds still to run). Each
    node's X25519 key is made here, by the operator;
    its SHA-256 fingerprint goes into the trust anchors handed to the owners when they are
    spawned (never through the curator, which relays the keys), with the round plan
    (protocol/securesum/plan.py: normalise and scan once each, at most one refresh per
    ``refresh_every`` epochs of the longest run ``params`` allows, each at its calibrated
    sigma or more) and the simulated colluders' behaviour (``[faults].colluders``).

    Relation: every round is planned under the run's one relation, ``params.neighbouring``
    (protocol/summary/releases.py), the one the summary releases, allocate-select and the
    auction are charged under: the L2 sensitivities are protocol/summary/snr.py's
    ``contribution_sensitivity`` for it (the function each remote owner prices the offered rounds
    with), sigma is calibrated to each
    round's (eps, delta) at that sensitivity (so the per-round epsilon is as configured), and
    the plan's relation is what the owners' and nodes' checks compare and what every ledger
    (the curator's, the owners' stores) records for a round.

    ``remote_nodes``: the remote compute nodes (actors/run/remote.py) and the public key each
    one gave over its authenticated stream (None: it never joined; it is pinned to a key
    nobody holds, so the session cannot start without it, as with a lost local node). They
    make their own keys; the local nodes are ``compute-1 ..`` for the rest of
    ``compute_nodes``.

    ``normalise_skipped``: the plan's line when it predicts the normalise release would be
    discarded (actors/run/preflight.py ``discarded_normalise``, from public numbers only): the
    round is left out of the plan, so no owner or node opens it and nobody is charged for it."""
    from dpmarket.protocol.securesum.driver import _auto_frac_bits
    from dpmarket.protocol.securesum.sealing import generate_keypair, key_fingerprint

    secure = config.secure
    if not secure["enabled"] or not secure_resumable(snapshot):
        return None
    owners = list(inputs.owners)
    k = inputs.validation.shape[1]
    bound = float(config.data.get("bound", 10.0))
    n_max = float(config.data.get("n_points", 1_000_000))
    value_bound = n_max * max(1.0, bound, bound**2)
    rows, width = secure["rows"], secure["width"]
    delta, relation = config.delta, params.neighbouring
    sketch = {
        "family": "l2",
        "rows": int(rows),
        "width": int(width),
        "seed": int(config.seed),
        "bandwidth": float(secure.get("bandwidth", 1.0 / np.sqrt(gamma))),
    }
    d_sketch = int(rows * width)
    # the function a remote owner prices each offered round with (protocol/agents/policy.py)
    sens_moments = contribution_sensitivity(
        "moments", 2 * k + 1, {"bound": bound}, k, neighbouring=relation
    )
    sens_sketch = contribution_sensitivity("sketch", d_sketch, sketch, k, neighbouring=relation)
    frac = min(
        _auto_frac_bits(len(owners), d, eps, delta, sens, value_bound, config.tolerance, "analytic")
        for d, eps, sens in (
            (2 * k + 1, secure["eps_normalise"], sens_moments),
            (rows * width, secure["eps_scan"], sens_sketch),
            (rows * width, secure["eps_refresh"], sens_sketch),
        )
    )
    remote_nodes = remote_nodes or {}
    local_nodes = tuple(f"compute-{i + 1}" for i in range(config.compute_nodes - len(remote_nodes)))
    nodes = local_nodes + tuple(remote_nodes)
    dca = DcaConfig(
        f"{config.name}-dca",
        tuple(owners),
        nodes,
        tolerance=config.tolerance,
        bound=value_bound,
        frac_bits=frac,
        shares=config.dca_shares,
        colluders=tuple(config.faults.colluders),  # they count against T in every round
    )
    node_keys, pins = {}, {}
    for name in local_nodes:
        private, public = generate_keypair()
        node_keys[name], pins[name] = private.private_bytes_raw(), key_fingerprint(public)
    for name, public_key in remote_nodes.items():  # an absent node: a key nobody holds
        pins[name] = key_fingerprint(public_key or generate_keypair()[1])
    epochs = params.epoch_limit + params.explore_epochs(len(owners))
    every = int(secure["refresh_every"])
    refreshes = epochs // every + 1 if every > 0 else 0
    planned: dict[str, tuple[str, int, float, float, int, dict[str, Any]]] = {
        "normalise": (
            "moments",
            2 * k + 1,
            float(secure["eps_normalise"]),
            sens_moments,
            1,
            {"bound": bound},
        ),
        "scan": ("sketch", d_sketch, float(secure["eps_scan"]), sens_sketch, 1, sketch),
    }
    if normalise_skipped is not None:  # not planned: never opened, never charged
        del planned["normalise"]
    if refreshes:
        eps = float(secure["eps_refresh"])
        planned["refresh"] = ("sketch_delta", d_sketch, eps, sens_sketch, refreshes, sketch)
    rounds = SecureSumPlan.calibrated(
        dca,
        delta,
        planned,
        neighbouring=record_relation(relation),
        per_round={"refresh": ("base_rounds",)},  # which records a delta covers
    )
    plan = {
        "config": dca,
        "rounds": rounds,
        "n_features": k,
        "refresh_every": every,
        "timeout": max(2.0, config.deadline_seconds),
        "sketch": sketch,
        "neighbouring": record_relation(relation),  # every round's, as the plan's
        "normalise_skipped": normalise_skipped,
    }
    behaviours = {o: "withhold" for o in config.faults.colluders}  # a simulated fault
    return SecurePrep(dca, node_keys, OperatorTrust(dca, pins, rounds, behaviours), plan)


def secure_phases(
    config: MarketConfig,
    prep: SecurePrep | None,
    market: RayMarket,
    snapshot: Any,
    journal: Path | None = None,
    timings: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Spawn the compute nodes and run normalise + scan through the curator's hub; with
    ``[privacy].refresh_every`` the nodes stay up for the refresh rounds
    (actors/parties/refresh.py). ``timings`` receives the seconds of the nodes' spawn with the
    owners' keys (``secure_nodes``) and of the owners' warm-up (``warm_up``: any records not yet
    hashed for the plan's sketches, normally none).

    A curator actor lost during them (``RayActorError``: killed, crashed) is respawned from
    ``journal`` up to MAX_CURATOR_RESTARTS times and continues the same session: rounds it
    journaled are reused, an opened one is charged once and not run again
    (actors/parties/securephase_journal.py)."""
    import ray

    if prep is None:
        if (done := journaled_summary(snapshot)) is not None:
            return done | {"resumed": "journaled before the driver restarted"}
        if not config.secure["enabled"]:  # the operator's explicit choice, said out loud
            print(
                "dpmarket: WARNING: secure phases off ([privacy].secure_phases = false): no "
                "normalise, scan or standardisation in this run",
                file=sys.stderr,
            )
            return {"skipped": "disabled ([privacy].secure_phases = false)"}
        return {"skipped": "resumed run"}
    timings = {} if timings is None else timings
    tick = time.perf_counter()
    handles = spawn_nodes(prep, market)
    timings["secure_nodes"] = time.perf_counter() - tick
    for name in config.faults.kill_compute:  # simulated compute-node crash
        if name in handles and not is_remote(handles[name]):
            ray.kill(handles[name], no_restart=True)
    progress("owners: warming up")
    tick = time.perf_counter()
    gather_alive([h.warm_up.remote() for h in unique_actors(market.owners)])
    timings["warm_up"] = time.perf_counter() - tick
    progress("secure sums: normalise and scan")
    market.compute_nodes = handles  # killed with the market
    restarts, session_ready = 0, False
    while True:
        call = market.curator.secure_phases.remote(handles, market.owners, prep.plan, session_ready)
        try:
            result: dict[str, Any] = ray.get(call)
            break
        except ray.exceptions.RayActorError:
            if restarts >= MAX_CURATOR_RESTARTS:
                return {"refused": curator_lost(restarts, journal)}
            progress("curator lost in the secure sums: respawning it")
            session_ready = respawn_curator(market, journal, snapshot)
            restarts += 1
    result["curator_restarts"] = restarts
    if not config.secure["refresh_every"]:  # no refresh rounds later: the nodes can go now
        for handle in handles.values():
            if not is_remote(handle):
                ray.kill(handle)
        market.compute_nodes = {}
    print(file=sys.stderr)
    return result


def respawn_curator(market: RayMarket, journal: Path | None, snapshot: Any) -> bool:
    """Replace a lost curator actor: from its journal when this run's curator wrote one, else
    from the snapshot the run started from (a fresh curator for a fresh run). No journal
    written by this run means the lost curator never opened a secure-sum session and released
    nothing: nothing is charged twice and nothing is lost. True when the respawned curator
    continues a session the owners and compute nodes already hold."""
    current = None
    if journal is not None and journal.exists():
        current = json.loads(journal.read_text(encoding="utf-8"))
    ready = current is not None and current != snapshot  # journaled by this driver's curator
    market.curator = market.spawn_curator(current if current is not None else snapshot)
    return ready


def curator_lost(restarts: int, journal: Path | None) -> dict[str, Any]:
    """The refused payload of a run whose curator actor was lost more than
    MAX_CURATOR_RESTARTS times (exit 3; resumable when it journaled anything)."""
    journaled = journal is not None and journal.exists()
    return {
        "state": "refused",
        "reason": f"the curator actor was lost {restarts + 1} times (its node or process fails)",
        "refusal": {"before_start": not journaled, "curator_lost": restarts + 1},
    }


def gather_alive(calls: list[Any]) -> list[Any]:
    """``ray.get`` of each call, None for one whose actor died (``RayActorError``): an owner
    lost before the secure sums is absent from their rounds, and the rounds' T-tolerance
    decides (actors/parties/dca.py), not an exception here."""
    import ray

    out: list[Any] = []
    for call in calls:
        try:
            out.append(ray.get(call))
        except ray.exceptions.RayActorError:
            out.append(None)
    return out


def spawn_local_nodes(prep: SecurePrep | None, run_id: str) -> dict[str, Any]:
    """The local compute nodes' actors, asked for with the owners' (their start-up overlaps
    the owners' and the ingest): each gets its private key (made in :func:`prepare_secure`)
    now, and the owners' keys and the round plan later, once, from the driver
    (:func:`spawn_nodes`, ``ComputeNodeHost.begin``), before the curator holds any handle of
    them. Until then a node takes part in nothing. None of them without a session (``prep``
    None) or where every node is remote."""
    from dpmarket.actors.parties.ray_actors import ComputeNodeActor

    if prep is None:
        return {}
    return {
        name: ComputeNodeActor.options(**actor_options(run_id, name)).remote(
            prep.config, name, prep.node_keys[name], await_session=True
        )
        for name in prep.config.nodes
        if name in prep.node_keys
    }


def spawn_nodes(prep: SecurePrep, market: RayMarket) -> dict[str, Any]:
    """Each local compute node's actor (spawned with the owners, :func:`spawn_local_nodes`,
    or now) gets the owners' public keys, which the operator asks the owners for directly
    (never through the curator): a registration under another key is refused at the node;
    and the round plan, so a node opens no round below the plan's sigma floor or beyond its
    count. Remote nodes get the same in their ``begin``, with each remote owner's proof."""

    import ray

    from dpmarket.actors.cluster.placement import preflight_owners
    from dpmarket.protocol.securesum.sealing import generate_keypair

    owners, dca = market.owners, prep.config
    asked = ask_owners({o: owners[o] for o in dca.clients}, "dca_identity", lambda o: ())
    known: dict[str, Any] = {}  # one call per owner host; an owner that failed is absent
    for (_, names), answer in zip(asked, gather_alive([r for r, _ in asked]), strict=True):
        if answer is not None:
            known.update(owner_answers(names, answer)[0])
    answers = [known.get(o) for o in dca.clients]
    # a remote owner answers with its key signed by its TLS key (actors/remote/owneragent.py):
    # its remote nodes check the proof themselves, so the market cannot swap the key
    proofs = {o: a for o, a in zip(dca.clients, answers, strict=True) if isinstance(a, dict)}
    publics = [a["key"] if isinstance(a, dict) else a for a in answers]
    # an owner whose actor died before it answered is pinned to a key nobody holds (its
    # private half is dropped here): it cannot register, so it is absent from every round
    client_keys = {
        o: key if key is not None else generate_keypair()[1]
        for o, key in zip(dca.clients, publics, strict=True)
    }
    nodes = {n: h for n, h in market.compute_nodes.items() if not is_remote(h)}
    nodes = nodes or spawn_local_nodes(prep, market.run_id)
    preflight_owners(nodes, {}, {})  # each runs the driver's dpmarket, or refused by name
    ray.get([h.begin.remote(client_keys, prep.trust.plan) for h in nodes.values()])
    for name, handle in market.remote_nodes.items():  # its own key; the session, keys, plan
        try:
            ray.get(handle.begin.remote(dca, client_keys, prep.trust.plan, proofs))
        except ray.exceptions.RayTaskError as exc:  # absent: the session cannot start
            print(f"dpmarket: {name}: no session ({error_line(exc)})", file=sys.stderr)
        nodes[name] = handle
    return {name: nodes[name] for name in dca.nodes}


def standardize(
    config: MarketConfig, inputs: OwnerInputs, market: RayMarket, secure: Any, snapshot: Any
) -> dict[str, Any]:
    """Standardise the features h1 hashes with the normalise round's DP means and spreads.

    Post-processing of a release every owner was already charged for (and of the public seed
    set and bound: no privacy cost), skipped (with the reason) when the released DP count is
    below 3 sigma of its noise (protocol/summary/snr.py). Then per feature
    (protocol/summary/standardise.py): a spread whose DP variance is not 3 standard errors of
    its own noise above zero keeps the public scale (1, as with ``standardize = false``), and
    no scale falls below a tenth of the seed set's spread, so the kernel width, the median
    heuristic on the public seed set in standardised units unless the config fixes
    ``[data].gamma``, cannot collapse. The per-feature decisions go to the public report.
    """
    import ray

    normalise = secure.get("normalise", {}) if isinstance(secure, dict) else {}
    if snapshot is not None and snapshot.get("state") != "new":
        return {"applied": False, "reason": "resumed run: the journal holds the standardisation"}
    if not config.secure["standardize"] or normalise.get("status") != "released":
        reason = "disabled" if not config.secure["standardize"] else "no normalise release"
        if normalise.get("status") == "skipped":
            reason = f"no normalise round: {normalise['reason']}"
        return {"applied": False, "reason": reason}
    useful, why = standardisation_verdict(float(normalise["count"]), float(normalise["sigma"]))
    if not useful:  # decided from the DP release alone (post-processing)
        print(f"dpmarket: WARNING: standardisation skipped: {why}", file=sys.stderr)
        return {"applied": False, "reason": why}
    bound = float(config.data.get("bound", 10.0))
    records = expected_records(
        inputs, config.data.get("files") if config.source == "files" else None
    )
    result = standardisation_of(
        normalise, bound, inputs.seed_set, config.data.get("gamma"), records
    )
    ray.get(
        market.curator.standardize.remote(list(result.center), list(result.scale), result.gamma)
    )
    return {"applied": True} | result.report()


def standardisation_of(
    normalise: dict[str, Any], bound: float, seed_set: Any, gamma: Any, records: float = 0.0
) -> Standardisation:
    """The per-feature standardisation from a released normalise summary (``moments_summary``)
    and the public seed set; ``gamma`` (the config's ``[data].gamma``) fixes the kernel width;
    ``records`` the public pool size the plan read (0: the DP count decides)."""
    return standardisation(
        normalise["mean"],
        normalise["std"],
        max(float(normalise["count"]), 1.0),
        float(normalise["sigma"]),
        bound,
        seed_set,
        None if gamma is None else float(gamma),
        records or None,
    )


def summarise(
    config: MarketConfig, market: RayMarket, plan: FaultPlan, journal: Path, snapshot: Any
) -> Any:
    """The summary phase: the curator's epochs, with a crashed curator respawned from its
    journal (at most MAX_CURATOR_RESTARTS times); the curator's payload."""
    import ray

    # a simulated curator crash happens inside the curator's process at that epoch (exactly
    # there, however fast the epochs run); a real one anywhere. Both resume from the journal.
    # A journal from before the epochs (state "new") is a run that never reached them.
    fresh = snapshot is None or snapshot.get("state") == "new"
    crash_at = config.faults.kill_curator_at if fresh else None
    run_ref = market.curator.run.remote(market.owners, plan, crash_at)
    restarts = 0
    try:
        while True:
            ready, _ = ray.wait([run_ref], timeout=0.25)
            if ready:
                try:
                    payload: dict[str, Any] = ray.get(run_ref)
                    payload["curator_restarts"] = restarts
                    return payload
                except ray.exceptions.RayActorError:
                    if restarts >= MAX_CURATOR_RESTARTS:
                        return curator_lost(restarts, journal)
                    progress("curator lost: resuming from its journal")
                    respawn_curator(market, journal, snapshot)
                    run_ref = market.curator.run.remote(market.owners, plan)
                    restarts += 1
                    continue
            try:
                status = ray.get(market.curator.progress.remote())
            except ray.exceptions.RayActorError:
                continue  # the run call reports the loss
            progress(
                f"epoch {status['epoch']:>5}  summary {status['summary_size']:>5}/"
                f"{config.summary_size}  lost {len(status['lost'])}  "
                f"absent {len(status.get('absent', []))}"
            )
    finally:
        print(file=sys.stderr)

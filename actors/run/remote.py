"""The driver's side of remote parties: the gateway, the joins, the offers, the end.

With ``[remote]`` (actors/config/remote.py) the driver starts the gateway actor on its own node
(actors/remote/gateway.py) before anything else of the run exists, and waits up to
``join_deadline`` for every declared agent. A remote compute node's public key is asked over its
authenticated stream (``public_key``) and its fingerprint pinned for the local owners (the
operator is their operator); remote owners pin the nodes from their own configurations. Then
every remote owner gets the purchase's offer (``begin``: the session, its round plan, the
curator's public parameters, the schema and the ledger run) and decides by its own policy; a
party that did not join or declined is a lost party: absent from every round, silent in the
epochs, counted against T. When the run ends every agent is told (``agent.end``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from dpmarket.actors.config.inputs import MarketConfig
from dpmarket.actors.parties.dca import error_line
from dpmarket.actors.remote.handles import RemoteHandle
from dpmarket.actors.remote.tls import load_pem
from dpmarket.actors.run.refusals import RefusalWatch
from dpmarket.actors.run.spawn import actor_options
from dpmarket.protocol.agents.records import record
from dpmarket.streams.records.files import Schema

__all__ = [
    "RemoteParties",
    "finish_remote",
    "join_shortfall",
    "offer_purchase",
    "start_remote",
]


@dataclass
class RemoteParties:
    """A market's remote parties as the run sees them: the gateway and a stand-in each."""

    gateway: Any
    market: str = ""  # the market's name the agents joined ([run].name)
    owners: dict[str, RemoteHandle] = field(default_factory=dict)
    nodes: dict[str, RemoteHandle] = field(default_factory=dict)
    node_keys: dict[str, bytes | None] = field(default_factory=dict)  # None: not joined
    joined: dict[str, bool] = field(default_factory=dict)
    declined: dict[str, str] = field(default_factory=dict)
    watch: RefusalWatch | None = None  # prints the gateway's refusals while the run goes on
    refusals: list[dict[str, Any]] = field(default_factory=list)  # kinds and counts, at the end
    rejoined: list[dict[str, Any]] = field(default_factory=list)  # parties that dialled in again

    def collect(self) -> None:
        """Every kind of refusal so far with its count (the watch goes on: a run of
        ``[[requests]]`` reports each request)."""
        if self.watch is not None:
            self.watch.poll(force=True)
            self._take(self.watch)

    def _take(self, watch: RefusalWatch) -> None:
        self.refusals, self.rejoined = watch.lines.entries(), watch.lines.entries(rejoined=True)

    def stop_watching(self) -> None:
        if self.watch is not None:
            self.watch.stop()
            self._take(self.watch)
            self.watch = None

    def public(self) -> dict[str, Any]:
        """For report.json: who joined, who declined and why, who never came (participation
        is seen by every party anyway: README, "Across organisations"), and each refused or
        replaced connection with its count (actors/run/refusals.py)."""
        self.collect()
        public: dict[str, Any] = {
            "owners": sorted(self.owners),
            "nodes": sorted(self.nodes),
            "absent": sorted(p for p, ok in self.joined.items() if not ok),
            "declined": dict(sorted(self.declined.items())),
        }
        if self.refusals:  # an optional key: present when a connection was refused or replaced
            public["refusals"] = list(self.refusals)
        if self.rejoined:  # an optional key: a party dialled in again after its stream ended
            public["rejoined"] = {e["claimed"]: e["count"] for e in self.rejoined}
        return public


def start_remote(config: MarketConfig) -> RemoteParties | None:
    """Start the gateway and wait for the declared agents (module docstring)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from dpmarket.actors.remote.gateway import GatewayActor

    remote = config.remote
    if remote is None:
        return None
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    gateway: Any = GatewayActor.options(
        scheduling_strategy=here, **actor_options(config.name, "gateway")
    ).remote(
        config.name,
        remote.listen,
        load_pem(remote.certificate, "the market's certificate"),
        load_pem(remote.key, "the market's private key"),
        load_pem(remote.client_ca, "the CA of the agents' certificates"),
        remote.parties(),
        remote.call_timeout,
        config.deadline_seconds,  # a link back within the phase deadline costs nothing
    )
    port = ray.get(gateway.start.remote())
    watch = RefusalWatch(gateway).start()  # each refusal a line of this run's output
    host = remote.listen.rpartition(":")[0]
    print(
        f"dpmarket: waiting up to {remote.join_deadline:g} s for {len(remote.parties())} remote "
        f"parties at {host}:{port}",
        file=sys.stderr,
        flush=True,
    )
    joined = ray.get(gateway.joined.remote(remote.join_deadline))
    parties = RemoteParties(
        gateway,
        config.name,
        {o: RemoteHandle(gateway, o, "owner") for o in remote.owners},
        {n: RemoteHandle(gateway, n, "node") for n in remote.nodes},
        joined=joined,
        watch=watch,
    )
    absent = sorted(p for p, ok in joined.items() if not ok)
    if absent:
        print(f"dpmarket: not joined by the deadline (lost): {absent}", file=sys.stderr)
    for name, handle in parties.nodes.items():
        parties.node_keys[name] = None
        if joined.get(name):
            try:
                parties.node_keys[name] = ray.get(handle.public_key.remote())
            except ray.exceptions.RayTaskError as exc:
                print(f"dpmarket: {name}: no public key ({error_line(exc)})", file=sys.stderr)
    return parties


def offer_purchase(
    parties: RemoteParties,
    config: MarketConfig,
    params: Any,
    prep: Any,
    schema: Schema | None,
    ledger_run: str,
) -> None:
    """Offer the purchase to every remote owner; record who declined (and why): a fresh
    record for each purchase (a ``[[requests]]`` run offers each request in turn)."""
    import ray

    if not parties.owners:
        return
    offer = {
        "market": parties.market,
        "run": config.name,  # a request's run is RUN.NAME: one purchase of the market
        "params": record(params),
        "dca": None if prep is None else record(prep.config),
        "plan": None if prep is None else record(prep.trust.plan),
        "ledger_run": ledger_run,
        "schema": None if schema is None else schema_record(schema),
    }
    names = list(parties.owners)
    parties.declined = {}
    answers = ray.get([parties.owners[o].begin.remote(offer) for o in names])
    for owner, answer in zip(names, answers, strict=True):
        if not answer.get("accepted"):
            reasons = answer.get("reasons") or ["declined"]
            parties.declined[owner] = "; ".join(str(r) for r in reasons)
    for owner, why in parties.declined.items():
        print(f"dpmarket: {owner} takes no part in this purchase: {why}", file=sys.stderr)


def join_shortfall(
    parties: RemoteParties, config: MarketConfig, secure: bool
) -> dict[str, Any] | None:
    """The refused payload of a purchase that cannot release anything, decided after the
    joins and the offers and before any round opens (so nothing is released and no owner's
    store is charged; nothing to resume: the same command run again starts cleanly): more than
    T owners absent, declined or colluding, or, when the secure sums must run (``secure``), a
    remote compute node that did not join or gave no key (the DCA needs every node). None when
    the purchase can go on."""
    absent = [o for o in parties.owners if not parties.joined.get(o)]
    why = {o: "not joined by the deadline" for o in absent}
    why |= {o: f"declined: {r}" for o, r in parties.declined.items() if o not in why}
    colluders = sorted(set(config.faults.colluders) - set(why))
    missing_nodes = sorted(n for n, key in parties.node_keys.items() if key is None)
    lost = sorted(why)
    if secure and missing_nodes:
        reason = (
            f"compute nodes missing when the secure sums must start: {missing_nodes} (the "
            "secure sum needs every node)"
        )
    elif len(lost) + len(colluders) > config.tolerance:
        named = "; ".join(
            [f"{o}: {why[o]}" for o in lost] + [f"colluders {colluders}"] * bool(colluders)
        )
        reason = (
            f"{len(lost) + len(colluders)} owners cannot take part, more than T = "
            f"{config.tolerance} ({named})"
        )
    else:
        return None
    return {
        "state": "refused",
        "reason": f"refused before any release (join): {reason}; no release was made",
        "refusal": {
            "epoch": 0,
            "phase": "join",
            "lost": lost,
            "nodes": missing_nodes,
            "colluders": colluders,
            "tolerance": config.tolerance,
            "before_start": True,
        },
    }


def schema_record(schema: Schema) -> dict[str, Any]:
    return {
        "n_features": schema.n_features,
        "lower": [float(v) for v in schema.lower],
        "upper": [float(v) for v in schema.upper],
        "label_column": schema.label_column,
        "policy": schema.policy,
    }


def finish_remote(parties: RemoteParties | None, finished: bool, reason: str) -> None:
    """Tell every agent the market is over, stop the gateway."""
    import ray

    if parties is None:
        return
    parties.stop_watching()
    try:
        ray.get(parties.gateway.finish.remote(reason, finished), timeout=30)
    except (ray.exceptions.RayError, TimeoutError) as exc:
        print(f"dpmarket: the gateway did not stop cleanly ({exc})", file=sys.stderr)
    ray.kill(parties.gateway)

"""Ray transport for ``benchmarks/dca_scaling.py --ray``: the same session and rounds in actors.

The M compute nodes are the market's :class:`~dpmarket.actors.parties.compute.ComputeNodeActor`
(one Ray worker process each); clients are batched many per :class:`ClientBatch` actor (one
per ``--workers``); the driver runs the market's :class:`~dpmarket.actors.parties.dca.DcaHub`, which
hosts the aggregator and relays every frame between actors (shares stay sealed end to end).
A round is timed from the hub's open to the release, as in the process transport; the clients'
values are generated before the clock starts.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

from dpmarket.actors.cluster.connect import connect
from dpmarket.actors.parties.dca import DcaHub
from dpmarket.actors.parties.ray_actors import ComputeNodeActor
from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.securesum.client import Client
from dpmarket.protocol.securesum.spec import DcaConfig, RoundSpec
from dpmarket.protocol.wire.codec import encode

__all__ = ["ClientBatch", "RayCluster"]


@ray.remote(num_cpus=0)
class ClientBatch:
    """Many secure-sum clients in one Ray worker, in parties of at most ``party_size``.

    Speaks the owner actor's secure-sum interface (``dca_setup``, ``dca_contribute``), so the
    market's hub drives it unchanged; ``prepare`` draws the next round's values off the clock.
    """

    def __init__(self, members: tuple[str, ...], party_size: int, seed: int) -> None:
        self.members, self.party_size = members, party_size
        self.rng = np.random.default_rng(seed)
        self.parties: list[Client] = []
        self.values: dict[int, Any] = {}

    def pid(self) -> int:
        return os.getpid()

    def dca_setup(
        self,
        owner: str,
        config: DcaConfig,
        node_keys: dict[str, bytes],
    ) -> list[bytes]:
        """As the owner actor's ``dca_setup``: register every party, return the frames."""
        size = self.party_size
        self.parties = [
            Client(config, f"{owner}-{i}", node_keys, self.members[i : i + size])
            for i in range(0, len(self.members), size)
        ]
        return [encode(m) for party in self.parties for m in party.start()]

    def dca_roster(self, owner: str, attestations: dict[str, Any]) -> int:
        """The hub hands each owner its nodes' roster attestations after set-up; the batch's
        clients, whose operator is this driver, contribute without them (as local owners do)."""
        return len(attestations)

    def prepare(self, d: int) -> Any:
        """Draw the values of every party for a round at dimension d; return their sum."""
        sizes = {len(p.members) for p in self.parties}
        self.values = {n: self.rng.uniform(-1.0, 1.0, (n, d)) for n in sizes}
        return sum(self.values[len(p.members)].sum(axis=0) for p in self.parties)

    def dca_contribute(
        self, owner: str, spec: RoundSpec, what: str, options: dict[str, Any]
    ) -> list[bytes]:
        """As the owner actor's ``dca_contribute``, with the values ``prepare`` drew."""
        return [
            encode(m)
            for p in self.parties
            for m in p.contribute(spec, self.values[len(p.members)], self.rng)
        ]


class RayCluster:
    """One session over N clients on Ray: W client-batch actors, M node actors, hub here."""

    def __init__(
        self,
        n: int,
        workers: int,
        max_d: int,
        party_values: int,
        nodes: int,
        cpu_seconds: Callable[[list[int]], float],
        shares: str = "derived",
    ) -> None:
        connect(num_cpus=os.cpu_count() or 2)
        clients = tuple(f"c{i}" for i in range(n))
        names = tuple(f"compute-{k}" for k in range(nodes))
        self.cfg = DcaConfig(
            f"bench-{n}", clients, names, "aggregator", bound=1.0, frac_bits=32, shares=shares
        )
        self.node_actors = {name: ComputeNodeActor.remote(self.cfg, name) for name in names}  # type: ignore[attr-defined]
        share = math.ceil(n / workers)
        party = max(1, min(1 << 16, party_values // max_d))  # as PARTY_MEMBERS there
        self.batches = {
            f"batch-{w}": ClientBatch.remote(clients[w * share : (w + 1) * share], party, 1000 + w)  # type: ignore[attr-defined]
            for w in range(workers)
            if clients[w * share : (w + 1) * share]
        }
        handles = [*self.node_actors.values(), *self.batches.values()]
        self.pids: list[int] = ray.get([h.pid.remote() for h in handles])  # actors are up
        self.cpu_seconds = cpu_seconds
        self.loop = asyncio.new_event_loop()
        self.hub = DcaHub(self.cfg, self.node_actors, self.batches, PrivacyLedger("bench"))
        start = time.perf_counter()
        self.loop.run_until_complete(self.hub.setup())
        status = ray.get([h.status.remote() for h in self.node_actors.values()])
        self.setup_seconds = time.perf_counter() - start
        short = [s for s in status if s["registered"] != n or s["errors"]]
        if short or self.hub.errors:
            raise RuntimeError(f"session set-up failed: {short[:2]} {self.hub.errors[:2]}")
        self.rounds = 0

    def run_round(self, d: int) -> tuple[float, float, float]:
        """One round at dimension d: (seconds open -> release, CPU seconds of the driver and the
        actors' processes on this machine (not Ray's own daemons), |error| / noise sd)."""
        self.rounds += 1
        spec = self.cfg.spec(self.rounds, d, 1.0, 1e-5, math.sqrt(d), label=f"d={d}")
        truth = np.sum(ray.get([b.prepare.remote(d) for b in self.batches.values()]), axis=0)
        cpu, start = self.cpu_seconds(self.pids), time.perf_counter()
        result = self.loop.run_until_complete(self.hub.round(spec, "values", {}, 600.0))
        seconds, cpu = time.perf_counter() - start, self.cpu_seconds(self.pids) - cpu
        if not result.released or result.value is None or self.hub.errors:
            raise RuntimeError(f"round {spec.round} ended {result.status}: {result.reason}")
        noise_sd = spec.sigma_std * math.sqrt(self.cfg.n_clients / (self.cfg.n_clients - 1))
        return seconds, cpu, float(np.abs(result.value - truth).max()) / noise_sd

    def close(self) -> None:
        for handle in [*self.node_actors.values(), *self.batches.values()]:
            ray.kill(handle)
        self.loop.close()

"""Drive a whole private summarisation in-process (LoopbackTransport), plus the baselines.

The same Owner and Curator parties run here and under Ray (actors/run/spawn.py); this driver
only wires them to the loopback transport, kicks the curator off and waits until it is done.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpmarket.actors.parties.transport import FaultPlan, LoopbackTransport
from dpmarket.actors.randomness import NoiseSource
from dpmarket.protocol.summary.curator import Curator, CuratorParams, SummaryResult
from dpmarket.protocol.summary.h1 import RandomFourierFeatures
from dpmarket.protocol.summary.objective import greedy_exact, greedy_hashed, uniform_sample
from dpmarket.protocol.summary.owner import Owner
from dpmarket.streams.synthetic import Scenario

__all__ = ["Baselines", "InProcessRun", "baselines", "run_inprocess"]


@dataclass
class InProcessRun:
    """A finished in-process run: the curator's result and the transport's counters."""

    result: SummaryResult
    transport: LoopbackTransport
    owners: dict[str, Owner]


def run_inprocess(
    scenario: Scenario,
    params: CuratorParams,
    rng: np.random.Generator,
    faults: FaultPlan | None = None,
    run_id: str = "run",
    owner_noise: NoiseSource | None = None,
    noise_label: str = "",
) -> InProcessRun:
    """Run Algorithm 3 over ``scenario`` on a LoopbackTransport; return the curator's result.
    ``owner_noise`` keys the owners' own noise generators (OS entropy unless given; in a
    simulation ``noise_label`` makes the streams of distinct runs distinct)."""
    source = owner_noise or NoiseSource.secure()
    owners = {
        name: Owner(
            name,
            run_id,
            X,
            y,
            rng=source.generator(f"summary:{noise_label}:{name}"),
            profile_floor=params.profile_floor,
        )
        for name, (X, y) in zip(scenario.owner_names, scenario.owners, strict=True)
    }
    curator = Curator(run_id, list(owners), scenario.validation, scenario.seed_set, params, rng)
    transport = LoopbackTransport([curator, *owners.values()], faults=faults)
    transport.send(curator.start())
    transport.run_until(lambda: curator.done)
    return InProcessRun(curator.result(), transport, owners)


@dataclass
class Baselines:
    """Non-private reference summaries as (features, labels) plus the pool's owner index."""

    greedy: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]
    hashed_greedy: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]
    uniform: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]


def baselines(
    scenario: Scenario, p: int, d: int, gamma: float, h1_seed: int, rng: np.random.Generator
) -> Baselines:
    """Exact greedy on the kernel, greedy on h1 with exact means, and uniform p/K per owner.

    The pool's hashes are the largest array here (N x d float32; by arithmetic 287 MB at
    K = 1024 of benchmarks/owner_scale.py); they are made owner by owner once the pooled copy
    of the features is gone, so the two are never held together."""
    X = np.concatenate([X for X, _ in scenario.owners])
    y = np.concatenate([y for _, y in scenario.owners]).astype(np.float64)
    owner_of = np.concatenate(
        [np.full(len(X_k), k, dtype=np.int64) for k, (X_k, _) in enumerate(scenario.owners)]
    )
    exact = greedy_exact(X, scenario.validation, p, gamma)
    uniform = uniform_sample(owner_of, p, rng)
    greedy, sampled = (X[exact], y[exact]), (X[uniform], y[uniform])
    dim = X.shape[1]
    del X
    h1 = RandomFourierFeatures(dim, d, gamma, h1_seed)
    H = np.empty((len(y), h1.d), dtype=np.float32)
    first = np.concatenate([[0], np.cumsum([len(X_k) for X_k, _ in scenario.owners])])
    for k, (X_k, _) in enumerate(scenario.owners):
        H[first[k] : first[k + 1]] = h1(X_k)
    hashed = greedy_hashed(H, h1(scenario.validation), p)
    del H
    points = np.array([scenario.owners[owner_of[i]][0][i - first[owner_of[i]]] for i in hashed])
    return Baselines(greedy, (points.reshape(len(hashed), dim), y[hashed]), sampled)

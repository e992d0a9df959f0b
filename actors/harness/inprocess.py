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
    """Exact greedy on the kernel, greedy on h1 with exact means, and uniform p/K per owner."""
    X = np.concatenate([X for X, _ in scenario.owners])
    y = np.concatenate([y for _, y in scenario.owners]).astype(np.float64)
    owner_of = np.concatenate(
        [np.full(len(X_k), k, dtype=np.int64) for k, (X_k, _) in enumerate(scenario.owners)]
    )
    h1 = RandomFourierFeatures(X.shape[1], d, gamma, h1_seed)
    exact = greedy_exact(X, scenario.validation, p, gamma)
    hashed = greedy_hashed(h1(X), h1(scenario.validation), p)
    uniform = uniform_sample(owner_of, p, rng)
    return Baselines((X[exact], y[exact]), (X[hashed], y[hashed]), (X[uniform], y[uniform]))

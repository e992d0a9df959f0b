"""Small markets shared by the protocol, journal and Ray tests: fast to run, never flaky."""

from __future__ import annotations

import dataclasses

import numpy as np

from dpmarket.actors.parties.transport import LoopbackTransport
from dpmarket.protocol.summary.curator import Curator, CuratorParams
from dpmarket.protocol.summary.owner import Owner
from dpmarket.streams.synthetic import Scenario, gaussian_mixture_shift


def small_scenario(
    seed: int, n_points: int = 800, dim: int = 4, n_validation: int = 40, n_test: int = 100
) -> Scenario:
    """Four owners over four Gaussian components, a 20-point public seed set."""
    return gaussian_mixture_shift(
        np.random.default_rng(seed),
        n_points=n_points,
        n_owners=4,
        n_components=4,
        dim=dim,
        n_validation=n_validation,
        n_test=n_test,
        n_seed=20,
    )


def small_params(scenario: Scenario, **overrides: object) -> CuratorParams:
    """Generous budgets and few iterations (tests check the protocol, not utility)."""
    base = CuratorParams(
        p=10,
        d=32,
        gamma=scenario.gamma,
        h1_seed=1,
        eps_validation=1.0,
        validation_iterations=200,
        seed_iterations=200,
        eps_summary=1.0,
        summary_iterations=10,
        eps_auction=0.5,
        tau=2,
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


def small_curator(run: str, scenario: Scenario, params: CuratorParams, seed: int) -> Curator:
    """A curator over ``scenario``'s owners, validation and seed sets."""
    return Curator(
        run,
        list(scenario.owner_names),
        scenario.validation,
        scenario.seed_set,
        params,
        np.random.default_rng(seed),
    )


def run_small(run: str, scenario: Scenario, curator: Curator, owner_seed: int) -> list[Owner]:
    """``scenario``'s owners (owner i's generator seeded ``[owner_seed, i]``, the curator's
    profile floor) and ``curator`` in-process until the curator is done; the owners."""
    floor = curator.params.profile_floor
    owners = [
        Owner(n, run, X, y, rng=np.random.default_rng([owner_seed, i]), profile_floor=floor)
        for i, (n, (X, y)) in enumerate(zip(scenario.owner_names, scenario.owners, strict=True))
    ]
    transport = LoopbackTransport([curator, *owners])
    transport.send(curator.start())
    transport.run_until(lambda: curator.done)
    return owners

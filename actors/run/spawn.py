"""Spawn a market's actors on Ray: owners (grouped and placed), compute nodes, the curator.

The same Owner and Curator parties run here and in-process (actors/harness/inprocess.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.actors.config.placement import Placement, shared_requests
from dpmarket.actors.parties.dcaowner import OperatorTrust
from dpmarket.actors.parties.transport import FaultPlan
from dpmarket.actors.randomness import NoiseSource
from dpmarket.protocol.summary.curator import CuratorParams
from dpmarket.streams.synthetic import Scenario

__all__ = [
    "OwnerInputs",
    "RayMarket",
    "actor_options",
    "curator_spawner",
    "owner_groups",
    "run_ray",
    "spawn_market",
    "spawn_owners",
    "unique_actors",
]


@dataclass
class OwnerInputs:
    """What the actors start from: each owner's records (or, for owners that ingest files,
    their feature count), the curator's validation set and the public seed set."""

    owners: dict[str, tuple[npt.NDArray[np.float64] | int, npt.NDArray[np.float64] | None]]
    validation: npt.NDArray[np.float64]
    seed_set: npt.NDArray[np.float64]

    @classmethod
    def of(cls, scenario: Scenario) -> OwnerInputs:
        owners: dict[str, tuple[npt.NDArray[np.float64] | int, npt.NDArray[np.float64] | None]]
        owners = {
            name: (X, y.astype(np.float64))
            for name, (X, y) in zip(scenario.owner_names, scenario.owners, strict=True)
        }
        return cls(owners, scenario.validation, scenario.seed_set)


@dataclass
class RayMarket:
    """The actors of one market on Ray: owners by name and the curator (respawnable)."""

    owners: dict[str, Any]
    curator: Any
    spawn_curator: Any  # Callable[[snapshot | None], curator handle]
    compute_nodes: dict[str, Any] = field(default_factory=dict)  # alive while the run needs them
    run_id: str = "run"  # names the actors: actor_options(run_id, role)
    remote_nodes: dict[str, Any] = field(default_factory=dict)  # stand-ins (actors/remote/)

    def kill_all(self) -> None:
        import ray

        from dpmarket.actors.remote.handles import is_remote

        for handle in [self.curator, *unique_actors(self.owners), *self.compute_nodes.values()]:
            if not is_remote(handle):  # a stand-in: its agent is told by the gateway
                ray.kill(handle)


def spawn_market(
    scenario: Scenario | OwnerInputs,
    params: CuratorParams,
    noise: NoiseSource,
    faults: FaultPlan | None = None,
    run_id: str = "run",
    journal: str | None = None,
    snapshot: dict[str, Any] | None = None,
    placement: dict[str, Placement] | None = None,
    owners_per_actor: int = 1,
    dca: OperatorTrust | None = None,
    budgets: dict[str, Any] | None = None,
    remote: dict[str, Any] | None = None,
) -> RayMarket:
    """Spawn one owner actor per owner and the curator actor (Ray must be connected).
    ``remote``: stand-ins of remote owners (actors/remote/handles.py), used as their handles
    (no actor is spawned for them; the curator knows every owner).

    ``dca`` is the operator's secure-sum trust anchors (actors/parties/dcaowner.py): every owner
    actor
    gets them at construction (for a later request of ``[[requests]]``, from the driver's
    ``begin_request``: never through a curator); so are ``budgets`` (per owner
    a ``BudgetGate``, actors/budgets/gate.py: its store, cap and planned summary charge).

    The curator is pinned to this (the driver's) node so its journal lands where the driver can
    read it; ``placement`` maps an owner to the Ray resources and node labels that pin it to
    nodes (``[owners.NAME]``, actors/config/placement.py). Slow
    owners (``faults.delay``) wait that long before every reply.
    """
    inputs = scenario if isinstance(scenario, OwnerInputs) else OwnerInputs.of(scenario)
    faults = faults or FaultPlan()
    remote = remote or {}
    local = OwnerInputs(
        {o: v for o, v in inputs.owners.items() if o not in remote},
        inputs.validation,
        inputs.seed_set,
    )
    owners = spawn_owners(
        local, params.profile_floor, noise, faults, run_id, placement, owners_per_actor, dca,
        budgets,
    ) if local.owners else {}  # fmt: skip
    owners = {o: owners[o] if o in owners else remote[o] for o in inputs.owners}
    spawn = curator_spawner(run_id, inputs, params, noise, journal)
    return RayMarket(owners, spawn(snapshot), spawn, run_id=run_id)


def spawn_owners(
    inputs: OwnerInputs,
    profile_floor: float | None,
    noise: NoiseSource,
    faults: FaultPlan,
    run_id: str,
    placement: dict[str, Placement] | None = None,
    owners_per_actor: int = 1,
    dca: OperatorTrust | None = None,
    budgets: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The owner actors (:func:`spawn_market`): owner name -> handle (co-located owners share
    one), each named ``dpmarket:RUN:ROLE``."""
    from dpmarket.actors.parties.ray_actors import OwnerActor

    placement = placement or {}
    owners: dict[str, Any] = {}
    groups = owner_groups(list(inputs.owners), owners_per_actor, faults, placement)
    places = [placement.get(group[0], Placement()) for group in groups]
    # the actors naming a resource share the amount written (actors/config/placement.py)
    for group, place, share in zip(groups, places, shared_requests(places), strict=True):
        role = group[0] if len(group) == 1 else "owners-" + "-".join(_number(n) for n in group)
        handle = OwnerActor.options(**place.options(share), **actor_options(run_id, role)).remote(
            run_id,
            {name: inputs.owners[name] for name in group},
            noise,
            faults.delay,
            dca,
            {n: b for n, b in (budgets or {}).items() if n in group},
            profile_floor,
        )
        owners.update(dict.fromkeys(group, handle))
    return owners


def curator_spawner(
    run_id: str,
    inputs: OwnerInputs,
    params: CuratorParams,
    noise: NoiseSource,
    journal: str | None,
) -> Any:
    """A function snapshot -> a curator actor of this run, pinned to the driver's node (its
    journal lands where the driver reads it); called again to respawn a lost curator."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from dpmarket.actors.parties.curator import CuratorActor

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)

    def spawn_curator(snap: dict[str, Any] | None) -> Any:
        return CuratorActor.options(  # type: ignore[attr-defined]
            scheduling_strategy=here, **actor_options(run_id, "curator")
        ).remote(
            run_id,
            list(inputs.owners),
            inputs.validation,
            inputs.seed_set,
            params,
            noise,
            journal,
            snap,
        )

    return spawn_curator


def actor_options(run_id: str, role: str) -> dict[str, str]:
    """The Ray name and namespace of one of a run's actors: ``dpmarket:RUN:ROLE`` in namespace
    ``dpmarket-RUN`` (roles ``owner-3``, ``owners-1-2`` for co-located owners, ``compute-2``,
    ``curator``), so a second driver finds it with ``ray.get_actor(name, namespace=...)``.

    Ray frees a name when its actor dies, so a respawned curator takes the name again; while a
    live actor still holds it (a curator not yet torn down, or another run of the same name)
    the attempt is appended: ``dpmarket:RUN:curator#2``.
    """
    import ray

    namespace, base = f"dpmarket-{run_id}", f"dpmarket:{run_id}:{role}"
    name, attempt = base, 1
    while True:
        try:
            ray.get_actor(name, namespace=namespace)
        except ValueError:  # nobody holds the name
            return {"name": name, "namespace": namespace}
        attempt += 1
        name = f"{base}#{attempt}"


def _number(owner: str) -> str:
    return owner.removeprefix("owner-")


def owner_groups(
    names: list[str],
    per_actor: int,
    faults: FaultPlan,
    placement: dict[str, Placement],
) -> list[list[str]]:
    """Which owners share an actor process: consecutive chunks of ``per_actor`` owners.

    Co-location is for simulations on few cores (17 processes on 2 cores spend more time being
    scheduled than computing). An owner under a simulated fault (killed or slow) gets an actor
    of its own, so the fault stays with that owner alone; the others are chunked among owners
    of the same placement only (an actor runs on one node). Killing a shared actor (a crash, or
    removing its node) loses every owner in it, as losing a machine would.
    """
    if per_actor < 1:
        raise ValueError(f"owners_per_actor: must be >= 1, got {per_actor}")
    alone = {n for n in names if n in faults.kill_at or faults.delay.get(n)}
    groups = [[n] for n in names if n in alone]
    by_place: dict[Placement, list[str]] = {}
    for n in names:
        if n not in alone:
            by_place.setdefault(placement.get(n, Placement()), []).append(n)
    for shared in by_place.values():
        groups += [shared[i : i + per_actor] for i in range(0, len(shared), per_actor)]
    return groups


def unique_actors(owners: dict[str, Any]) -> list[Any]:
    """Each owner actor once (co-located owners share a handle)."""
    seen: dict[Any, None] = {}
    for handle in owners.values():
        seen.setdefault(handle, None)
    return list(seen)


def run_ray(
    scenario: Scenario,
    params: CuratorParams,
    noise: NoiseSource,
    faults: FaultPlan | None = None,
    run_id: str = "run",
    journal: str | None = None,
    snapshot: dict[str, Any] | None = None,
    owners_per_actor: int = 1,
) -> dict[str, Any]:
    """Run Algorithm 3 with the parties in Ray actors; return the curator's payload."""
    import ray

    market = spawn_market(
        scenario,
        params,
        noise,
        faults,
        run_id,
        journal,
        snapshot,
        owners_per_actor=owners_per_actor,
    )
    try:
        payload: dict[str, Any] = ray.get(market.curator.run.remote(market.owners, faults))
    finally:
        market.kill_all()
    return payload

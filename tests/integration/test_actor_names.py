"""Operators find a run's actors by name (issue 14, item 6): ``dpmarket:RUN:ROLE`` in namespace
``dpmarket-RUN``, looked up with ``ray.get_actor`` from this driver and from a second one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dpmarket.actors.config.market import load_market_config
from dpmarket.actors.parties.transport import FaultPlan
from dpmarket.actors.randomness import NoiseSource
from dpmarket.actors.run.phases import prepare_secure, spawn_nodes
from dpmarket.actors.run.spawn import OwnerInputs, spawn_market
from tests.small import small_params, small_scenario

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

RUN, NS = "names", "dpmarket-names"

SECOND_DRIVER = """
import json, sys
import ray
ray.init(address=sys.argv[1], namespace="operator", log_to_driver=False)
names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
               if a["namespace"] == sys.argv[2])
ray.kill(ray.get_actor(sys.argv[3], namespace=sys.argv[2]), no_restart=True)
print(json.dumps(names))
"""


def _same(name: str, handle: Any) -> bool:
    import ray

    return bool(ray.get_actor(name, namespace=NS)._actor_id == handle._actor_id)


def test_every_actor_is_named_by_run_and_role_in_the_runs_namespace() -> None:
    import ray

    scenario = small_scenario(3, n_points=200)  # owner-1 .. owner-4
    plan = FaultPlan(kill_at={"owner-1": 99})  # a faulty owner gets an actor of its own
    demo = Path(__file__).resolve().parents[2] / "configs" / "demo.toml"
    config = load_market_config(demo, [f"run.name={RUN}", "market.compute_nodes=2"])
    params = small_params(scenario)
    prep = prepare_secure(config, OwnerInputs.of(scenario), scenario.gamma, params, None)
    assert prep is not None
    market = spawn_market(
        scenario, params, NoiseSource.reproducible(1), plan, RUN, owners_per_actor=2,
        dca=prep.trust,
    )  # fmt: skip
    try:
        market.compute_nodes = spawn_nodes(prep, market)
        owners = market.owners
        assert _same(f"dpmarket:{RUN}:owner-1", owners["owner-1"])
        assert _same(f"dpmarket:{RUN}:owners-2-3", owners["owner-2"])
        assert owners["owner-2"] is owners["owner-3"]  # co-located: one actor, one name
        assert _same(f"dpmarket:{RUN}:owner-4", owners["owner-4"])
        assert _same(f"dpmarket:{RUN}:curator", market.curator)
        for node in ("compute-1", "compute-2"):
            assert _same(f"dpmarket:{RUN}:{node}", market.compute_nodes[node])
        # the roles answer as such: an owner actor serves its owners, a node its status
        found = ray.get_actor(f"dpmarket:{RUN}:owners-2-3", namespace=NS)
        assert {ray.get(found.status.remote(o))["name"] for o in ("owner-2", "owner-3")} == {
            "owner-2",
            "owner-3",
        }
        # a curator spawned while the first still holds the name takes the attempt's suffix
        second = market.spawn_curator(None)
        assert _same(f"dpmarket:{RUN}:curator#2", second)
        ray.kill(second, no_restart=True)
        # a second driver lists the run's actors and kills one by name
        gcs = ray.get_runtime_context().gcs_address
        victim = f"dpmarket:{RUN}:owner-4"
        done = subprocess.run(
            [sys.executable, "-c", SECOND_DRIVER, gcs, NS, victim],
            capture_output=True, text=True, timeout=300, env=dict(os.environ), check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        listed = json.loads(done.stdout.strip().splitlines()[-1])
        assert listed == sorted(
            f"dpmarket:{RUN}:{role}"
            for role in ("owner-1", "owners-2-3", "owner-4", "curator", "compute-1", "compute-2")
        )
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(owners["owner-4"].status.remote("owner-4"), timeout=60)
        # the killed curator's name is free again for its successor
        ray.kill(market.curator, no_restart=True)
        market.curator = market.spawn_curator(None)
        assert _same(f"dpmarket:{RUN}:curator", market.curator)
    finally:
        market.kill_all()

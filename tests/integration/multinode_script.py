"""Run by test_multinode.py in its own process: a 3-node Ray cluster on this machine
(ray.cluster_utils.Cluster); removing a node loses the owners placed on it."""

from __future__ import annotations

import json
import time

import ray
from ray.cluster_utils import Cluster

from dpmarket.actors.config.placement import Placement
from dpmarket.actors.randomness import NoiseSource
from dpmarket.actors.run.spawn import spawn_market
from tests.small import small_params, small_scenario


def case(cluster: Cluster, zone: str, on_zone: list[str], tolerance: int) -> dict[str, object]:
    node = cluster.add_node(num_cpus=1, resources={zone: 10})
    cluster.wait_for_nodes()
    scenario = small_scenario(3)
    params = small_params(scenario, phase_timeout=3.0, max_lost=tolerance)
    placement = {
        name: Placement(((zone if name in on_zone else "head", 1.0),))
        for name in scenario.owner_names
    }
    market = spawn_market(scenario, params, NoiseSource.secure(), run_id=zone, placement=placement)
    ref = market.curator.run.remote(market.owners, None)
    while ray.get(market.curator.progress.remote())["epoch"] < 3:
        time.sleep(0.05)
    cluster.remove_node(node)
    payload = ray.get(ref)
    market.kill_all()
    return {
        "state": payload["state"],
        "lost": sorted(payload["lost"]),
        "summary": len(payload["provenance"]),
        "refusal": payload["refusal"],
    }


def main() -> None:
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"head": 100}}
    )
    ray.init(address=cluster.address, log_to_driver=False)
    tolerated = case(cluster, "zone_a", ["owner-1", "owner-2"], tolerance=2)
    refused = case(cluster, "zone_b", ["owner-3", "owner-4"], tolerance=1)
    print(json.dumps({"tolerated": tolerated, "refused": refused}, default=str))
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main()

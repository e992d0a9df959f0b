"""The Ray actors of the owner and compute-node hosts: the one module of theirs that imports Ray.

:class:`~dpmarket.actors.parties.owner.OwnerHost` and
:class:`~dpmarket.actors.parties.compute.ComputeNodeHost` are plain classes, so an owner's or a
compute node's own agent (actors/remote/owneragent.py, nodeagent.py) hosts them without Ray
installed; the market's driver spawns them as the actors below (actors/run/spawn.py,
actors/run/phases.py).
"""

from __future__ import annotations

import ray

from dpmarket.actors.parties.compute import ComputeNodeHost
from dpmarket.actors.parties.owner import OwnerHost

__all__ = ["ComputeNodeActor", "OwnerActor"]

OwnerActor = ray.remote(num_cpus=0)(OwnerHost)
"""The Ray actor of :class:`OwnerHost` (what the driver spawns)."""

ComputeNodeActor = ray.remote(num_cpus=0)(ComputeNodeHost)
"""The Ray actor of :class:`ComputeNodeHost` (what the driver spawns for a local node)."""

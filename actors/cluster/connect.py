"""Connecting to Ray: an embedded local instance by default, or a cluster by address.

Order of precedence: an explicit ``address`` argument (``"auto"`` joins the cluster this machine
belongs to), then the ``RAY_ADDRESS`` environment variable, then a new local instance sized to
this machine (``num_cpus`` = the cores the OS reports).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray

from dpmarket.actors.cluster.shipping import connect_runtime_env

__all__ = ["UNREACHABLE_ERRORS", "connect", "describe"]


def _unreachable_errors() -> tuple[type[BaseException], ...]:
    """Errors of a ``ray.get`` on an actor that died or whose node did: a lost party."""
    import ray.exceptions as rex

    return (rex.ActorDiedError, rex.ActorUnavailableError, rex.RayActorError, rex.GetTimeoutError)


UNREACHABLE_ERRORS = _unreachable_errors()


def connect(address: str | None = None, num_cpus: int | None = None) -> dict[str, Any]:
    """Start or join Ray once per process; return what was connected to."""
    if ray.is_initialized():
        return {"address": "already connected", "resources": ray.cluster_resources()}  # type: ignore[no-untyped-call]
    target = address or os.environ.get("RAY_ADDRESS")
    common: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
    # Ray's start-up banners (token authentication, log locations, "Started a local Ray
    # instance") are warnings and infos of the "ray" logger; the CLI prints its own line.
    ray_logger = logging.getLogger("ray")
    level = ray_logger.level
    ray_logger.setLevel(logging.ERROR)
    try:
        if target:  # a cluster: ship this driver's code with the job (actors/cluster/shipping.py)
            ray.init(address=target, runtime_env=connect_runtime_env(target), **common)
        else:
            cpus = num_cpus if num_cpus is not None else (os.cpu_count() or 1)
            # "local": always a new instance, never an unrelated cluster left on this machine
            ray.init(address="local", num_cpus=cpus, include_dashboard=False, **common)
    finally:
        ray_logger.setLevel(level)
    return {"address": target or "local", "resources": ray.cluster_resources()}  # type: ignore[no-untyped-call]


def describe(connected: dict[str, Any]) -> str:
    """One line for the terminal: "Ray: local, 2 CPUs" or "Ray: cluster at ADDR, 8 CPUs"."""
    address = str(connected.get("address", "local"))
    cpus = int(float(connected.get("resources", {}).get("CPU", 0)))
    where = "local" if address == "local" else f"cluster at {address}"
    if address == "already connected":
        where = "already connected"
    return f"Ray: {where}, {cpus} CPU{'s' if cpus != 1 else ''}"

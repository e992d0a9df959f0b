"""Placements checked on the cluster: a node for each, the owner's files readable on it.

The placements come from the config (actors/config/placement.py). Before any actor is spawned
a placement no alive node can satisfy is refused (:func:`require_placeable`). Before any
secure sum the driver asks every owner actor, on its node, whether each of its input files
exists and can be read there and which dpmarket it runs (:func:`preflight_owners`, the actor
answering with :func:`node_report`); the first failure is a :class:`ConfigError` (exit 2)
naming the owner, the node (Ray node id and IP) and the path.
"""

from __future__ import annotations

import time
from typing import Any

from dpmarket.actors.cluster.connect import UNREACHABLE_ERRORS
from dpmarket.actors.cluster.shipping import code_identity, require_same_code
from dpmarket.actors.config.checks import ConfigError
from dpmarket.actors.config.placement import BUILTIN_RESOURCES, Placement

__all__ = ["node_report", "preflight_owners", "require_placeable"]

PREFLIGHT_TIMEOUT = 120.0  # seconds for every owner actor to start and answer


def require_placeable(
    placements: dict[str, Placement], nodes: list[dict[str, Any]] | None = None
) -> None:
    """Refuse (ConfigError) a placement that no alive node in ``nodes`` (default: the connected
    cluster's ``ray.nodes()``) satisfies, instead of an actor waiting forever to be scheduled."""
    if not placements:
        return
    if nodes is None:
        import ray

        nodes = list(ray.nodes())  # type: ignore[no-untyped-call]
    alive = [n for n in nodes if n.get("Alive")]
    for owner, placement in placements.items():
        if not any(_fits(placement, n) for n in alive):
            offered = sorted(
                {r for n in alive for r in n.get("Resources", {}) if r not in BUILTIN_RESOURCES}
                - {r for n in alive for r in n.get("Resources", {}) if r.startswith("node:")}
            )
            raise ConfigError(
                f"[owners.{owner}]: no alive Ray node offers {placement.describe()} (custom "
                f"resources offered: {offered}); start its node with `ray start --resources` / "
                "`--labels`, or fix the config"
            )


def _fits(placement: Placement, node: dict[str, Any]) -> bool:
    resources, labels = node.get("Resources", {}), node.get("Labels", {}) or {}
    return all(resources.get(r, 0.0) >= a for r, a in placement.resources) and all(
        labels.get(k) == v for k, v in placement.node_labels
    )


def node_report(paths: list[str]) -> dict[str, Any]:
    """Run inside an actor: this node's Ray id and IP, the actor's dpmarket (version and
    fingerprint, actors/cluster/shipping.py) and, per input path, why it cannot be read here
    (missing,
    not a file, permission denied); readable paths are not listed."""
    import ray

    problems: dict[str, str] = {}
    for path in paths:
        try:
            with open(path, "rb") as fh:
                fh.read(1)
        except OSError as exc:
            problems[path] = exc.strerror or type(exc).__name__
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
        "problems": problems,
        "code": code_identity(),
    }


def preflight_owners(
    owners: dict[str, Any],
    files: dict[str, list[str]],
    placements: dict[str, Placement],
    timeout: float = PREFLIGHT_TIMEOUT,
) -> dict[str, dict[str, Any]]:
    """Ask every actor in ``owners`` (all at once) on its node whether its files can be read
    there and which dpmarket it runs; return each one's node report. Raises
    :class:`ConfigError` naming the owner, its node and the path for the first unreadable file,
    an actor whose dpmarket differs from the driver's, or one that did not start in time. An
    actor that died before answering is left out: a lost party, which the run's T-tolerance
    counts like any other."""
    import ray

    refs = {o: h.where.remote(files.get(o, [])) for o, h in owners.items()}
    deadline, reports = time.monotonic() + timeout, {}
    for owner, ref in refs.items():
        where = placements.get(owner, Placement()).describe()
        try:
            reports[owner] = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            raise ConfigError(
                f"preflight: {owner} (placed {where}) did not start within {timeout:.0f} s"
            ) from None
        except ray.exceptions.RuntimeEnvSetupError as exc:
            raise ConfigError(
                f"preflight: {owner} (placed {where}): Ray could not set up its runtime "
                f"environment (the shipped code) on its node: {str(exc)[-500:]}"
            ) from None
        except UNREACHABLE_ERRORS:
            continue  # died (or its node did): a lost party, counted against T by the run
    require_same_code(reports)  # every owner runs the driver's dpmarket, or refused by name
    for owner, report in reports.items():
        for path, why in report["problems"].items():
            raise ConfigError(
                f"preflight: {owner}'s input file {path}: {why} on its node {report['node_id']} "
                f"({report['ip']}; placed {placements.get(owner, Placement()).describe()}); a "
                "placed owner's paths are paths on its node"
            )
    return reports

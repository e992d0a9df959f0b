"""Placements checked on the cluster: a node for each, the owner's files readable on it.

The placements come from the config (actors/config/placement.py). Before any actor is spawned
a placement no alive node can satisfy is refused (:func:`require_placeable`). Before any
secure sum the driver asks every owner actor, on its node, whether each of its input files
exists and can be read there and which dpmarket it runs (:func:`preflight_owners`, the actor
answering with :func:`node_report`); the first failure is a :class:`ConfigError` (exit 2)
naming the owner, the node (Ray node id and IP) and the path.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from dpmarket.actors.cluster.connect import UNREACHABLE_ERRORS
from dpmarket.actors.cluster.shipping import code_identity, require_same_code
from dpmarket.actors.config.checks import ConfigError
from dpmarket.actors.config.placement import BUILTIN_RESOURCES, Placement

__all__ = ["node_report", "preflight_owners", "require_placeable"]

PREFLIGHT_TIMEOUT = 120.0  # seconds for every owner actor to start and answer
PLACEMENT_GRACE = 10.0  # seconds after which an actor Ray has not placed is reported


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
    grace: float = PLACEMENT_GRACE,
    warn: Callable[[str], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Ask every actor in ``owners`` (all at once) on its node whether its files can be read
    there and which dpmarket it runs; return each one's node report. Raises
    :class:`ConfigError` naming the owner, its node and the path for the first unreadable file,
    an actor whose dpmarket differs from the driver's, or one that did not start in time (with
    what it asked for and what every alive node offers). An actor Ray has not placed on a node
    after ``grace`` seconds is said at once (``warn``, default stderr), with the same detail,
    while the wait goes on. An actor that died before answering is left out: a lost party,
    which the run's T-tolerance counts like any other."""
    import ray

    refs = {o: h.where.remote(files.get(o, [])) for o, h in owners.items()}
    start = time.monotonic()
    reports: dict[str, dict[str, Any]] = {}
    pending, warned = dict(refs), False
    while pending and time.monotonic() - start < timeout:
        wait = min(1.0, max(0.0, timeout - (time.monotonic() - start)))
        ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=wait)
        for owner in [o for o, ref in pending.items() if ref in ready]:
            answer = _answer(owner, pending.pop(owner), placements)
            if answer is not None:
                reports[owner] = answer
        if pending and not warned and time.monotonic() - start >= grace:
            unplaced = [o for o in pending if not _placed(owners[o])]
            if unplaced:
                warned = True
                (warn or _stderr)(
                    f"dpmarket: WARNING: not placed on any node after {grace:.0f} s: "
                    f"{_placement_detail(unplaced, owners, placements)}"
                )
    for owner in pending:
        raise ConfigError(
            f"preflight: {owner} did not start within {timeout:.0f} s: "
            f"{_placement_detail([owner], owners, placements)}"
        )
    require_same_code(reports)  # every owner runs the driver's dpmarket, or refused by name
    for owner, report in reports.items():
        for path, why in report["problems"].items():
            raise ConfigError(
                f"preflight: {owner}'s input file {path}: {why} on its node {report['node_id']} "
                f"({report['ip']}; placed {placements.get(owner, Placement()).describe()}); a "
                "placed owner's paths are paths on its node"
            )
    return reports


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _answer(owner: str, ref: Any, placements: dict[str, Placement]) -> dict[str, Any] | None:
    """One actor's node report; None for an actor that died (a lost party)."""
    import ray

    where = placements.get(owner, Placement()).describe()
    try:
        report: dict[str, Any] = ray.get(ref)
    except ray.exceptions.RuntimeEnvSetupError as exc:
        raise ConfigError(
            f"preflight: {owner} (placed {where}): Ray could not set up its runtime "
            f"environment (the shipped code) on its node: {str(exc)[-500:]}"
        ) from None
    except UNREACHABLE_ERRORS:
        return None  # died (or its node did): a lost party, counted against T by the run
    return report


def _actor_record(handle: Any) -> Any:
    """The GCS actor table's record of ``handle`` (None when it cannot be read)."""
    try:
        from ray._private import state
        from ray.core.generated import gcs_pb2

        raw = state.state.get_actor_info(handle._actor_id)
        return None if raw is None else gcs_pb2.ActorTableData.FromString(raw)  # type: ignore[attr-defined]
    except Exception:  # a private API: without it, no detail, never an error
        return None


def _placed(handle: Any) -> bool:
    """Whether Ray has given the actor a worker process on a node (the GCS records its pid)."""
    record = _actor_record(handle)
    return record is None or record.pid != 0


def _placement_detail(
    unplaced: list[str], owners: dict[str, Any], placements: dict[str, Placement]
) -> str:
    """What each actor asked for (as Ray recorded it) and what every alive node offers."""
    import ray

    asked = []
    for owner in unplaced:
        record = _actor_record(owners[owner])
        request = {} if record is None else dict(record.required_resources)
        labels = {} if record is None else dict(getattr(record, "label_selector", {}) or {})
        text = f"{owner} asks {_amounts(request) or 'nothing'}"
        text += f", node labels {labels}" if labels else ""
        where = placements.get(owner)
        asked.append(text + (f" (placed {where.describe()})" if where else ""))
    try:
        from ray._private import state

        available = state.available_resources_per_node()  # type: ignore[no-untyped-call]
    except Exception:  # a private API: totals only
        available = {}
    nodes = []
    for node in (n for n in ray.nodes() if n.get("Alive")):  # type: ignore[no-untyped-call]
        free = available.get(node["NodeID"])
        nodes.append(
            f"node {node['NodeID']} ({node.get('NodeManagerAddress', '?')}): offers "
            f"{_amounts(node.get('Resources', {}))}"
            + (f", free now {_amounts(free)}" if free is not None else "")
            + (f", labels {_labels(node)}" if _labels(node) else "")
        )
    return "; ".join(asked) + ". Alive nodes: " + "; ".join(nodes or ["none"])


def _amounts(resources: dict[str, float]) -> str:
    """CPU, GPU and custom resources as ``{name: amount}`` (memory and node ids left out)."""
    shown = {
        name: round(float(amount), 4)
        for name, amount in sorted(resources.items())
        if name not in ("memory", "object_store_memory") and not name.startswith("node:")
    }
    return str(shown) if shown else ""


def _labels(node: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in (node.get("Labels") or {}).items() if not k.startswith("ray.io/")}

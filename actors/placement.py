"""Owners on the nodes that hold their data: placements from the config, checked on the node.

A config places an owner with ``[owners.NAME]``::

    [owners.owner-1]
    resources = { site_a = 1 }      # Ray custom resources its node offers (ray start --resources)
    node_labels = { site = "a" }    # and/or node labels (ray start --labels), all must match

Both become the owner actor's Ray options (``resources``, ``label_selector``); co-location
(``owners_per_actor``) only groups owners with the same placement. Before any secure sum the
driver asks every owner actor, on its node, whether each of its input files exists and can be
read there (:func:`preflight_owners`); the first failure is a :class:`ConfigError` (exit 2)
naming the owner, the node (Ray node id and IP) and the path. A placed owner's paths are paths
on its node: the driver does not probe them (actors/validate.py), its actor does. A placement
no alive node can satisfy is refused before any actor is spawned (:func:`require_placeable`).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any

from dpmarket.actors.config_checks import ConfigError
from dpmarket.actors.shipping import code_identity, require_same_code

__all__ = [
    "Placement",
    "node_report",
    "parse_placements",
    "preflight_owners",
    "require_placeable",
]

PREFLIGHT_TIMEOUT = 120.0  # seconds for every owner actor to start and answer
_BUILTIN = {"CPU", "GPU", "memory", "object_store_memory"}
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.\-]{0,61}[A-Za-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([a-z0-9.\-]{0,251}[a-z0-9])?/)?" + _NAME.pattern[1:])


@dataclass(frozen=True)
class Placement:
    """Where an owner's actor may run: custom resources it needs and node labels it requires."""

    resources: tuple[tuple[str, float], ...] = ()
    node_labels: tuple[tuple[str, str], ...] = ()

    def options(self) -> dict[str, Any]:
        """The owner actor's Ray options for this placement."""
        out: dict[str, Any] = {}
        if self.resources:
            out["resources"] = dict(self.resources)
        if self.node_labels:
            out["label_selector"] = dict(self.node_labels)
        return out

    def describe(self) -> str:
        parts = [f"resources {dict(self.resources)}"] if self.resources else []
        parts += [f"node labels {dict(self.node_labels)}"] if self.node_labels else []
        return " and ".join(parts) or "anywhere"


PLACEMENT_KEYS = frozenset({"resources", "node_labels"})


def parse_placements(
    path: str, table: object, owners: tuple[str, ...], other_keys: frozenset[str] = frozenset()
) -> dict[str, Placement]:
    """``[owners.NAME]`` tables -> placements, every key and value checked (ConfigError);
    ``other_keys`` are the table's keys that other parsers read (budgets)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [owners]: expected tables [owners.NAME], got {table!r}")
    unknown = sorted(set(table) - set(owners))
    if unknown:
        raise ConfigError(f"{path}: [owners]: unknown owners {unknown}; the market has {owners}")
    out: dict[str, Placement] = {}
    for owner, entry in table.items():
        at = f"{path}: [owners.{owner}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{at}: expected a table with resources and/or node_labels")
        extra = sorted(set(entry) - PLACEMENT_KEYS - other_keys)
        if extra:
            raise ConfigError(
                f"{at}: unknown keys {extra}; allowed: {sorted(PLACEMENT_KEYS | other_keys)}"
            )
        placement = Placement(
            _resources(at, entry.get("resources", {})), _labels(at, entry.get("node_labels", {}))
        )
        if placement != Placement():
            out[owner] = placement
    return out


def _resources(at: str, value: object) -> tuple[tuple[str, float], ...]:
    if not isinstance(value, dict):
        raise ConfigError(f"{at}.resources: expected a table like {{ site_a = 1 }}")
    out = []
    for name, amount in sorted(value.items()):
        if name in _BUILTIN or not _NAME.match(name):
            raise ConfigError(
                f"{at}.resources: {name!r} is not a custom resource name (letters, digits, "
                "_ . -; not CPU, GPU or memory)"
            )
        if (
            isinstance(amount, bool)
            or not isinstance(amount, int | float)
            or not (math.isfinite(amount) and amount > 0)
        ):
            raise ConfigError(f"{at}.resources.{name}: expected a number > 0, got {amount!r}")
        out.append((name, float(amount)))
    return tuple(out)


def _labels(at: str, value: object) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict):
        raise ConfigError(f'{at}.node_labels: expected a table like {{ site = "a" }}')
    for key, label in value.items():
        if not _LABEL_KEY.match(key):
            raise ConfigError(f"{at}.node_labels: {key!r} is not a valid Ray label key")
        if not isinstance(label, str) or not _NAME.match(label):
            raise ConfigError(
                f"{at}.node_labels.{key}: expected a label value (letters, digits, _ . -, at most "
                f"63), got {label!r}"
            )
    return tuple(sorted(value.items()))


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
                {r for n in alive for r in n.get("Resources", {}) if r not in _BUILTIN}
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
    fingerprint, actors/shipping.py) and, per input path, why it cannot be read here (missing,
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

    from dpmarket.actors.survivors import UNREACHABLE_ERRORS

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

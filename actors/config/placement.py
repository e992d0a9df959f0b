"""Owners on the nodes that hold their data: the ``[owners.NAME]`` placement tables.

A config places an owner with ``[owners.NAME]``::

    [owners.owner-1]
    resources = { site_a = 1 }      # Ray custom resources its node offers (ray start --resources)
    node_labels = { site = "a" }    # and/or node labels (ray start --labels), all must match

Both become the owner actor's Ray options (``resources``, ``label_selector``); co-location
(``owners_per_actor``) only groups owners with the same placement. A placement's resources
select a node, they do not size one owner: the owner actors that name a resource share the
amount written (:func:`shared_requests`), so any number of owners placed with
``site_a = 1`` fit together on a node started with ``--resources='{"site_a": 1}'``.
What is checked on the cluster at run time (a node that satisfies each placement, the owner's
files readable on its node) is actors/cluster/placement.py. A placed owner's paths are paths on
its node: the driver does not probe them (actors/config/validate.py), its actor does.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from dpmarket.actors.config.checks import ConfigError

__all__ = ["BUILTIN_RESOURCES", "RESOURCE_UNIT", "Placement", "parse_placements", "shared_requests"]

BUILTIN_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.\-]{0,61}[A-Za-z0-9])?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([a-z0-9.\-]{0,251}[a-z0-9])?/)?" + _NAME.pattern[1:])


@dataclass(frozen=True)
class Placement:
    """Where an owner's actor may run: custom resources it needs and node labels it requires."""

    resources: tuple[tuple[str, float], ...] = ()
    node_labels: tuple[tuple[str, str], ...] = ()

    def options(self, resources: dict[str, float] | None = None) -> dict[str, Any]:
        """The owner actor's Ray options for this placement (``resources``: the amounts it
        asks, by default those written; :func:`shared_requests`)."""
        out: dict[str, Any] = {}
        if self.resources:
            out["resources"] = dict(self.resources) if resources is None else dict(resources)
        if self.node_labels:
            out["label_selector"] = dict(self.node_labels)
        return out

    def describe(self) -> str:
        parts = [f"resources {dict(self.resources)}"] if self.resources else []
        parts += [f"node labels {dict(self.node_labels)}"] if self.node_labels else []
        return " and ".join(parts) or "anywhere"


PLACEMENT_KEYS = frozenset({"resources", "node_labels"})
RESOURCE_UNIT = 1e-4  # the finest fraction of a resource Ray schedules


def shared_requests(placements: list[Placement]) -> list[dict[str, float]]:
    """The custom resources each actor asks, one placement per actor spawned together: the
    actors naming a resource share its amount, each asking ``amount / n`` (n the actors naming
    it) rounded down to Ray's unit of 0.0001. Together they never ask more than the largest
    amount written, so a node offering what one placement names holds all of them (the
    placement check, actors/cluster/placement.py, asks a node for the written amount).
    ConfigError when a share would be below Ray's unit (more than 10000 actors per unit)."""
    count = Counter(name for p in placements for name, _ in p.resources)
    out = []
    for placement in placements:
        request = {}
        for name, amount in placement.resources:
            units = math.floor(amount / count[name] / RESOURCE_UNIT + 1e-9)
            if units < 1:
                raise ConfigError(
                    f"[owners]: {count[name]} owner actors share resources.{name} = {amount:g}: "
                    f"each would ask less than Ray's unit {RESOURCE_UNIT:g}; write a larger "
                    "amount (it only selects the node) or co-locate them (owners_per_actor)"
                )
            request[name] = round(units * RESOURCE_UNIT, 4)
        out.append(request)
    return out


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
        if name in BUILTIN_RESOURCES or not _NAME.match(name):
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

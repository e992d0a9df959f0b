"""Several consumers' requests in one market config (``[[requests]]``), checked before a run.

A config may list requests that ``dpmarket run`` buys one after the other against the same
owner actors while the owners keep ingesting (actors/run/requests.py). Each request is a table
of ``[[requests]]``:

- ``name`` (required): a unique name, ``[A-Za-z0-9][A-Za-z0-9._-]*``; its outputs go to
  ``OUT/requests/NAME`` and its run is named ``RUN.NAME``.
- ``validation``: the consumer's validation file (``[data].source = "files"``: required
  unless ``[data].validation`` is given, which is then the default); ``seed_set``: its public
  seed set (default ``[data].seed_set``). A simulated source draws one validation set for
  every request, so these keys are refused there.
- ``summary_size``: p for this request (default ``[market].summary_size``); ``summary``: keys
  of ``[summary]`` overriding the market's for this request.
- ``budget = {epsilon = E, delta = D}`` and ``ledger = "PATH"``: this consumer's cap and store
  (default store ``[privacy].ledger_dir/consumer-NAME.sqlite``). Without a ``budget`` the
  request is the ``[consumer]``'s (its store and cap, shared by every such request).

Every owner's store and cap is the market's (``[owners.NAME]``, ``[privacy]``): each request
is charged to the same stores, so an owner's filter holds its cap across them. Simulated
faults (``[faults]``) belong to a single run and are refused with ``[[requests]]``.
Relative paths are taken from the config file's folder; every error names the file and key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpmarket.actors.config.budgets import (
    OwnerBudget,
    cap_delta,
    cap_epsilon,
    check_existing_store,
    store_path,
)
from dpmarket.actors.config.checks import MAX_SUMMARY_SIZE, ConfigError, integer

__all__ = [
    "REQUEST_KEYS",
    "Request",
    "parse_requests",
]

REQUEST_KEYS = frozenset(
    {"name", "validation", "seed_set", "summary_size", "summary", "budget", "ledger"}
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Request:
    """One consumer's request: its files (absolute paths; None: the market's), p, summary
    overrides and the consumer's store and cap (None: the market's ``[consumer]``)."""

    name: str
    validation: str | None = None
    seed_set: str | None = None
    summary_size: int | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    consumer: OwnerBudget | None = None

    def public(self) -> dict[str, Any]:
        """As report.json records it: no file paths or store."""
        caps = None if self.consumer is None else {
            "epsilon": self.consumer.epsilon, "delta": self.consumer.delta,
        }  # fmt: skip
        return {
            "name": self.name,
            "summary_size": self.summary_size,
            "summary": dict(self.summary),
            "consumer_budget": caps,
        }


def _file(path: str, key: str, value: object) -> str:
    base = Path(path).parent
    if not isinstance(value, str) or not (base / value).is_file():
        raise ConfigError(f"{path}: {key}: file {value!r} not found")
    return str(store_path(base, path, key, value))


def _consumer(
    path: str, key: str, table: dict[str, Any], privacy: dict[str, Any], name: str
) -> OwnerBudget | None:
    if "budget" not in table:
        if "ledger" in table:
            raise ConfigError(f"{path}: {key}.ledger: a store needs a cap: set {key}.budget")
        return None
    budget = table["budget"]
    if not isinstance(budget, dict) or set(budget) != {"epsilon", "delta"}:
        raise ConfigError(
            f"{path}: {key}.budget: expected {{epsilon = E, delta = D}}, got {budget!r}"
        )
    base = Path(path).parent
    if "ledger" in table:
        store = store_path(base, path, f"{key}.ledger", table["ledger"])
    elif privacy.get("ledger_dir") is not None:
        store = store_path(base, path, "[privacy].ledger_dir", privacy["ledger_dir"])
        store = store / f"consumer-{name}.sqlite"
    else:
        raise ConfigError(
            f"{path}: {key}: a budget needs a store: set {key}.ledger or [privacy].ledger_dir"
        )
    check_existing_store(path, "consumer", store)
    return OwnerBudget(
        str(store),
        cap_epsilon(path, f"{key}.budget.epsilon", budget["epsilon"]),
        cap_delta(path, f"{key}.budget.delta", budget["delta"]),
    )


def parse_requests(
    path: str, data: dict[str, Any], source: str, summary_keys: frozenset[str]
) -> tuple[Request, ...]:
    """The ``[[requests]]`` of a parsed TOML document (empty without them); ConfigError naming
    the file and the key (``[[requests]] #2 (NAME).validation``) otherwise."""
    tables = data.get("requests")
    if tables is None:
        return ()
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{path}: [[requests]]: expected one or more [[requests]] tables")
    if data.get("faults"):
        raise ConfigError(
            f"{path}: [faults]: simulated faults belong to one run; not with [[requests]]"
        )
    market_data, privacy = data.get("data", {}), data.get("privacy", {})
    out: list[Request] = []
    for i, table in enumerate(tables, start=1):
        name = table.get("name")
        where = f"[[requests]] #{i}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(
                f"{path}: {where}.name: expected a name of letters, digits, '.', '_' or '-', "
                f"got {name!r}"
            )
        key = f"{where} ({name})"
        if name in {r.name for r in out}:
            raise ConfigError(f"{path}: {key}.name: two requests are named {name!r}")
        unknown = sorted(set(table) - REQUEST_KEYS)
        if unknown:
            raise ConfigError(
                f"{path}: {key}: unknown keys {unknown}; allowed {sorted(REQUEST_KEYS)}"
            )
        files: dict[str, str | None] = {}
        for k in ("validation", "seed_set"):
            if source != "files" and k in table:
                raise ConfigError(
                    f"{path}: {key}.{k}: a simulated source draws the consumer's sets; "
                    "files are for [data].source = 'files'"
                )
            files[k] = None if k not in table else _file(path, f"{key}.{k}", table[k])
        if source == "files" and files["validation"] is None and "validation" not in market_data:
            raise ConfigError(
                f"{path}: {key}.validation: missing (the consumer's validation file; or set "
                "[data].validation for every request)"
            )
        size = table.get("summary_size")
        summary = table.get("summary", {})
        if not isinstance(summary, dict):
            raise ConfigError(f"{path}: {key}.summary: expected a table of [summary] keys")
        extra = sorted(set(summary) - summary_keys)
        if extra:
            raise ConfigError(
                f"{path}: {key}.summary: unknown keys {extra}; allowed {sorted(summary_keys)}"
            )
        out.append(
            Request(
                name,
                files["validation"],
                files["seed_set"],
                None
                if size is None
                else integer(path, f"{key}.summary_size", size, 1, MAX_SUMMARY_SIZE),
                dict(summary),
                _consumer(path, key, table, privacy, name),
            )
        )
    stores = [r.consumer.ledger for r in out if r.consumer is not None]
    owners = {b for b in _owner_stores(data, path)}
    if owners & set(stores):
        raise ConfigError(f"{path}: [[requests]]: a consumer's store is an owner's store")
    return tuple(out)


def _owner_stores(data: dict[str, Any], path: str) -> set[str]:
    base = Path(path).parent
    owners = data.get("owners", {})
    return {
        str(store_path(base, path, f"[owners.{n}].ledger", t["ledger"]))
        for n, t in (owners.items() if isinstance(owners, dict) else [])
        if isinstance(t, dict) and "ledger" in t
    }

"""Owners' persistent budgets in a market config: where each store lives and each owner's cap.

Keys (all optional; without a store for any owner a run has no persistent budgets):

- ``[privacy].ledger_dir``: where owners' stores live when an owner names none
  (``DIR/NAME.sqlite``); a simulated market puts every owner's store there.
- ``[privacy].owner_budget``: the market-wide cap, epsilon at ``[privacy].delta``.
- ``[owners.NAME].budget = {epsilon = E, delta = D}``: that owner's own cap.
- ``[owners.NAME].ledger = "PATH"``: that owner's store (on its own node).
- ``[privacy].block_records = N``: owners' records are grouped by arrival into blocks of N,
  each with the owner's cap as its own budget (actors/budgets/gate.py, "Blocks"); or
  ``[privacy].block_seconds = W``: into windows of W seconds of arrival time (not both).
- ``[consumer].budget = {epsilon = E, delta = D}``: the cap of the consumer's validation set
  across purchases, in ``[consumer].ledger`` (default ``[privacy].ledger_dir``/consumer.sqlite).

Relative paths are taken from the config file's folder. Every owner with a store needs a cap
(its own or the market-wide one) and every owner with a cap a store; anything else is refused
with the key named, before anything is spent.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dpmarket.actors.budgets.gate import OwnerBudget
from dpmarket.actors.config.checks import ConfigError, allocate_selected

__all__ = [
    "BUDGET_PRIVACY_KEYS",
    "OwnerBudget",
    "check_allocate_blocks",
    "parse_budgets",
    "parse_consumer",
]

BUDGET_PRIVACY_KEYS = frozenset({"ledger_dir", "owner_budget", "block_records", "block_seconds"})
_OWNER_KEYS = frozenset({"budget", "ledger"})
OWNER_BUDGET_KEYS = _OWNER_KEYS


def cap_epsilon(path: str, key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{path}: {key}: expected a number > 0, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{path}: {key}: expected a finite number > 0, got {value!r}")
    return float(value)


def cap_delta(path: str, key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ConfigError(f"{path}: {key}: expected a number in (0, 1), got {value!r}")
    return float(value)


def store_path(base: Path, path: str, key: str, value: object) -> Path:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{path}: {key}: expected a path, got {value!r}")
    p = Path(value)
    return p if p.is_absolute() else (base / p).resolve()


def parse_budgets(
    path: str,
    privacy: dict[str, Any],
    owners_table: object,
    owners: tuple[str, ...],
    delta: float,
    other_keys: frozenset[str] = frozenset(),
) -> dict[str, OwnerBudget]:
    """The owners' budgets of a config (empty: no persistent budgets); ConfigError by key.
    ``other_keys`` are the ``[owners.NAME]`` keys that other parsers read (placement)."""
    base = Path(path).parent
    if not isinstance(owners_table, dict):
        raise ConfigError(f"{path}: [owners]: expected tables [owners.NAME]")
    unknown = sorted(set(owners_table) - set(owners))
    if unknown:
        raise ConfigError(f"{path}: [owners]: unknown owners {unknown}; owners are {list(owners)}")
    ledger_dir = privacy.get("ledger_dir")
    directory = (
        None if ledger_dir is None else store_path(base, path, "[privacy].ledger_dir", ledger_dir)
    )
    default_cap = privacy.get("owner_budget")
    market_cap = (
        None
        if default_cap is None
        else (cap_epsilon(path, "[privacy].owner_budget", default_cap), delta)
    )
    blocks = privacy.get("block_records", 0)
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 0:
        raise ConfigError(f"{path}: [privacy].block_records: expected an integer >= 0")
    seconds = privacy.get("block_seconds", 0.0)
    if "block_seconds" in privacy:
        seconds = cap_epsilon(path, "[privacy].block_seconds", seconds)  # a finite number > 0
        if "block_records" in privacy:
            raise ConfigError(
                f"{path}: [privacy].block_seconds: blocks are by record count "
                "(block_records) or by arrival time (block_seconds), not both"
            )
    out: dict[str, OwnerBudget] = {}
    for name in owners:
        table = owners_table.get(name, {})
        key = f"[owners.{name}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: {key}: expected a table with {sorted(_OWNER_KEYS)}")
        extra = sorted(set(table) - _OWNER_KEYS - other_keys)
        if extra:
            allowed = sorted(_OWNER_KEYS | other_keys)
            raise ConfigError(f"{path}: {key}: unknown keys {extra}; allowed {allowed}")
        cap = market_cap
        if "budget" in table:
            budget = table["budget"]
            if not isinstance(budget, dict) or set(budget) != {"epsilon", "delta"}:
                raise ConfigError(
                    f"{path}: {key}.budget: expected {{epsilon = E, delta = D}}, got {budget!r}"
                )
            cap = (
                cap_epsilon(path, f"{key}.budget.epsilon", budget["epsilon"]),
                cap_delta(path, f"{key}.budget.delta", budget["delta"]),
            )
        store: Path | None = None
        if "ledger" in table:
            store = store_path(base, path, f"{key}.ledger", table["ledger"])
        elif directory is not None:
            store = directory / f"{name}.sqlite"
        if store is None and cap is None:
            continue
        if store is None:
            raise ConfigError(
                f"{path}: {key}: a budget needs a store: set [privacy].ledger_dir or {key}.ledger"
            )
        if cap is None:
            raise ConfigError(
                f"{path}: {key}: a store needs a cap: set [privacy].owner_budget or {key}.budget"
            )
        out[name] = OwnerBudget(str(store), cap[0], cap[1], blocks, seconds)
    if (blocks or seconds) and not out:
        key = "block_records" if blocks else "block_seconds"
        raise ConfigError(f"{path}: [privacy].{key}: blocks need owners' stores and caps")
    stores = [b.ledger for b in out.values()]
    if len(set(stores)) != len(stores):
        raise ConfigError(f"{path}: [owners]: two owners share one ledger store")
    for name, budget in out.items():  # a store on this machine is checked now, before a run
        check_existing_store(path, name, Path(budget.ledger), blocked=bool(blocks or seconds))
    return out


def _key(owner: str) -> str:
    return "[consumer]" if owner == "consumer" else f"[owners.{owner}]"


def check_existing_store(path: str, owner: str, store: Path, blocked: bool = False) -> None:
    """An existing local store must be a ledger store of ``owner`` (one on another node is
    checked by the owner's actor when it opens it), and a run without blocks may not use a store
    that holds charges to blocks: it would charge those records against the whole-store budget
    alone (actors/budgets/store.py, "Per record"). Another block size is fine: records keep the
    blocks the store gave them."""
    from dpmarket.actors.budgets.reading import read_store
    from dpmarket.actors.budgets.store import BLOCKS_KEY, StoreError

    if not store.exists():
        return
    try:
        contents = read_store(store)
    except StoreError as exc:
        raise ConfigError(f"{path}: {_key(owner)}: {exc}") from None
    found = contents["owner"]
    if found != owner:
        raise ConfigError(
            f"{path}: {_key(owner)}: {store} is the ledger store of {found!r}, not {owner!r}"
        )
    if not blocked and any(r["state"] == "charged" and r["block"] >= 0 for r in contents["rows"]):
        raise ConfigError(
            f"{path}: {BLOCKS_KEY}: {store} holds charges to blocks of {owner}'s records; a run "
            "without blocks would charge them against the whole-store budget alone: set "
            "block_records or block_seconds again (any size: records keep their blocks) or use "
            "another store"
        )


def parse_consumer(path: str, privacy: dict[str, Any], table: object) -> OwnerBudget | None:
    """The consumer's store and cap (``[consumer]``), or None; ConfigError by key."""
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [consumer]: expected a table with {sorted(_OWNER_KEYS)}")
    extra = sorted(set(table) - _OWNER_KEYS)
    if extra:
        raise ConfigError(
            f"{path}: [consumer]: unknown keys {extra}; allowed {sorted(_OWNER_KEYS)}"
        )
    if not table:
        return None
    budget = table.get("budget")
    if not isinstance(budget, dict) or set(budget) != {"epsilon", "delta"}:
        raise ConfigError(
            f"{path}: [consumer].budget: expected {{epsilon = E, delta = D}}, got {budget!r}"
        )
    base = Path(path).parent
    if "ledger" in table:
        store = store_path(base, path, "[consumer].ledger", table["ledger"])
    elif privacy.get("ledger_dir") is not None:
        store = (
            store_path(base, path, "[privacy].ledger_dir", privacy["ledger_dir"])
            / "consumer.sqlite"
        )
    else:
        raise ConfigError(
            f"{path}: [consumer]: a budget needs a store: set [consumer].ledger or "
            "[privacy].ledger_dir"
        )
    check_existing_store(path, "consumer", store)
    return OwnerBudget(
        str(store),
        cap_epsilon(path, "[consumer].budget.epsilon", budget["epsilon"]),
        cap_delta(path, "[consumer].budget.delta", budget["delta"]),
    )


def parse_budget_tables(
    path: str,
    data: dict[str, Any],
    owners: tuple[str, ...],
    delta: float,
    other_keys: frozenset[str] = frozenset(),
) -> tuple[dict[str, OwnerBudget], OwnerBudget | None]:
    """A market config's budgets: the owners' (:func:`parse_budgets`) and the consumer's
    (:func:`parse_consumer`). allocate-select's profile reads every record of an owner, retired
    blocks included, so it is refused together with blocks."""
    privacy = data.get("privacy", {})
    budgets = parse_budgets(path, privacy, data.get("owners", {}), owners, delta, other_keys)
    check_allocate_blocks(path, "[summary].allocate", data.get("summary", {}), budgets)
    return budgets, parse_consumer(path, privacy, data.get("consumer", {}))


def check_allocate_blocks(
    path: str, key: str, summary: object, budgets: dict[str, OwnerBudget]
) -> None:
    """Refuse allocate-select (chosen by ``summary``) with block budgets: its histogram reads
    every record of an owner, retired blocks included. ``key`` names where it was chosen."""
    if allocate_selected(summary) and any(
        b.block_records or b.block_seconds for b in budgets.values()
    ):
        raise ConfigError(
            f"{path}: {key}: allocate-select (chosen by allocate = true, or by max_points or an "
            "allocation key without allocate = false) reads every record, retired blocks "
            "([privacy].block_records or block_seconds) included: use one or the other "
            "(allocate = false buys by herding-select under max_points)"
        )

"""Range tables and relations of a market config, checked before anything is spent.

actors/config/market.py reads the TOML and calls these: every key typed and in range, and the
relations between keys (T <= K - 2, p <= the records a simulated source holds, the scan sketch
within one frame, faults naming known owners and compute nodes). The ``[summary]`` keys are
checked by :class:`CuratorParams` itself; :func:`summary_error` names the key a user wrote.
Every message names the file and the key: ``demo.toml: [summary].max_epochs: expected an
integer >= 1, got -5``.
"""

from __future__ import annotations

import math
import re
import tomllib
from typing import Any

from dpmarket.protocol.summary.params import ParamError
from dpmarket.protocol.wire.checks import MAX_ARRAY_BYTES

__all__ = [
    "ALLOCATION_KEYS",
    "GENERATOR_KEYS",
    "SOURCE_KEYS",
    "STEERING_KEYS",
    "ConfigError",
    "allocate_selected",
    "apply_set",
    "check_data_keys",
    "check_faults",
    "check_market",
    "check_run",
    "check_sketch",
    "check_summary_sizes",
    "integer",
    "market_size",
    "number",
    "secure_settings",
    "selected_mechanism",
    "summary_error",
]

# A secure-sum vector (the scan sketch: rows x width counters) travels in one frame.
MAX_VECTOR = MAX_ARRAY_BYTES // 8
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

# The synthetic source's generator (streams/synthetic.py gaussian_mixture_shift): key ->
# (kind, low, high, default). Every point is held in memory, hence the upper limits.
GENERATOR_KEYS: dict[str, tuple[str, float, float, float]] = {
    "n_points": ("int", 1, 10**8, 20_000),
    "dim": ("int", 1, 10_000, 20),
    "components": ("int", 2, 10_000, 8),
    "concentration": ("real", 0, 1e6, 0.5),
    "n_validation": ("int", 1, 10**7, 500),
    "n_test": ("int", 1, 10**7, 2000),
    "n_seed": ("int", 2, 10**6, 50),
}
# Size keys, bounded by what the machine and the protocol carry, checked when the config is
# parsed, before anything of that size is built (docs/guide/configuration.md "Limits"). Every
# owner is a party of every secure-sum round and has a ledger in every report; every owner actor
# and compute node is a process (MAX_OWNER_ACTORS: owners / owners_per_actor, rounded up); the
# compute nodes each hold a share of every owner's vector (M >= 2: one node alone would see
# every value); the summary, the points bought and the features are held in the curator's
# memory; a simulated source's points (records x dim float64s) are all in memory at once.
MAX_OWNERS, MAX_OWNER_ACTORS, MAX_COMPUTE_NODES = 2048, 128, 32
MAX_SUMMARY_SIZE, MAX_FEATURES = 100_000, 10_000
MAX_SIMULATED_BYTES = 2 << 30
# [summary] keys that size a loop or a buffer (CuratorParams checks only their lower bounds)
SUMMARY_LIMITS: dict[str, int] = {
    "max_epochs": 100_000,
    "max_points": 1_000_000,
    "max_deliveries": 1_000,
    "tau": MAX_OWNERS,
    "validation_iterations": 10_000_000,
    "seed_iterations": 10_000_000,
    "summary_iterations": 1_000_000,
    "herding_ascent_steps": 10_000,
    "allocation_dims": MAX_FEATURES,
}

# [data] keys each source uses; any other [data] key is refused for that source (it would be
# silently ignored). n_points also bounds the records of a files market (the secure sums'
# fixed-point range, actors/run/phases.py).
SOURCE_KEYS = {
    "synthetic": set(GENERATOR_KEYS) | {"gamma", "stream", "bound"},
    "digits": {"n_seed", "gamma", "stream", "bound"},
    "files": {
        "features",
        "label_column",
        "lower",
        "upper",
        "policy",
        "header",
        "validation",
        "seed_set",
        "files",
        "gamma",
        "bound",
        "n_points",
    },
}
_SUMMARY_KEY = {  # CuratorParams fields that other sections set
    "p": "[market].summary_size",
    "max_lost": "[market].tolerance",
    "phase_timeout": "[run].deadline_seconds",
    "h1_seed": "[run].seed",
    "gamma": "[data].gamma",
    "known_colluders": "[faults].colluders",
}


class ConfigError(ValueError):
    """A configuration file that cannot be used, with the reason and the offending key."""


def integer(path: str, key: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` as an integer in ``low..high`` (booleans refused), else ConfigError."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        top = "" if high is None else f" and <= {high}"
        raise ConfigError(f"{path}: {key}: expected an integer >= {low}{top}, got {value!r}")
    return value


def number(path: str, key: str, value: object, low: float, high: float) -> float:
    """``value`` as a finite number in the open interval (low, high), else ConfigError."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        x = float(value)
        if math.isfinite(x) and low < x < high:
            return x
    raise ConfigError(
        f"{path}: {key}: expected a finite number in ({low:g}, {high:g}), got {value!r}"
    )


def check_run(path: str, run: dict[str, Any]) -> None:
    """``[run]``: the name names the actors and their namespace (``dpmarket:NAME:owner-3``)."""
    name = run.get("name")
    if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
        raise ConfigError(
            f"{path}: [run].name: expected 1-64 letters, digits, '.', '_' or '-' (it names "
            f"the run's Ray actors), got {name!r}"
        )
    if "out" in run and (not isinstance(run["out"], str) or not run["out"]):
        raise ConfigError(f"{path}: [run].out: expected a directory path, got {run['out']!r}")
    for key in ("seed", "noise_seed"):
        if key in run:
            integer(path, f"[run].{key}", run[key], 0, 2**63 - 1)


def market_size(path: str, market: dict[str, Any]) -> tuple[int, int]:
    """``[market].owners`` and ``compute_nodes`` within their limits (before any list of
    owners or nodes is made), and ``owners_per_actor`` keeping the owner actors within theirs."""
    owners = integer(path, "[market].owners", market.get("owners", 5), 1, MAX_OWNERS)
    nodes = market.get("compute_nodes", 3)
    if nodes == 1 and not isinstance(nodes, bool):
        raise ConfigError(
            f"{path}: [market].compute_nodes: 1 node alone would see every owner's value in the "
            "secure sums; expected 2 or more"
        )
    nodes = integer(path, "[market].compute_nodes", nodes, 2, MAX_COMPUTE_NODES)
    group = integer(path, "[market].owners_per_actor", market.get("owners_per_actor", 1), 1, owners)
    if -(-owners // group) > MAX_OWNER_ACTORS:
        raise ConfigError(
            f"{path}: [market].owners_per_actor: {owners} owners in groups of {group} make "
            f"{-(-owners // group)} owner actors (processes), more than {MAX_OWNER_ACTORS}; "
            f"set owners_per_actor >= {-(-owners // MAX_OWNER_ACTORS)}"
        )
    return owners, nodes


def check_summary_sizes(path: str, section: str, summary: dict[str, Any]) -> None:
    """The ``[summary]`` keys that size a loop or a buffer within :data:`SUMMARY_LIMITS`."""
    for key, high in SUMMARY_LIMITS.items():
        value = summary.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > high:
            raise ConfigError(f"{path}: {section}.{key}: expected at most {high}, got {value}")


def check_market(path: str, owners: int, tolerance: int) -> None:
    """T <= K - 2: the secure sums' noise comes from K - T - 1 >= 1 honest owners."""
    if tolerance > owners - 2:
        raise ConfigError(
            f"{path}: [market].tolerance: T = {tolerance} with owners = {owners} leaves "
            f"K - T - 1 = {owners - tolerance - 1} honest owners for the secure-sum noise; "
            f"expected T <= owners - 2 = {owners - 2}"
            + (" (a market needs at least 2 owners)" if owners < 2 else "")
        )


def check_data_keys(
    path: str, source: str, data: dict[str, Any], owners: int, summary_size: int, seed: int
) -> None:
    """The [data] keys of ``source``: generator sizes typed and in range, ``gamma`` and
    ``bound`` finite and positive, and ``summary_size`` within the records a simulated source
    holds (a files market's records are known only as its files are read)."""
    unused = sorted(set(data) - SOURCE_KEYS[source] - {"source"})
    if unused:
        raise ConfigError(
            f"{path}: [data]: {unused} not used with source = {source!r} (it uses "
            f"{sorted(SOURCE_KEYS[source])})"
        )
    for key in ("gamma", "bound"):
        if key in data:
            number(path, f"[data].{key}", data[key], 0.0, 1e12)
    sizes: dict[str, float] = {}
    for key, (kind, low, high, default) in GENERATOR_KEYS.items():
        if key not in data or key not in SOURCE_KEYS[source]:
            sizes[key] = default
        elif kind == "int":
            sizes[key] = integer(path, f"[data].{key}", data[key], int(low), int(high))
        else:
            sizes[key] = number(path, f"[data].{key}", data[key], low, high)
    if source == "synthetic":
        points = sum(sizes[k] for k in ("n_points", "n_validation", "n_test", "n_seed"))
        if points * sizes["dim"] * 8 > MAX_SIMULATED_BYTES:
            raise ConfigError(
                f"{path}: [data].n_points: {points:g} simulated points (n_points, n_validation, "
                f"n_test and n_seed) of dim = {sizes['dim']:g} take {points * sizes['dim'] * 8:g} "
                f"bytes in memory, more than {MAX_SIMULATED_BYTES} (2 GiB)"
            )
        if sizes["n_points"] < owners:
            raise ConfigError(
                f"{path}: [data].n_points: {sizes['n_points']:g} points cannot give each of "
                f"the {owners} owners one"
            )
        if summary_size > sizes["n_points"]:
            raise ConfigError(
                f"{path}: [market].summary_size: p = {summary_size} exceeds the pool of "
                f"[data].n_points = {sizes['n_points']:g} records"
            )
    elif source == "digits":
        _check_digits(path, owners, summary_size, seed, int(sizes["n_seed"]))


def _check_digits(path: str, owners: int, summary_size: int, seed: int, n_seed: int) -> None:
    from dpmarket.actors.config.digits import digits_rows
    from dpmarket.actors.randomness import public_generator

    if owners != 5:
        raise ConfigError(f"{path}: [market].owners: the digits split has 5 owners, got {owners}")
    try:
        rows = digits_rows(public_generator(seed), seed_size=n_seed)
    except ValueError as exc:
        raise ConfigError(f"{path}: [data].n_seed: {exc}") from None
    pool = sum(len(r) for r in rows.owners)
    if summary_size > pool:
        raise ConfigError(
            f"{path}: [market].summary_size: p = {summary_size} exceeds the digits pool of "
            f"{pool} records"
        )


def check_sketch(path: str, rows: int, width: int) -> None:
    """The scan sketch's rows x width counters are one secure-sum vector in one frame."""
    if rows * width > MAX_VECTOR:
        raise ConfigError(
            f"{path}: [sketch].width: rows x width = {rows} x {width} counters exceed the "
            f"{MAX_VECTOR} one frame carries"
        )


def check_faults(path: str, table: dict[str, Any], owners: tuple[str, ...], nodes: int) -> None:
    """[faults] names only known owners and compute nodes, each once."""
    colluders = table.get("colluders", [])
    if (
        not isinstance(colluders, list)
        or not all(isinstance(c, str) and c in owners for c in colluders)
        or len(set(colluders)) != len(colluders)
    ):
        raise ConfigError(
            f"{path}: [faults].colluders: expected a list of distinct owner names from "
            f"{list(owners)}, got {colluders!r}"
        )
    known = [f"compute-{i + 1}" for i in range(nodes)]
    kill_compute = table.get("kill_compute", [])
    if not isinstance(kill_compute, list) or not all(
        isinstance(n, str) and n in known for n in kill_compute
    ):
        raise ConfigError(
            f"{path}: [faults].kill_compute: expected names of compute nodes from {known}, "
            f"got {kill_compute!r}"
        )


# [summary] keys that configure a steered purchase (the g_tilde release, the seed, the summary
# release, the auction, herding's candidates, exploration, the selection and withdrawal rules):
# a table that sets one of them without naming a mechanism keeps herding-select, the default
# before issue 30 (random-select would ignore most of them silently).
STEERING_KEYS = frozenset({
    "d", "eps_validation", "validation_iterations", "validation_release", "validation_sigma",
    "validation_center", "clip_norm", "eps_seed", "seed_iterations", "eps_summary",
    "summary_iterations", "summary_release", "summary_sigma", "eta", "warm_start",
    "eps_auction", "auction_variant", "tau", "n_candidates", "candidate_distribution",
    "candidate_center", "candidate_scale", "herding_residual_weight", "herding_ascent_steps",
    "explore_share", "final_selection", "max_deliveries",
})  # fmt: skip
# [summary] keys only allocate-select reads: a table that sets one selects it (with the plan's
# max_points, ceil(1.5 p), unless given), as allocate = true does.
ALLOCATION_KEYS = frozenset({
    "allocation_floor", "allocation_sigma", "allocation_rule", "allocation_dims",
    "allocation_ridge", "random_share",
})  # fmt: skip


def selected_mechanism(summary: object) -> str:
    """The purchase mechanism a ``[summary]`` table selects (protocol/summary/params.py
    ``MARKET_MECHANISMS``), in this order:

    1. its ``mechanism`` key when given (a name outside the list is left to the parameter
       checks, which refuse it by name);
    2. random-select with ``random_purchase = true``;
    3. allocate-select with ``allocate = true``, or a budget (``max_points``) or one of its own
       keys (:data:`ALLOCATION_KEYS`) without ``allocate = false`` (issue 18: under a budget it
       closes more of the gap than herding-select held to the same budget,
       benchmarks/RESULTS.md "parsimony"); herding-select with ``allocate = false``;
    4. herding-select with ``random_purchase = false``, under ``neighbouring = "add_remove"``
       (the others send exact counts, which that relation refuses) or when the table sets a key
       only a steered purchase reads (:data:`STEERING_KEYS`);
    5. else (no ``[summary]``, or one without any of those): random-select at the default
       budget, the (K + 1) p points herding-select accesses unbounded (issue 30: at that
       budget a random purchase then the exact selection is as good as herding-select or
       better in 10 of 12 held-out cells, with no summary release (owners pay the secure sums,
       as in every run); benchmarks/RESULTS.md "utility_vs_random", "the default").

    A non-boolean ``allocate`` is left to the parameter checks."""
    if not isinstance(summary, dict):
        return "random-select"
    named = summary.get("mechanism")
    if isinstance(named, str):
        return named
    if summary.get("random_purchase") is True:
        return "random-select"
    allocate = summary.get("allocate")
    if isinstance(allocate, bool):
        return "allocate-select" if allocate else "herding-select"
    if "max_points" in summary or ALLOCATION_KEYS & summary.keys():
        return "allocate-select"
    if (
        summary.get("random_purchase") is False
        or summary.get("neighbouring") == "add_remove"
        or STEERING_KEYS & summary.keys()
    ):
        return "herding-select"
    return "random-select"


def allocate_selected(summary: object) -> bool:
    """Whether a ``[summary]`` table selects allocate-select (:func:`selected_mechanism`)."""
    return selected_mechanism(summary) == "allocate-select"


def summary_error(path: str, exc: ParamError) -> ConfigError:
    """A :class:`ParamError` as a ConfigError naming the key the user wrote."""
    key = _SUMMARY_KEY.get(exc.field, f"[summary].{exc.field}")
    return ConfigError(f"{path}: {key}: {exc.detail}")


def apply_set(data: dict[str, Any], item: str) -> None:
    """Apply one ``section.key=value`` (or ``section.table.key=value``) override; the value is
    parsed as TOML, a bare word is taken as a string."""
    key, sep, raw = item.partition("=")
    parts = [p.strip() for p in key.split(".")]
    if not sep or len(parts) < 2 or not all(parts):
        raise ConfigError(f"--set {item!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    table = data
    for part in parts[:-1]:
        nested = table.setdefault(part, {})
        if not isinstance(nested, dict):
            raise ConfigError(f"--set {item!r}: {part} is not a table")
        table = nested
    table[parts[-1]] = value


def secure_settings(path: str, privacy: dict[str, Any], sketch: dict[str, Any]) -> dict[str, Any]:
    """The secure-sum phases' public settings: budgets and the scan sketch's shape."""
    enabled = privacy.get("secure_phases", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{path}: [privacy].secure_phases: expected true or false")
    standardize = privacy.get("standardize", True)
    if not isinstance(standardize, bool):
        raise ConfigError(f"{path}: [privacy].standardize: expected true or false")
    normalise_round = privacy.get("normalise_round", "auto")
    if normalise_round not in ("auto", "always"):
        raise ConfigError(
            f'{path}: [privacy].normalise_round: expected "auto" (skip a normalise round whose '
            'release the plan predicts will be discarded) or "always", got '
            f"{normalise_round!r}"
        )
    out: dict[str, Any] = {
        "enabled": enabled,
        "standardize": standardize,
        "normalise_round": normalise_round,
        "eps_normalise": number(
            path, "[privacy].eps_normalise", privacy.get("eps_normalise", 0.5), 0.0, 100.0
        ),
        "eps_scan": number(path, "[privacy].eps_scan", privacy.get("eps_scan", 0.5), 0.0, 100.0),
        "refresh_every": integer(
            path, "[privacy].refresh_every", privacy.get("refresh_every", 0), 0
        ),
        "rows": integer(path, "[sketch].rows", sketch.get("rows", 50), 1),
        "width": integer(path, "[sketch].width", sketch.get("width", 256), 2),
    }
    check_sketch(path, out["rows"], out["width"])
    out["eps_refresh"] = number(
        path, "[privacy].eps_refresh", privacy.get("eps_refresh", out["eps_scan"]), 0.0, 100.0
    )
    if "bandwidth" in sketch:
        out["bandwidth"] = number(path, "[sketch].bandwidth", sketch["bandwidth"], 0.0, 1e12)
    return out

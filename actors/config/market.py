"""Run configuration from TOML: what a scenario is and which protocol parameters to override.

Unknown sections or keys are refused with a message that names them, so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from dpmarket.actors.config import checks as checks
from dpmarket.actors.config.budgets import (
    BUDGET_PRIVACY_KEYS,
    OWNER_BUDGET_KEYS,
    check_allocate_blocks,
    parse_budget_tables,
)
from dpmarket.actors.config.checks import ConfigError
from dpmarket.actors.config.inputs import FaultConfig, MarketConfig
from dpmarket.actors.config.placement import PLACEMENT_KEYS, parse_placements
from dpmarket.actors.config.remote import check_remote_market, parse_remote
from dpmarket.actors.config.requests import parse_requests
from dpmarket.actors.config.validate import check_schema, resolved_data
from dpmarket.protocol.securesum.spec import SHARE_MODES
from dpmarket.protocol.summary.curator import CuratorParams
from dpmarket.protocol.summary.params import ParamError

__all__ = [
    "ConfigError",
    "FaultConfig",
    "MarketConfig",
    "check_keys",
    "load_market_config",
    "parse_market_config",
]

_SCENARIOS = ("digits", "synthetic", "files")


def check_keys(section: str, table: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"[{section}]: unknown keys {unknown}; allowed: {sorted(allowed)}")


# ------------------------------------------------------------------------ the market run
MARKET_SECTIONS = {
    "run": {
        "name",
        "seed",
        "out",
        "deadline_seconds",
        "reproducible_noise",
        "noise_seed",
        "simulation",
    },
    "market": {
        "owners",
        "compute_nodes",
        "tolerance",
        "summary_size",
        "owners_per_actor",
        "dca_shares",
    },
    "data": {"source"} | set().union(*checks.SOURCE_KEYS.values()),
    "privacy": {
        "delta",
        "eps_normalise",
        "eps_scan",
        "secure_phases",
        "standardize",
        "normalise_round",
        "refresh_every",
        "eps_refresh",
    }
    | BUDGET_PRIVACY_KEYS,
    "sketch": {"rows", "width", "bandwidth"},
    "summary": {"mechanism"}
    | {f.name for f in dataclasses.fields(CuratorParams)}
    - {"p", "gamma", "h1_seed", "phase_timeout", "max_lost", "known_colluders", "center", "scale"},
    "faults": {"kill", "slow", "colluders", "kill_curator_at", "kill_compute", "kill_actor"},
}


def _int(path: str, key: str, value: object, minimum: int) -> int:
    return checks.integer(path, key, value, minimum)


def _number(path: str, key: str, value: object, low: float, high: float) -> float:
    return checks.number(path, key, value, low, high)


def _choice(path: str, key: str, value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"{path}: {key}: expected one of {list(allowed)}, got {value!r}")
    return value


def _faults(path: str, table: dict[str, Any], owners: tuple[str, ...]) -> FaultConfig:
    kill = table.get("kill", {})
    slow = table.get("slow", {})
    kill_actor = table.get("kill_actor", {})
    colluders = table.get("colluders", [])
    for key, mapping in (("kill", kill), ("slow", slow), ("kill_actor", kill_actor)):
        if not isinstance(mapping, dict):
            raise ConfigError(f"{path}: [faults].{key}: expected a table of owner = value")
        unknown = sorted(set(mapping) - set(owners))
        if unknown:
            raise ConfigError(f"{path}: [faults].{key}: unknown owners {unknown}")
    if both := sorted((set(kill) | set(slow)) & set(kill_actor)):  # those get actors of their own
        raise ConfigError(
            f"{path}: [faults].kill_actor: {both} also killed or slow alone ([faults].kill, "
            "slow): an owner is alone in its actor or killed with the owners it shares one with"
        )
    if not isinstance(colluders, list) or not set(colluders) <= set(owners):
        raise ConfigError(f"{path}: [faults].colluders: expected a list of owner names")
    at = table.get("kill_curator_at")
    kill_compute = table.get("kill_compute", [])
    if not isinstance(kill_compute, list) or not all(
        isinstance(n, str) and n.startswith("compute-") for n in kill_compute
    ):
        raise ConfigError(f"{path}: [faults].kill_compute: expected names like 'compute-2'")
    return FaultConfig(
        kill={o: _int(path, f"[faults].kill.{o}", e, 1) for o, e in kill.items()},
        slow={o: _number(path, f"[faults].slow.{o}", s, 0.0, 3600.0) for o, s in slow.items()},
        colluders=tuple(colluders),
        kill_curator_at=None if at is None else _int(path, "[faults].kill_curator_at", at, 1),
        kill_compute=tuple(kill_compute),
        kill_actor={o: _int(path, f"[faults].kill_actor.{o}", e, 1) for o, e in kill_actor.items()},
    )


def load_market_config(path: str | Path, sets: list[str] | None = None) -> MarketConfig:
    """Parse a market run TOML file; ``sets`` are ``section.key=value`` overrides (TOML values).
    The config keeps the text it was parsed from and the overrides (``text``, ``sets``): a run
    journals them, and ``resume`` parses them again (actors/config/journaled.py)."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{name}:{line}: not UTF-8 text (byte "
            f"{exc.start}: {exc.object[exc.start : exc.end]!r}); a TOML configuration must be UTF-8"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read configuration ({exc})") from None
    return parse_market_config(text, name, sets)


def parse_market_config(text: str, path: str | Path, sets: list[str] | None = None) -> MarketConfig:
    """A market config from TOML ``text`` as if read from ``path`` (the name in messages, the
    directory relative data paths are taken from), with ``sets`` applied on top."""
    name = str(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{name}: cannot read configuration ({exc})") from None
    for item in sets or []:
        checks.apply_set(data, item)
    check_keys(
        f"{name}: top level",
        data,
        set(MARKET_SECTIONS) | {"owners", "consumer", "requests", "remote"},
    )
    for section, allowed in MARKET_SECTIONS.items():
        if not isinstance(data.get(section, {}), dict):
            raise ConfigError(f"{name}: [{section}]: expected a table, got {data[section]!r}")
        check_keys(f"{name}: {section}", data.get(section, {}), allowed)
    run, market = data.get("run", {}), data.get("market", {})
    source = data.get("data", {}).get("source", "synthetic")
    if source not in _SCENARIOS:
        raise ConfigError(f"{name}: [data].source: {source!r} is not one of {list(_SCENARIOS)}")
    K, M = checks.market_size(name, market)  # bounded before any owner or node is named
    T = _int(name, "[market].tolerance", market.get("tolerance", 1), 0)
    checks.check_market(name, K, T)
    checks.check_run(name, run)
    owners = tuple(f"owner-{k + 1}" for k in range(K))
    reproducible = run.get("reproducible_noise", False)
    if not isinstance(reproducible, bool):
        raise ConfigError(f"{name}: [run].reproducible_noise: expected true or false")
    simulation = run.get("simulation", False)
    if not isinstance(simulation, bool):
        raise ConfigError(f"{name}: [run].simulation: expected true or false")
    if reproducible and source == "files" and not simulation:
        raise ConfigError(
            f"{name}: [run].reproducible_noise: refused with [data].source = 'files' (noise "
            "from a public seed would make every release of private data reversible; a test "
            "on files that are not private says so with [run].simulation = true)"
        )
    if "noise_seed" in run and not reproducible:
        raise ConfigError(
            f"{name}: [run].noise_seed: only meaningful with reproducible_noise = true "
            "(the default draws noise from OS entropy)"
        )
    if source == "files" and data.get("summary", {}).get("neighbouring") == "add_remove":
        raise ConfigError(
            f"{name}: [summary].neighbouring: 'add_remove' refused with [data].source = 'files' "
            "(m and q are published, so it would under-charge the releases of private data)"
        )
    remote = parse_remote(name, data.get("remote"), Path(path).parent, owners, M)
    local = tuple(o for o in owners if remote is None or o not in remote.owners)
    _check_data(name, source, data.get("data", {}), local, Path(path).parent, "requests" in data)
    p = checks.integer(
        name, "[market].summary_size", market.get("summary_size", 50), 1, checks.MAX_SUMMARY_SIZE
    )
    checks.check_summary_sizes(name, "[summary]", data.get("summary", {}))
    seed = _int(name, "[run].seed", run.get("seed", 0), 0)
    checks.check_data_keys(name, source, data.get("data", {}), K, p, seed)
    checks.check_faults(name, data.get("faults", {}), owners, M)
    config = MarketConfig(
        source=source,
        name=str(run.get("name", Path(path).stem)),
        seed=seed,
        reproducible_noise=reproducible,
        noise_seed=_int(name, "[run].noise_seed", run.get("noise_seed", 0), 0),
        out=str(run.get("out", f"out/{Path(path).stem}")),
        deadline_seconds=_number(
            name, "[run].deadline_seconds", run.get("deadline_seconds", 5.0), 0.0, 3600.0
        ),
        owners=K,
        compute_nodes=M,
        owners_per_actor=market.get("owners_per_actor", 1),
        dca_shares=_choice(
            name, "[market].dca_shares", market.get("dca_shares", "derived"), SHARE_MODES
        ),
        tolerance=T,
        summary_size=p,
        data={k: v for k, v in data.get("data", {}).items() if k != "source"},
        delta=_number(
            name, "[privacy].delta", data.get("privacy", {}).get("delta", 1e-5), 0.0, 1.0
        ),
        overrides=dict(data.get("summary", {})),
        faults=_faults(name, data.get("faults", {}), owners),
        secure=checks.secure_settings(name, data.get("privacy", {}), data.get("sketch", {})),
        path=name,
        placement=parse_placements(name, data.get("owners", {}), owners, OWNER_BUDGET_KEYS),
        remote=remote,
    )
    if source == "files":  # paths absolute and the schema checked, once (validate.py)
        resolved = resolved_data(name, config.data)
        config = dataclasses.replace(config, data=resolved, written_data=config.data)
        config = dataclasses.replace(config, schema=check_schema(config))
    budgets, consumer = parse_budget_tables(name, data, owners, config.delta, PLACEMENT_KEYS)
    requests = parse_requests(name, data, source, frozenset(MARKET_SECTIONS["summary"]))
    config = dataclasses.replace(
        config,
        budgets=budgets,
        consumer_budget=consumer,
        requests=requests,
        text=text,
        sets=tuple(sets or ()),
    )
    check_request_params(config)
    check_remote_market(name, config)
    m = config.data.get("n_validation", 500)  # m is known at run time; any m checks the keys
    try:
        config.curator_params(gamma=1.0, m=m if isinstance(m, int) and m >= 1 else 500)
    except ParamError as exc:
        raise checks.summary_error(name, exc) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}: [summary]: {exc}") from None
    return config


def _check_data(
    path: str,
    source: str,
    data: dict[str, Any],
    owners: tuple[str, ...],
    base: Path,
    requests: bool = False,
) -> None:
    """Check the [data] keys a source needs: input files exist, bounds are numbers, ..."""
    stream = data.get("stream")
    if stream is not None:
        if source == "files" or not isinstance(stream, dict):
            raise ConfigError(f"{path}: [data].stream: a table, for simulated sources only")
        check_keys(f"{path}: [data.stream]", stream, {"initial_fraction", "batches", "interval"})
        _number(
            path,
            "[data.stream].initial_fraction",
            stream.get("initial_fraction", 0.5),
            0.0,
            1.0 + 1e-9,
        )
        _int(path, "[data.stream].batches", stream.get("batches", 5), 1)
        _number(path, "[data.stream].interval", stream.get("interval", 0.5), 0.0, 3600.0)
    if source != "files":
        return
    checks.integer(path, "[data].features", data.get("features"), 1, checks.MAX_FEATURES)
    for key in ("lower", "upper"):
        value = data.get(key)
        values = value if isinstance(value, list) else [value]
        if not values or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
        ):
            raise ConfigError(f"{path}: [data].{key}: expected a number or a list of numbers")
    files = data.get("files", {} if not owners else None)  # remote owners hold their own
    if not isinstance(files, dict) or set(files) != set(owners):
        raise ConfigError(
            f"{path}: [data.files]: expected one list of input files per local owner "
            f"{list(owners)} (remote owners' files are in their own agents' configurations)"
        )
    for owner, paths in files.items():
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) for p in paths):
            raise ConfigError(f"{path}: [data.files].{owner}: expected a non-empty list of paths")
    for key in (
        ("seed_set",) if requests and "validation" not in data else ("validation", "seed_set")
    ):
        target = data.get(key)
        if not isinstance(target, str) or not (base / target).is_file():
            raise ConfigError(
                f"{path}: [data].{key}: file {target!r} not found or not a regular file"
            )


def check_request_params(config: MarketConfig) -> None:
    """Each request's curator parameters are valid (ConfigError naming the request)."""
    for request in config.requests:
        derived = config.for_request(request)
        key = f"[[requests]] ({request.name}).summary"
        checks.check_summary_sizes(config.path, key, request.summary)
        check_allocate_blocks(config.path, key, derived.overrides, config.budgets)
        m = derived.data.get("n_validation", 500)
        try:
            derived.curator_params(gamma=1.0, m=m if isinstance(m, int) and m >= 1 else 500)
        except ParamError as exc:
            error = str(checks.summary_error(config.path, exc)).removeprefix(f"{config.path}: ")
            raise ConfigError(f"{config.path}: [[requests]] ({request.name}): {error}") from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"{config.path}: [[requests]] ({request.name}).summary: {exc}"
            ) from None

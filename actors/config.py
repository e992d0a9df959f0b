"""Run configuration from TOML: what a scenario is and which protocol parameters to override.

Unknown sections or keys are refused with a message that names them, so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpmarket.protocol.curator import CuratorParams

__all__ = ["ConfigError", "DemoConfig", "load_demo_config"]

_SCENARIOS = ("digits", "synthetic")


class ConfigError(ValueError):
    """A configuration file that cannot be used, with the reason and the offending key."""


@dataclass(frozen=True)
class DemoConfig:
    scenario: str = "digits"
    seeds: tuple[int, ...] = (0, 1)
    p: tuple[int, ...] = (20, 50, 100)
    delta: float = 1e-5
    overrides: dict[str, Any] = field(default_factory=dict)

    def apply(self, params: CuratorParams) -> CuratorParams:
        return dataclasses.replace(params, **self.overrides)


def _check_keys(section: str, table: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"[{section}]: unknown keys {unknown}; allowed: {sorted(allowed)}")


def load_demo_config(path: str | Path) -> DemoConfig:
    """Parse a demo/evaluation TOML file (see configs/demo.toml)."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read configuration ({exc})") from None
    _check_keys("top level", data, {"scenario", "summary"})
    scen = data.get("scenario", {})
    _check_keys("scenario", scen, {"name", "seeds", "p", "delta"})
    summary = data.get("summary", {})
    tunable = {f.name for f in dataclasses.fields(CuratorParams)} - {"p", "gamma", "h1_seed"}
    _check_keys("summary", summary, tunable)
    name = scen.get("name", "digits")
    if name not in _SCENARIOS:
        raise ConfigError(f"[scenario].name: {name!r} is not one of {list(_SCENARIOS)}")
    seeds, p = scen.get("seeds", [0, 1]), scen.get("p", [20, 50, 100])
    for key, values in (("seeds", seeds), ("p", p)):
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, int) and v >= 0 for v in values)
        ):
            raise ConfigError(f"[scenario].{key}: expected a non-empty list of integers >= 0")
    if any(v < 1 for v in p):
        raise ConfigError("[scenario].p: summary sizes must be >= 1")
    delta = scen.get("delta", 1e-5)
    if not isinstance(delta, float) or not 0 < delta < 1:
        raise ConfigError(f"[scenario].delta: expected a number in (0, 1), got {delta!r}")
    config = DemoConfig(name, tuple(seeds), tuple(p), delta, dict(summary))
    try:  # validate the overrides now, with CuratorParams' own checks
        config.apply(CuratorParams(p=1))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[summary]: {exc}") from None
    return config

"""dpmarket: a runtime for private data marketplaces (README.md).

The Python API, the functions the ``dpmarket`` command calls (docs/guide/python.md):

- :func:`load_config` a market config (TOML) with overrides -> :class:`MarketConfig`;
- :func:`run_market` one purchase on Ray -> :class:`MarketResult`;
- :func:`read_report` the result of a finished (or stopped) run from its output directory;
- :func:`load_study` and :func:`simulate` a dropout and collusion study -> :class:`StudyResult`;
- :class:`ConfigError` a configuration or input that cannot be used (the command's exit 2).

The names load on first use, so importing a subpackage (``dpmarket.protocol``, an agent's
``dpmarket.actors.remote``) never imports the runtime behind them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dpmarket.api import (
        ConfigError,
        MarketConfig,
        MarketResult,
        StudyConfig,
        StudyResult,
        load_config,
        load_study,
        read_report,
        run_market,
        simulate,
    )

INSTALL_MARKET = "pip install 'dpmarket[market]'"

__all__ = [
    "ConfigError",
    "MarketConfig",
    "MarketResult",
    "StudyConfig",
    "StudyResult",
    "load_config",
    "load_study",
    "read_report",
    "run_market",
    "simulate",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'dpmarket' has no attribute {name!r}")
    try:
        api = importlib.import_module("dpmarket.api")
    except ModuleNotFoundError as exc:  # an agent's install: no market runtime
        if (exc.name or "dpmarket").split(".")[0] == "dpmarket":
            raise
        raise ImportError(  # the command's words (actors/commands/main.py INSTALL_MARKET)
            f"dpmarket.{name} needs the market's runtime, which this install lacks "
            f"({exc.name} not installed): {INSTALL_MARKET}",
            name=exc.name,
        ) from None
    return getattr(api, name)


def __dir__() -> list[str]:
    return sorted(__all__)

"""The ``dpmarket`` command line: one module per command in this package; this one assembles
the parser and maps errors to exit codes.

Exit codes: 0 success; 2 bad configuration or input (the message names the file and key), or a
command this install cannot run (an agent's install, ``pip install dpmarket``, runs the agents,
``certs``, ``account``, ``budget``, ``sketch``, ``audit`` and ``regress``; a market's commands
need ``pip install 'dpmarket[market]'``, and the message says so); 3 refused by T-tolerance
(more owners lost or colluding than T; resume when they are back); 1 or other non-zero:
internal error. ``DPMARKET_TRACEBACK=1`` in the environment adds the traceback to the one-line
message of exit 2 (for a job on a cluster, where the message is all the operator sees).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import traceback
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from dpmarket.actors.commands.account import add_account_parser
from dpmarket.actors.commands.agents import add_agent_parsers
from dpmarket.actors.commands.audit import build_audit_parser
from dpmarket.actors.commands.budget import add_budget_parser
from dpmarket.actors.commands.certs import add_certs_parser
from dpmarket.actors.commands.digits import add_digits_parser
from dpmarket.actors.commands.evaluate import add_evaluate_parser
from dpmarket.actors.commands.market import add_market_parsers
from dpmarket.actors.commands.regress import add_regress_parser
from dpmarket.actors.commands.sketch import add_sketch_parser
from dpmarket.actors.config.market import ConfigError

__all__ = ["MARKET_COMMANDS", "MARKET_EXTRA", "build_parser", "main", "missing_market_modules"]

# The market's runtime: the module each package of pyproject.toml's ``market`` extra installs
# (tests/test_packaging.py holds the two together). An agent's install has none of them.
MARKET_EXTRA = {
    "ray": "ray[default]",
    "sklearn": "scikit-learn",
    "matplotlib": "matplotlib",
    "pyarrow": "pyarrow",
}
# commands that need the market's runtime whatever their arguments (others may, for some
# inputs: a budget plot needs matplotlib, regress's diabetes data scikit-learn; main says so)
MARKET_COMMANDS = frozenset({"run", "simulate", "validate", "resume", "digits", "evaluate"})
INSTALL_MARKET = "pip install 'dpmarket[market]'"


def _version() -> str:
    try:
        return version("dpmarket")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpmarket", description=__doc__)
    parser.add_argument("--version", action="version", version=f"dpmarket {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_digits_parser(sub)
    add_market_parsers(sub)
    add_account_parser(sub)
    add_budget_parser(sub)
    add_regress_parser(sub)
    add_sketch_parser(sub)
    build_audit_parser(sub)
    add_evaluate_parser(sub)
    add_agent_parsers(sub)
    add_certs_parser(sub)
    return parser


def missing_market_modules() -> list[str]:
    """The modules of the market's extra that this install lacks (found without importing)."""
    return [module for module in MARKET_EXTRA if importlib.util.find_spec(module) is None]


def _needs_market(command: str, missing: list[str]) -> int:
    print(
        f"dpmarket {command}: needs the market's runtime, which this install lacks "
        f"({', '.join(missing)} not installed): {INSTALL_MARKET}",
        file=sys.stderr,
    )
    return 2


def _traceback() -> None:
    if os.environ.get("DPMARKET_TRACEBACK", "") not in ("", "0"):
        traceback.print_exc(file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in MARKET_COMMANDS and (missing := missing_market_modules()):
        return _needs_market(args.command, missing)  # before anything is read or started
    try:
        return int(args.func(args))
    except ModuleNotFoundError as exc:  # an input that needs the market's extra after all
        if (exc.name or "").split(".")[0] not in MARKET_EXTRA:
            raise
        return _needs_market(args.command, [str(exc.name)])
    except ConfigError as exc:
        _traceback()
        print(f"dpmarket: configuration error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        _traceback()
        print(f"dpmarket: bad input: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

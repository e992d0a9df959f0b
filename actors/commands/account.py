"""``dpmarket account``: a ledger calculator for a list of mechanisms.

Each mechanism is written ``kind:key=value,key=value``::

    laplace:scale=100,count=1656            Laplace, L1 sensitivity 1 unless sensitivity=...
    exponential:eps=0.01,count=1656         sampling prop. to exp(eps * score), score sens. 1
    gaussian:sigma=3.2,sensitivity=1.4
    auction:eps=0.04,variant=pure,count=200
    approx:eps=0.5,delta=1e-6,count=3

and ``paper=EPS`` adds how the paper counts the event. The command prints epsilon at ``--delta``
by dp-accounting's PLD accountant, by Theorem 7 of the paper and as the paper counts it.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from dpmarket.actors.config.market import ConfigError
from dpmarket.protocol.privacy.ledger import PrivacyLedger

__all__ = ["add_account_parser", "ledger_from_specs"]

_KEYS = {
    "laplace": {"scale", "sensitivity", "count", "paper"},
    "exponential": {"eps", "sensitivity", "count", "paper"},
    "gaussian": {"sigma", "sensitivity", "count", "paper"},
    "auction": {"eps", "variant", "count"},
    "approx": {"eps", "delta", "count", "paper"},
}
_REQUIRED = {
    "laplace": {"scale"},
    "exponential": {"eps"},
    "gaussian": {"sigma"},
    "auction": {"eps", "variant"},
    "approx": {"eps", "delta"},
}


def _parse(spec: str) -> tuple[str, dict[str, str]]:
    kind, _, rest = spec.partition(":")
    if kind not in _KEYS:
        raise ConfigError(f"mechanism {spec!r}: unknown kind {kind!r}; one of {sorted(_KEYS)}")
    fields: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in _KEYS[kind]:
            raise ConfigError(
                f"mechanism {spec!r}: bad field {item!r}; allowed {sorted(_KEYS[kind])}"
            )
        fields[key] = value
    missing = _REQUIRED[kind] - set(fields)
    if missing:
        raise ConfigError(f"mechanism {spec!r}: missing {sorted(missing)}")
    return kind, fields


def ledger_from_specs(specs: list[str], party: str = "calculator") -> PrivacyLedger:
    """Build a ledger from mechanism specs; refuse anything malformed by name."""
    ledger = PrivacyLedger(party)
    for spec in specs:
        kind, f = _parse(spec)
        try:
            count = int(f.get("count", "1"))
            sens = float(f.get("sensitivity", "1"))
            meta: dict[str, Any] = {"label": spec}
            if "paper" in f:
                meta["paper_epsilon"] = float(f["paper"])
            if kind == "laplace":
                ledger.laplace(float(f["scale"]), sens, count, **meta)
            elif kind == "exponential":
                ledger.exponential(float(f["eps"]), sens, count, **meta)
            elif kind == "gaussian":
                ledger.gaussian(float(f["sigma"]), sens, count, **meta)
            elif kind == "auction":
                ledger.auction(float(f["eps"]), f["variant"], count, label=spec)
            else:
                ledger.approx_dp(float(f["eps"]), float(f["delta"]), count, **meta)
        except ValueError as exc:
            raise ConfigError(f"mechanism {spec!r}: {exc}") from None
    return ledger


def _account(args: argparse.Namespace) -> int:
    ledger = ledger_from_specs(args.mechanisms)
    result = {}
    for method in ("pld", "theorem7", "paper"):
        eps = ledger.epsilon(args.delta, method)
        result[method] = eps if math.isfinite(eps) else None
    if args.json:
        print(json.dumps({"delta": args.delta, "epsilon": result}))
        return 0
    print(f"{len(args.mechanisms)} mechanism(s), delta = {args.delta:g}")
    for method, label in (
        ("pld", "dp-accounting PLD"),
        ("theorem7", "Theorem 7 (Kairouz)"),
        ("paper", "as the paper counts it"),
    ):
        value = result[method]
        print(f"  {label:<24} {'inf' if value is None else f'{value:.4f}'}")
    return 0


def add_account_parser(sub: Any) -> None:
    cmd = sub.add_parser(
        "account",
        help="epsilon of a list of mechanisms (PLD, Theorem 7, paper count)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("mechanisms", nargs="+", metavar="KIND:KEY=VALUE,...")
    cmd.add_argument("--delta", type=float, default=1e-5)
    cmd.add_argument("--json", action="store_true", help="print one JSON object")
    cmd.set_defaults(func=_account)

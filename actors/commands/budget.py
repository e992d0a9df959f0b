"""``dpmarket budget DIR``: what each owner's persistent ledger has spent and has left.

``DIR`` is a ``[privacy].ledger_dir`` (every ``*.sqlite`` in it is an owner's store) or one
store file. For each owner: epsilon spent at its cap's delta by the owner's Rényi filter
(protocol/privacy/filter.py; the same number the owner's actor decides by), the cap (the one
the latest run ran under), what is left, the runs that used the store and the releases it
declined, and by mechanism label how many releases it paid for. ``--json`` prints one object
``{"owners": {NAME: {"spent": eps, "cap": eps, "delta": d, "runs": n, ...}}}``; ``--plot PATH``
draws each owner's spending over time against its cap. Reads the stores only (read-only).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from dpmarket.actors.budgets.reading import read_store, spending
from dpmarket.actors.budgets.store import StoreError
from dpmarket.actors.config.market import ConfigError
from dpmarket.protocol.privacy.filter import RenyiFilter
from dpmarket.protocol.privacy.ledger import MechanismEvent

__all__ = ["add_budget_parser", "budget_summary"]


def _stores(target: Path) -> list[Path]:
    if target.is_file():
        return [target]
    if not target.is_dir():
        raise ConfigError(f"{target}: no such ledger directory or store")
    found = sorted(target.glob("*.sqlite"))
    if not found:
        raise ConfigError(f"{target}: no ledger stores (*.sqlite) in it")
    return found


def _owner(contents: dict[str, Any]) -> dict[str, Any]:
    runs = contents["runs"]
    charged = [r for r in contents["rows"] if r["state"] == "charged"]
    once = {r["release"]: r for r in charged}  # with blocks, a release has a row per block
    events = [MechanismEvent.from_dict(e) for r in once.values() for e in r["events"]]
    by_label: Counter[str] = Counter()
    for e in events:
        by_label[e.label or e.mechanism] += e.count
    entry: dict[str, Any] = {
        "spent": 0.0,
        "cap": None,
        "delta": None,
        "runs": len(runs),
        "left": None,
        "declined": sum(r["state"] == "declined" for r in contents["rows"]),
        "mechanisms": dict(sorted(by_label.items())),
        "history": [(r["at"], r["spent_after"]) for r in charged],
    }
    if runs:
        cap, delta = float(runs[-1]["cap_epsilon"]), float(runs[-1]["delta"])
        filt = RenyiFilter(cap, delta)
        history, paid = spending(contents["rows"], contents["blocks"])
        spent = filt.spent(history)  # what every record paid (charges made without blocks)
        blocks = sorted(set(paid) | set(contents["retired"]))
        if blocks:  # per record: the history and its block's charges; the largest block's
            per = {b: filt.spent([*history, *paid.get(b, [])]) for b in blocks}
            entry["blocks"] = {
                str(b): {
                    "spent": per[b],
                    "left": max(0.0, cap - per[b]),
                    "retired": b in contents["retired"],
                }
                for b in blocks
            }
            spent = max(spent, *per.values())
        entry |= {"spent": spent, "cap": cap, "delta": delta, "left": max(0.0, cap - spent)}
    return entry


def budget_summary(target: Path) -> dict[str, Any]:
    """``{"owners": {NAME: {...}}}`` for every store under ``target``."""
    owners: dict[str, Any] = {}
    for path in _stores(target):
        try:
            contents = read_store(path)
        except StoreError as exc:
            raise ConfigError(str(exc)) from None
        name = str(contents["owner"])
        if name == "consumer" and path.stem != "consumer":  # a request's own consumer store
            name = path.stem  # ([[requests]] budget: consumer-NAME.sqlite), by its file
        owners[name] = _owner(contents)
    return {"owners": owners}


def _plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, entry in summary["owners"].items():
        history = entry["history"]
        if not history:
            continue
        t0 = history[0][0]
        xs = [(t - t0) / 60.0 for t, _ in history]
        line = ax.step(xs, [s for _, s in history], where="post", label=name)[0]
        if entry["cap"] is not None:
            ax.axhline(entry["cap"], color=line.get_color(), linestyle="--", linewidth=0.8)
    ax.set_xlabel("minutes since the owner's first charge")
    ax.set_ylabel("epsilon spent (Rényi filter; dashed: cap)")
    ax.set_title("owners' persistent privacy budgets")
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _budget(args: argparse.Namespace) -> int:
    summary = budget_summary(Path(args.dir))
    if args.plot:
        _plot(summary, Path(args.plot))
    if args.json:
        out = {
            "owners": {
                name: {k: v for k, v in entry.items() if k != "history"}
                for name, entry in summary["owners"].items()
            }
        }
        print(json.dumps(out))
        return 0
    print(f"{'owner':<12} {'spent':>8} {'cap':>8} {'left':>8} {'delta':>8} {'runs':>5} declined")
    for name, e in summary["owners"].items():
        cap = "-" if e["cap"] is None else f"{e['cap']:.4g}"
        left = "-" if e["left"] is None else f"{e['left']:.4g}"
        delta = "-" if e["delta"] is None else f"{e['delta']:.0e}"
        print(
            f"{name:<12} {e['spent']:>8.4g} {cap:>8} {left:>8} {delta:>8} {e['runs']:>5} "
            f"{e['declined']:>8}"
        )
        for label, count in e["mechanisms"].items():
            print(f"{'':<12}   {count:>5} x {label}")
        for block, b in e.get("blocks", {}).items():
            state = "retired" if b["retired"] else "live"
            print(
                f"{'':<12}   block {block:>4}: spent {b['spent']:.4g}, "
                f"left {b['left']:.4g}, {state}"
            )
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def add_budget_parser(sub: Any) -> None:
    cmd = sub.add_parser(
        "budget",
        help="owners' persistent budgets: spent, cap, left, runs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("dir", metavar="DIR", help="a [privacy].ledger_dir, or one store file")
    cmd.add_argument("--json", action="store_true", help="print one JSON object")
    cmd.add_argument("--plot", metavar="PATH", help="plot spending over time (PNG)")
    cmd.set_defaults(func=_budget)

"""T-tolerance at scale (issue 29, part 3): K = 1024 owners co-located 50 per actor process,
T = 100, owner actors killed during the epochs.

    python benchmarks/owner_kill.py                  # K = 1024, T = 100, 50 owners per actor
    python benchmarks/owner_kill.py --owners 64 --tolerance 6 --per-actor 3   # a quick look

Three runs of benchmarks/owner_scale.py's market on one local Ray instance:

1. ``kill-T``: the actors hosting owner-1 and owner-(per_actor + 1) killed at epoch 5
   (``[faults].kill_actor``): 2 x per_actor = T owners lost (not 2 actors): expected exit 0, the
   report listing the T owners.
2. ``kill-T+1``: the same two actors and one more owner alone in its own actor
   (``[faults].kill``): T + 1 owners lost: expected exit 3, the journal kept.
3. ``resume``: ``dpmarket resume`` of run 2 (the faults happened; the owners are back):
   expected exit 0.

Prints one line per run and, last, one JSON object (``runs``: case, exit_code, owners_lost,
seconds; ``as_expected``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from owner_scale import TreeSampler, market_toml


def _case(name: str, run: Any, expected: int) -> dict[str, Any]:
    tick = time.perf_counter()
    with TreeSampler() as sampler:
        outcome = run()
    seconds = time.perf_counter() - tick
    lost = (outcome.report or {}).get("faults", {}).get("lost", {})
    row = {
        "case": name,
        "exit_code": outcome.exit_code,
        "expected": expected,
        "owners_lost": len(lost),
        "seconds": round(seconds, 1),
        "peak_rss_mb": sampler.result(),
        "message": outcome.message,
    }
    print(
        f"{name:<10} exit {row['exit_code']} (expected {expected})  owners lost in the "
        f"report: {row['owners_lost']:>4}  {row['seconds']:>7.1f} s  peak MB {row['peak_rss_mb']}"
        f"  {outcome.message[:90]}",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", type=int, default=1024)
    parser.add_argument("--tolerance", type=int, default=100)
    parser.add_argument("--per-actor", type=int, default=50)
    parser.add_argument("--epoch", type=int, default=5)
    args = parser.parse_args()
    if 2 * args.per_actor != args.tolerance or args.owners < 3 * args.per_actor + 1:
        parser.error("--per-actor: two actors must hold exactly T owners, with room for more")

    from dpmarket.actors.config.market import parse_market_config
    from dpmarket.actors.run.market import resume_market, run_market

    second = f"owner-{args.per_actor + 1}"
    actors = f"kill_actor = {{ owner-1 = {args.epoch}, {second} = {args.epoch} }}"
    alone = f"kill = {{ owner-{args.owners} = {args.epoch} }}"
    print(f"load before: {os.getloadavg()}", flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="owner-kill-") as tmp:
        for name, faults, expected in (
            ("kill-T", actors, 0),
            ("kill-T+1", f"{actors}\n{alone}", 3),
        ):
            out = Path(tmp) / name
            text = market_toml(args.owners, str(out), args.per_actor, args.tolerance, faults)
            (Path(tmp) / f"{name}.toml").write_text(text)
            config = parse_market_config(text, Path(tmp) / f"{name}.toml")
            runs.append(_case(name, lambda c=config, o=out: run_market(c, o), expected))
        refused = Path(tmp) / "kill-T+1"
        runs.append(_case("resume", lambda: resume_market(refused), 0))
    print(f"load after: {os.getloadavg()}", flush=True)
    ok = [r["exit_code"] == r["expected"] for r in runs] + [
        runs[0]["owners_lost"] == args.tolerance
    ]
    print(json.dumps({"benchmark": "owner_kill", "owners": args.owners,
                      "tolerance": args.tolerance, "owners_per_actor": args.per_actor,
                      "runs": runs, "as_expected": all(ok)}))  # fmt: skip


if __name__ == "__main__":
    main()

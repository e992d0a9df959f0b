"""Issue 24's reproduction, end to end: does a new block size give spent records a fresh budget?

Runs ``dpmarket run configs/demo.toml`` (embedded Ray) on one ledger directory with
``owner_budget = 1.2``: twice with ``block_records = 1000``, then with 999, then with 10, then
without blocks. Before the fix the 999 and 10 runs recomputed blocks as ``position // N`` and
made a full purchase from records that had paid (real per-record loss 1.57-1.94 against 1.2,
while ``dpmarket budget`` showed 1.115). After it, every record keeps the block the store gave
it, so those runs read nothing that has paid; the run without blocks is refused (exit 2).

For each run: its exit code, the distinct points the curator bought (report.private.json's
``parsimony.distinct_points``: a count that depends on the data, so the consumer's),
report.json's ``budgets.errors`` count, and, from the stores
alone, the largest loss of any record (the filter over the whole-store charges and its
block's, ``dpmarket budget``'s figure) against the cap.

    python benchmarks/block_regroup.py          # about 5 minutes on 2 cores

Last line: ``{"benchmark": "block_regroup", "cap", "runs": [{"block_records", "exit",
"distinct_points", "budget_errors", "max_record_loss"}], "max_record_loss"}``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from dpmarket.actors.commands.budget import budget_summary

ROOT = Path(__file__).resolve().parents[1]
CAP = 1.2
SEQUENCE = (1000, 1000, 999, 10, 0)  # 0: without blocks


def run(ledgers: Path, out: Path, block_records: int) -> dict[str, object]:
    sets = ["--set", f"privacy.ledger_dir={json.dumps(str(ledgers))}"]
    sets += ["--set", f"privacy.owner_budget={CAP}"]
    if block_records:
        sets += ["--set", f"privacy.block_records={block_records}"]
    command = [sys.executable, "-m", "dpmarket.actors.commands.main", "run"]
    done = subprocess.run(
        [*command, str(ROOT / "configs" / "demo.toml"), "--out", str(out), *sets],
        capture_output=True,
        text=True,
        check=False,
    )
    ok = done.returncode == 0 and (out / "report.json").is_file()
    public = json.loads((out / "report.json").read_text()) if ok else {}
    private = json.loads((out / "report.private.json").read_text()) if ok else {}
    owners = budget_summary(ledgers)["owners"] if ledgers.is_dir() else {}
    return {
        "block_records": block_records,
        "exit": done.returncode,
        "distinct_points": private.get("parsimony", {}).get("distinct_points"),
        "budget_errors": len((public.get("budgets") or {}).get("errors", [])) if public else None,
        "max_record_loss": max((o["spent"] for o in owners.values()), default=0.0),
        "message": done.stderr.strip().splitlines()[-1] if done.returncode else "",
    }


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n", 1)[0]).parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for index, size in enumerate(SEQUENCE):
            rows.append(run(Path(tmp) / "L", Path(tmp) / f"out-{index}", size))
    print(f"{'run':>3} {'block_records':>13} {'exit':>4} {'points':>6} {'errors':>6} "
          f"{'max record loss':>15} (cap {CAP})")  # fmt: skip
    for index, row in enumerate(rows):
        size = row["block_records"] or "none"
        print(
            f"{index + 1:>3} {size:>13} {row['exit']:>4} {row['distinct_points']!s:>6} "
            f"{row['budget_errors']!s:>6} {row['max_record_loss']:>15.4f}"
        )
        if row["message"]:
            print(f"    {row['message'][:160]}")
    worst = max(float(r["max_record_loss"]) for r in rows)  # type: ignore[arg-type]
    print(
        json.dumps(
            {"benchmark": "block_regroup", "cap": CAP, "runs": rows, "max_record_loss": worst}
        )
    )


if __name__ == "__main__":
    main()

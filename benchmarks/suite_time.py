"""The test suite's time per part (issue 37): wall clock and CPU seconds of each make target.

Runs the targets of ``make test`` one after another (or any targets named with ``--targets``),
each in its own cpuacct cgroup when this machine lets a process create one (cgroup v1 at
/sys/fs/cgroup/cpuacct, as root), so the CPU seconds of every process a part starts are counted
(Ray's raylets and workers included, even those that outlive their parent), and in a memory
cgroup its peak (every process of the part together, page cache included: an upper bound of
any one pytest process's resident memory); without the cgroups those columns are empty.
The CPU seconds say how much work a part is, whatever else the machine runs; the wall clock
is what a user waits, and is only the target's on an otherwise idle machine (the load average
at the start and end of each part is printed beside it).

    .venv/bin/python benchmarks/suite_time.py                 # lint typecheck unit-fast unit-ray
    .venv/bin/python benchmarks/suite_time.py --targets test  # make test as one command
    .venv/bin/python benchmarks/suite_time.py --targets check

Each part's output is kept in ``--logs`` (default a temporary directory); the slowest tests
pytest printed (``--durations``) are collected into one table. The last line is one JSON object:
``{"parts": {target: {"wall_s", "cpu_s", "peak_gib", "load_start", "load_end", "status"}},
"total_wall_s",
"total_cpu_s", "slowest": [[seconds, phase, test], ...]}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
MEMORY = Path("/sys/fs/cgroup/memory")
DURATION = re.compile(r"^\s*([0-9.]+)s (call|setup|teardown)\s+(\S+)")


@contextlib.contextmanager
def cpu_group(name: str, hierarchy: Path = CPUACCT) -> Iterator[Path | None]:
    """A fresh cgroup of ``hierarchy`` (removed afterwards), or None where none can be made."""
    group = hierarchy / f"dpmarket-suite-{name}-{os.getpid()}"
    try:
        group.mkdir()
    except OSError:
        yield None
        return
    try:
        yield group
    finally:
        for _ in range(50):  # processes leave the group as they exit
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def run_part(target: str, logs: Path) -> dict[str, object]:
    log = logs / f"{target}.log"
    load_start = os.getloadavg()[0]
    with (
        cpu_group(target) as group,
        cpu_group(target, MEMORY) as memory,
        log.open("wb") as out,
    ):
        # the child joins the groups before it execs make: everything it starts is counted
        join = "".join(f"echo $$ > {g / 'cgroup.procs'} && " for g in (group, memory) if g)
        start = time.monotonic()
        status = subprocess.call(
            ["sh", "-c", f"{join}exec make {target}"],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        wall = time.monotonic() - start
        cpu = int((group / "cpuacct.usage").read_text()) / 1e9 if group else None
        # every process of the part together at its peak, page cache included: an upper bound
        # of any one pytest process's resident memory
        peak = int((memory / "memory.max_usage_in_bytes").read_text()) / 2**30 if memory else None
    return {
        "wall_s": round(wall, 1),
        "cpu_s": None if cpu is None else round(cpu, 1),
        "peak_gib": None if peak is None else round(peak, 2),
        "load_start": round(load_start, 2),
        "load_end": round(os.getloadavg()[0], 2),
        "status": status,
        "log": str(log),
    }


def slowest(logs: Path, limit: int) -> list[tuple[float, str, str]]:
    rows = []
    for log in sorted(logs.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            match = DURATION.match(line)
            if match:
                rows.append((float(match[1]), match[2], match[3]))
    return sorted(rows, reverse=True)[:limit]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--targets", nargs="+", default=["lint", "typecheck", "unit-fast", "unit-ray"]
    )
    parser.add_argument("--logs", type=Path, help="where each part's output is kept")
    parser.add_argument("--slowest", type=int, default=25, help="rows of the slowest tests")
    args = parser.parse_args(argv)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="dpmarket-suite-"))
    logs.mkdir(parents=True, exist_ok=True)

    parts = {}
    for target in args.targets:
        parts[target] = run_part(target, logs)
        print(f"  {target}: {parts[target]['wall_s']} s", file=sys.stderr, flush=True)

    print(
        f"{'part':<12} {'status':>6} {'wall s':>8} {'CPU s':>8} {'CPU/wall':>8} {'peak GiB':>8}"
        "  load start -> end"
    )
    for target, part in parts.items():
        cpu, wall = part["cpu_s"], float(part["wall_s"])  # type: ignore[arg-type]
        ratio = f"{float(cpu) / wall:.2f}" if cpu is not None and wall > 0 else "-"  # type: ignore[arg-type]
        print(
            f"{target:<12} {part['status']:>6} {wall:>8.1f} {cpu if cpu is not None else '-':>8} "
            f"{ratio:>8} {part['peak_gib'] if part['peak_gib'] is not None else '-':>8}"
            f"  {part['load_start']} -> {part['load_end']}"
        )
    total_wall = round(sum(float(p["wall_s"]) for p in parts.values()), 1)  # type: ignore[arg-type]
    cpus = [p["cpu_s"] for p in parts.values()]
    total_cpu = None if None in cpus else round(sum(float(c) for c in cpus), 1)  # type: ignore[arg-type]
    print(
        f"{'total':<12} {'':>6} {total_wall:>8.1f} {total_cpu if total_cpu is not None else '-':>8}"
    )
    rows = slowest(logs, args.slowest)
    print(f"\nslowest tests ({len(rows)}):")
    for seconds, phase, test in rows:
        print(f"{seconds:8.2f} s  {phase:<8} {test}")
    print(f"logs: {logs}")
    print(
        json.dumps(
            {
                "parts": {t: {k: v for k, v in p.items() if k != "log"} for t, p in parts.items()},
                "total_wall_s": total_wall,
                "total_cpu_s": total_cpu,
                "slowest": [list(r) for r in rows],
            }
        )
    )
    return 0 if all(p["status"] == 0 for p in parts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

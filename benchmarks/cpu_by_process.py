"""CPU seconds of a command and of every process it starts, by kind (issue 37).

Runs COMMAND in its own cpuacct cgroup (cgroup v1 at /sys/fs/cgroup/cpuacct, as root; as
benchmarks/suite_time.py) and samples /proc every 0.1 s: each process's own user + system
time, last seen before it exits, grouped by kind (a Ray worker by its actor class, ``ray::X``;
any other process by the first words of its command line). The cgroup's total counts every
process, also those shorter than a sample; the by-kind rows are a lower bound of their kind.
Used to find where a market run's CPU goes, e.g.:

    cd DIR_WITH_A_MARKET && HOME=$(mktemp -d) python benchmarks/cpu_by_process.py -- \\
        python -m dpmarket.actors.commands.main run market.toml --out /tmp/out

Prints a table, then one JSON object: {"cpu_s", "wall_s", "returncode", "kinds": {kind: s}}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
TICK = os.sysconf("SC_CLK_TCK")


def _kind(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    if args and args[0].startswith("ray::"):
        return args[0].split()[0]
    words = [a.rsplit("/", 1)[-1] for a in args[:4]] or [comm]
    return " ".join(words)[:60]


def _cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14 and 15)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command after --")
    group = CPUACCT / f"cpu_by_process.{os.getpid()}"
    try:
        group.mkdir()
    except OSError as exc:
        print(f"cpu_by_process: cannot make a cgroup under {CPUACCT} ({exc})", file=sys.stderr)
        return 2
    procs = group / "cgroup.procs"
    start = time.monotonic()
    child = subprocess.Popen(
        ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *command],
        stdout=sys.stderr,  # the command's output beside the table, not in the JSON line
    )
    seen: dict[int, tuple[float, str]] = {}
    try:
        while True:
            done = child.poll() is not None
            pids = [int(p) for p in procs.read_text().split()]
            for pid in pids:
                cpu, kind = _cpu(pid), _kind(pid)
                if cpu is not None and kind is not None:
                    seen[pid] = (cpu, kind)
            if done and not pids:
                break
            if done and time.monotonic() - start > 600:
                break  # a leftover daemon: stopped below
            time.sleep(0.1)
        wall = time.monotonic() - start
        total = int((group / "cpuacct.usage").read_text()) / 1e9
    finally:
        for pid in [int(p) for p in procs.read_text().split()]:  # only what COMMAND started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while procs.read_text().split() and time.monotonic() < deadline:
            time.sleep(0.1)
        group.rmdir()
    kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for cpu, kind in seen.values():
        kinds[kind][0] += cpu
        kinds[kind][1] += 1
    print(f"{'CPU s':>8}  {'n':>3}  kind")
    for kind, (cpu, n) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        print(f"{cpu:8.2f}  {n:3d}  {kind}")
    print(f"{total:8.2f}       every process (the cgroup); wall {wall:.1f} s")
    out = {
        "cpu_s": round(total, 2),
        "wall_s": round(wall, 1),
        "returncode": child.returncode,
        "kinds": {k: round(v[0], 2) for k, v in kinds.items()},
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

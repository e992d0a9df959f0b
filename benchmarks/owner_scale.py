"""How the market's cost grows with the number of owners K (issue 29, part 1).

The same market shape at every K: 500 records x 20 features per owner, p = 100, M = 3 compute
nodes, T = K / 10, the plan's mechanism (herding, every bidder asked each epoch), simulated
noise (``reproducible_noise``: a benchmark, nothing private). Two modes:

- ``inprocess``: the study engine (actors/studies/trial.py): the real parties in one process,
  every frame encoded and decoded, the secure sums through the real client, node and aggregator
  parties, the epochs on a LoopbackTransport with simulated time.
- ``ray``: ``dpmarket simulate`` (actors/run/market.py run_market) on a fresh local Ray with the
  owners co-located, ``owners_per_actor = ceil(K / P)`` for P owner processes: one per core,
  at most 16, by default (2 on the two-core machine of benchmarks/RESULTS.md;
  ``--owner-processes`` sets another count).

Phases (seconds, wall clock): ``spawn`` (in-process: the parties constructed; Ray: connecting,
the compute-node keys, the owner, curator and local compute-node actors asked for),
``ingest`` (in-process: the records generated; Ray: until every owner actor process has
started, holds its owners' records and answered the on-node check; the compute nodes start
beside them), ``normalise`` and ``scan`` (the two secure-sum rounds; Ray: normalise with the
owners' keys handed to the nodes, the owners' warm-up and the session set-up, each
also timed alone in ``secure_seconds``: ``secure_nodes``, ``warm_up``, ``secure_setup``,
``normalise_round``),
``epochs`` (the curator's run: setup, every epoch, the finish), ``report`` (in-process: each
owner's ledger accounted by PLD, as report.json does; Ray: the outputs and reports written).
``ms_per_epoch`` is ``epochs`` over the epochs run. ``peak_rss_mb``: the peak resident memory
(VmHWM) of the curator's process and of the largest owner process (in-process: both are the
one process, whose data generation is included; Ray: sampled every 0.5 s from /proc under the
benchmark's own process tree, with ``sum`` over the market's actor processes and ``sum_all``
with the driver and Ray's own processes, each process once under the role it last had (a Ray
worker is ``ray::IDLE`` before it becomes an actor), ``by_role`` and ``processes`` (each one's
peak and title): ``TreeSampler.result``; a sum of per-process peaks, each counting every
shared page it maps: Ray's object store, libraries; and ``pss_sum_all``, the highest sum at
one sample of every process's proportional set size, each page counted once). Printed after
the table: K = 1024's processes, largest first. ``memory_cgroup_mb``:
every process of the run together, each page once, from the memory cgroup the run is started
in where this machine allows one (``GroupSampler``); ``--cold-cache`` drops the page cache
first so the libraries' pages are charged to the run.

Each (K, mode) runs in a subprocess of its own (its own peak memory, its own Ray instance in a
temporary directory). The table, the plot ``benchmarks/owner_scale.png`` and, as the last
line, one JSON object with the rows (keys ``owners``, ``mode``, ``phase_seconds``,
``ms_per_epoch``, ``peak_rss_mb``, ``seconds``) and the goals as ratios measured in this run.

    python benchmarks/owner_scale.py                         # K = 16, 64, 256, 1024, both modes
    python benchmarks/owner_scale.py --owners 16 64 --modes inprocess
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from suite_time import MEMORY, cpu_group  # benchmarks/: the memory cgroup of a command

RECORDS_PER_OWNER, DIM, P, NODES = 500, 20, 100, 3
# default (--owner-processes): one owner process per core, at most 16. Each costs ~310-440 MB
# before its owners' records; the secure sums and the epochs make one call per process, not
# per owner, so on few cores more processes add memory, not speed (benchmarks/RESULTS.md)
OWNER_PROCESSES = min(16, os.cpu_count() or 1)
PHASES = ("spawn", "ingest", "normalise", "scan", "epochs", "report")
TITLES = {  # Ray's process titles of the market's actors
    "curator": ("ray::CuratorActor",),
    "owner": ("ray::OwnerActor", "ray::OwnerHost"),
    "compute": ("ray::ComputeNodeActor", "ray::ComputeNodeHost"),
}


def market_toml(
    owners: int,
    out: str,
    per_actor: int = 1,
    tolerance: int | None = None,
    faults: str = "",
    deadline: float = 30.0,
) -> str:
    """The benchmark's market config at ``owners`` owners (module docstring)."""
    tolerance = max(1, owners // 10) if tolerance is None else tolerance
    return f"""
[run]
name = "owner-scale-{owners}"
seed = 0
out = "{out}"
deadline_seconds = {deadline}
reproducible_noise = true

[market]
owners = {owners}
compute_nodes = {NODES}
tolerance = {tolerance}
summary_size = {P}
owners_per_actor = {per_actor}

[data]
source = "synthetic"
n_points = {RECORDS_PER_OWNER * owners}
dim = {DIM}
components = 8
n_validation = 500
n_test = 1000
bound = 3.0

[summary]
mechanism = "herding-select"   # as measured in RESULTS.md (the default is now random-select)

[faults]
{faults}
"""


def per_actor_for(owners: int, processes: int = OWNER_PROCESSES) -> int:
    """Owners per actor so that at most ``processes`` owner processes run."""
    return math.ceil(owners / processes)


def _proc_mb(path: str, key: str) -> float:
    """The ``key:`` line of a /proc file, in MiB (its value is in kB); 0 when it is gone."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    except OSError:
        return 0.0
    return 0.0


def peak_rss_mb(pid: int | str = "self") -> float:
    """VmHWM of a process (its peak resident set), in MiB; 0 when it is gone."""
    return _proc_mb(f"/proc/{pid}/status", "VmHWM:")


def pss_mb(pid: int) -> float:
    """A process's proportional set size in MiB (each page it maps divided by the number of
    processes mapping it, so summing it over processes counts every page once); 0 when gone."""
    return _proc_mb(f"/proc/{pid}/smaps_rollup", "Pss:")


class TreeSampler:
    """Samples the peak memory of every process under this process every ``period`` seconds:
    each one's highest VmHWM (a monotone counter: only growth in a process's last ``period``
    is missed), counted once under the role it last had (a Ray worker starts as ``ray::IDLE``
    and becomes an actor: the curator, an owner host, a compute node by their process titles;
    Ray's own daemons and workers that stay idle are "ray"), and the highest sum over every
    process of their proportional set sizes at one sample."""

    ROLES = ("curator", "owner", "compute", "driver", "ray")

    def __init__(self, period: float = 0.5) -> None:
        self.period = period
        self.peak: dict[int, float] = {}
        self.role: dict[int, str] = {}
        self.title: dict[int, str] = {}
        self.pss_peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _descendants(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry.name))
        out, todo = [], [os.getpid()]
        while todo:
            pid = todo.pop()
            out.extend(children.get(pid, []))
            todo.extend(children.get(pid, []))
        return out

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            pss = 0.0
            for pid in [os.getpid(), *self._descendants()]:
                pss += pss_mb(pid)
                try:
                    title = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                role = next((r for r, t in TITLES.items() if title.startswith(t)), "ray")
                role = "driver" if pid == os.getpid() else role
                peak = peak_rss_mb(pid)
                if peak:
                    self.peak[pid] = max(self.peak.get(pid, 0.0), peak)
                    if role != "ray" or pid not in self.role:  # an actor stays one
                        self.role[pid] = role
                        self.title[pid] = title.replace("\0", " ").strip()
            self.pss_peak = max(self.pss_peak, pss)

    def result(self) -> dict[str, Any]:
        """The curator's peak, the largest owner process's, the largest compute node's, the
        driver's (this process: the scenario, the run, the harness's baselines) and the largest
        of Ray's own processes; ``sum``: the sum of the market's actor processes' peaks
        (curator, owners, compute nodes: an upper bound of the market's memory, shared library
        pages counted once per process); ``sum_all``: with the driver and Ray's processes (each
        process once); ``by_role``: each role's processes and their peaks summed;
        ``pss_sum_all``: the highest sum, at one sample, of every process's proportional set
        size (driver, Ray's processes, actors): every page counted once, at one moment;
        ``processes``: each process's peak and title, largest first."""
        peaks = {r: [v for pid, v in self.peak.items() if self.role[pid] == r] for r in self.ROLES}
        out: dict[str, Any] = {role: round(max(p, default=0.0), 1) for role, p in peaks.items()}
        out["sum"] = round(sum(sum(peaks[r]) for r in ("curator", "owner", "compute")), 1)
        out["sum_all"] = round(sum(self.peak.values()), 1)
        out["pss_sum_all"] = round(self.pss_peak, 1)
        out["by_role"] = {
            r: {"processes": len(p), "mb": round(sum(p), 1)} for r, p in peaks.items()
        }
        order = sorted(self.peak, key=lambda pid: -self.peak[pid])
        out["processes"] = [[round(self.peak[pid], 1), self.title[pid][:80]] for pid in order]
        return out


@contextmanager
def timed(phases: dict[str, float], name: str) -> Iterator[None]:
    tick = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - tick


def run_inprocess(owners: int) -> dict[str, Any]:
    """One market through the study engine's pieces, each phase timed (module docstring)."""
    from dpmarket.actors.config.market import parse_market_config
    from dpmarket.actors.config.scenarios import make_market_scenario
    from dpmarket.actors.randomness import NoiseSource
    from dpmarket.actors.run.report import privacy_section
    from dpmarket.actors.studies import trial
    from dpmarket.actors.studies.trial import FaultDraw, trial_secure_phases
    from dpmarket.protocol.securesum.driver import DcaSession
    from dpmarket.protocol.summary.curator import Curator
    from dpmarket.protocol.summary.owner import Owner

    phases: dict[str, float] = {}

    class TimedSession(DcaSession):
        """The study engine's secure-sum session, each round timed under its phase's name."""

        def run_round(self, spec: Any, *args: Any, **kwargs: Any) -> Any:
            with timed(phases, "normalise" if spec.round == 1 else "scan"):
                return super().run_round(spec, *args, **kwargs)

    trial.DcaSession = TimedSession  # type: ignore[misc]  # the benchmark's timer, nothing else
    started = time.perf_counter()
    text = market_toml(owners, "unused", per_actor_for(owners))
    config = parse_market_config(text, "owner_scale.toml")
    with timed(phases, "ingest"):
        scenario = make_market_scenario(config)
    noise = NoiseSource.reproducible(config.seed)
    with timed(phases, "spawn"):
        params = config.curator_params(scenario.gamma, len(scenario.validation))
        parties = {
            name: Owner(name, "scale", X, y, rng=noise.generator(f"summary:{name}"))
            for name, (X, y) in zip(scenario.owner_names, scenario.owners, strict=True)
        }
        curator = Curator(
            "scale", list(parties), scenario.validation, scenario.seed_set, params,
            noise.generator("curator"),
        )  # fmt: skip
    secure = trial_secure_phases(config, scenario, curator, FaultDraw({}, {}, ()), noise)
    if secure.refused is not None:
        raise SystemExit(f"owner_scale: K = {owners}: refused in {secure.refused}")
    from dpmarket.actors.parties.transport import LoopbackTransport

    with timed(phases, "epochs"):
        transport = LoopbackTransport([curator, *parties.values()])
        transport.send(curator.start())
        transport.run_until(lambda: curator.state in ("done", "refused"))
    with timed(phases, "report"):
        result = curator.result()
        raw = {party: ledger.to_dict() for party, ledger in curator.ledgers.items()}
        privacy_section(raw, config.delta, ())  # report.json's privacy section
    peak = round(peak_rss_mb(), 1)
    return {
        "owners": owners,
        "mode": "inprocess",
        "epochs": result.epochs,
        "state": curator.state,
        "phase_seconds": {k: round(phases.get(k, 0.0), 3) for k in PHASES},
        "ms_per_epoch": round(1000 * phases["epochs"] / max(result.epochs, 1), 3),
        "peak_rss_mb": {"curator": peak, "owner": peak},
        "seconds": round(time.perf_counter() - started, 2),
        "tokens": [[q.owner, q.token] for q in result.provenance],
    }


def run_ray(
    owners: int, faults: str = "", tolerance: int | None = None, processes: int = OWNER_PROCESSES
) -> dict[str, Any]:
    """``dpmarket simulate`` of the benchmark's market on a fresh local Ray (module
    docstring); with ``faults`` (a [faults] body) the part-3 demonstration."""
    from dpmarket.actors.config.market import parse_market_config
    from dpmarket.actors.run.market import run_market

    per_actor = per_actor_for(owners, processes)
    with tempfile.TemporaryDirectory(prefix="owner-scale-") as tmp:
        out = Path(tmp) / "out"
        text = market_toml(owners, str(out), per_actor, tolerance, faults)
        path = Path(tmp) / "market.toml"
        path.write_text(text)
        config = parse_market_config(text, path)
        started = time.perf_counter()
        with TreeSampler() as sampler:
            outcome = run_market(config, out)
        seconds = time.perf_counter() - started
        row: dict[str, Any] = {
            "owners": owners,
            "mode": "ray",
            "owners_per_actor": per_actor,
            "exit_code": outcome.exit_code,
            "message": outcome.message,
            "phase_seconds": {k: round(outcome.phase_seconds.get(k, 0.0), 3) for k in PHASES},
            "secure_seconds": {  # normalise's parts: nodes, kernels, the session's set-up, round
                k: round(outcome.phase_seconds.get(k, 0.0), 3)
                for k in ("secure_nodes", "warm_up", "secure_setup", "normalise_round")
            },
            "peak_rss_mb": sampler.result(),
            "seconds": round(seconds, 2),
        }
        report = outcome.report or {}
        epochs = int(report.get("outcome", {}).get("epochs", 0))
        row["epochs"] = epochs
        row["ms_per_epoch"] = round(1000 * row["phase_seconds"]["epochs"] / max(epochs, 1), 3)
        row["lost"] = report.get("faults", {}).get("lost", {})
        return row


class GroupSampler:
    """The peak, every ``period`` seconds, of what the processes of a memory cgroup (cgroup v1)
    hold together: anonymous memory, shared memory (Ray's object store) and mapped file pages,
    a page mapped by many processes counted once (``memory.stat``: ``total_rss + total_shmem +
    total_mapped_file``; shared memory a process maps is in both of the last two, so this is an
    upper bound), beside the kernel's ``memory.max_usage_in_bytes`` (which also counts page
    cache no process maps: logs written, files read)."""

    def __init__(self, group: Path, period: float = 0.25) -> None:
        self.group, self.period, self.peak = group, period, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _mapped(self) -> int:
        stat = dict(line.split() for line in (self.group / "memory.stat").read_text().splitlines())
        return sum(
            int(stat.get(key, 0)) for key in ("total_rss", "total_shmem", "total_mapped_file")
        )

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            with contextlib.suppress(OSError, ValueError):
                self.peak = max(self.peak, self._mapped())

    def __enter__(self) -> GroupSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def result(self) -> dict[str, float]:
        usage = int((self.group / "memory.max_usage_in_bytes").read_text())
        return {"mapped_peak": round(self.peak / 2**20, 1), "max_usage": round(usage / 2**20, 1)}


def _drop_caches() -> bool:
    """Write back and drop the clean page cache (root only), so that the file pages the run
    maps are charged to its cgroup instead of to whoever read them first."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def _child(mode: str, owners: int, processes: int, cold: bool = False) -> dict[str, Any]:
    """Run one (K, mode) in a subprocess; its last stdout line is its row. Where this machine
    lets a process create one (cgroup v1, as root), the subprocess and everything it starts
    (Ray's daemons and workers) run in a memory cgroup of their own: ``memory_cgroup_mb``."""
    env = os.environ | {"RAY_TMPDIR": tempfile.mkdtemp(prefix="ray-owner-scale-")}
    cmd = [sys.executable, __file__, "--child", mode, str(owners)]
    cmd += ["--owner-processes", f"{processes}"]
    with cpu_group(f"owner-scale-{mode}-{owners}", MEMORY) as group:
        dropped = cold and _drop_caches()
        if group is not None:  # joins the group before it execs: every process it starts too
            cmd = ["sh", "-c", f"echo $$ > {group / 'cgroup.procs'} && exec {shlex.join(cmd)}"]
        sampler = GroupSampler(group) if group is not None else None
        with sampler or contextlib.nullcontext():
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"owner_scale: {mode} K = {owners} failed:\n{proc.stderr[-3000:]}")
        row: dict[str, Any] = json.loads(lines[-1])
        if sampler is not None:
            row["memory_cgroup_mb"] = sampler.result() | {"caches_dropped": dropped}
    return row


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = sorted({r["mode"] for r in rows})
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.5), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["owners"])
        ks = [r["owners"] for r in mine]
        for phase in PHASES:
            ys = [max(r["phase_seconds"][phase], 1e-3) for r in mine]
            ax.plot(ks, ys, marker="o", label=phase)
        ax.plot(ks, [max(r["seconds"], 1e-3) for r in mine], "k--", label="end to end")
        ax.set(xscale="log", yscale="log", xlabel="owners K", ylabel="seconds", title=mode)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--modes", nargs="+", default=["inprocess", "ray"])
    parser.add_argument("--owner-processes", type=int, default=OWNER_PROCESSES)
    parser.add_argument(
        "--cold-cache",
        action="store_true",
        help="drop the page cache before each run (root): its file pages are charged to it",
    )
    parser.add_argument("--child", nargs=2, metavar=("MODE", "K"), help=argparse.SUPPRESS)
    parser.add_argument("--plot", default=str(Path(__file__).with_name("owner_scale.png")))
    args = parser.parse_args()
    if args.child:
        mode, k = args.child[0], int(args.child[1])
        processes = args.owner_processes
        row = run_inprocess(k) if mode == "inprocess" else run_ray(k, processes=processes)
        print(json.dumps(row))
        return
    for mode in args.modes:
        if mode not in ("inprocess", "ray"):
            parser.error(f"--modes: {mode!r} is not inprocess or ray")
    rows = []
    for mode in args.modes:
        for k in args.owners:
            print(f"... {mode} K = {k} (load: {os.getloadavg()[0]:.2f})", file=sys.stderr)
            load = round(os.getloadavg()[0], 2)
            rows.append(
                _child(mode, k, args.owner_processes, args.cold_cache) | {"load_before": load}
            )
    header = f"{'mode':<10} {'K':>5} " + " ".join(f"{p:>9}" for p in PHASES)
    print(
        header + f" {'ms/epoch':>9} {'epochs':>6} {'cur MB':>7} {'own MB':>7} {'sum MB':>7}"
        f" {'all MB':>7} {'PSS MB':>7} {'group MB':>8} {'total s':>8}"
    )
    for r in rows:
        ph = " ".join(f"{r['phase_seconds'][p]:>9.2f}" for p in PHASES)
        mem = r["peak_rss_mb"]
        print(
            f"{r['mode']:<10} {r['owners']:>5} {ph} {r['ms_per_epoch']:>9.2f} {r['epochs']:>6} "
            f"{mem['curator']:>7.0f} {mem['owner']:>7.0f} {mem.get('sum', 0.0):>7.0f} "
            f"{mem.get('sum_all', math.nan):>7.0f} {mem.get('pss_sum_all', math.nan):>7.0f} "
            f"{r.get('memory_cgroup_mb', {}).get('mapped_peak', float('nan')):>8.0f} "
            f"{r['seconds']:>8.1f}"
        )
    goals: dict[str, Any] = {}
    for mode in args.modes:
        by_k = {r["owners"]: r for r in rows if r["mode"] == mode}
        lo, hi = min(by_k), max(by_k)
        if hi > lo:
            ratio = by_k[hi]["ms_per_epoch"] / by_k[lo]["ms_per_epoch"]
            goals[f"{mode}_ms_per_epoch_ratio_{hi}_over_{lo}"] = round(ratio, 2)
            goals[f"{mode}_linear_ratio"] = hi / lo
    if "ray" in args.modes and 1024 in args.owners:
        big = next(r for r in rows if r["mode"] == "ray" and r["owners"] == 1024)
        goals["ray_1024_seconds"] = big["seconds"]
        mem = big["peak_rss_mb"]
        print("K = 1024 on Ray, each process's peak (VmHWM) MB, largest first:")
        for peak, title in mem.get("processes", []):
            print(f"  {peak:>8.1f}  {title}")
        goals["ray_1024_peak_mb_total_sampled"] = {
            k: v for k, v in mem.items() if k != "processes"
        }  # sum_all: every process's own peak, added (shared pages once per process)
        goals["ray_1024_sum_of_process_peaks_mb"] = mem.get("sum_all")
        # every process summed, each page once (proportional set sizes at one sample)
        goals["ray_1024_pss_sum_mb"] = big["peak_rss_mb"].get("pss_sum_all")
        if "memory_cgroup_mb" in big:  # every process together, shared pages once
            goals["ray_1024_memory_cgroup_mb"] = big["memory_cgroup_mb"]
    for name, value in goals.items():
        print(f"goal: {name} = {value}")
    if len(args.owners) > 1:
        plot(rows, Path(args.plot))
    for r in rows:
        r.pop("tokens", None)
    print(json.dumps({"benchmark": "owner_scale", "rows": rows, "goals": goals}))


if __name__ == "__main__":
    main()

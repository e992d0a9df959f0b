"""DCA secure-sum scaling against Table 1 of Heikkilä et al. (2017): N clients, d, M = 10 nodes.

Every round runs the real parties with sealing on (X25519 session keys, per-round AES-GCM frame
keys, discrete Gaussian noise) and every frame crosses the msgpack codec. ``--shares derived``
(the default) derives the blinding shares and frame keys from each pair's AES-CTR block stream,
one stream per pair per block of B(d) rounds (``protocol/securesum/masks.py``); ``--shares
sealed-seeds`` sends each share as a sealed seed and derives round keys with HKDF.
Clients are batched many per process (``--workers`` processes, each hosting
client parties of at most 2^24 values at the session's largest d); each compute node runs in
its own process; the aggregator runs in the main process. Processes exchange batches of encoded
frames over multiprocessing queues. With ``--ray`` the compute nodes are the market's
ComputeNodeActor, the clients ``--workers`` Ray actors, and the market's DcaHub relays and
aggregates in the driver (``dca_scaling_ray.py``).

Per N, one session is set up (timed apart: X25519 per client-node pair, registration, and the
pair's mask key or the HKDF round keys of the first 16 rounds) and then rounds run for each d of
the grid (the paper's runtime excludes key set-up and encryption; ours includes encryption).
With derived shares a cell times whole blocks of B(d) consecutive rounds, so exactly one block
set-up (every pair's stream on both sides) falls in every B(d) timed rounds and the mean carries
it. A round is timed from
the aggregator's open to its release (clients' noise, splitting and sealing, the nodes' opening,
expansion and agreement, the aggregation), and the release is checked against the exact sum
(within 10 noise standard deviations). CPU is the user + system time of all processes.

    python benchmarks/dca_scaling.py                  # Table 1 grid (N*d <= 1e8; more if < 10 min)
    python benchmarks/dca_scaling.py --quick          # a few cells, under 60 s
    python benchmarks/dca_scaling.py --dims 10,100    # the grid's cells with d in {10, 100}
    python benchmarks/dca_scaling.py --cells 1000:10,10000:100 --ray

Last line: ``{"benchmark": "dca_scaling", "backend": "processes" | "ray", "cells": [{"N", "d",
"M", "seconds", "paper_seconds", "speedup"}...]}`` with ``seconds`` the mean round time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue, SimpleQueue
from typing import Any, Protocol

import numpy as np

from dpmarket.protocol.securesum.aggregator import Aggregator
from dpmarket.protocol.securesum.client import Client
from dpmarket.protocol.securesum.masks import block_rounds
from dpmarket.protocol.securesum.node import ComputeNode
from dpmarket.protocol.securesum.spec import SHARE_MODES, DcaConfig
from dpmarket.protocol.wire.codec import Message, ReplayGuard, decode, encode

PAPER = {  # Table 1: Spark, M = 10, seconds; rows N, columns d = 10, 1e2, 1e3, 1e4
    100: (1.72, 2.03, 3.43, 15.30),
    1_000: (1.89, 2.86, 10.56, 84.95),
    10_000: (2.99, 12.36, 101.2, 994.96),
    100_000: (8.58, 65.64, 610.55, 1592.29),
}
DIMS = (10, 100, 1_000, 10_000)
M = 10
PARTY_VALUES = 1 << 24  # values per client party: its share arrays stay about 128 MiB per copy
PARTY_MEMBERS = 1 << 16  # and members (derived-share blocks cost up to 8 KiB per member)
TIME_LIMIT = 600.0  # cells beyond N*d = 1e8 run only when estimated under 10 minutes
AGGREGATOR = "aggregator"


# ----------------------------------------------------------------------------- processes
class Outlet(Protocol):
    def put(self, item: Any, /) -> None: ...


class PipeOutlet:
    """One child's private pipe to the main process (the aggregator's inbox)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def put(self, item: Any) -> None:
        self.conn.send(item)


def node_main(cfg: DcaConfig, name: str, inbox: Queue[Any], routes: dict[str, Outlet]) -> None:
    """A compute node: decode batches of frames from its inbox, answer through the routes.

    Share frames that arrive before the round's open (queues from different senders are not
    ordered) wait here until the open has been handled; the node itself never sees them early.
    """
    node, guard = ComputeNode(cfg, name), ReplayGuard()
    routes[AGGREGATOR].put(("key", name, node.public_key))
    early: list[Message] = []
    while (batch := inbox.get()) is not None:
        for item in batch:
            msg = decode(item, guard)
            if msg.kind == "dca.shares" and node.state == "idle":
                early.append(msg)
                continue
            todo = [msg, *early] if msg.kind == "dca.open" else [msg]
            early = early if msg.kind != "dca.open" else []
            for one in todo:
                send(node.receive(one), routes)
            if msg.kind == "dca.register" and node.registered == cfg.n_clients:
                routes[AGGREGATOR].put(("registered", name, 0))


def client_main(
    cfg: DcaConfig,
    members: tuple[str, ...],
    node_keys: dict[str, bytes],
    party_size: int,
    inbox: SimpleQueue[Any],
    seed: int,
    routes: dict[str, Outlet],
) -> None:
    """Many client parties in one process: register, then contribute to each round asked."""
    rng = np.random.default_rng(seed)
    parties = [
        Client(cfg, f"{members[i]}-party", node_keys, members[i : i + party_size])
        for i in range(0, len(members), party_size)
    ]
    send([msg for party in parties for msg in party.start()], routes)
    while (spec := inbox.get()) is not None:
        d = spec.d
        pools = {n: rng.uniform(-1.0, 1.0, (n, d)) for n in {len(p.members) for p in parties}}
        truth = sum(pools[len(p.members)].sum(axis=0) for p in parties)
        routes[AGGREGATOR].put(("ready", "", 0))
        if inbox.get() != "go":
            return
        out = [m for p in parties for m in p.contribute(spec, pools[len(p.members)], rng)]
        send(out, routes)
        routes[AGGREGATOR].put(("truth", "", truth))


def send(messages: list[Message], routes: Mapping[str, Outlet]) -> None:
    """Encode; one batch per compute node (one queue put), frame by frame to the aggregator."""
    batches: dict[str, list[bytes]] = {}
    for msg in messages:
        batches.setdefault(msg.recipient, []).append(encode(msg))
    for recipient, frames in batches.items():
        if recipient == AGGREGATOR:
            for frame in frames:
                routes[AGGREGATOR].put(frame)
        else:
            routes[recipient].put(frames)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of this process and ``pids`` (Linux /proc; 0 for the others)."""
    total = time.process_time()
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):  # process already gone
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


# ----------------------------------------------------------------------------- the cluster
@dataclass
class Cell:
    n: int
    d: int
    seconds: list[float]
    cpu: list[float]
    error_sds: float

    @property
    def mean(self) -> float:
        return statistics.fmean(self.seconds)


class LocalCluster:
    """One session over N clients: W client processes, M node processes, aggregator here.

    Node inboxes are multiprocessing queues (a put never blocks, so nodes sending their sets to
    each other cannot deadlock) and carry one batch of frames per sender and step; every child
    has its own pipe to the main process. Client parties hold at most 2^24 values at the
    session's largest d, so small-d sessions have few, large parties."""

    def __init__(self, n: int, workers: int, max_d: int, shares: str = "derived") -> None:
        ctx = mp.get_context("fork") if os.name == "posix" else mp.get_context("spawn")
        clients = tuple(f"c{i}" for i in range(n))
        nodes = tuple(f"compute-{k}" for k in range(M))
        self.cfg = DcaConfig(
            f"bench-{n}", clients, nodes, AGGREGATOR, bound=1.0, frac_bits=32, shares=shares
        )
        queues: dict[str, Queue[Any]] = {name: ctx.Queue() for name in nodes}
        self.queues, self.rounds = queues, 0
        self.conns: list[Connection] = []
        self.procs: list[BaseProcess] = []

        def spawn(target: Any, *args: Any) -> None:
            mine, theirs = ctx.Pipe(duplex=False)
            routes: dict[str, Outlet] = {**queues, AGGREGATOR: PipeOutlet(theirs)}
            proc = ctx.Process(target=target, args=(*args, routes), daemon=True)
            proc.start()
            self.conns.append(mine)
            self.procs.append(proc)

        for name in nodes:
            spawn(node_main, self.cfg, name, queues[name])
        keys = {name: key for name, key in self.wait_for("key", M)}
        start = time.perf_counter()
        self.controls: list[SimpleQueue[Any]] = []
        share = math.ceil(n / workers)
        for w in range(workers):
            members = clients[w * share : (w + 1) * share]
            if members:
                self.controls.append(ctx.SimpleQueue())
                party = max(1, min(PARTY_MEMBERS, PARTY_VALUES // max_d))
                spawn(client_main, self.cfg, members, keys, party, self.controls[-1], 1000 + w)
        self.wait_for("registered", M)
        self.setup_seconds = time.perf_counter() - start
        self.aggregator, self.guard = Aggregator(self.cfg), ReplayGuard()

    def receive(self) -> Any:
        """The next item any child sent to the main process."""
        while True:
            for conn in wait(self.conns, timeout=600):
                if isinstance(conn, Connection):
                    try:
                        return conn.recv()
                    except EOFError:
                        raise RuntimeError("a benchmark process exited early") from None
            dead = [p.pid for p in self.procs if not p.is_alive()]
            if dead:
                raise RuntimeError(f"benchmark processes {dead} died")

    def wait_for(self, tag: str, count: int) -> list[Any]:
        got: list[Any] = []
        while len(got) < count:
            item = self.receive()
            if not (isinstance(item, tuple) and item[0] == tag):
                raise RuntimeError(f"expected {tag!r}, got {str(item)[:80]}")
            got.append(item[1:] if tag == "key" else item[2])
        return got

    def run_round(self, d: int) -> tuple[float, float, float]:
        """One round at dimension d: (seconds open -> release, CPU seconds, |error| / noise sd)."""
        self.rounds += 1
        spec = self.cfg.spec(self.rounds, d, 1.0, 1e-5, math.sqrt(d), label=f"d={d}")
        for control in self.controls:
            control.put(spec)
        self.wait_for("ready", len(self.controls))  # values generated: not timed
        pids = [p.pid for p in self.procs if p.pid is not None]
        cpu, start = cpu_seconds(pids), time.perf_counter()
        for control in self.controls:  # shares that overtake the open wait at the node
            control.put("go")
        send(self.aggregator.open_round(spec, deadline=1e12), self.queues)
        truths: list[Any] = []
        while (result := self.aggregator.result(spec.round)) is None:
            item = self.receive()
            if isinstance(item, tuple) and item[0] == "truth":
                truths.append(item[2])
            else:
                self.aggregator.receive(decode(item, self.guard))
        seconds, cpu = time.perf_counter() - start, cpu_seconds(pids) - cpu
        truths += self.wait_for("truth", len(self.controls) - len(truths))
        if not result.released or result.value is None:
            raise RuntimeError(f"round {spec.round} ended {result.status}: {result.reason}")
        noise_sd = spec.sigma_std * math.sqrt(self.cfg.n_clients / (self.cfg.n_clients - 1))
        error = float(np.abs(result.value - np.sum(truths, axis=0)).max()) / noise_sd
        return seconds, cpu, error

    def close(self) -> None:
        for control in self.controls:
            control.put(None)
        for queue in self.queues.values():
            queue.put(None)
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()


# ----------------------------------------------------------------------------- the grid
def available_bytes() -> float:
    with contextlib.suppress(OSError), open("/proc/meminfo", encoding="ascii") as info:
        for line in info:
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    return 8e9


def estimate(cells: list[Cell], n: int, d: int) -> float:
    """Seconds per round at (n, d), from the largest cell run so far (time ~ N d)."""
    if not cells:
        return 0.0
    big = max(cells, key=lambda c: c.n * c.d)
    return big.mean * (n * d) / (big.n * big.d)


class Session(Protocol):
    """A set-up session on some transport (processes here, Ray in dca_scaling_ray.py)."""

    setup_seconds: float

    def run_round(self, d: int) -> tuple[float, float, float]: ...

    def close(self) -> None: ...


def make_session(backend: str, n: int, workers: int, max_d: int, shares: str) -> Session:
    if backend == "ray":
        from dca_scaling_ray import RayCluster  # Ray is imported only when asked for

        return RayCluster(n, workers, max_d, PARTY_VALUES, M, cpu_seconds, shares)
    return LocalCluster(n, workers, max_d, shares)


def timed_rounds(d: int, repeats: int, shares: str) -> int:
    """Rounds timed per cell: with derived shares, whole blocks of B(d) consecutive rounds
    (exactly one block set-up per B(d) rounds falls inside), at least ``repeats``."""
    if shares != "derived":
        return repeats
    block = block_rounds(d)
    return block * math.ceil(repeats / block)


def run_grid(
    grid: list[tuple[int, list[int]]],
    repeats: int,
    workers: int,
    backend: str = "processes",
    shares: str = "derived",
) -> list[Cell]:
    cells: list[Cell] = []
    for n, dims in grid:
        todo = []
        for d in dims:
            guess = estimate(cells, n, d)
            memory = 1.5 * n * d * 8  # the nodes keep every value share until the round ends
            if n * d > 1e8 and (guess > TIME_LIMIT or memory > 0.5 * available_bytes()):
                why = f"estimated {guess:.0f} s/round, {memory / 1e9:.1f} GB"
                print(f"N={n:>6} d={d:>5}: skipped ({why})")
                continue
            todo.append(d)
        if not todo:
            continue
        cluster = make_session(backend, n, workers, max(todo), shares)
        print(f"N={n:>6}: session set-up {cluster.setup_seconds:.2f} s ({n * M} X25519 pairs)")
        try:
            for d in todo:
                guess = estimate(cells, n, d)
                if guess < 10:
                    cluster.run_round(d)  # warm-up round (page faults, first allocations)
                count = timed_rounds(d, repeats if guess < 30 else 1, shares)
                runs = [cluster.run_round(d) for _ in range(count)]
                cell = Cell(
                    n, d, [r[0] for r in runs], [r[1] for r in runs], max(r[2] for r in runs)
                )
                cells.append(cell)
                print_cell(cell)
        finally:
            cluster.close()
    return cells


def print_cell(cell: Cell) -> None:
    paper = PAPER[cell.n][DIMS.index(cell.d)]
    print(
        f"N={cell.n:>6} d={cell.d:>5} M={M}: {cell.mean:8.3f} s/round "
        f"({len(cell.seconds)} rounds: min {min(cell.seconds):.3f}, "
        f"max {max(cell.seconds):.3f}), paper {paper:8.2f} s, "
        f"speed-up {paper / cell.mean:7.1f}x, CPU {statistics.fmean(cell.cpu):.2f} s/round, "
        f"max error {cell.error_sds:.1f} noise sd"
    )


def parse_cells(text: str) -> list[tuple[int, list[int]]]:
    """``N:d,N:d`` as a grid [(N, [d...])...]; ``ValueError`` names what is wrong."""
    try:
        pairs = [tuple(int(v) for v in cell.split(":")) for cell in text.split(",")]
    except ValueError:
        raise ValueError(f"cells must be N:d pairs, got {text!r}") from None
    if any(len(p) != 2 or p[0] not in PAPER or p[1] not in DIMS for p in pairs):
        raise ValueError(f"cells must be N:d with N in {list(PAPER)}, d in {list(DIMS)}")
    return [(n, [d for m, d in pairs if m == n]) for n in dict.fromkeys(m for m, _ in pairs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few cells, under 60 s")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per cell")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--cells", "--only", default="", help="cells to run, e.g. 100000:10000,1000:10"
    )
    parser.add_argument(
        "--dims", default="", help="restrict the grid (or --quick) to these d, e.g. 10,100"
    )
    parser.add_argument(
        "--ray", action="store_true", help="compute nodes and client batches as Ray actors"
    )
    parser.add_argument(
        "--shares",
        choices=SHARE_MODES,
        default="derived",
        help="blinding shares derived from the pair keys (default) or sent as sealed seeds",
    )
    args = parser.parse_args()
    repeats = args.repeats
    if args.cells:
        try:
            grid = parse_cells(args.cells)
        except ValueError as exc:
            parser.error(f"--cells: {exc}")
    elif args.quick:
        grid = [(100, [10, 1_000]), (1_000, [100, 10_000]), (10_000, [1_000])]
        repeats = 2
    else:
        grid = [(n, list(DIMS)) for n in PAPER]
    if args.dims:
        keep = {int(d) for d in args.dims.split(",")}
        grid = [(n, [d for d in dims if d in keep]) for n, dims in grid]
        grid = [(n, dims) for n, dims in grid if dims]
    backend = "ray" if args.ray else "processes"
    start = time.perf_counter()
    cells = run_grid(grid, repeats, args.workers, backend, args.shares)
    print(
        f"total {time.perf_counter() - start:.1f} s, {args.workers} client "
        f"{'actors' if args.ray else 'processes'}, {M} nodes ({backend}), "
        f"shares {args.shares}"
    )
    rows = [
        {
            "N": c.n,
            "d": c.d,
            "M": M,
            "seconds": round(c.mean, 4),
            "paper_seconds": PAPER[c.n][DIMS.index(c.d)],
            "speedup": round(PAPER[c.n][DIMS.index(c.d)] / c.mean, 1),
        }
        for c in cells
    ]
    out = {"benchmark": "dca_scaling", "backend": backend, "shares": args.shares, "cells": rows}
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""Real raylets on this machine for tests: ``ray start`` with its own ports and temp dir, each
node's processes recorded by PID when it starts and stopped by PID (never ``ray stop``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))


_HANDED_OUT: set[int] = set()
_RAY_WORKER_PORTS_END = 20000  # Ray's workers listen on 10002-19999 by default


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (32768 by default)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _own_range() -> range:
    """This pytest process's share of the ports between Ray's worker ports and the ephemeral
    range: a port there is never the local port of an outgoing connection (those are
    ephemeral), never one Ray picks itself, and never one another xdist worker hands out."""
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    span = (_ephemeral_start() - _RAY_WORKER_PORTS_END) // workers
    start = _RAY_WORKER_PORTS_END + (worker % workers) * span
    return range(start, start + max(0, span))


_NEXT = [int.from_bytes(os.urandom(2), "big")]  # where this process starts in its range


def free_port() -> int:
    """A loopback port free now for a server that another process opens later (a Ray
    component, a market's gateway), never handed out before in this process. Taken from
    :func:`_own_range`, not from ``bind(port 0)``: an ephemeral port free now can become the
    local port of one of the many outgoing connections of a parallel run before the server
    binds it (two Ray components on one port, seen once in CI; a market that cannot listen
    while its agents dial whatever took its port). Falls back to the kernel's choice where
    the range is too small to share."""
    ports = _own_range()
    if len(ports) < 256:
        while True:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
    for _ in range(len(ports)):
        port = ports[_NEXT[0] % len(ports)]
        _NEXT[0] += 1
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"free_port: no free port left in {ports}")


def _cmdlines() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process we can read."""
    out: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry)] = (parent, cmd)
    return out


@dataclass
class Node:
    """One ``ray start``: the processes it left running (daemons, found by the temp dir)."""

    name: str
    pids: set[int] = field(default_factory=set)

    def kill(self) -> None:
        """SIGKILL the node's processes and every descendant (its workers and agents)."""
        table = _cmdlines()
        doomed, grew = set(self.pids) & set(table), True
        while grew:
            children = {p for p, (parent, _) in table.items() if parent in doomed} - doomed
            doomed |= children
            grew = bool(children)
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.pids.clear()


@dataclass
class RayletCluster:
    """A head and further raylets started with ``ray start`` under ``temp_dir``."""

    temp_dir: Path
    env: dict[str, str]
    gcs_port: int = 0
    dashboard_port: int = 0
    nodes: list[Node] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def _ports(self) -> list[str]:
        names = ["node-manager", "object-manager", "dashboard-agent-listen",
                 "dashboard-agent-grpc", "metrics-export", "runtime-env-agent"]  # fmt: skip
        return [f"--{n}-port={free_port()}" for n in names]

    def _start(self, name: str, args: list[str], attempts: int = 3) -> Node:
        """``ray start``; a node that did not register within Ray's fixed 30 s (a loaded
        machine) is killed by PID and started again."""
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once(name, args)
            except RuntimeError:
                self.nodes.pop().kill()
                if attempt == attempts:
                    raise
        raise AssertionError("unreachable")

    def _start_once(self, name: str, args: list[str]) -> Node:
        before = set(self._ours())
        done = subprocess.run(
            [RAY, "start", *args, "--node-ip-address=127.0.0.1", f"--temp-dir={self.temp_dir}",
             "--min-worker-port=0", "--max-worker-port=0", "--disable-usage-stats", *self._ports()],
            env=self.env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        node = Node(name, set(self._ours()) - before)
        self.nodes.append(node)
        if done.returncode != 0:
            raise RuntimeError(f"ray start ({name}) failed: {done.stderr[-2000:]}")
        return node

    def _ours(self) -> list[int]:
        me = os.getpid()
        return [p for p, (_, cmd) in _cmdlines().items() if str(self.temp_dir) in cmd and p != me]

    def start_head(self, resources: dict[str, float], num_cpus: int) -> Node:
        self.gcs_port, self.dashboard_port = free_port(), free_port()
        return self._start("head", [
            "--head", f"--port={self.gcs_port}", f"--dashboard-port={self.dashboard_port}",
            "--dashboard-host=127.0.0.1", "--include-dashboard=true",
            f"--ray-client-server-port={free_port()}", f"--num-cpus={num_cpus}",
            f"--resources={json.dumps(resources)}",
        ])  # fmt: skip

    def add_node(self, name: str, resources: dict[str, float], num_cpus: int) -> Node:
        return self._start(name, [
            f"--address={self.address}", f"--num-cpus={num_cpus}",
            f"--resources={json.dumps(resources)}",
        ])  # fmt: skip

    def stop(self) -> None:
        """Every node this cluster started, workers first, the head last; then anything
        still running under the temp dir (ours alone: the temp dir is this test's)."""
        for node in reversed(self.nodes):
            node.kill()
        Node("rest", set(self._ours())).kill()
        time.sleep(0.5)

"""A market with remote agents in a temporary directory, for the integration tests and the
benchmark of issue 26 (tests/integration/test_remote_market.py, benchmarks/remote_market.py).

:func:`build` lays out, under one root, a directory per party, each holding only what that
party would hold on its own machine::

    ROOT/pki/                     the throwaway CA (tls.write_party_certs), never read by a party
    ROOT/market/market.toml       [remote] with the market's certificate, key, client CA and the
                                  parties' certificate fingerprints; the consumer's files
    ROOT/market-local.toml        the same market with local owner actors ([data.files], no
                                  [remote]) over the same records, for comparisons
    ROOT/owner-N/owner.toml       its own files, certificate, key, CA, node pins, policy, state
    ROOT/node-N/node.toml         its own certificate, key, CA and X25519 key

The node pins are what ``dpmarket node fingerprint`` prints (the same function), written to each
owner's ``node-keys.toml``. The market's port is chosen free on 127.0.0.1; an owner may dial
through a :class:`~tests.remote.proxy.FaultProxy` instead (its ``[market].address`` then points
at the proxy, :meth:`RemoteMarket.route_through`).

:class:`RemoteMarket` starts the driver (``dpmarket run`` / ``resume``) and the agents
(``dpmarket owner serve`` / ``node serve``) as subprocesses, each in a new session with the
working directory of its party, with ``HOME`` and ``RAY_TMPDIR`` of the test; :meth:`close`
kills the process groups it started that are still alive, and the Ray processes its drivers
left (by their session or their Ray temp dir), and removes the Ray temp dir.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpmarket.actors.remote import tls
from dpmarket.actors.remote.agentconfig import load_node_config
from dpmarket.actors.remote.nodeagent import fingerprint_of
from tests.integration.raylets import free_port

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "configs" / "remote" / "data"
ENTRY = [sys.executable, "-m", "dpmarket.actors.commands.main"]

SCHEMA = """\
features = 13
label_column = 13
lower = [10.0, 0.0, 1.0, 5.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0]
upper = [16.0, 6.0, 4.0, 32.0, 18.0, 4.0, 6.0, 1.0, 4.0, 14.0, 2.0, 4.5, 18.0]
policy = "clip"
header = false
bound = 18.0
"""

SUMMARY = """\
[privacy]
delta = 1e-5
eps_normalise = 0.5
eps_scan = 0.5

[summary]
auction_variant = "pure"
eps_auction = 1e-6
tau = 1
max_epochs = {max_epochs}
max_deliveries = 1
d = 256
validation_release = "gaussian"
validation_sigma = 1.3907161
clip_norm = 1.0883883
summary_release = "herding"
final_selection = "exact"
candidate_distribution = "gaussian"
"""

POLICY = {
    "epsilon": 8.0,
    "delta": 1e-5,
    "max_points": 40,  # > max_epochs: the local market has no such limit (build: max_points)
    "rounds": "{ normalise = 1, scan = 1, refresh = 0 }",
    "min_noise": "{ normalise = 1.0, scan = 1.0, refresh = 1.0, profile = 1.0, summary = 1.0 }",
}


def _toml_value(value: object) -> str:
    if isinstance(value, str) and value.startswith("{"):
        return value  # an inline table, written as given
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


@dataclass
class RemoteMarket:
    """A built market directory (module docstring) and the processes started for it."""

    root: Path
    name: str
    port: int
    owners: list[str]
    nodes: list[str]
    ray_tmp: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    drivers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    # ------------------------------------------------------------------ paths
    @property
    def market(self) -> Path:
        return self.root / "market" / "market.toml"

    @property
    def local_market(self) -> Path:
        return self.root / "market-local.toml"

    def config(self, party: str) -> Path:
        kind = "owner" if party in self.owners else "node"
        return self.root / party / f"{kind}.toml"

    def store(self, owner: str) -> Path:
        return self.root / owner / "state" / "ledger.sqlite"

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def tail(self, name: str, lines: int = 30) -> str:
        """The last ``lines`` lines of a process's log, for a failing assertion's message."""
        path = self.log(name)
        text = path.read_text(errors="replace") if path.exists() else "(no log)"
        return f"--- {name} ---\n" + "\n".join(text.splitlines()[-lines:])

    def env(self) -> dict[str, str]:
        env = os.environ | {"RAY_TMPDIR": str(self.ray_tmp), "TMPDIR": str(self.ray_tmp)}
        env.pop("RAY_ADDRESS", None)
        return env

    def route_through(self, owner: str, port: int) -> None:
        """The owner's agent dials ``127.0.0.1:port`` (a proxy) instead of the market."""
        path = self.config(owner)
        text = path.read_text()
        path.write_text(text.replace(f"127.0.0.1:{self.port}", f"127.0.0.1:{port}"))

    def set_policy(self, owner: str, **changes: object) -> None:
        """Rewrite keys of the owner's own ``[policy]`` (a key it does not have is added)."""
        path = self.config(owner)
        lines, todo = [], dict(changes)
        for line in path.read_text().splitlines():
            key = line.split("=", 1)[0].strip()
            if key in todo:
                line = f"{key} = {_toml_value(todo.pop(key))}"
            lines.append(line)
            if line == "[policy]":
                lines += [f"{k} = {_toml_value(v)}" for k, v in changes.items() if k not in POLICY]
                todo = {k: v for k, v in todo.items() if k in POLICY}
        path.write_text("\n".join(lines) + "\n")

    # ------------------------------------------------------------------ processes
    def _popen(
        self, name: str, args: list[str], cwd: Path, entry: list[str] = ENTRY
    ) -> subprocess.Popen[bytes]:
        self.log(name).parent.mkdir(exist_ok=True)
        with self.log(name).open("ab") as log:
            return subprocess.Popen(
                [*entry, *args], cwd=cwd, env=self.env(), start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def start_driver(
        self, args: list[str], name: str = "market", entry: list[str] = ENTRY
    ) -> subprocess.Popen[bytes]:
        """The market's process: ``entry`` (the CLI, or a script that calls its main) with
        ``args``, in the market's folder."""
        proc = self._popen(name, args, self.root / "market", entry)
        self.drivers.append(proc)
        return proc

    def run(
        self, out: Path, *extra: str, local: bool = False, entry: list[str] = ENTRY
    ) -> subprocess.Popen[bytes]:
        config = self.local_market if local else self.market
        return self.start_driver(["run", str(config), "--out", str(out), *extra], entry=entry)

    def start_agent(
        self, party: str, give_up: float = 900.0, entry: list[str] = ENTRY
    ) -> subprocess.Popen[bytes]:
        """``dpmarket owner serve`` / ``node serve`` for ``party`` through ``entry`` (the CLI
        of this interpreter, or another install's ``dpmarket``)."""
        kind = "owner" if party in self.owners else "node"
        args = [kind, "serve", str(self.config(party)), "--give-up", str(give_up)]
        proc = self._popen(party, args, self.root / party, entry)
        self.procs[party] = proc
        return proc

    def start_agents(self, parties: list[str] | None = None, entry: list[str] = ENTRY) -> None:
        for party in parties if parties is not None else [*self.nodes, *self.owners]:
            self.start_agent(party, entry=entry)

    def kill(self, party: str, sig: int = signal.SIGKILL) -> None:
        """Signal the party's agent's process group (only a process this market started)."""
        proc = self.procs[party]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            proc.wait(timeout=60)

    def wait_agents(self, parties: list[str], timeout: float = 300.0) -> dict[str, int | None]:
        """Each agent's exit code once it has exited by itself (None: still running)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.procs[p].poll() is not None for p in parties):
                break
            time.sleep(0.2)
        return {p: self.procs[p].poll() for p in parties}

    def close(self) -> None:
        """Kill what is still running of what this market started; remove the Ray temp dir."""
        for proc in [*self.procs.values(), *self.drivers]:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=30)
        stop = time.monotonic() + 30
        while (left := self.leftovers()) and time.monotonic() < stop:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        shutil.rmtree(self.ray_tmp, ignore_errors=True)

    def leftovers(self) -> list[int]:
        """Processes still alive that a driver started (its session, its Ray temp dir)."""
        from tests.integration.test_secure_resume import _started_by

        left: set[int] = set()
        for driver in self.drivers:
            left |= set(_started_by(driver.pid, str(self.ray_tmp)))
        return sorted(left)

    def __enter__(self) -> RemoteMarket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _copy(src: Path, dst_dir: Path, name: str | None = None) -> None:
    dst_dir.mkdir(parents=True, exist_ok=True)
    dst = dst_dir / (name or src.name)
    shutil.copyfile(src, dst)
    if src.suffix == ".key":
        dst.chmod(0o600)


def build(
    root: Path,
    owners: int = 4,
    nodes: int = 3,
    tolerance: int = 1,
    noise_seed: int = 7,
    name: str = "remote-test",
    data: dict[str, list[Path]] | None = None,
    max_epochs: int = 30,
    summary_size: int = 10,
    deadline_seconds: float = 5.0,
    join_deadline: float = 300.0,
    call_timeout: float = 30.0,
    reproducible: bool = True,
    max_points: int = 40,
    schema: str = SCHEMA,
    consumer: tuple[Path, Path] = (DATA / "validation.csv", DATA / "seed.csv"),
) -> RemoteMarket:
    """The market directory of the module docstring under ``root`` (which must be empty).
    ``data``: owner -> its CSV files (default: configs/remote/data/owner-N.csv, cycled);
    ``schema``: the ``[data]`` keys of the files (default: the wine data's); ``consumer``:
    the validation set and the public seed set."""
    owner_names = [f"owner-{i}" for i in range(1, owners + 1)]
    node_names = [f"node-{i}" for i in range(1, nodes + 1)]
    if data is None:
        data = {o: [DATA / f"owner-{(i % 4) + 1}.csv"] for i, o in enumerate(owner_names)}
    pki = root / "pki"
    tls.write_party_certs(pki, owner_names, node_names)
    port = free_port()
    address = f"127.0.0.1:{port}"

    # the market: its own certificate and key, the client CA, the parties' fingerprints
    market = root / "market"
    for f in ("market.crt", "market.key", "ca.crt", "fingerprints.toml"):
        _copy(pki / f, market / "certs")
    _copy(consumer[0], market / "data", "validation.csv")
    _copy(consumer[1], market / "data", "seed.csv")
    run = f'[run]\nname = "{name}"\nseed = 0\ndeadline_seconds = {deadline_seconds}\n'
    if reproducible:
        run += f"reproducible_noise = true\nnoise_seed = {noise_seed}\nsimulation = true\n"
    head = (
        f"{run}\n[market]\nowners = {owners}\ncompute_nodes = {nodes}\n"
        f"tolerance = {tolerance}\nsummary_size = {summary_size}\n\n"
    )
    data_table = (
        f'[data]\nsource = "files"\n{schema}'
        f'validation = "{market / "data" / "validation.csv"}"\n'
        f'seed_set = "{market / "data" / "seed.csv"}"\n\n'
    )
    tail = SUMMARY.format(max_epochs=max_epochs)
    remote = (
        f'[remote]\nlisten = "{address}"\ncertificate = "certs/market.crt"\n'
        'key = "certs/market.key"\nclient_ca = "certs/ca.crt"\n'
        'fingerprints = "certs/fingerprints.toml"\n'
        f"owners = {owner_names!r}\nnodes = {node_names!r}\n".replace("'", '"')
        + f"join_deadline = {join_deadline}\ncall_timeout = {call_timeout}\n\n"
    )
    (market / "market.toml").write_text(head + remote + data_table + tail)
    files = "".join(
        f"{o} = [{', '.join(repr(str(p)) for p in data[o])}]\n".replace("'", '"')
        for o in owner_names
    )
    (root / "market-local.toml").write_text(
        head + data_table.rstrip("\n") + "\n\n[data.files]\n" + files + "\n" + tail
    )

    # the nodes: each makes its own X25519 key; the owners pin what `node fingerprint` prints
    pins = []
    for node in node_names:
        home = root / node
        for f in (f"{node}.crt", f"{node}.key", "ca.crt"):
            _copy(pki / f, home / "certs")
        (home / "node.toml").write_text(
            f'[node]\nname = "{node}"\nkey = "certs/{node}.x25519"\nowners_ca = "certs/ca.crt"\n\n'
            f'[market]\naddress = "{address}"\nname = "{name}"\nca = "certs/ca.crt"\n\n'
            f'[tls]\ncertificate = "certs/{node}.crt"\nkey = "certs/{node}.key"\n'
        )
        pins.append(f'{node} = "{fingerprint_of(load_node_config(home / "node.toml"))}"')

    for owner in owner_names:
        home = root / owner
        for f in (f"{owner}.crt", f"{owner}.key", "ca.crt"):
            _copy(pki / f, home / "certs")
        (home / "certs" / "node-keys.toml").write_text("\n".join(pins) + "\n")
        for i, src in enumerate(data[owner]):
            _copy(src, home / "data", f"{i}-{src.name}")
        own_files = [f"data/{i}-{src.name}" for i, src in enumerate(data[owner])]
        own = POLICY | {"max_points": max_points}
        policy = "".join(f"{k} = {_toml_value(v)}\n" for k, v in own.items())
        simulation = (
            f"\n[simulation]\nreproducible_noise = true\nnoise_seed = {noise_seed}\n"
            if reproducible
            else ""
        )
        (home / "owner.toml").write_text(
            f'[owner]\nname = "{owner}"\nstate = "state"\n\n'
            f'[market]\naddress = "{address}"\nname = "{name}"\nca = "certs/ca.crt"\n\n'
            f'[tls]\ncertificate = "certs/{owner}.crt"\nkey = "certs/{owner}.key"\n\n'
            f"[data]\nfiles = {own_files!r}\nheader = false\n\n".replace("'", '"')
            + '[nodes]\npins = "certs/node-keys.toml"\n\n'
            f"[policy]\n{policy}{simulation}"
        )
    ray_tmp = Path(tempfile.mkdtemp(prefix="dpr", dir="/tmp"))  # short: Ray's socket paths
    return RemoteMarket(root, name, port, owner_names, node_names, ray_tmp)


def build_shipped(root: Path) -> RemoteMarket:
    """The market of configs/remote/ as shipped under ``root``: :func:`build`'s directories,
    certificates and node pins, then every party's configuration replaced by its shipped file
    (market.toml, node-N.toml, owner-N.toml: their policies, bounds, noise from OS entropy), with
    only what names this directory adjusted: the market's address (a free port), each owner's
    state folder (``state``, where :meth:`RemoteMarket.store` looks) and data file (``data/`` as
    :func:`build` copied it)."""
    shipped = ROOT / "configs" / "remote"
    listen = tomllib.loads((shipped / "market.toml").read_text())["remote"]["listen"]
    market = build(root, owners=4, nodes=3, name="remote-demo", reproducible=False)
    address = f"127.0.0.1:{market.port}"

    def adjusted(src: Path, dst: Path, *changes: tuple[str, str]) -> None:
        text = src.read_text()
        for old, new in [(f'"{listen}"', f'"{address}"'), *changes]:
            if old not in text:
                raise ValueError(f"{src}: no {old} to adjust")
            text = text.replace(old, new)
        dst.write_text(text)

    adjusted(shipped / "market.toml", market.market)
    for node in market.nodes:
        adjusted(shipped / f"{node}.toml", market.config(node))
    for owner in market.owners:
        adjusted(
            shipped / f"{owner}.toml",
            market.config(owner),
            (f'state = "state/{owner}"', 'state = "state"'),
            (f'"data/{owner}.csv"', f'"data/0-{owner}.csv"'),
        )
    return market


def charged_rows(store: Path) -> list[dict[str, Any]]:
    """The charged rows of an owner's store (empty if it does not exist yet)."""
    from dpmarket.actors.budgets.reading import read_store
    from dpmarket.actors.budgets.store import StoreError

    if not store.exists():
        return []
    try:
        return [r for r in read_store(store)["rows"] if r["state"] == "charged"]
    except StoreError:
        return []  # mid-creation


def charged_labels(store: Path) -> list[str]:
    return [str(r["label"]) for r in charged_rows(store)]


def release_counts(store: Path) -> Counter[str]:
    """How many charged rows each release id has in an owner's store."""
    return Counter(str(r["release"]) for r in charged_rows(store))


def wait_until(predicate: Any, timeout: float, poll: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return bool(predicate())

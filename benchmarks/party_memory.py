"""Every party kind's resident memory, idle and after ingesting 100,000 records (issue 39).

    python benchmarks/party_memory.py                  # 100,000 records
    python benchmarks/party_memory.py --records 20000

Each party is its own process, measured by its ``VmRSS`` (/proc/PID/status, MB = 2^20 bytes):

- ``owner agent``: ``dpmarket owner serve`` of a configs/remote-style owner (built by
  tests/integration/remote_setup.py), idle = waiting for its market (nothing listens: it has
  dialled and is retrying). After records: the agent's own code in a fresh process (the agent's
  modules imported, its :class:`OwnerHost` tailing a CSV of ``--records`` records until caught
  up, then the columns it keeps of them for the scan round's sketch, 50 x 256, counted as in
  ``dca_contribute``: streams/race/columns.py) without the market's runtime importable (the
  agent's install: numpy paths); ``+numba`` the same with the ``numba`` extra (the compiled
  CSV scanner, loaded from numba's cache; a secure-sum round runs no sketch kernel).
- ``node agent``: ``dpmarket node serve`` waiting for its market. A node holds no records.
- ``owner host actor``: an ``OwnerActor`` on a local Ray instance, idle after construction;
  after records: the same tailing and kept columns (the market's install).
- ``compute-node actor``: a ``ComputeNodeActor`` after construction. It holds no records.
- ``curator``: a ``CuratorActor`` with the configs/remote consumer's sizes (24 validation, 20
  seed records) idle; after records: one constructed with ``--records`` validation records.

An owner's secure sums need no compiled kernel (records are hashed with numpy as they
arrive and a round counts the kept columns; tests/streams/test_lazy_numba.py), so a new owner
process has nothing to compile or load before its rounds.

Targets: idle owner agent <= 120 MB, node agent <= 100 MB, owner host actor <= 200 MB.
Last line: ``{"benchmark": "party_memory", "records": n, "rows": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.remote_setup import SCHEMA, build  # noqa: E402

TARGETS = {"owner agent": 120.0, "node agent": 100.0, "owner host actor": 200.0}
FEATURES = 13
SKETCH = (50, 256)  # the scan round's default [sketch] rows and width
MARKET_RUNTIME = ("ray", "sklearn", "matplotlib", "pyarrow", "numba", "llvmlite")


def _bounds() -> tuple[list[float], list[float]]:
    lines = dict(line.split(" = ", 1) for line in SCHEMA.splitlines() if " = " in line)
    return json.loads(lines["lower"]), json.loads(lines["upper"])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"process {pid}: no VmRSS")


def write_records(path: Path, n: int) -> None:
    """``n`` records of the wine schema (13 features and a label), uniform within its bounds."""
    lower, upper = _bounds()
    rng = np.random.default_rng(0)
    X = rng.uniform(lower, upper, size=(n, FEATURES))
    y = rng.integers(1, 4, size=(n, 1))
    np.savetxt(path, np.hstack([X, y]), fmt="%.4f", delimiter=",")


def idle_agent(config: Path, kind: str, log: Path) -> float:
    """RSS of ``dpmarket KIND serve`` once it has dialled twice (nothing listens)."""
    entry = [sys.executable, "-m", "dpmarket.actors.commands.main"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*entry, kind, "serve", str(config), "--give-up", "600"],
            cwd=config.parent, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while log.read_text().count("retrying") < 2:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{kind} agent: no retry line\n{log.read_text()}")
            time.sleep(0.1)
        return rss_mb(proc.pid)
    finally:
        proc.kill()
        proc.wait()


# the agent's own code after records, in a fresh process (a JSON line on stdout)
AGENT_AFTER = """
import asyncio, json, sys
if {block}:
    for module in {runtime!r}:
        sys.modules[module] = None  # as in the agent's install
import numpy as np
import dpmarket.actors.remote.owneragent  # the agent's imports
from dpmarket.actors.parties.owner import OwnerHost
from dpmarket.actors.randomness import NoiseSource
from dpmarket.streams.race.columns import SketchColumns
from dpmarket.streams.race.lsh import make_family
from dpmarket.streams.records.files import Schema

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0

async def main():
    host = OwnerHost("bench", {{"owner-1": ({features}, None)}}, NoiseSource.secure())
    idle = rss()
    schema = Schema({features}, tuple({lower!r}), tuple({upper!r}), {features}, "clip")
    await host.start_ingest("owner-1", [{csv!r}], schema, {state!r}, poll_interval=0.05)
    while (await host.ingest_status("owner-1"))["records"] < {n}:
        await asyncio.sleep(0.05)
    ingested = rss()
    records = host._owner("owner-1").party.records()
    columns = SketchColumns(make_family("l2", {features}, {rows}, 0, bandwidth=1.0), {width})
    columns.extend(records)  # what the owner keeps for its sketch rounds, then counts
    columns.counters()
    print(json.dumps({{"idle": idle, "ingested": ingested, "sketched": rss(),
                      "backend": "numba" if sys.modules.get("numba") else "numpy"}}))
    import os
    os._exit(0)  # the tailer threads

asyncio.run(main())
"""


def agent_after(csv: Path, n: int, state: Path, block: bool) -> dict[str, Any]:
    lower, upper = _bounds()
    code = AGENT_AFTER.format(
        block=block, runtime=MARKET_RUNTIME, features=FEATURES, lower=lower, upper=upper,
        csv=str(csv), state=str(state), n=n, rows=SKETCH[0], width=SKETCH[1],
    )  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def actors(csv: Path, n: int, state: Path) -> dict[str, tuple[float, float | None]]:
    """The three Ray actor kinds on a local Ray instance of this process."""
    import ray

    from dpmarket.actors.cluster.connect import connect
    from dpmarket.actors.parties.curator import CuratorActor
    from dpmarket.actors.parties.ray_actors import ComputeNodeActor, OwnerActor
    from dpmarket.actors.randomness import NoiseSource
    from dpmarket.protocol.securesum.spec import DcaConfig
    from dpmarket.protocol.summary.params import CuratorParams
    from dpmarket.streams.race.columns import SketchColumns
    from dpmarket.streams.race.lsh import make_family
    from dpmarket.streams.records.files import Schema

    def pid(handle: Any) -> int:
        return int(ray.get(handle.__ray_call__.remote(lambda _self: os.getpid())))

    connect(num_cpus=2)
    out: dict[str, tuple[float, float | None]] = {}
    try:
        noise = NoiseSource.secure()
        owner = OwnerActor.remote("bench", {"owner-1": (FEATURES, None)}, noise)
        idle = rss_mb(pid(owner))
        lower, upper = _bounds()
        schema = Schema(FEATURES, tuple(lower), tuple(upper), FEATURES, "clip")
        ray.get(owner.start_ingest.remote("owner-1", [str(csv)], schema, str(state), 0.05))
        while ray.get(owner.ingest_status.remote("owner-1"))["records"] < n:
            time.sleep(0.05)
        rows, width = SKETCH

        def sketch(host: Any) -> int:
            columns = SketchColumns(make_family("l2", FEATURES, rows, 0, bandwidth=1.0), width)
            columns.extend(host._owner("owner-1").party.records())  # kept, then counted
            return int(columns.counters().sum())

        ray.get(owner.__ray_call__.remote(sketch))
        out["owner host actor"] = (idle, rss_mb(pid(owner)))

        config = DcaConfig("bench", ("owner-1", "owner-2", "owner-3"), ("node-1", "node-2"))
        node = ComputeNodeActor.remote(config, "node-1")
        out["compute-node actor"] = (rss_mb(pid(node)), None)

        rng = np.random.default_rng(1)
        params = CuratorParams(p=10, d=256)

        def curator(records: int) -> float:
            handle = CuratorActor.remote(  # type: ignore[attr-defined]
                "bench", ["owner-1"], rng.uniform(size=(records, FEATURES)),
                rng.uniform(size=(20, FEATURES)), params, noise,
            )  # fmt: skip
            used = rss_mb(pid(handle))
            ray.kill(handle)
            return used

        out["curator"] = (curator(24), curator(n))
    finally:
        ray.shutdown()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    n = args.records
    with tempfile.TemporaryDirectory(prefix="party-memory") as tmp:
        root = Path(tmp)
        csv = root / "records.csv"
        write_records(csv, n)
        market = build(root / "m", owners=1, nodes=2)
        idle_owner = idle_agent(market.config("owner-1"), "owner", root / "owner.log")
        idle_node = idle_agent(market.config("node-1"), "node", root / "node.log")
        lean = agent_after(csv, n, root / "state-lean", block=True)
        compiled = agent_after(csv, n, root / "state-numba", block=False)
        on_ray = actors(csv, n, root / "state-actor")
    rows = [
        {"party": "owner agent", "idle_mb": idle_owner, "records_mb": lean["sketched"],
         "note": f"agent's install ({lean['backend']})"},
        {"party": "owner agent +numba", "idle_mb": idle_owner, "records_mb": compiled["sketched"],
         "note": f"[numba] extra ({compiled['backend']})"},
        {"party": "node agent", "idle_mb": idle_node, "records_mb": None, "note": "no records"},
        {"party": "owner host actor", "idle_mb": on_ray["owner host actor"][0],
         "records_mb": on_ray["owner host actor"][1], "note": "local Ray (market install)"},
        {"party": "compute-node actor", "idle_mb": on_ray["compute-node actor"][0],
         "records_mb": None, "note": "no records"},
        {"party": "curator", "idle_mb": on_ray["curator"][0], "records_mb": on_ray["curator"][1],
         "note": f"{n} validation records"},
    ]  # fmt: skip
    print(f"resident memory (MB), idle and after {n} records (tailed; columns kept, 50 x 256)")
    print(f"{'party':<20} {'idle':>8} {'records':>8} {'target':>8}  note")
    for row in rows:
        target = TARGETS.get(str(row["party"]))
        after = "-" if row["records_mb"] is None else f"{row['records_mb']:.0f}"
        print(
            f"{row['party']:<20} {row['idle_mb']:>8.0f} {after:>8} "
            f"{'-' if target is None else f'<= {target:.0f}':>8}  {row['note']}"
        )
    print(json.dumps({"benchmark": "party_memory", "records": n, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

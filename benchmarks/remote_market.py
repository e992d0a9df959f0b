"""Remote agents against local Ray actors: the same market, owners and compute nodes as agent
processes dialling in over mutual TLS on localhost, then as local actors (issue 26).

    python benchmarks/remote_market.py                       # demo and K = 16, one run each
    python benchmarks/remote_market.py --records-per-owner 500 --summary-size 20

Two sizes, each run twice in one invocation (remote, then local):

- ``demo``: configs/remote/'s market: 4 owners with the wine data (about 34 records each),
  3 compute nodes, T = 1, a 10-point summary;
- ``scale``: market_scale's shape (K = 16 owners, a Gaussian mixture in 20 dimensions with a
  covariate shift, 3 compute nodes), as CSV files: ``--records-per-owner`` records per owner
  (market_scale itself has 1e6 records in all and p = 1000, which 16 agent processes on a
  small machine do not reach in a benchmark's time) and ``--summary-size`` points.

Every party is its own process with its own directory, certificates and configuration
(tests/integration/remote_setup.py builds them); reproducible noise from one public seed, so
both runs of a size buy the same summary (``same_summary``). ``seconds_*``: the driver's wall
clock, end to end (Ray start, with remote agents the wait for their joins, ingest, the secure
sums, the epochs, reports). ``ms_per_epoch_*``: report.json's ``timings.summarise`` (the
curator's run: setup, every epoch, finish, timed in the curator) over ``outcome.epochs``; the
difference between the two is what the gateway, gRPC and the agents cost per epoch against Ray
actor calls. The goal of issue 26: remote at most 2x local per epoch.

Last line: one JSON object ``{"benchmark": "remote_market", "rows": [...]}``, one row per size
with keys ``size``, ``owners``, ``records``, ``epochs``, ``seconds_remote``, ``seconds_local``,
``ms_per_epoch_remote``, ``ms_per_epoch_local``, ``ratio`` and ``same_summary``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the market builder of the integration tests

from dpmarket.streams.synthetic import gaussian_mixture_shift  # noqa: E402
from tests.integration.remote_setup import DATA, RemoteMarket, build  # noqa: E402

RUN = 3600.0


def _write(path: Path, X: np.ndarray, y: np.ndarray) -> Path:
    np.savetxt(path, np.column_stack([X, y]), delimiter=",", fmt="%.6g")
    return path


def scale_data(folder: Path, owners: int, per_owner: int) -> dict[str, Any]:
    """market_scale's scenario (K owners, 20 dimensions, 8 components) as CSV files."""
    scenario = gaussian_mixture_shift(
        np.random.default_rng(0),
        n_points=owners * per_owner,
        n_owners=owners,
        n_components=8,
        dim=20,
        n_validation=500,
        n_test=10,
        n_seed=50,
    )
    folder.mkdir(parents=True)
    files = {}
    for i, (X, y) in enumerate(scenario.owners, start=1):
        files[f"owner-{i}"] = [_write(folder / f"owner-{i}.csv", X, y)]
    zeros = np.zeros(len(scenario.validation))
    validation = _write(folder / "validation.csv", scenario.validation, zeros)
    seed = _write(folder / "seed.csv", scenario.seed_set, np.zeros(len(scenario.seed_set)))
    every = np.vstack([X for X, _ in scenario.owners] + [scenario.validation])
    lower, upper = np.floor(every.min(axis=0)), np.ceil(every.max(axis=0))
    schema = (
        f"features = 20\nlabel_column = 20\nlower = {lower.tolist()}\nupper = {upper.tolist()}\n"
        f'policy = "clip"\nheader = false\nbound = {float(np.abs(every).max()):.1f}\n'
    )
    return {"data": files, "schema": schema, "consumer": (validation, seed)}


def _one(market: RemoteMarket, out: Path, remote: bool) -> tuple[float, dict[str, Any]]:
    tick = time.perf_counter()
    driver = market.run(out, local=not remote)
    if remote:
        market.start_agents()
    code = driver.wait(timeout=RUN)
    seconds = time.perf_counter() - tick
    if code != 0:
        where = market.log("market")
        raise SystemExit(f"the {'remote' if remote else 'local'} run exited {code}: see {where}")
    if remote:
        parties = [*market.nodes, *market.owners]
        codes = market.wait_agents(parties)
        if set(codes.values()) != {0}:
            raise SystemExit(f"agents did not all finish: {codes}")
    return seconds, json.loads((out / "report.json").read_text())


def measure(size: str, root: Path, owners: int, records: int, **kw: Any) -> dict[str, Any]:
    with build(root / size, owners=owners, name=f"bench-{size}", **kw) as market:
        remote_s, remote = _one(market, root / f"{size}-remote", True)
        local_s, local = _one(market, root / f"{size}-local", False)
        a = np.load(root / f"{size}-remote" / "summary.npz")
        b = np.load(root / f"{size}-local" / "summary.npz")
    same = all(np.array_equal(a[k], b[k]) for k in a.files)
    epochs = int(remote["outcome"]["epochs"])
    ms_remote = 1000 * remote["timings"]["summarise"] / epochs
    ms_local = 1000 * local["timings"]["summarise"] / int(local["outcome"]["epochs"])
    return {
        "size": size,
        "owners": owners,
        "records": records,
        "epochs": epochs,
        "seconds_remote": round(remote_s, 2),
        "seconds_local": round(local_s, 2),
        "ms_per_epoch_remote": round(ms_remote, 1),
        "ms_per_epoch_local": round(ms_local, 1),
        "ratio": round(ms_remote / ms_local, 2),
        "same_summary": same,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owners", type=int, default=16)
    parser.add_argument("--records-per-owner", type=int, default=1000)
    parser.add_argument("--summary-size", type=int, default=20)
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dpmarket-remote-bench-") as tmp:
        root = Path(tmp)
        if not args.skip_demo:
            demo_records = sum(
                len((DATA / f"owner-{i}.csv").read_text().splitlines()) for i in range(1, 5)
            )
            rows.append(measure("demo", root, 4, demo_records))
        if not args.skip_scale:
            p = args.summary_size
            scale = scale_data(root / "scale-data", args.owners, args.records_per_owner)
            rows.append(
                measure(
                    "scale",
                    root,
                    args.owners,
                    args.owners * args.records_per_owner,
                    summary_size=p,
                    max_epochs=3 * p,
                    max_points=3 * p + 10,
                    **scale,
                )
            )
    keys = ["size", "owners", "records", "epochs", "seconds_remote", "seconds_local"]
    keys += ["ms_per_epoch_remote", "ms_per_epoch_local", "ratio", "same_summary"]
    print(" ".join(f"{k:>19}" if i else f"{k:<6}" for i, k in enumerate(keys)))
    for row in rows:
        print(" ".join(f"{row[k]!s:>19}" if i else f"{row[k]!s:<6}" for i, k in enumerate(keys)))
    print(json.dumps({"benchmark": "remote_market", "rows": rows}))


if __name__ == "__main__":
    main()

"""Several consumers' requests in one config ([[requests]]) on Ray: the owner actors are spawned
once and keep ingesting their growing files between requests, every owner's store is charged
for each request, and the owners' caps hold across them (the last request is refused, exit 3,
while the earlier ones' results stay)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from dpmarket.actors.commands.main import main
from dpmarket.actors.ledger_store import read_store
from dpmarket.streams.synthetic import gaussian_mixture_shift

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

OWNERS = ("owner-1", "owner-2", "owner-3", "owner-4")
# One request below costs each owner (normalise, scan and the summary plan, all fixed by the
# config before the run) about 1.115 by its Rényi filter at delta 1e-5, two requests about
# 1.573, and a third request's normalise round alone would take an owner to about 1.775. A cap
# of 1.65 therefore admits exactly two requests: every owner declines the third's normalise
# round (4 > T = 1) and it is refused.
CAP = 1.65


def _csv(path: Path, X: np.ndarray, y: np.ndarray) -> None:
    np.savetxt(path, np.column_stack([X, y]), delimiter=",", fmt="%.6f")


def _market(tmp_path: Path, cap: float) -> tuple[Path, list[Path]]:
    sc = gaussian_mixture_shift(
        np.random.default_rng(7), n_points=2400, n_owners=4, n_components=3, dim=4,
        n_validation=180, n_test=50, n_seed=30,
    )  # fmt: skip
    data = tmp_path / "data"
    data.mkdir()
    files = []
    for name, (X, y) in zip(sc.owner_names, sc.owners, strict=True):
        half = len(X) // 2  # the rest is appended while the requests run
        _csv(data / f"{name}.csv", X[:half], y[:half])
        np.save(data / f"{name}.rest.npy", np.column_stack([X[half:], y[half:]]))
        files.append(data / f"{name}.csv")
    for i in range(3):  # three consumers, 60 validation points each
        V = sc.validation[60 * i : 60 * (i + 1)]
        _csv(data / f"v{i + 1}.csv", V, np.zeros(len(V)))
    _csv(data / "seed.csv", sc.seed_set, np.zeros(len(sc.seed_set)))
    config = tmp_path / "requests.toml"
    config.write_text(
        "[run]\nname = 'reqs'\ndeadline_seconds = 2.0\n"
        "[market]\nowners = 4\ntolerance = 1\nsummary_size = 8\nowners_per_actor = 2\n"
        "[data]\nsource = 'files'\nfeatures = 4\nlabel_column = 4\nlower = -8.0\nupper = 8.0\n"
        "seed_set = 'data/seed.csv'\nbound = 8.0\n"
        "[data.files]\n"
        + "".join(f"'{o}' = ['data/{o}.csv']\n" for o in OWNERS)
        + f"[privacy]\nledger_dir = 'stores'\nowner_budget = {cap}\n"
        "[summary]\nd = 32\nvalidation_iterations = 200\nseed_iterations = 200\n"
        "[consumer]\nbudget = {epsilon = 20.0, delta = 1e-5}\n"
        "[[requests]]\nname = 'r1'\nvalidation = 'data/v1.csv'\n"
        "[[requests]]\nname = 'r2'\nvalidation = 'data/v2.csv'\n"
        "budget = {epsilon = 10.0, delta = 1e-5}\n"
        "[[requests]]\nname = 'r3'\nvalidation = 'data/v3.csv'\n"
    )
    return config, files


def _append_while(stop: threading.Event, files: list[Path], out: Path) -> None:
    """Once the first request has begun (its output folder exists), append 5 records to every
    owner's file every 0.5 s (whole lines, one write each) until stopped or out of records."""
    rests = [np.load(f.with_suffix(".rest.npy")) for f in files]
    while not stop.wait(0.05) and not (out / "requests").exists():
        pass
    at = 0
    while not stop.wait(0.5) and at < min(len(r) for r in rests):
        for f, rows in zip(files, rests, strict=True):
            text = "".join(",".join(f"{v:.6f}" for v in row) + "\n" for row in rows[at : at + 5])
            with f.open("a") as fh:
                fh.write(text)
        at += 5


def test_requests_share_owner_actors_and_their_caps(tmp_path: Path) -> None:
    config, files = _market(tmp_path, CAP)
    out, stores = tmp_path / "out", tmp_path / "stores"
    stop = threading.Event()
    writer = threading.Thread(target=_append_while, args=(stop, files, out), daemon=True)
    writer.start()
    try:
        code = main(["run", str(config), "--out", str(out)])
    finally:
        stop.set()
        writer.join()
    assert code == 3
    index = json.loads((out / "requests.json").read_text())
    requests = {r["name"]: r for r in index["requests"]}
    assert {n: r["exit_code"] for n, r in requests.items()} == {"r1": 0, "r2": 0, "r3": 3}
    assert "refused" in requests["r3"]["message"]
    # the owner actors were spawned once: two (owners_per_actor = 2), the same processes
    assert len(set(index["owner_actors"].values())) == 2
    pids = [requests[n]["owner_pids"] for n in ("r1", "r2", "r3")]
    assert pids[0] == pids[1] == pids[2] and set(pids[0]) == set(OWNERS)
    # the earlier requests' results are kept; the refused one wrote no report
    reports = {
        n: json.loads((out / "requests" / n / "report.json").read_text()) for n in ("r1", "r2")
    }
    private = {
        n: json.loads((out / "requests" / n / "report.private.json").read_text())
        for n in ("r1", "r2")
    }
    assert not (out / "requests" / "r3" / "report.json").exists()
    assert reports["r1"]["run"]["name"] == "reqs.r1" and reports["r2"]["run"]["name"] == "reqs.r2"
    for n in ("r1", "r2"):
        assert reports[n]["parsimony"]["summary_size"] == 8
        assert reports[n]["budgets"]["errors"] == []
    for o in OWNERS:
        # the owners kept ingesting: by the end of the second request they held more records
        # (the files grew while the first request ran)
        first, second = (private[n]["owners"][o]["ingested"] for n in ("r1", "r2"))
        assert 300 <= first < second <= 600
        # every request charged the same store; the cap held across them
        one, two = (reports[n]["budgets"]["owners"][o]["spent"] for n in ("r1", "r2"))
        assert 1.0 < one < two <= CAP
        store = read_store(stores / f"{o}.sqlite")
        assert len(store["runs"]) == 3
        charged = [r for r in store["rows"] if r["state"] == "charged"]
        assert [r["label"].split(" (")[0] for r in charged] == [
            "normalise",
            "scan",
            "summary plan: auction",
        ] * 2
        assert charged[-1]["spent_after"] == pytest.approx(two)
        declined = [r for r in store["rows"] if r["state"] == "declined"]
        assert [r["label"] for r in declined] == ["normalise (secure sum)"]
    # the consumers: r1 and r3 are the [consumer]'s (one store, two validation charges, the
    # refused one paid up front), r2 has its own store
    assert len(read_store(stores / "consumer.sqlite")["runs"]) == 2
    r2 = read_store(stores / "consumer-r2.sqlite")
    assert len(r2["runs"]) == 1 and [r["state"] for r in r2["rows"]] == ["charged"]

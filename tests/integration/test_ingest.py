"""Owners ingest files: a file-based market with bad records, and a streaming simulation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from dpmarket.actors.commands.main import main
from dpmarket.streams.synthetic import gaussian_mixture_shift

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]
ROOT = Path(__file__).resolve().parents[2]


def _csv(path: Path, X: np.ndarray, y: np.ndarray | None = None, header: str = "") -> None:
    rows = X if y is None else np.column_stack([X, y])
    np.savetxt(path, rows, delimiter=",", fmt="%.6f", header=header, comments="")


def test_file_market_ingests_clips_and_rejects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sc = gaussian_mixture_shift(
        np.random.default_rng(4),
        n_points=1200,
        n_owners=3,
        n_components=3,
        dim=4,
        n_validation=60,
        n_test=50,
        n_seed=30,
    )
    data = tmp_path / "data"
    data.mkdir()
    names = "a,b,c,d,label"  # a header line: detected (no [data].header), skipped, not rejected
    for name, (X, y) in zip(sc.owner_names, sc.owners, strict=True):
        _csv(data / f"{name}.csv", X, y, header=names if name == "owner-2" else "")
    with (data / "owner-1.csv").open("a") as fh:  # garbage the decoder must reject
        fh.write("1,2,three,4,0\n1,2,3\nnan,1,1,1,0\n")
    _csv(data / "validation.csv", sc.validation, np.zeros(len(sc.validation)), header=names)
    with (data / "validation.csv").open("a") as fh:  # the consumer's bad lines are counted too
        fh.write("1,2,3\n")
    _csv(data / "seed.csv", sc.seed_set, np.zeros(len(sc.seed_set)))
    with (data / "seed.csv").open("a") as fh:
        fh.write("1,x,1,1,0\ninf,1,1,1,0\n")
    config = tmp_path / "files.toml"
    config.write_text(
        "[run]\nname = 'files'\ndeadline_seconds = 3.0\n"
        "[market]\nowners = 3\ntolerance = 1\nsummary_size = 8\n"
        "[data]\nsource = 'files'\nfeatures = 4\nlabel_column = 4\nlower = -8.0\nupper = 8.0\n"
        "validation = 'data/validation.csv'\nseed_set = 'data/seed.csv'\n"
        "[data.files]\n'owner-1' = ['data/owner-1.csv']\n'owner-2' = ['data/owner-2.csv']\n"
        "'owner-3' = ['data/owner-3.csv']\n"
        "[summary]\nd = 32\nvalidation_iterations = 200\nseed_iterations = 200\n"
    )
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    consumer = json.loads((out / "report.private.json").read_text())
    assert report["parsimony"]["summary_size"] == 8 and "utility" not in consumer
    assert "owners" not in report  # exact record counts are not for the other owners
    owners = consumer["owners"]
    assert owners["owner-1"]["ingested"] == len(sc.owners[0][0])
    assert owners["owner-1"]["rejected_records"] == 3
    assert owners["owner-1"]["ingest_gaps"] == 0  # appended only: no record may be missing
    rejects = [
        json.loads(line)
        for line in next((out / ".ingest").glob("attempt-*/owner-1/rejects.jsonl")).open()
    ]
    assert sorted(r["reason"] for r in rejects) == ["arity", "non_finite", "non_numeric"]
    assert all(r["source"].endswith("owner-1.csv") and r["offset"] > 0 for r in rejects)
    assert owners["owner-2"]["ingested"] == len(sc.owners[1][0])  # header skipped, not taken
    assert owners["owner-2"]["rejected_records"] == 0
    attempt = next((out / ".ingest").glob("attempt-*"))
    for party, reasons in (("validation", ["arity"]), ("seed_set", ["non_finite", "non_numeric"])):
        found = [json.loads(line) for line in (attempt / party / "rejects.jsonl").open()]
        assert sorted(r["reason"] for r in found) == reasons
    assert report["run"]["validation_size"] == len(sc.validation)
    stdout = capsys.readouterr().out
    for party, count in (("owner-1", 3), ("owner-2", 0), ("owner-3", 0), ("validation", 1),
                         ("seed_set", 2)):  # fmt: skip
        assert re.search(
            rf"^  {party} +{count}  {attempt / party / 'rejects.jsonl'}$", stdout, re.M
        )


def test_missing_input_file_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(
        "[market]\nowners = 2\ntolerance = 0\n[data]\nsource = 'files'\nfeatures = 2\n"
        "lower = 0.0\nupper = 1.0\nvalidation = 'nope.csv'\nseed_set = 'nope.csv'\n"
        "[data.files]\n'owner-1' = ['a.csv']\n'owner-2' = ['b.csv']\n"
    )
    assert main(["validate", str(config)]) == 2
    assert "[data].validation: file 'nope.csv' not found" in capsys.readouterr().err


def test_streaming_owners_take_in_records_written_during_the_run(tmp_path: Path) -> None:
    out = tmp_path / "stream"
    args = [
        "run",
        str(ROOT / "configs" / "stream.toml"),
        "--out",
        str(out),
        "--set",
        "market.summary_size=30",
        "--set",
        "data.stream.interval=0.2",
        "--set",
        "data.n_points=2000",
        "--set",
        "privacy.refresh_every=5",
        # replace-one scan noise is sqrt(2) times add/remove's: a larger refresh budget keeps
        # 6 noise sds below the pool, so the size check below can fail
        "--set",
        "privacy.eps_refresh=1.0",
    ]
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    consumer = json.loads((out / "report.private.json").read_text())
    ingested = [o["ingested"] for o in consumer["owners"].values()]
    initial = [round(0.4 * 500)] * 4
    assert all(i > first for i, first in zip(ingested, initial, strict=True))
    # the pool sketch was refreshed every 5 epochs from disjoint deltas, each one charged
    refreshes = report["secure_phases"]["refreshes"]
    released = [r for r in refreshes if r["status"] == "released"]
    assert len(released) >= 3 and [r["epoch"] for r in refreshes][:2] == [5, 10]
    events = report["privacy"]["parties"]["owner-3"]["events"]["events"]
    charged = sum(e["count"] for e in events if e["label"] == "scan refresh (secure sum)")
    assert charged == len(released)
    # records counted once: the accumulated sketch's size estimate stays within 6 noise
    # standard deviations of what the owners hold (re-sending old records would multiply it)
    last = released[-1]
    rows, width = 50, 256  # configs/stream.toml's [sketch] defaults
    std = last["sigma"] * np.sqrt(last["releases"] * width / rows)
    assert abs(last["records_estimate"] - sum(ingested)) < 6 * std < sum(ingested)

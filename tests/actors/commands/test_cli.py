"""The command line and its configuration files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpmarket.actors.commands.main import main
from dpmarket.actors.config.market import ConfigError
from dpmarket.actors.harness.evaluation import load_demo_config
from dpmarket.protocol.summary.curator import CuratorParams

ROOT = Path(__file__).resolve().parents[3]


def test_shipped_demo_config_loads_and_applies() -> None:
    config = load_demo_config(ROOT / "configs" / "evaluate.toml")
    assert config.scenario == "digits" and config.p and config.seeds
    applied = config.apply(CuratorParams(p=10))
    assert applied.auction_variant == config.overrides.get("auction_variant", "paper")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[scenario]\nnmae = 'digits'\n", "unknown keys ['nmae']"),
        ("[summary]\neps_sumary = 0.1\n", "unknown keys ['eps_sumary']"),
        ("[summary]\neps_summary = -1.0\n", "eps_summary"),
        ("[scenario]\nname = 'mnist'\n", "'mnist' is not one of"),
        ("[scenario]\np = [0]\n", "summary sizes"),
        ("[scenario]\ndelta = 2.0\n", "delta"),
        ("[oops]\n", "unknown keys ['oops']"),
        ("not toml = = 1", "cannot read"),
    ],
)
def test_bad_config_is_refused_with_the_key_named(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_demo_config(path)
    assert needle in str(info.value)


def test_demo_command_prints_the_table_and_the_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text(
        "[scenario]\nname = 'digits'\nseeds = [0]\np = [6]\n"
        "[summary]\nvalidation_iterations = 100\nseed_iterations = 100\n"
    )
    assert main(["digits", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    for method in ("greedy", "hashed_greedy", "private", "uniform"):
        assert f"  {method} " in out
    ledger = json.loads(out[out.index("{") :])
    assert ledger["paper_count"]["validation"] > 0 and ledger["validation"] > 0


def test_demo_command_reports_config_errors_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[scenario]\nseeds = 'all'\n")
    assert main(["digits", "--config", str(path)]) == 2
    assert "seeds" in capsys.readouterr().err


def test_account_reproduces_the_paper_and_the_correct_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [
        "account",
        "laplace:scale=100,count=1656,paper=0.01",
        "exponential:eps=0.01,count=1656",
        "--delta",
        "0.01",
        "--json",
    ]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)["epsilon"]
    assert result["paper"] == pytest.approx(1.40, abs=0.01)
    assert result["theorem7"] == pytest.approx(3.18, abs=0.02)
    assert result["pld"] < result["theorem7"]


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("laplace:scale=0", "scale"),
        ("poisson:rate=1", "unknown kind"),
        ("gaussian:sensitivity=1", "missing ['sigma']"),
        ("auction:eps=0.1,variant=pure,colour=red", "bad field"),
    ],
)
def test_account_refuses_bad_mechanisms(
    spec: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["account", spec]) == 2
    assert needle in capsys.readouterr().err


def test_regress_runs_through_the_secure_sum(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["regress", "--eps", "4", "--json", "--colluders", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["clients"] == 353 and result["epsilon"] <= 4.0
    assert result["median_abs_error"] < 1.5 * result["median_abs_error_nonprivate"] + 0.5


def test_regress_refuses_a_bad_budget(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["regress", "--eps", "0"]) == 2
    assert "--eps" in capsys.readouterr().err


def test_sketch_build_merge_release_query(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        rows = rng.normal(size=(300, 3))
        text = "\n".join(",".join(f"{v:.5f}" for v in row) for row in rows)
        (tmp_path / f"{name}.csv").write_text(text + "\nnot,a,number\n")
    common = ["--features", "3", "--lower", "-4", "--upper", "4", "--rows", "20", "--width", "64"]
    for name in ("a", "b"):
        out = str(tmp_path / f"{name}.race")
        assert main(["sketch", "build", str(tmp_path / f"{name}.csv"), *common, "--out", out]) == 0
    merged = str(tmp_path / "m.race")
    assert (
        main(
            ["sketch", "merge", str(tmp_path / "a.race"), str(tmp_path / "b.race"), "--out", merged]
        )
        == 0
    )
    released = str(tmp_path / "r.race")
    assert main(["sketch", "release", merged, "--eps", "1", "--out", released]) == 0
    capsys.readouterr()
    (tmp_path / "q.csv").write_text("0,0,0\n3,3,3\n")
    assert main(["sketch", "query", released, "--points", str(tmp_path / "q.csv")]) == 0
    near, far = (float(v) for v in capsys.readouterr().out.split())
    assert near > far  # the pool is centred at 0
    rejects = (tmp_path / "a.race.rejects.jsonl").read_text().splitlines()
    assert len(rejects) == 1 and '"non_numeric"' in rejects[0]
    other = str(tmp_path / "o.race")
    assert (
        main(
            [
                "sketch",
                "build",
                str(tmp_path / "a.csv"),
                *common[:-2],
                "--width",
                "32",
                "--out",
                other,
            ]
        )
        == 0
    )
    assert main(["sketch", "merge", merged, other, "--out", str(tmp_path / "x.race")]) == 2
    assert "width" in capsys.readouterr().err


def test_regress_never_rescales_private_records_and_charges_replace_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user's CSV is private: no mean or range of the data may shape the records (one outlier
    would move every other record); records are clipped to public bounds in the fit."""
    from dpmarket.actors.commands.regress import load_records

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + rng.normal(0, 0.1, 300)
    data = np.column_stack([x, y])
    data[0, 0] = 1e6  # an outlier must not rescale the others
    path = tmp_path / "clients.csv"
    np.savetxt(path, data, delimiter=",")
    loaded_x, loaded_y = load_records(str(path))
    np.testing.assert_allclose(loaded_x, data[:, :3])
    np.testing.assert_allclose(loaded_y, data[:, 3])
    assert main(["regress", "--data", str(path), "--eps", "2", "--json"]) == 0
    assert main(["regress", "--data", str(path), "--reproducible-noise"]) == 2
    assert "refused" in capsys.readouterr().err


def test_add_remove_accounting_is_refused_for_private_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "v.csv").write_text("0.5,0.5\n")
    config = tmp_path / "files.toml"
    config.write_text(
        "[market]\nowners = 2\ntolerance = 0\n[data]\nsource = 'files'\nfeatures = 2\n"
        "lower = 0.0\nupper = 1.0\nvalidation = 'v.csv'\nseed_set = 'v.csv'\n"
        "[data.files]\n'owner-1' = ['v.csv']\n'owner-2' = ['v.csv']\n"
        "[summary]\nneighbouring = 'add_remove'\n"
    )
    assert main(["validate", str(config)]) == 2
    assert "[summary].neighbouring: 'add_remove' refused" in capsys.readouterr().err


def test_ingest_gaps_are_named_per_owner_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    from dpmarket.actors.commands.market import print_gaps

    consumer = {
        "owners": {
            "owner-1": {"ingested": 10, "ingest_gaps": 0},
            "owner-2": {"ingested": 7, "ingest_gaps": 2},
        }
    }
    print_gaps(consumer)
    print_gaps(None)  # a refused run has no consumer report
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("dpmarket: WARNING: owner-2: 2 gap(s)")

"""``dpmarket validate`` and the pre-run check of a files market (no Ray): each impossible
schema or input file exits 2 naming the file, the line and the key; header lines; --out."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpmarket.actors.commands.main import main
from dpmarket.actors.config.market import ConfigError
from dpmarket.actors.run.ingest import follow_ingest

ROOT = Path(__file__).resolve().parents[3]
ROWS = "".join(f"{0.1 * i:.1f},{1 - 0.1 * i:.1f},{i % 2}\n" for i in range(8))


def _market(tmp: Path, data: str = "", owner_1: str = ROWS, header: str = "") -> Path:
    """A 2-owner files market: 2 features and a label column; ``data`` is added to [data]."""
    (tmp / "d").mkdir(exist_ok=True)
    (tmp / "d" / "owner-1.csv").write_text(header + owner_1)
    for name in ("owner-2", "validation", "seed"):
        (tmp / "d" / f"{name}.csv").write_text(header + ROWS)
    config = tmp / "files.toml"
    keys = {"features": "2", "label_column": "2", "lower": "0.0", "upper": "1.0"}
    for line in data.splitlines():
        key, _, value = line.partition(" = ")
        keys[key] = value
    body = "".join(f"{k} = {v}\n" for k, v in keys.items())
    config.write_text(
        "[run]\nname = 'v'\n[market]\nowners = 2\ntolerance = 0\nsummary_size = 4\n"
        f"[data]\nsource = 'files'\n{body}"
        "validation = 'd/validation.csv'\nseed_set = 'd/seed.csv'\n"
        "[data.files]\n'owner-1' = ['d/owner-1.csv']\n'owner-2' = ['d/owner-2.csv']\n"
    )
    return config


def _line(config: Path, key: str) -> int:
    lines = config.read_text().splitlines()
    return 1 + next(i for i, line in enumerate(lines) if re.match(rf"^'?{key}'? =", line))


def test_the_example_config_validates_and_shows_its_files(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["validate", str(ROOT / "configs" / "files-example.toml")]) == 0
    out = capsys.readouterr().out
    for party in ("owner-1", "owner-2", "owner-3", "validation", "seed_set"):
        assert re.search(rf"^{party} +\S+\.csv \(csv, \d+ bytes\): \d+ rows probed", out, re.M)
    assert out.count("header line skipped ([data].header = true)") == 5
    assert re.search(r"owner-2 .*: 50 rows probed, 49 valid, 1 rejected, 14 columns", out)
    assert "line 19: non_numeric (a field is not a number): goes to the rejects file" in out


@pytest.mark.parametrize(
    ("data", "key", "needle"),
    [
        ("policy = 'clipp'", "policy", "'clipp' is not 'clip' or 'reject'"),
        ("label_column = 5", "label_column", "5 is out of range"),
        ("lower = [0.0]", "lower", "1 values for features = 2"),
        ("upper = [1.0, 1.0, 1.0]", "upper", "3 values for features = 2"),
        ("header = 'yes'", "header", "expected true or false"),
    ],
)
def test_an_impossible_schema_exits_2_naming_file_line_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: str, key: str, needle: str
) -> None:
    config = _market(tmp_path, data)
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{config}:{_line(config, key)}: [data].{key}: {needle}" in err


def test_rows_of_the_wrong_arity_exit_2_naming_the_data_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _market(tmp_path, "features = 3\nlower = 0.0\nupper = 1.0\nlabel_column = 3")
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    data = tmp_path / "d" / "owner-1.csv"
    assert f"{data}:1: the row has 3 values, but [data].features = 3 + label_column 3" in err
    assert "means 4 (8 of the first 8 rows have the wrong arity" in err


def test_a_few_bad_lines_pass_validate_and_are_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _market(tmp_path, owner_1=ROWS + "0.5,x,1\n0.1,0.2\n" + ROWS)
    assert main(["validate", str(config)]) == 0
    out = capsys.readouterr().out
    assert "18 rows probed, 16 valid, 2 rejected, 3 columns" in out
    assert "line 9: non_numeric" in out and "line 10: arity (not 3 fields)" in out


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_missing_owner_file_fails_before_ray_naming_owner_and_path(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    def no_ray(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("Ray must not start for a market whose inputs are missing")

    monkeypatch.setattr("dpmarket.actors.run.market.connect", no_ray)
    config = _market(tmp_path)
    missing = tmp_path / "d" / "owner-2.csv"
    missing.unlink()
    assert main([command, str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{config}:{_line(config, 'owner-2')}: [data.files].owner-2" in err
    assert f"owner-2's file {missing} does not exist" in err
    assert not (tmp_path / "out").exists()


def test_an_unreadable_owner_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _market(tmp_path)
    path = tmp_path / "d" / "owner-1.csv"
    path.unlink()
    path.mkdir()  # exists, cannot be read as a file
    assert main(["validate", str(config)]) == 2
    assert f"owner-1's file {path} cannot be read" in capsys.readouterr().err


def test_a_header_line_is_detected_or_configured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _market(tmp_path, header="x1,x2,label\n")
    assert main(["validate", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.count("header line skipped (detected: its fields are not numbers") == 4
    assert out.count("8 rows probed, 8 valid, 0 rejected") == 4
    config = _market(tmp_path, "header = false", header="x1,x2,label\n")
    assert main(["validate", str(config)]) == 0  # one bad line among good ones
    out = capsys.readouterr().out
    assert "header line skipped" not in out
    assert out.count("9 rows probed, 8 valid, 1 rejected") == 4
    assert out.count("line 1: non_numeric") == 4
    config = _market(tmp_path, "header = true", header="x1,x2,label\n")
    assert main(["validate", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.count("header line skipped ([data].header = true)") == 4


def test_out_and_run_out_are_both_relative_to_the_working_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cfg").mkdir()
    config = _market(tmp_path / "cfg")
    config.write_text(config.read_text().replace("name = 'v'", "name = 'v'\nout = 'from-run'"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["validate", str(config)]) == 0
    assert f"out: {work / 'from-run'} (" in capsys.readouterr().out
    assert main(["validate", str(config), "--out", "from-cli"]) == 0
    assert f"out: {work / 'from-cli'} (" in capsys.readouterr().out


def test_ingest_gives_up_naming_the_owner_of_a_missing_file_or_a_failed_tailer() -> None:
    clock = iter(float(t) for t in range(100))

    def status(missing: list[str], failed: list[str]) -> dict[str, Any]:
        return {"records": 5, "rejected": 0, "caught_up": False, "missing": missing,
                "failed": failed}  # fmt: skip

    def poll_missing() -> dict[str, Any]:
        return {"owner-1": status([], []), "owner-2": status(["/data/b.csv"], [])}

    with pytest.raises(ConfigError, match=r"ingest: owner-2: input file /data/b.csv is missing"):
        follow_ingest(poll_missing, grace=2.0, clock=lambda: next(clock), pause=lambda s: None)
    with pytest.raises(ConfigError, match=r"ingest: owner-1: reading its input failed: denied"):
        follow_ingest(
            lambda: {"owner-1": status([], ["denied"])}, clock=lambda: 0.0, pause=lambda s: None
        )
    # a path missing for less than the grace (a rotation in progress) is waited for
    replies = iter([["/data/b.csv"], ["/data/b.csv"], []])

    def poll_rotating() -> dict[str, Any]:
        missing = next(replies)
        return {"owner-2": status(missing, []) | {"caught_up": not missing}}

    ticks = iter([0.0, 0.0, 0.5, 1.0, 1.5, 1.6])
    done = follow_ingest(poll_rotating, grace=2.0, clock=lambda: next(ticks), pause=lambda s: None)
    assert done["owner-2"]["caught_up"]
    # an owner that never catches up (its files on another node) is named at the timeout
    behind = {"owner-1": status([], []) | {"caught_up": True}, "owner-3": status([], [])}
    late = iter([0.0, 0.0, 5.0, 11.0])
    with pytest.raises(ConfigError, match=r"did not catch up within 10.0 s: owner-3$"):
        follow_ingest(lambda: behind, 10.0, clock=lambda: next(late), pause=lambda s: None)


# --- issue 30 part 3: the first hour with your own files ---------------------------------------

WINE_LIKE = "".join(f"{10 + 0.37 * i:.2f},{0.5 + 0.11 * i:.2f},{1 + i % 3}\n" for i in range(12))


def test_a_label_column_that_is_a_feature_warns_before_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """label_column = 1 on rows whose label is last: feature 1 (continuous) becomes the label
    and the real label (1..3) a clipped feature; validate and run warn before Ray starts."""

    def no_ray(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the warning must come before Ray starts")

    data = "features = 2\nlabel_column = 1\nlower = 0.0\nupper = 20.0"
    config = _market(tmp_path, data, owner_1=WINE_LIKE)
    for name in ("owner-2", "validation", "seed"):
        (tmp_path / "d" / f"{name}.csv").write_text(WINE_LIKE)
    assert main(["validate", str(config)]) == 0
    err = capsys.readouterr().err
    assert "WARNING: [data].label_column = 1 does not look like a label" in err
    assert "not whole numbers" in err and "column(s) [2] hold a few whole numbers" in err
    monkeypatch.setattr("dpmarket.actors.run.market.connect", no_ray)
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--strict"]) == 2
    assert "label_column = 1 does not look like a label" in capsys.readouterr().err
    # the right column: no warning
    config = _market(tmp_path, "features = 2\nlabel_column = 2\nlower = 0.0\nupper = 20.0",
                     owner_1=WINE_LIKE)  # fmt: skip
    assert main(["validate", str(config)]) == 0
    assert "does not look like a label" not in capsys.readouterr().err


def test_header_true_on_a_file_without_a_header_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _market(tmp_path, "header = true")  # the files have no header line
    assert main(["validate", str(config)]) == 0
    err = capsys.readouterr().err
    validation = tmp_path / "d" / "validation.csv"
    assert f"WARNING: {validation}: [data].header = true but its first line is all numbers" in err
    assert err.count("first line is all numbers") == 4
    config = _market(tmp_path, "header = true", header="x1,x2,label\n")
    assert main(["validate", str(config)]) == 0
    assert "first line is all numbers" not in capsys.readouterr().err


def test_features_one_short_says_the_rows_have_one_value_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _market(tmp_path, "features = 1\nlower = 0.0\nupper = 1.0")  # label_column = 2
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    owner_1 = tmp_path / "d" / "owner-1.csv"
    assert f"{config}:{_line(config, 'label_column')}: [data].label_column: 2 is out of" in err
    assert f"the rows of {owner_1} have 3 values, 1 more than features + 1 = 2" in err
    assert "[data].features = 1 is 1 short (set features = 2" in err


def test_lower_above_upper_names_the_feature(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _market(tmp_path, "lower = [0.0, 0.9]\nupper = [1.0, 0.5]")
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{config}:{_line(config, 'lower')}: [data].lower: feature 1 (column 1" in err
    assert "lower 0.9 > upper 0.5" in err


@pytest.mark.parametrize("name", ["files-example.toml", "demo.toml"])
def test_max_points_alone_selects_allocate_select_on_the_shipped_examples(name: str) -> None:
    """README: ``max_points`` alone selects allocate-select on the shipped examples (which
    leave explore_share to the plan; an explicit one beside a budget is refused by name)."""
    from dpmarket.actors.config.market import load_market_config

    path = ROOT / "configs" / name
    assert main(["validate", str(path), "--set", "summary.max_points=60"]) == 0
    params = load_market_config(path, ["summary.max_points=60"]).curator_params(0.1, 24)
    assert params.allocate and params.max_points == 60 and params.explore_share == 0
    assert main(["validate", str(path), "--set", "summary.max_points=60",
                 "--set", "summary.explore_share=1.0"]) == 2  # fmt: skip


@pytest.mark.parametrize("name", ["owner-1", "validation", "seed"])
def test_a_fifo_given_as_an_input_is_refused_by_name_before_anything_blocks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """Issue 28: a FIFO hung validate (the probe blocked opening it). Any non-regular input
    exits 2 naming the key and the file; ``run`` checks the same before Ray starts."""
    config = _market(tmp_path)
    fifo = tmp_path / "d" / f"{name}.csv"
    fifo.unlink()
    os.mkfifo(fifo)
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    key = {"owner-1": "[data.files].owner-1", "validation": "[data].validation"}
    assert key.get(name, "[data].seed_set") in err
    assert "not a regular file" in err
    if name == "owner-1":
        assert str(fifo) in err
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 2


def test_an_owner_npy_file_is_refused_by_validate_and_the_consumer_may_use_npy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 28: ``.npy`` owner files passed validate, then the run's tailer failed with a
    traceback. An owner's files are followed as they grow, which a ``.npy`` file cannot be:
    validate (and run, before Ray) exit 2 naming the key and the file; a validation set in
    ``.npy`` is read whole, and stays accepted."""
    config = _market(tmp_path)
    rows = np.loadtxt(tmp_path / "d" / "owner-1.csv", delimiter=",", ndmin=2)
    np.save(tmp_path / "d" / "owner-1.npy", rows)
    np.save(tmp_path / "d" / "validation.npy", rows)
    text = config.read_text().replace("d/owner-1.csv", "d/owner-1.npy")
    config.write_text(text)
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    assert "[data.files].owner-1" in err and "owner-1.npy" in err and "cannot be followed" in err
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 2
    config.write_text(
        text.replace("d/owner-1.npy", "d/owner-1.csv").replace(
            "d/validation.csv", "d/validation.npy"
        )
    )
    assert main(["validate", str(config)]) == 0

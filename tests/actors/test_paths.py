"""Paths are made absolute on the driver: --out from the working directory, data paths from
the configuration file's directory, so no worker resolves them in its own directory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dpmarket.actors.config.market import load_market_config
from dpmarket.actors.config.validate import check_inputs, resolve_out
from dpmarket.actors.run.ingest import file_inputs

EXAMPLE = Path(__file__).resolve().parents[2] / "configs"


def _copy_example(root: Path) -> Path:
    shutil.copytree(EXAMPLE / "example-data", root / "market" / "example-data")
    shutil.copy(EXAMPLE / "files-example.toml", root / "market" / "files.toml")
    return root / "market" / "files.toml"


def test_relative_paths_become_absolute_on_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _copy_example(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the driver's directory is not the config's
    config = load_market_config("../market/files.toml")  # a relative config path
    assert resolve_out(config, "out/x") == elsewhere / "out" / "x"
    assert resolve_out(config, None) == elsewhere / "out" / "files-example"  # [run].out
    check = check_inputs(config)
    inputs = file_inputs(config, check.headers, tmp_path / "rejects")
    for paths in inputs.files.values():
        for path in paths:
            assert Path(path).is_absolute() and Path(path).is_file()
            assert Path(path).parent == tmp_path / "market" / "example-data"
    assert inputs.headers and all(Path(p).is_absolute() for p in inputs.headers)
    assert all(Path(config.data[k]).is_absolute() for k in ("validation", "seed_set"))
    assert config.schema is not None and config.schema.n_features == 13  # checked once


def test_a_placed_owners_files_are_not_probed_on_the_driver(tmp_path: Path) -> None:
    path = _copy_example(tmp_path)
    text = path.read_text().replace(
        'owner-2 = ["example-data/owner-2.csv"]', 'owner-2 = ["/on/site-b/owner-2.csv"]'
    )
    path.write_text(text + "\n[owners.owner-2]\nresources = { site_b = 1 }\n")
    config = load_market_config(path)
    check = check_inputs(config)  # the missing driver-side path is not an error here
    assert {f.party for f in check.files} == {"owner-1", "owner-3", "validation", "seed_set"}
    inputs = file_inputs(config, check.headers, tmp_path / "rejects")
    assert inputs.files["owner-2"] == ["/on/site-b/owner-2.csv"]
    assert inputs.headers["/on/site-b/owner-2.csv"] is True  # [data].header = true, declared


def test_the_public_record_keeps_the_data_paths_as_written(tmp_path: Path) -> None:
    """The run resolves paths once, but report.json records ``[data]`` as the operator wrote
    it (no driver directories), and nothing derived (the schema) goes in."""
    import json

    config = load_market_config(_copy_example(tmp_path))
    record = json.loads(json.dumps(config.public_record()))  # JSON as written to report.json
    assert record["data"]["validation"] == "example-data/validation.csv"
    assert record["data"]["files"]["owner-1"] == ["example-data/owner-1.csv"]
    assert "schema" not in record and "written_data" not in record
    assert Path(config.data["validation"]).is_absolute()

"""``dpmarket validate`` refuses impossible configs by file and key (issue 14, item 5): types,
ranges and the relations between keys, before anything is spent; every shipped config passes.

Each case changes one key of a valid base config (which itself validates: see the first test),
so each refusal is caused by that key alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpmarket.actors.commands.main import main

ROOT = Path(__file__).resolve().parents[3]

BASE: dict[str, dict[str, str]] = {
    "run": {"name": "'ranges'", "seed": "0", "deadline_seconds": "5.0"},
    "market": {"owners": "4", "compute_nodes": "3", "tolerance": "1", "summary_size": "10"},
    "data": {
        "source": "'synthetic'",
        "n_points": "400",
        "dim": "4",
        "components": "3",
        "n_validation": "50",
        "n_test": "50",
        "n_seed": "10",
        "bound": "3.0",
    },
    "privacy": {"delta": "1e-5", "eps_normalise": "0.5", "eps_scan": "0.5"},
    "sketch": {"rows": "10", "width": "64"},
    "summary": {"eps_auction": "1e-6", "tau": "1", "max_epochs": "30", "d": "64"},
    "faults": {},
}

# (section.key = TOML value, what the message must name after "FILE: ")
CASES = [
    # the examples
    ("data.n_points", "'many'", "[data].n_points"),
    ("data.n_points", "-400", "[data].n_points"),
    ("summary.max_epochs", "-5", "[summary].max_epochs: expected an integer >= 1, got -5"),
    ("data.dim", "0", "[data].dim"),
    ("market.tolerance", "3", "[market].tolerance: T = 3 with owners = 4 leaves K - T - 1 = 0"),
    ("summary.eps_auction", "inf", "[summary].eps_auction: expected a finite number > 0"),
    ("data.bound", "-1.0", "[data].bound"),
    ("summary.d", "1e8", "[summary].d: expected an integer"),
    ("market.summary_size", "401", "[market].summary_size: p = 401 exceeds the pool"),
    # [data]: the synthetic generator
    ("data.n_points", "3", "[data].n_points: 3 points cannot give each of the 4 owners"),
    ("data.n_points", "1e12", "[data].n_points"),
    ("data.dim", "2.5", "[data].dim"),
    ("data.components", "1", "[data].components"),
    ("data.concentration", "0", "[data].concentration"),
    ("data.concentration", "inf", "[data].concentration"),
    ("data.concentration", "'high'", "[data].concentration"),
    ("data.n_validation", "0", "[data].n_validation"),
    ("data.n_test", "-1", "[data].n_test"),
    ("data.n_seed", "1", "[data].n_seed"),
    ("data.n_seed", "true", "[data].n_seed"),
    ("data.bound", "nan", "[data].bound"),
    ("data.gamma", "0.0", "[data].gamma"),
    ("data.features", "3", "[data]: ['features'] not used with source = 'synthetic'"),
    ("data.stream", "{ batches = 0 }", "[data.stream].batches"),
    # [market]
    ("market.tolerance", "-1", "[market].tolerance"),
    ("market.tolerance", "4", "[market].tolerance"),
    ("market.owners", "'four'", "[market].owners"),
    ("market.summary_size", "0", "[market].summary_size"),
    ("market.compute_nodes", "0", "[market].compute_nodes"),
    ("market.owners_per_actor", "0", "[market].owners_per_actor"),
    ("market.dca_shares", "'plain'", "[market].dca_shares"),
    # issue 28: size keys bounded by what the machine and the protocol carry, before anything
    # of that size is built (an owners tuple of 10^20 names took 3.9 GB before)
    (
        "market.owners",
        "99999999999999999999",
        "[market].owners: expected an integer >= 1 and <= 2048",
    ),
    ("market.owners", "1000000", "[market].owners: expected an integer >= 1 and <= 2048"),
    (
        "market.compute_nodes",
        "1000000",
        "[market].compute_nodes: expected an integer >= 2 and <= 32",
    ),
    ("market.compute_nodes", "1", "[market].compute_nodes: 1 node alone would see every"),
    (
        "market.owners_per_actor",
        "5",
        "[market].owners_per_actor: expected an integer >= 1 and <= 4",
    ),
    (
        "market.summary_size",
        "1000000",
        "[market].summary_size: expected an integer >= 1 and <= 100000",
    ),
    ("data.n_points", "100000000", "[data].n_points: 1e+08 simulated points"),
    ("summary.max_epochs", "10000000000", "[summary].max_epochs: expected at most 100000"),
    ("summary.max_points", "99999999999", "[summary].max_points: expected at most 1000000"),
    (
        "summary.validation_iterations",
        "1000000000",
        "[summary].validation_iterations: expected at most",
    ),
    # [run]
    ("run.deadline_seconds", "inf", "[run].deadline_seconds"),
    ("run.seed", "-1", "[run].seed"),
    ("run.name", "'a b:c'", "[run].name"),
    ("run.out", "5", "[run].out"),
    ("run.reproducible_noise", "'yes'", "[run].reproducible_noise"),
    # [privacy]
    ("privacy.delta", "1.0", "[privacy].delta"),
    ("privacy.delta", "0", "[privacy].delta"),
    ("privacy.eps_normalise", "inf", "[privacy].eps_normalise"),
    ("privacy.eps_scan", "-0.5", "[privacy].eps_scan"),
    ("privacy.eps_refresh", "nan", "[privacy].eps_refresh"),
    ("privacy.refresh_every", "-1", "[privacy].refresh_every"),
    ("privacy.secure_phases", "1", "[privacy].secure_phases"),
    # [sketch]
    ("sketch.rows", "0", "[sketch].rows"),
    ("sketch.width", "1", "[sketch].width"),
    ("sketch.width", "10000000", "[sketch].width: rows x width"),
    ("sketch.bandwidth", "inf", "[sketch].bandwidth"),
    # [summary]: CuratorParams fields, named by key
    ("summary.max_epochs", "0", "[summary].max_epochs"),
    ("summary.eps_auction", "0.0", "[summary].eps_auction"),
    ("summary.eps_validation", "-inf", "[summary].eps_validation"),
    ("summary.d", "100000000", "[summary].d: expected an integer in 1.."),
    ("summary.d", "true", "[summary].d"),
    ("summary.tau", "1.5", "[summary].tau"),
    ("summary.warm_start", "'yes'", "[summary].warm_start: expected true or false"),
    ("summary.less_trusted", "1", "[summary].less_trusted"),
    ("summary.auction_variant", "3", "[summary].auction_variant"),
    ("summary.summary_release", "'fancy'", "[summary].summary_release"),
    ("summary.neighbouring", "1", "[summary].neighbouring"),
    ("summary.validation_sigma", "nan", "[summary].validation_sigma"),
    ("summary.clip_norm", "2.0", "[summary].clip_norm"),
    ("summary.eta", "0.3", "[summary].eta"),
    ("summary.explore_share", "-0.5", "[summary].explore_share"),
    ("summary.verify_tolerance", "-1.0", "[summary].verify_tolerance"),
    ("summary.n_candidates", "0", "[summary].n_candidates"),
    ("summary.herding_ascent_steps", "-1", "[summary].herding_ascent_steps"),
    ("summary.candidate_center", "inf", "[summary].candidate_center"),
    ("summary.validation_iterations", "'many'", "[summary].validation_iterations"),
    # issue 18: the budget on distinct points received
    ("summary.max_points", "0", "[summary].max_points: expected an integer >= 1, got 0"),
    ("summary.max_points", "9", "[summary].max_points: 9 is below p = 10"),
    ("summary.max_points", "'few'", "[summary].max_points: expected an integer"),
    ("summary.allocate", "'yes'", "[summary].allocate: expected true or false"),
    ("summary.allocation_sigma", "0", "[summary].allocation_sigma: expected a finite number > 0"),
    ("summary.allocation_rule", "'median'", "[summary].allocation_rule: expected one of"),
    ("summary.validation_center", "'test'", "[summary].validation_center: expected one of"),
    (
        "summary.allocation_ridge",
        "-0.5",
        "[summary].allocation_ridge: expected a finite number >= 0",
    ),
    ("summary.allocation_ridge", "inf", "[summary].allocation_ridge"),
    # [faults]: epochs >= 1, owners and compute nodes known
    ("faults.kill", "{ owner-9 = 2 }", "[faults].kill: unknown owners ['owner-9']"),
    ("faults.kill", "{ owner-1 = 0 }", "[faults].kill.owner-1"),
    ("faults.kill_curator_at", "0", "[faults].kill_curator_at"),
    ("faults.colluders", "['owner-1', 'owner-1']", "[faults].colluders"),
    ("faults.colluders", "[[1]]", "[faults].colluders"),
    ("faults.kill_compute", "['compute-7']", "[faults].kill_compute"),
    ("faults.slow", "{ owner-1 = -1.0 }", "[faults].slow.owner-1"),
]


def _write(tmp: Path, change: dict[str, str] | None = None, name: str = "c.toml") -> Path:
    sections = {s: dict(keys) for s, keys in BASE.items()}
    for dotted, value in (change or {}).items():
        section, key = dotted.split(".")
        sections[section][key] = value
    text = "".join(
        f"[{s}]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items())
        for s, keys in sections.items()
    )
    path = tmp / name
    path.write_text(text, encoding="utf-8")
    return path


def test_the_base_config_validates(tmp_path: Path) -> None:
    assert main(["validate", str(_write(tmp_path))]) == 0


def test_there_are_enough_cases() -> None:
    assert len({(k, v) for k, v, _ in CASES}) == len(CASES) >= 40


@pytest.mark.parametrize(("key", "value", "needle"), CASES)
def test_an_impossible_key_exits_2_naming_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: str, needle: str
) -> None:
    config = _write(tmp_path, {key: value})
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{config}: {needle}" in err, err


def test_relations_between_summary_keys_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The MWEM marginals (d x (2 / eta + 1) cells) must fit one array; explore_share needs the
    exact final selection (the default plan's; a config that turns selection off may not)."""
    config = _write(tmp_path, {"summary.d": "2000", "summary.summary_release": "'mwem'"})
    assert main(["validate", str(config)]) == 2
    assert f"{config}: [summary].d: d = 2000 with grid step" in capsys.readouterr().err
    config = _write(tmp_path, {"summary.explore_share": "0.5", "summary.final_selection": "'none'"})
    assert main(["validate", str(config)]) == 2
    assert f"{config}: [summary].explore_share" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"market.summary_size": "5000"}, "[market].summary_size: p = 5000 exceeds the digits"),
        ({"data.n_seed": "10000000"}, "[data].n_seed: expected an integer >= 2 and <= 1000000"),
        ({"data.n_seed": "5000"}, "[data].n_seed: seed_size must be <="),
        ({"market.owners": "4"}, "[market].owners: the digits split has 5 owners"),
        ({"data.n_points": "400"}, "[data]: ['n_points'] not used with source = 'digits'"),
    ],
)
def test_the_digits_source_is_checked_against_its_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, str], needle: str
) -> None:
    base = (ROOT / "configs" / "digits.toml").read_text(encoding="utf-8")
    config = tmp_path / "digits.toml"
    config.write_text(base, encoding="utf-8")
    assert main(["validate", str(config)]) == 0
    sets = [f"{k}={v}" for k, v in change.items()]
    assert main(["validate", str(config), *[a for s in sets for a in ("--set", s)]]) == 2
    assert f"{config}: {needle}" in capsys.readouterr().err


def test_a_config_that_is_not_utf8_is_named_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "latin1.toml"
    config.write_bytes("[run]\nname = 'caf\xe9'\n".encode("latin-1"))
    assert main(["validate", str(config)]) == 2
    assert f"{config}:2: not UTF-8 text" in capsys.readouterr().err


def test_a_section_that_is_not_a_table_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "flat.toml"
    config.write_text("summary = 3\n", encoding="utf-8")
    assert main(["validate", str(config)]) == 2
    assert f"{config}: [summary]: expected a table" in capsys.readouterr().err


MARKET_CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.toml") if p.name != "evaluate.toml")


@pytest.mark.parametrize("config", MARKET_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_market_config_validates(config: Path) -> None:
    assert main(["validate", str(config)]) == 0


def test_the_shipped_market_configs_are_all_found() -> None:
    names = {p.name for p in MARKET_CONFIGS}
    assert {"demo.toml", "digits.toml", "dropout.toml", "files-example.toml"} <= names


@pytest.mark.parametrize(
    ("args", "content", "needle"),
    [
        ([], b"", "holds no records"),
        ([], b"\xff\xfe1,2\n", "not UTF-8 text"),
        ([], b"1,2\n3,x\n", "cannot read a numeric CSV"),
        ([], b"1,2\n", "1 records give 0 training clients"),
        (["--test-fraction", "1.5"], b"1,2\n" * 20, "--test-fraction: expected a number in (0, 1)"),
        (["--nodes", "1"], b"1,2\n" * 20, "--nodes: expected an integer >= 2"),
        (["--colluders", "-1"], b"1,2\n" * 20, "--colluders: expected an integer >= 0"),
        (["--eps", "inf"], b"1,2\n" * 20, "--eps: expected a finite number > 0"),
    ],
)
def test_regress_refuses_a_bad_data_file_or_option_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], content: bytes, needle: str
) -> None:
    data = tmp_path / "records.csv"
    data.write_bytes(content)
    assert main(["regress", "--data", str(data), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err, err
    if "--data" in needle or not args:
        assert str(data) in err

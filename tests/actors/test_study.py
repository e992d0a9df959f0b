"""Studies (actors/study_*.py): the file's checks, a cell with a known answer, resume."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy.stats import binom

from dpmarket.actors.commands.main import main
from dpmarket.actors.config.market import ConfigError
from dpmarket.actors.studies.config import Cell, is_study_file, load_study
from dpmarket.actors.studies.intervals import clopper_pearson, wilson
from dpmarket.actors.studies.report import summarise
from dpmarket.actors.studies.run import RESULTS_FILE, read_results, run_study
from dpmarket.actors.studies.trial import draw_faults

ROOT = Path(__file__).resolve().parents[2]
SMALL = (
    '["data.n_points=1200", "market.summary_size=6", "data.n_test=200", "sketch.rows=10", '
    '"sketch.width=64"]'
)


def _study(tmp: Path, axes: str, timing: str, trials: int, seed: int = 3) -> Path:
    path = tmp / "study.toml"
    path.write_text(
        f'[study]\nbase = "{ROOT / "configs" / "dropout.toml"}"\nset = {SMALL}\n'
        f"trials = {trials}\nseed = {seed}\n[axes]\n{axes}\n[timing]\n{timing}\n",
        encoding="utf-8",
    )
    return path


def test_study_errors_name_the_file_and_key(tmp_path: Path) -> None:
    bad_key = _study(tmp_path, "owners = [6]\ndropuot = [0.1]", "epochs = 1.0", 2)
    with pytest.raises(ConfigError, match=r"study.toml: axes.*\['dropuot'\]"):
        load_study(bad_key)
    bad_prob = _study(tmp_path, "dropout = [0.1, 1.5]", "epochs = 1.0", 2)
    with pytest.raises(ConfigError, match=r"\[axes\]\.dropout\[1\]: expected a probability"):
        load_study(bad_prob)
    bad_cell = _study(tmp_path, "owners = [6]\ntolerance = [2, 5]", "epochs = 1.0", 2)
    with pytest.raises(ConfigError, match=r"cell K6-T5-.*tolerance"):
        load_study(bad_cell)
    bad_timing = _study(tmp_path, "owners = [6]", "normalise = -1", 2)
    with pytest.raises(ConfigError, match=r"\[timing\]\.normalise"):
        load_study(bad_timing)
    refresh = tmp_path / "refresh.toml"
    refresh.write_text(
        bad_timing.read_text(encoding="utf-8").replace('"sketch.width=64"', '"sketch.width=64", '
        '"privacy.refresh_every=5"').replace("normalise = -1", "epochs = 1"),
        encoding="utf-8",
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"refresh_every: refresh rounds are not simulated"):
        load_study(refresh)
    # through the command: exit 2, the message names the key
    assert main(["simulate", str(bad_prob), "--out", str(tmp_path / "o"), "--serial"]) == 2


def test_simulate_decides_by_content(tmp_path: Path) -> None:
    assert is_study_file(_study(tmp_path, "owners = [6]", "epochs = 1.0", 1))
    assert not is_study_file(ROOT / "configs" / "dropout.toml")


def test_intervals_are_binomial_intervals() -> None:
    low, high = clopper_pearson(0, 10)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 10))  # exact at k = 0
    w_low, w_high = wilson(50, 100)
    assert w_low == pytest.approx(0.4038, abs=1e-3) and w_high == pytest.approx(0.5962, abs=1e-3)


def test_highest_value_owners_fail_first() -> None:
    cell = Cell(0, 6, 2, 3, 0.5, 0.0, 4.0, 1, "highest-value")
    owners = [f"owner-{i}" for i in range(1, 7)]
    values = {o: float(i) for i, o in enumerate(owners)}  # owner-6 is worth most
    for seed in range(20):
        draw = draw_faults(
            cell, owners, values, {"normalise": 1.0, "scan": 0.0, "epochs": 0.0}, (1, 1),
            np.random.default_rng(seed),
        )  # fmt: skip
        n = len(draw.drops)
        assert set(draw.drops) == set(owners[len(owners) - n :])
        assert not set(draw.colluders) & set(draw.drops) and len(draw.colluders) == 1


@pytest.mark.slow
def test_known_answer_binomial_tail(tmp_path: Path) -> None:
    """Owners drop independently with probability q before the first secure sum, T = 2 of
    K = 6: the run completes iff at most T dropped, P = binomial CDF(T; K, q). That value lies
    in the study's 95% interval; the answers for T - 1 and T + 1 (a T off by one) do not."""
    q, K, T = 0.3, 6, 2
    study = load_study(
        _study(
            tmp_path, f"owners = [{K}]\ntolerance = [{T}]\ndropout = [{q}]", "normalise = 1.0", 80
        )
    )
    results = run_study(study, tmp_path / "out", serial=True, batch=20)
    (row,) = summarise(study, results)
    assert row["trials"] == 80
    assert row["p_low"] <= binom.cdf(T, K, q) <= row["p_high"]
    assert not row["p_low"] <= binom.cdf(T - 1, K, q) <= row["p_high"]
    assert not row["p_low"] <= binom.cdf(T + 1, K, q) <= row["p_high"]
    refused = [r for r in results if r["verdict"] == "refused"]
    assert refused and all(r["refused_phase"] == "normalise" for r in refused)
    assert all(len(r["faults"]["drops"]) > T for r in refused)  # the verdict is the count's


def _table(out: Path) -> list[dict[str, str]]:
    with (out / "study.csv").open(encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow
def test_interrupted_study_resumes_to_the_same_table(tmp_path: Path) -> None:
    axes = "owners = [6]\ntolerance = [1, 2]\ndropout = [0.25]\nslow_fraction = [0.2]"
    path = _study(tmp_path, axes, "normalise = 0.3\nepochs = 0.7\nepoch_range = [1, 5]", 3)
    study = load_study(path)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main(["simulate", str(path), "--out", str(whole), "--serial"]) == 0
    for name in ("study.json", "completion_vs_dropout.png", "epsilon_vs_coalition.png",
                 "utility_vs_dropout.png"):  # fmt: skip
        assert (whole / name).stat().st_size > 0
    parquet = pq.read_table(whole / "study.parquet")  # the CSV's table, typed
    csv_rows = _table(whole)
    assert parquet.column_names == list(csv_rows[0]) and parquet.num_rows == len(csv_rows)
    assert [str(r["cell"]) for r in parquet.to_pylist()] == [r["cell"] for r in csv_rows]
    first = run_study(study, parts, serial=True, batch=1, limit=2)  # interrupted
    assert len(first) == 2
    with (parts / RESULTS_FILE).open("a", encoding="utf-8") as fh:
        fh.write('{"cell": "K6-T1')  # a crash mid-line: never accepted
    assert main(["simulate", str(path), "--out", str(parts), "--serial"]) == 0
    rows = read_results(parts)
    assert len(rows) == 6 and len({(r["cell"], r["trial"]) for r in rows}) == 6  # none twice
    assert rows[:2] == first  # what was kept stays as it was
    assert _table(parts) == _table(whole)
    # a rerun runs nothing and writes the same table again
    assert main(["simulate", str(path), "--out", str(parts), "--serial"]) == 0
    assert len(read_results(parts)) == 6 and _table(parts) == _table(whole)


def test_other_study_in_the_same_directory_is_refused(tmp_path: Path) -> None:
    path = _study(tmp_path, "owners = [6]\ntolerance = [2]\ndropout = [1.0]", "normalise = 1", 1)
    out = tmp_path / "out"
    run_study(load_study(path), out, serial=True)
    other = _study(
        tmp_path, "owners = [6]\ntolerance = [2]\ndropout = [1.0]", "normalise = 1", 1, 4
    )
    with pytest.raises(ConfigError, match="different study"):
        run_study(load_study(other), out, serial=True)


def test_coalition_sees_the_honest_included_noise_less_one() -> None:
    """A secure sum protects an honest owner against the coalition with the noise of the
    honest owners it included, less one (Theorem 1): exactly the plan's sigma when lost +
    colluding = T, more (a smaller epsilon) when fewer, none (infinite) when only one is left."""
    from dpmarket.actors.config.market import MarketConfig
    from dpmarket.actors.parties.securephase_journal import LABELS
    from dpmarket.actors.studies.trial import FaultDraw, TrialSecure, coalition_ledger
    from dpmarket.protocol.privacy.ledger import PrivacyLedger
    from dpmarket.protocol.securesum.spec import RoundResult

    K, T, sigma, delta = 8, 3, 4.0, 1e-5
    config = MarketConfig(source="synthetic", owners=K, tolerance=T, delta=delta)
    owners = [f"owner-{i}" for i in range(1, K + 1)]

    def eps_against(included: list[str], colluders: tuple[str, ...]) -> float:
        ledger = PrivacyLedger("owner-1")
        ledger.gaussian(sigma, 1.0, label=LABELS["normalise"])
        result = RoundResult(1, "released", "", None, None, tuple(included), (), sigma, 1.0)
        pooled = coalition_ledger(
            ledger, config, FaultDraw({}, {}, colluders), TrialSecure(rounds={"normalise": result})
        )
        return float("inf") if pooled is None else pooled.epsilon(delta, "pld")

    charged = PrivacyLedger("owner-1")
    charged.gaussian(sigma, 1.0, label=LABELS["normalise"])
    at_plan = charged.epsilon(delta, "pld")
    # two lost + one colluder = T: the plan's sigma exactly
    assert eps_against(owners[:6], ("owner-6",)) == pytest.approx(at_plan, rel=1e-3)
    # nobody lost, no colluder: sqrt((8 - 1) / (8 - 3 - 1)) times the noise, a smaller epsilon
    fewer = eps_against(owners, ())
    assert fewer < 0.8 * at_plan
    assert eps_against(owners[:2], ("owner-2",)) == float("inf")


@pytest.mark.parametrize("name", ["dropout", "collusion"])
def test_shipped_studies_load(name: str) -> None:
    study = load_study(ROOT / "configs" / "studies" / f"{name}.toml")
    assert study.cells and all(c.key in study.configs for c in study.cells)

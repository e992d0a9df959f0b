"""Issue 6 evaluation (actors/harness/evaluation.py, actors/harness/utility.py,
actors/commands/evaluate.py):
scenarios, the recommended preset, rows and JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from dpmarket.actors.commands.evaluate import utility_json, utility_main, utility_table
from dpmarket.actors.config.market import load_market_config
from dpmarket.actors.harness.evaluation import load_demo_config, paper_params
from dpmarket.actors.harness.inprocess import run_inprocess
from dpmarket.actors.harness.utility import (
    evaluate_utility,
    mechanism_params,
    recommended_params,
    utility_scenario,
)
from dpmarket.actors.randomness import NoiseSource
from dpmarket.protocol.summary.objective import greedy_exact, mmd2, uniform_sample
from dpmarket.streams.synthetic import gaussian_mixture_shift

DELTA = 1e-5
SIMULATED = NoiseSource.reproducible(0)  # fixed noise: the comparisons below are deterministic
KEYS = [
    "dataset", "mechanism", "p", "gap_closed", "mmd2_private", "mmd2_greedy", "mmd2_uniform",
    "svm_private", "svm_uniform", "svm_greedy", "eps_owner", "eps_validation", "delta",
    "points_accessed", "mmd2_uniform_select", "svm_uniform_select",
]  # fmt: skip


def test_synthetic_scenario_has_the_issue_parameters() -> None:
    scenario = utility_scenario("synthetic", np.random.default_rng(0))
    X, _, owner_of = scenario.pooled()
    assert X.shape == (100_000, 20) and len(set(owner_of.tolist())) == 6
    assert scenario.validation.shape == (500, 20) and scenario.test_X.shape == (5000, 20)
    assert set(np.unique(scenario.test_y).tolist()) == {0, 1}
    with pytest.raises(ValueError, match="dataset"):
        utility_scenario("mnist", np.random.default_rng(0))


def test_mechanism_params_map_names_to_releases() -> None:
    scenario = utility_scenario("digits", np.random.default_rng(1))
    budget = (1.0, 3.0, DELTA)
    paper = mechanism_params("paper", "digits", 20, scenario, 1, budget)
    assert (paper.validation_release, paper.summary_release) == ("mwem", "mwem")
    pure = mechanism_params("herding-pure", "digits", 20, scenario, 1, budget)
    assert pure.summary_release == "herding" and pure.auction_variant == "pure" and pure.tau > 1
    assert pure.candidate_distribution == "uniform" and pure.candidate_center == 0.5
    tree = mechanism_params("tree", "digits", 20, scenario, 1, budget)
    assert tree.summary_release == "tree" and tree.tau == 1 and tree.summary_sigma > 1.0
    with pytest.raises(ValueError, match="mechanism"):
        mechanism_params("laplace", "digits", 20, scenario, 1, budget)


def test_recommended_preset_meets_budgets_and_closes_most_of_the_gap() -> None:
    scenario = gaussian_mixture_shift(
        np.random.default_rng(2), n_points=12_000, n_validation=300, n_test=2000
    )
    p = 40
    params = recommended_params(p, scenario, 2)
    assert (params.validation_release, params.summary_release) == ("gaussian", "herding")
    res = run_inprocess(scenario, params, np.random.default_rng(3)).result
    assert res.reason == "complete" and res.points is not None
    assert res.ledgers["validation"].epsilon(DELTA) <= 3.0
    assert all(res.ledgers[o].epsilon(DELTA) <= 1.0 for o in scenario.owner_names)
    X, _, owner_of = scenario.pooled()
    greedy = mmd2(X[greedy_exact(X, scenario.validation, p, scenario.gamma)], scenario.test_X,
                  scenario.gamma)  # fmt: skip
    uniform = mmd2(X[uniform_sample(owner_of, p, np.random.default_rng(4))], scenario.test_X,
                   scenario.gamma)  # fmt: skip
    private = mmd2(res.points, scenario.test_X, scenario.gamma)
    assert (uniform - private) / (uniform - greedy) > 0.6


def test_rows_and_json_carry_the_issue_keys() -> None:
    rows = evaluate_utility(
        ["digits"], ["paper", "herding"], [8], [0], (1.0, 3.0, DELTA), noise=SIMULATED
    )
    assert [(r["mechanism"], r["p"]) for r in rows] == [("paper", 8), ("herding", 8)]
    paper, herding = rows
    assert paper["eps_owner"] is None  # the paper's auction has no finite epsilon
    assert herding["eps_owner"] <= 1.0 and herding["eps_validation"] <= 3.0
    for row in rows:
        gap = (row["mmd2_uniform"] - row["mmd2_private"]) / (
            row["mmd2_uniform"] - row["mmd2_greedy"]
        )
        assert row["gap_closed"] == pytest.approx(gap, abs=2e-3)
        assert row["points_accessed"] >= 8
    line = json.loads(utility_json(rows))
    assert line["benchmark"] == "utility" and [list(r) for r in line["rows"]] == [KEYS, KEYS]


def test_every_row_carries_the_random_purchase_baseline_of_the_same_size() -> None:
    rows = evaluate_utility(
        ["digits"], ["herding", "herding-select"], [10], [0], (1.0, 3.0, DELTA), noise=SIMULATED
    )
    plain, selected = rows
    assert plain["mmd2_uniform_select"] is not None and plain["svm_uniform_select"] is not None
    assert plain["points_accessed"] >= 10
    assert selected["eps_owner"] <= 1.0 and selected["eps_validation"] <= 3.0
    # ceil(10 / 5) exploration epochs of 5 owners, then 5 deliveries per steering epoch
    assert selected["points_accessed"] == 10 + 5 * 10
    assert selected["mmd2_uniform_select"] < selected["mmd2_uniform"]
    assert selected["mmd2_private"] < plain["mmd2_private"]
    assert "random-buy select" in utility_table(rows)[0]


def test_allocate_select_is_evaluated_at_its_budget_beside_random_select() -> None:
    (row,) = evaluate_utility(
        ["digits"], ["allocate-select"], [10], [0], (1.0, 3.0, DELTA), noise=SIMULATED
    )
    assert row["points_accessed"] == 15  # ceil(1.5 p), the plan's max_points
    assert row["eps_owner"] <= 1.0 and row["eps_validation"] <= 3.0
    assert row["mmd2_uniform_select"] is not None


def test_utility_command_prints_the_table_then_the_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--datasets", "digits", "--mechanisms", "tree", "--p", "6", "--seeds", "1"]
    assert utility_main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "gap" in lines[1] and lines[2].startswith("digits")
    assert json.loads(lines[-1])["rows"][0]["mechanism"] == "tree"


def test_configs_default_to_the_planned_herding_mechanism_within_the_budgets() -> None:
    configs = Path(__file__).resolve().parents[2] / "configs"
    scenario = utility_scenario("digits", np.random.default_rng(0))
    planned = recommended_params(100, scenario, 0)  # m = 32: the plan the configs copy
    demo = load_demo_config(configs / "evaluate.toml")
    evaluated = demo.apply(paper_params(100, scenario.gamma, 0, 5, DELTA))
    digits = load_market_config(configs / "digits.toml")
    market = digits.curator_params(scenario.gamma, len(scenario.validation))
    for params in (evaluated, market):
        assert params.validation_sigma >= planned.validation_sigma
        keys = ("d", "validation_release", "summary_release", "tau", "max_deliveries",
                "final_selection", "explore_share")  # fmt: skip
        for key in keys:
            assert getattr(params, key) == getattr(planned, key), key
    assert evaluated.candidate_distribution == "uniform"  # the pixel domain [0, 1]^64
    res = run_inprocess(scenario, dataclasses.replace(evaluated, p=20),
                        np.random.default_rng(1)).result  # fmt: skip
    assert res.reason == "complete"
    assert res.ledgers["validation"].epsilon(DELTA) <= 3.0
    assert all(res.ledgers[o].epsilon(DELTA) <= 1.0 for o in scenario.owner_names)


def test_baselines_are_the_greedies_and_sample_over_the_pooled_records() -> None:
    """actors/harness/inprocess.py ``baselines`` hashes the pool owner by owner (never beside
    a pooled copy of the features): its three summaries are those of the exact greedy, of the
    hashed greedy over h1 of the pooled records and of the uniform sample, each with the picked
    records' own labels."""
    from types import SimpleNamespace

    from dpmarket.actors.harness.inprocess import baselines
    from dpmarket.protocol.summary.h1 import RandomFourierFeatures
    from dpmarket.protocol.summary.objective import greedy_hashed

    rng = np.random.default_rng(1)
    sizes = rng.integers(50, 300, 12)
    owners = [(rng.normal(size=(int(n), 5)), rng.integers(0, 2, int(n))) for n in sizes]
    V = rng.normal(size=(40, 5)) + 0.5
    scenario = SimpleNamespace(owners=owners, validation=V)
    got = baselines(scenario, 20, 64, 0.3, 5, np.random.default_rng(2))  # type: ignore[arg-type]
    X = np.concatenate([X for X, _ in owners])
    y = np.concatenate([y for _, y in owners]).astype(np.float64)
    owner_of = np.repeat(np.arange(len(owners)), sizes)
    h1 = RandomFourierFeatures(5, 64, 0.3, 5)
    exact = greedy_exact(X, V, 20, 0.3)
    hashed = greedy_hashed(h1(X), h1(V), 20)
    uniform = uniform_sample(owner_of, 20, np.random.default_rng(2))
    for (points, labels), picks in zip(
        (got.greedy, got.hashed_greedy, got.uniform), (exact, hashed, uniform), strict=True
    ):
        np.testing.assert_array_equal(points, X[picks])
        np.testing.assert_array_equal(labels, y[picks])

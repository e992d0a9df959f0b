"""The parsimony evaluation (actors/parsimony.py) and ``[summary].allocate`` in a config."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dpmarket.actors.config import load_market_config
from dpmarket.actors.parsimony import budget_of, evaluate_parsimony
from dpmarket.actors.randomness import NoiseSource

ROOT = Path(__file__).resolve().parents[2]
ROW_KEYS = {
    "dataset", "mechanism", "p", "max_points", "points_accessed", "gap_closed", "svm_private",
    "svm_uniform", "eps_owner", "eps_validation",
}  # fmt: skip


def test_budget_factors() -> None:
    assert budget_of("1.5", 50, 5) == 75 and budget_of("K+1", 50, 5) == 300
    assert budget_of("1", 33, 5) == 33
    with pytest.raises(ValueError, match="budget factor"):
        budget_of("0.5", 50, 5)


def test_rows_carry_the_issue_keys_and_respect_the_budget() -> None:
    rows = evaluate_parsimony(
        ["digits"], ["allocate-select", "random-select"], [20], [0], ["1.5"],
        noise=NoiseSource.reproducible(0),
    )  # fmt: skip
    assert [r["mechanism"] for r in rows] == ["allocate-select", "random-select"]
    for row in rows:
        assert set(row) >= ROW_KEYS
        assert row["max_points"] == 30 and row["points_accessed"] <= 30
    allocate = rows[0]
    assert allocate["eps_owner"] <= 1.0 and allocate["eps_validation"] <= 3.0 + 1e-9


def test_allocate_in_a_config_plans_the_profile_noise_and_the_budget(tmp_path: Path) -> None:
    text = (ROOT / "configs" / "demo.toml").read_text(encoding="utf-8")
    path = tmp_path / "m.toml"
    path.write_text(text.replace("[summary]", "[summary]\nallocate = true", 1), encoding="utf-8")
    config = load_market_config(path)
    params = config.curator_params(gamma=0.5, m=200)
    assert params.allocate and params.final_selection == "exact" and params.explore_share == 0
    assert params.max_points == math.ceil(1.5 * config.summary_size)
    assert params.allocation_sigma > 1.0  # eps_owner = 1 at delta 1e-5: z about 4.4

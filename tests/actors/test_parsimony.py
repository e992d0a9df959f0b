"""The parsimony evaluation (actors/harness/parsimony.py) and ``[summary].allocate`` in a config."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dpmarket.actors.config.market import ConfigError, load_market_config
from dpmarket.actors.harness.parsimony import budget_of, evaluate_parsimony
from dpmarket.actors.randomness import NoiseSource
from dpmarket.protocol.summary.allocate import RANDOM_SHARE

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
    # the default rule: score histograms, g_tilde around the seed mean
    assert params.allocation_rule == "histogram" and params.validation_center == "seed"
    # the hedge, unless [summary] says otherwise: the budget beyond p bought at random
    assert RANDOM_SHARE is None
    assert params.random_share == pytest.approx(1 - config.summary_size / params.max_points)
    assert params.random_share > 0
    steered = path.read_text(encoding="utf-8").replace(
        "allocate = true", "allocate = true\nrandom_share = 0", 1
    )
    path.write_text(steered, encoding="utf-8")
    assert load_market_config(path).curator_params(gamma=0.5, m=200).random_share == 0
    path.write_text(steered.replace("random_share = 0", "random_share = 2"), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\[summary\]\.random_share"):
        load_market_config(path).curator_params(gamma=0.5, m=200)
    path.write_text(steered.replace("random_share = 0\n", ""), encoding="utf-8")
    mixture = path.read_text(encoding="utf-8").replace(
        "allocate = true", 'allocate = true\nallocation_rule = "mixture"', 1
    )
    path.write_text(mixture, encoding="utf-8")
    params = load_market_config(path).curator_params(gamma=0.5, m=200)
    assert params.allocation_rule == "mixture" and params.validation_center == "origin"


def test_a_budget_alone_selects_allocate_select_and_allocate_false_keeps_herding(
    tmp_path: Path,
) -> None:
    text = (ROOT / "configs" / "demo.toml").read_text(encoding="utf-8")
    path = tmp_path / "m.toml"
    path.write_text(text.replace("[summary]", "[summary]\nmax_points = 55", 1), encoding="utf-8")
    params = load_market_config(path).curator_params(gamma=0.5, m=200)
    assert params.allocate and params.max_points == 55 and params.allocation_rule == "histogram"
    assert params.final_selection == "exact" and params.explore_share == 0
    herding = text.replace("[summary]", "[summary]\nmax_points = 55\nallocate = false", 1)
    path.write_text(herding, encoding="utf-8")
    params = load_market_config(path).curator_params(gamma=0.5, m=200)
    assert not params.allocate and params.max_points == 55  # herding-select, held to 55
    # a budget with herding-only settings names the way back to herding-select
    mixed = text.replace("[summary]", "[summary]\nmax_points = 55\nexplore_share = 0.3", 1)
    path.write_text(mixed, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"explore_share = 0 and max_deliveries = 1 \(a rec"):
        load_market_config(path).curator_params(gamma=0.5, m=200)
    # a record delivered again adds an epoch all owners see (uncharged): refused, named
    again = text.replace("[summary]", "[summary]\nmax_points = 55\nmax_deliveries = 3", 1)
    path.write_text(again, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"max_deliveries = 1 .*allocate = false keeps herding"):
        load_market_config(path).curator_params(gamma=0.5, m=200)
    # without a budget the configs keep herding-select, unbounded
    path.write_text(text, encoding="utf-8")
    params = load_market_config(path).curator_params(gamma=0.5, m=200)
    assert not params.allocate and params.max_points is None


def test_report_json_and_the_cli_print_points_accessed_against_the_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from types import SimpleNamespace

    import numpy as np

    from dpmarket.actors.commands.market import print_report
    from dpmarket.actors.parties.curator import result_payload
    from dpmarket.actors.parties.transport import LoopbackTransport
    from dpmarket.actors.run.report import write_outputs
    from dpmarket.protocol.summary.curator import Curator
    from dpmarket.protocol.summary.owner import Owner
    from tests.small import small_params, small_scenario

    scenario = small_scenario(3)
    params = small_params(scenario, final_selection="exact", explore_share=1.0, max_points=13)
    pairs = zip(scenario.owner_names, scenario.owners, strict=True)
    owners = [Owner(n, "r", X, y, rng=np.random.default_rng(i)) for i, (n, (X, y)) in
              enumerate(pairs)]  # fmt: skip
    curator = Curator("r", list(scenario.owner_names), scenario.validation, scenario.seed_set,
                      params, np.random.default_rng(0))  # fmt: skip
    transport = LoopbackTransport([curator, *owners])
    transport.send(curator.start())
    transport.run_until(lambda: curator.done)
    stats = SimpleNamespace(frames_sent=transport.frames_sent, bytes_sent=transport.bytes_sent,
                            calls=0, errors=[], dead=set(), refused={},
                            expelled=set())  # fmt: skip
    payload = result_payload(curator.result(), curator, stats)  # type: ignore[arg-type]
    payload.update(secure_phases={}, fault_verdicts=[], owners={})
    run = {"name": "r", "validation_size": len(scenario.validation), "gamma": scenario.gamma}
    reports = write_outputs(tmp_path, run, payload, 1e-5, (), {"start": 1.0}, None)
    parsimony = reports.public["parsimony"]
    assert parsimony["max_points"] == 13 and "distinct_points" not in parsimony  # consumer's
    assert reports.consumer["parsimony"]["distinct_points"] == 13
    print_report(reports.public, reports.consumer)
    assert "curator saw 13 distinct points of max_points 13" in capsys.readouterr().out
    print_report(reports.public)  # an owner reads the promise, not the points accessed
    printed = capsys.readouterr().out
    assert "; max_points 13\n" in printed and "distinct" not in printed

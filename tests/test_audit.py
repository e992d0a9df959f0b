"""Empirical privacy audit (protocol/audit.py, actors/audit.py).

Correct mechanisms must yield a lower bound at most the ledger's epsilon, mis-calibrated ones
(noise N times too small, including a factor of two) one far above it. Seeds are fixed; the
margins are those of 95% Clopper-Pearson bounds on >= 5,000 runs per input.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from dpmarket.actors.audit import audit_main, race_laplace_scenario
from dpmarket.protocol.audit import (
    AuditScenario,
    auction_scenario,
    audit_scores,
    clopper_pearson,
    epsilon_lower_bound,
    gaussian_validation_scenario,
    laplace_count_scenario,
    run_audit,
    summary_channel_scenario,
)
from dpmarket.protocol.release_plan import gaussian_noise_multiplier

DELTA = 1e-5


def test_clopper_pearson_matches_scipy_exact_interval() -> None:
    for k, n in ((0, 50), (7, 50), (50, 50), (310, 1000)):
        ci = stats.binomtest(k, n).proportion_ci(0.9, method="exact")
        assert clopper_pearson(k, n, 0.9) == pytest.approx((ci.low, ci.high), abs=1e-9)
    with pytest.raises(ValueError, match="successes"):
        clopper_pearson(5, 4, 0.9)


def test_epsilon_lower_bound_is_below_the_plain_estimate() -> None:
    bound = epsilon_lower_bound(500, 100, 1000, 0.0)
    assert 0.0 < bound < math.log(5.0)
    assert epsilon_lower_bound(500, 100, 1000, 0.45) == 0.0  # delta explains it all
    assert epsilon_lower_bound(100, 500, 1000, 0.0) == 0.0
    with pytest.raises(ValueError, match="delta"):
        epsilon_lower_bound(5, 1, 10, 1.5)


def test_audit_scores_finds_the_orientation_and_refuses_bad_samples() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.laplace(0.0, 1.0, 20000), 1.0 + rng.laplace(0.0, 1.0, 20000)
    forward, backward = audit_scores(a, b, 0.0), audit_scores(b, a, 0.0)
    assert 0.8 < forward.epsilon_lower <= 1.0 and 0.8 < backward.epsilon_lower <= 1.0
    assert forward.favours_neighbour != backward.favours_neighbour
    with pytest.raises(ValueError, match="equal"):
        audit_scores(a[:100], b[:90], 0.0)


@pytest.mark.parametrize("factor", [1.0, 2.0, 10.0])
def test_laplace_audit_passes_when_calibrated_and_catches_too_little_noise(
    factor: float,
) -> None:
    scenario = laplace_count_scenario(1.0, factor, DELTA)
    result = run_audit(scenario, 60000, np.random.default_rng(1))
    assert scenario.claimed_epsilon == pytest.approx(1.0, abs=1e-3)
    if factor == 1.0:
        assert 0.8 < result.epsilon_lower <= scenario.claimed_epsilon
    else:  # actual epsilon is factor * 1: the claim is refuted
        assert result.epsilon_lower > min(0.8 * factor, 5.0) > scenario.claimed_epsilon


def test_gaussian_validation_release_audits_below_its_ledger_and_a_shrunk_one_fails() -> None:
    z = gaussian_noise_multiplier(1.0, DELTA)
    honest = gaussian_validation_scenario(z, delta=DELTA)
    result = run_audit(honest, 5000, np.random.default_rng(2))
    assert honest.claimed_epsilon == pytest.approx(1.0, abs=0.01)
    assert 0.1 < result.epsilon_lower <= honest.claimed_epsilon
    shrunk = gaussian_validation_scenario(z / 10.0, delta=DELTA)
    lying = AuditScenario("lying", shrunk.sample, honest.claimed_epsilon, DELTA, "noise / 10")
    assert run_audit(lying, 2000, np.random.default_rng(3)).epsilon_lower > 3.0


def test_tree_summary_release_audits_below_its_ledger() -> None:
    scenario = summary_channel_scenario("tree", 2 * gaussian_noise_multiplier(1.0, DELTA))
    assert scenario.claimed_epsilon == pytest.approx(1.0, abs=0.01)  # 4 levels for 8 releases
    assert run_audit(scenario, 1500, np.random.default_rng(4)).epsilon_lower <= 1.0


def test_auction_audits_pure_is_tight_and_paper_is_not_pure() -> None:
    pure = auction_scenario(1.0, "pure")
    bound = run_audit(pure, 30000, np.random.default_rng(5)).epsilon_lower
    assert 0.85 < bound <= pure.claimed_epsilon == pytest.approx(1.0, abs=1e-3)
    paper = auction_scenario(0.5, "paper")
    assert math.isinf(paper.claimed_epsilon)  # the ledger: (0.5, 1 - e^-0.5) per step
    assert run_audit(paper, 20000, np.random.default_rng(6)).epsilon_lower > 3 * 0.5


def test_race_laplace_audit_catches_the_authors_noise_scale() -> None:
    honest = race_laplace_scenario(1.0, rows=8, width=32, n=100)
    assert run_audit(honest, 4000, np.random.default_rng(7)).epsilon_lower <= 1.0
    authors = race_laplace_scenario(1.0, rows=8, width=32, n=100, noise_factor=100.0)
    assert authors.claimed_epsilon == pytest.approx(honest.claimed_epsilon)
    assert run_audit(authors, 500, np.random.default_rng(8)).epsilon_lower > 3.0


def test_audit_command_exit_status_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert audit_main(["--mechanism", "laplace", "auction-pure", "--trials", "3000", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    rows = json.loads(out[-1])["rows"]
    assert [r["mechanism"] for r in rows] == ["laplace", "auction-pure"]
    assert all(r["passed"] and r["epsilon_lower"] <= r["ledger_epsilon"] for r in rows)
    assert audit_main(["--mechanism", "laplace-noise/10", "--trials", "2000"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_same_seed_same_audit() -> None:
    scenario = auction_scenario(0.5, "pure")
    first = run_audit(scenario, 500, np.random.default_rng(11))
    assert first == run_audit(scenario, 500, np.random.default_rng(11))
    with pytest.raises(ValueError, match="trials"):
        run_audit(scenario, 10, np.random.default_rng(0))

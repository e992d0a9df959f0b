"""The summarisation parties hosted in Ray actors: same result as in-process, faults, resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpmarket.actors.harness.inprocess import run_inprocess
from dpmarket.actors.parties.transport import FaultPlan
from dpmarket.actors.randomness import NoiseSource
from dpmarket.actors.run.spawn import run_ray
from dpmarket.protocol.summary.curator import CuratorParams
from dpmarket.streams.synthetic import Scenario
from tests.small import small_params, small_scenario

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return small_scenario(21, n_points=900)


def _params(scenario: Scenario, **kw: object) -> CuratorParams:
    return small_params(scenario, **({"p": 8, "h1_seed": 2, "phase_timeout": 2.0} | kw))


@pytest.mark.parametrize("per_actor", [1, 2])
def test_ray_and_loopback_give_the_same_summary(scenario: Scenario, per_actor: int) -> None:
    params = _params(scenario)
    noise = NoiseSource.reproducible(5)  # the same noise in both: the comparison is exact
    loop = run_inprocess(scenario, params, noise.generator("curator"), run_id="eq").result
    ray_run = run_ray(scenario, params, noise, run_id="eq", owners_per_actor=per_actor)
    assert ray_run["state"] == "done"
    assert [(p["owner"], p["token"]) for p in ray_run["provenance"]] == [
        (p.owner, p.token) for p in loop.provenance
    ]
    np.testing.assert_array_equal(ray_run["points"], loop.points)
    assert ray_run["ledgers"] == {k: v.to_dict() for k, v in loop.ledgers.items()}
    if per_actor > 1:  # co-located owners share one call per actor process per phase
        actors = -(-len(scenario.owner_names) // per_actor)
        assert ray_run["transport"]["calls"] <= actors * 2 * (ray_run["epochs"] + 2)


def test_killed_owner_actor_is_dropped_and_the_run_completes(scenario: Scenario) -> None:
    victim = scenario.owner_names[0]
    res = run_ray(
        scenario,
        _params(scenario, max_lost=1),
        noise=NoiseSource.reproducible(6),
        run_id="kill",
        faults=FaultPlan(kill_at={victim: 3}),
    )
    assert res["state"] == "done" and len(res["provenance"]) == 8
    assert res["lost"] == {victim: 3} and victim in res["transport"]["dead"]


def test_slow_owner_misses_the_deadline(scenario: Scenario) -> None:
    slow = scenario.owner_names[1]
    res = run_ray(
        scenario,
        _params(scenario, phase_timeout=0.5),
        noise=NoiseSource.reproducible(7),
        run_id="slow",
        faults=FaultPlan(delay={slow: 3.0}),
    )
    assert res["state"] == "done"
    assert slow in res["lost"]
    assert all(p["owner"] != slow for p in res["provenance"])


def test_refusal_above_t_journals_and_resumes(scenario: Scenario, tmp_path: Path) -> None:
    names = scenario.owner_names
    journal = tmp_path / "journal.json"
    faults = FaultPlan(kill_at={names[0]: 3, names[1]: 3})
    res = run_ray(
        scenario,
        _params(scenario, max_lost=1),
        noise=NoiseSource.reproducible(8),
        run_id="refuse",
        faults=faults,
        journal=str(journal),
    )
    assert res["state"] == "refused" and res["refusal"]["epoch"] == 3
    snapshot = json.loads(journal.read_text())
    assert snapshot["state"] == "refused"
    resumed = run_ray(
        scenario,
        _params(scenario, max_lost=1),
        noise=NoiseSource.reproducible(8),
        run_id="refuse",
        journal=str(journal),
        snapshot=snapshot,
    )
    assert resumed["state"] == "done" and len(resumed["provenance"]) == 8
    assert json.loads(journal.read_text())["state"] == "done"

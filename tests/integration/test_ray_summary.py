"""The summarisation parties hosted in Ray actors give the in-process result, exactly.

The faults once asserted here through ``run_ray`` (issue 37) are asserted where their logic
lives: a killed owner actor in tests/actors/test_transport.py (a dead actor loses its owners)
and tests/protocol/summary/test_summarize.py; a slow owner in test_transport.py (an answer held
past the deadline); a refusal above T journaled and resumed in
tests/protocol/summary/test_journal.py. End to end on actors, the same three run through the
market in tests/integration/test_market.py (kill within T, above T refuses and resumes) and
the fault matrix."""

from __future__ import annotations

import numpy as np
import pytest

from dpmarket.actors.harness.inprocess import run_inprocess
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

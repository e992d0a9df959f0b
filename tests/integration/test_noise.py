"""Deployed runs draw unpredictable noise (issue 12, part 1), end to end on Ray.

Two runs of one config release different g_tilde; an owner that regenerates the noise from the
published seed and subtracts it learns nothing; only the explicit simulation switch makes the
noise repeat (and then the same attack recovers the consumer's exact validation mean).
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import numpy as np
import pytest

from dpmarket.actors.commands.main import main
from dpmarket.actors.config.market import MarketConfig, load_market_config
from dpmarket.actors.randomness import NoiseSource
from dpmarket.actors.run.market import make_market_scenario
from dpmarket.protocol.summary.h1 import RandomFourierFeatures
from dpmarket.protocol.summary.releases import clip_rows

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo.toml"
SMALL = [
    "market.summary_size=4",
    "summary.max_epochs=6",
    "summary.explore_share=0.0",
    "data.n_points=800",
    "data.n_test=100",
    "privacy.secure_phases=false",  # h1 then hashes raw features: the attacker's job is simple
]


def _run(tmp_path: Path, name: str, *sets: str) -> np.ndarray:
    """Run the demo config; return the g_tilde the curator released (from its journal)."""
    out = tmp_path / name
    argv = ["run", str(DEMO), "--out", str(out)]
    for item in (*SMALL, *sets):
        argv += ["--set", item]
    assert main(argv) == 0
    journal = json.loads((out / ".journal" / "journal.json").read_text())
    release = journal["g_validation"]
    raw = base64.b64decode(release["b64"])
    return np.frombuffer(raw, dtype=np.dtype(release["dtype"])).reshape(release["shape"])


def _attack(config: MarketConfig, released: np.ndarray, guess: np.random.Generator) -> float:
    """An owner's attack with public values only (config, h1 seed, m): subtract the regenerated
    noise; return the recovered mean's error over the release's own noise norm."""
    scenario = make_market_scenario(config)  # the harness's data: the test plays the consumer
    params = config.curator_params(scenario.gamma, len(scenario.validation))
    H = RandomFourierFeatures(scenario.validation.shape[1], params.d, params.gamma,
                              params.h1_seed)(scenario.validation)  # fmt: skip
    m = len(H)
    exact = clip_rows(H, params.clip_norm).sum(axis=0) / m
    sigma = params.validation_sigma * params.clip_norm * params.sensitivity
    recovered = released - guess.normal(0.0, sigma, params.d) / m
    return float(np.linalg.norm(recovered - exact)) / (sigma * math.sqrt(params.d) / m)


def test_deployed_runs_draw_fresh_noise_that_the_published_seed_does_not_reveal(
    tmp_path: Path,
) -> None:
    config = load_market_config(DEMO, SMALL)
    first, second = _run(tmp_path, "a"), _run(tmp_path, "b")
    assert not np.allclose(first, second)  # same config, same seed: different noise
    for released in (first, second):
        assert _attack(config, released, np.random.default_rng(config.seed)) > 0.8
        guess = NoiseSource.reproducible(config.seed).generator("curator")
        assert _attack(config, released, guess) > 0.8


def test_only_the_simulation_switch_makes_noise_repeat(tmp_path: Path) -> None:
    switch = ["run.reproducible_noise=true", "run.noise_seed=5"]
    first, second = _run(tmp_path, "a", *switch), _run(tmp_path, "b", *switch)
    np.testing.assert_array_equal(first, second)
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["run"]["noise"]["mode"] == "reproducible"
    config = load_market_config(DEMO, [*SMALL, *switch])
    # what the switch costs: with the noise seed known, the attack recovers D_v's exact mean
    assert _attack(config, first, NoiseSource.reproducible(5).generator("curator")) < 1e-6

"""The DP standardisation end to end on scikit-learn's load_digits scaled to [0, 1] (issue 30):
the normalise round through the real DCA parties, in-process (actors/study_trial.py), then the
standardisation h1 uses. Before the per-feature rule, 20-odd pixels' spreads hit the floor of
1e-3 and gamma fell to about 1e-6."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpmarket.actors.config.market import load_market_config
from dpmarket.actors.config.scenarios import make_market_scenario
from dpmarket.actors.randomness import NoiseSource
from dpmarket.actors.studies.trial import FaultDraw, trial_secure_phases
from dpmarket.protocol.summary.curator import Curator

ROOT = Path(__file__).resolve().parents[2]


def test_digits_kernel_width_does_not_collapse() -> None:
    config = load_market_config(ROOT / "configs" / "digits.toml")
    scenario = make_market_scenario(config)
    assert scenario.seed_set.min() >= 0.0 and scenario.seed_set.max() <= 1.0
    params = config.curator_params(scenario.gamma, len(scenario.validation))
    noise = NoiseSource.reproducible(0)
    curator = Curator(
        "t", list(scenario.owner_names), scenario.validation, scenario.seed_set, params,
        noise.generator("curator"),
    )  # fmt: skip
    secure = trial_secure_phases(config, scenario, curator, FaultDraw({}, {}, ()), noise)
    assert secure.refused is None
    scale = np.asarray(curator.params.scale)
    assert scale.shape == (64,) and scale.min() >= 0.05  # no pixel blown up by noise
    # the kernel in standardised units is no narrower than a tenth of the raw pixels' own
    # median heuristic (the raw kernel is what standardize = false hashes)
    assert curator.params.gamma >= 0.1 * scenario.gamma > 1e-3

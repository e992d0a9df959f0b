"""The secure sums' L2 sensitivities under each relation (protocol/summary/snr.py, issue 24):
the formulas against brute force over the clip box, and against real RACE sketches."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpmarket.actors.parties.dcaowner import contribution
from dpmarket.protocol.securesum.spec import RoundSpec
from dpmarket.protocol.summary.snr import moments_sensitivity, sketch_sensitivity
from dpmarket.streams.race.lsh import make_family
from dpmarket.streams.race.sketch import RaceSketch


def _brute_pair(bound: float, n: int = 801) -> float:
    """max over a grid of u, v in [-b, b] of (u - v)^2 + (u^2 - v^2)^2."""
    g = np.linspace(-bound, bound, n)
    u, v = np.meshgrid(g, g)
    return float(np.max((u - v) ** 2 + (u**2 - v**2) ** 2))


@pytest.mark.parametrize("bound", [0.5, 1.0, math.sqrt(2.0), 1.6, 3.0, 10.0])
def test_replace_one_moments_sensitivity_is_the_sup_over_the_box(bound: float) -> None:
    k = 3
    exact = moments_sensitivity(k, bound, neighbouring="replace")
    brute = math.sqrt(k * _brute_pair(bound))
    assert brute <= exact * (1 + 1e-9)  # never exceeded on the grid ...
    assert brute >= exact * (1 - 2e-3)  # ... and attained (to the grid's resolution)


def test_moments_sensitivity_by_relation_and_by_a_real_contribution() -> None:
    k, b = 10, 3.0
    assert moments_sensitivity(k, b, neighbouring="add_remove") == pytest.approx(
        math.sqrt(k * b**2 + k * b**4 + 1)
    )
    # b = 3: s+ = (3 + sqrt 7) / 2, c(b) = (6 - s+)^2 (1 + s+^2), a bit above b^2 + b^4 = 90
    s = (3 + math.sqrt(7)) / 2
    assert moments_sensitivity(k, b, neighbouring="replace") == pytest.approx(
        math.sqrt(k * (6 - s) ** 2 * (1 + s * s))
    )
    with pytest.raises(ValueError, match="neighbouring"):
        moments_sensitivity(k, b, neighbouring="swap")
    # the worst pair, replaced in an owner's data: the contribution moves by exactly that
    X = np.random.default_rng(0).uniform(-b, b, (50, k))
    spec, options = RoundSpec(1, 2 * k + 1, 1.0), {"bound": b}
    worst_u, worst_v = b, s - b  # u + v = s+, u - v = 6 - s+
    Y, Z = X.copy(), X.copy()
    Y[7], Z[7] = worst_v, worst_u
    moved = contribution(Z, spec, "moments", options, "o", {}) - contribution(
        Y, spec, "moments", options, "o", {}
    )
    assert moved[-1] == 0.0  # the count does not move under replace-one
    assert float(np.linalg.norm(moved)) == pytest.approx(
        moments_sensitivity(k, b, neighbouring="replace")
    )


def test_replacing_a_record_moves_a_race_sketch_by_at_most_sqrt_2r() -> None:
    rows, width = 40, 64
    assert sketch_sensitivity(rows, neighbouring="add_remove") == math.sqrt(rows)
    assert sketch_sensitivity(rows, neighbouring="replace") == math.sqrt(2 * rows)
    family = make_family("l2", 3, rows, 5, bandwidth=0.5)
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 3)).astype(np.float32)
    base = RaceSketch(family, width)
    base.update(X)
    worst = 0.0
    for trial in range(20):
        Y = X.copy()
        Y[trial] = rng.normal(scale=5.0, size=3)  # far away: other buckets in (almost) every row
        other = RaceSketch(family, width)
        other.update(Y)
        moved = other.counter_vector().astype(np.float64) - base.counter_vector()
        per_row = np.linalg.norm(moved.reshape(rows, width), axis=1)
        assert np.all(per_row <= math.sqrt(2) + 1e-12)
        worst = max(worst, float(np.linalg.norm(moved)))
    assert worst <= sketch_sensitivity(rows, neighbouring="replace") + 1e-9
    assert worst > sketch_sensitivity(rows, neighbouring="add_remove")  # sqrt(R) is too little

"""Tests for the scenario generators: streams.synthetic and actors.scenarios (Appendix G)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dpmarket.actors.config.digits import DIGIT_GROUPS, digits_rows, digits_split
from dpmarket.protocol.summary.objective import greedy_exact, mmd2, uniform_sample
from dpmarket.streams.synthetic import Scenario, gaussian_mixture_shift, median_heuristic_gamma


def same_scenario(a: Scenario, b: Scenario) -> bool:
    arrays = [
        (x, y)
        for (xa, ya), (xb, yb) in zip(a.owners, b.owners, strict=True)
        for x, y in ((xa, xb), (ya, yb))
    ]
    arrays += [(a.validation, b.validation), (a.test_X, b.test_X), (a.test_y, b.test_y)]
    arrays += [(a.seed_set, b.seed_set)]
    return all(np.array_equal(x, y) for x, y in arrays) and a.gamma == b.gamma


@pytest.fixture(scope="module")
def mixture() -> Scenario:
    return gaussian_mixture_shift(np.random.default_rng(0), n_points=3000, n_test=2000)


def test_synthetic_shapes(mixture: Scenario) -> None:
    assert mixture.owner_names == tuple(f"owner-{i}" for i in range(1, 7))
    sizes = [X.shape[0] for X, _ in mixture.owners]
    assert sum(sizes) == 3000 and max(sizes) - min(sizes) <= 1
    assert all(X.shape[1] == 20 and y.shape == (X.shape[0],) for X, y in mixture.owners)
    assert mixture.validation.shape == (500, 20)
    assert mixture.test_X.shape == (2000, 20) and mixture.test_y.shape == (2000,)
    assert mixture.seed_set.shape == (50, 20)
    X, y, owner_of = mixture.pooled()
    assert X.shape == (3000, 20) and y.dtype == np.int64
    assert np.bincount(owner_of).tolist() == sizes


def test_synthetic_owner_mixtures_differ(mixture: Scenario) -> None:
    hists = [np.bincount(y, minlength=8) / y.shape[0] for _, y in mixture.owners]
    tv = [0.5 * np.abs(a - b).sum() for a, b in itertools.combinations(hists, 2)]
    assert min(tv) > 0.15


def test_synthetic_target_uses_only_target_components(mixture: Scenario) -> None:
    assert set(np.unique(mixture.test_y).tolist()) == {0, 1}
    share = float(np.mean(mixture.test_y == 0))
    assert abs(share - 0.7) < 5 * np.sqrt(0.7 * 0.3 / 2000)
    # The validation set comes from the consumer's distribution, not the public mixture.
    g = mixture.gamma
    assert mmd2(mixture.validation, mixture.test_X, g) < 0.2 * mmd2(
        mixture.validation, mixture.seed_set, g
    )


def test_synthetic_features_standardised(mixture: Scenario) -> None:
    X, _, _ = mixture.pooled()
    assert np.all(np.abs(X.mean(axis=0)) < 0.5)
    assert np.all((X.std(axis=0) > 0.5) & (X.std(axis=0) < 2.0))
    assert mixture.gamma == median_heuristic_gamma(mixture.seed_set)


def test_synthetic_deterministic() -> None:
    def make(seed: int) -> Scenario:
        return gaussian_mixture_shift(np.random.default_rng(seed), n_points=600, n_test=100)

    assert same_scenario(make(4), make(4))
    assert not same_scenario(make(4), make(5))


def test_synthetic_separation_sets_component_distance() -> None:
    scenario = gaussian_mixture_shift(
        np.random.default_rng(1), n_test=20000, separation=6.0, n_components=4, dim=10
    )
    first = scenario.test_X[scenario.test_y == 0]
    second = scenario.test_X[scenario.test_y == 1]
    # Components have unit covariance before standardisation, so the within-component spread
    # per coordinate recovers the standardisation scale; undoing it gives the raw distance.
    raw = (first.mean(axis=0) - second.mean(axis=0)) / first.std(axis=0)
    assert float(np.linalg.norm(raw)) == pytest.approx(6.0, rel=0.03)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_owners": 0}, "n_owners"),
        ({"n_points": 3, "n_owners": 4}, "n_points"),
        ({"concentration": 0.0}, "concentration"),
        ({"separation": -1.0}, "separation"),
        ({"target_components": (0, 9)}, "target_components"),
        ({"target_weights": (0.5, 0.4)}, "target_weights"),
        ({"target_components": (0,)}, "target_components"),
        ({"n_seed": 1}, "n_seed"),
    ],
)
def test_synthetic_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        gaussian_mixture_shift(np.random.default_rng(0), **kwargs)  # type: ignore[arg-type]


def test_greedy_beats_uniform_on_synthetic(mixture: Scenario) -> None:
    X, _, owner_of = mixture.pooled()
    g = mixture.gamma
    greedy = mmd2(X[greedy_exact(X, mixture.validation, 100, g)], mixture.test_X, g)
    uniform = mmd2(X[uniform_sample(owner_of, 100, np.random.default_rng(0))], mixture.test_X, g)
    assert greedy < 0.5 * uniform


@pytest.fixture(scope="module")
def digit_labels() -> np.ndarray[tuple[int], np.dtype[np.int64]]:
    return np.asarray(load_digits().target, dtype=np.int64)


def test_digits_rows_disjoint_and_sized(
    digit_labels: np.ndarray[tuple[int], np.dtype[np.int64]],
) -> None:
    rows = digits_rows(np.random.default_rng(7), seed_size=30)
    parts = [*rows.owners, rows.test, rows.validation, rows.seed]
    everything = np.concatenate(parts)
    assert len(np.unique(everything)) == everything.shape[0]
    for group, owner_rows in zip(DIGIT_GROUPS, rows.owners, strict=True):
        assert set(np.unique(digit_labels[owner_rows]).tolist()) == set(group)
        for digit in group:  # half of each class goes to training
            assert (
                abs(np.sum(digit_labels[owner_rows] == digit) - np.sum(digit_labels == digit) / 2)
                <= 1
            )
    target = np.concatenate([rows.test, rows.validation])
    assert set(np.unique(digit_labels[target]).tolist()) == {3, 4}
    assert rows.validation.shape[0] == round(0.25 * target.shape[0])
    assert rows.seed.shape == (30,)
    assert not np.isin(digit_labels[rows.seed], [3, 4]).any()


def test_digits_test_ratio(digit_labels: np.ndarray[tuple[int], np.dtype[np.int64]]) -> None:
    rows = digits_rows(np.random.default_rng(3))
    target = np.concatenate([rows.test, rows.validation])
    assert abs(np.mean(digit_labels[target] == 3) - 0.7) <= 1.0 / target.shape[0]
    assert abs(np.mean(digit_labels[rows.test] == 3) - 0.7) < 0.1


def test_digits_split_scenario_matches_rows() -> None:
    scenario = digits_split(np.random.default_rng(11), seed_size=25)
    rows = digits_rows(np.random.default_rng(11), seed_size=25)
    pixels = load_digits().data / 16.0
    assert scenario.owner_names == tuple(f"owner-{i}" for i in range(1, 6))
    assert np.array_equal(scenario.validation, pixels[rows.validation])
    assert np.array_equal(scenario.test_X, pixels[rows.test])
    assert np.array_equal(scenario.seed_set, pixels[rows.seed])
    assert all(
        np.array_equal(X, pixels[r]) for (X, _), r in zip(scenario.owners, rows.owners, strict=True)
    )
    X, _, _ = scenario.pooled()
    assert X.min() >= 0.0 and X.max() <= 1.0
    assert 25 <= scenario.validation.shape[0] <= 40


def test_digits_split_gamma() -> None:
    scenario = digits_split(np.random.default_rng(2))
    assert scenario.gamma == median_heuristic_gamma(scenario.seed_set)
    assert 0.05 < scenario.gamma < 0.2
    assert digits_split(np.random.default_rng(2), gamma=0.1).gamma == 0.1


def test_digits_split_deterministic() -> None:
    assert same_scenario(
        digits_split(np.random.default_rng(5)), digits_split(np.random.default_rng(5))
    )
    assert not same_scenario(
        digits_split(np.random.default_rng(5)), digits_split(np.random.default_rng(6))
    )


def test_digits_bad_arguments() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="train_fraction"):
        digits_rows(rng, train_fraction=1.0)
    with pytest.raises(ValueError, match="seed_size"):
        digits_rows(rng, seed_size=10_000)
    with pytest.raises(ValueError, match="gamma"):
        digits_split(rng, gamma=0.0)


def test_greedy_beats_uniform_on_digits() -> None:
    scenario = digits_split(np.random.default_rng(0))
    X, _, owner_of = scenario.pooled()
    g = scenario.gamma
    greedy = mmd2(X[greedy_exact(X, scenario.validation, 60, g)], scenario.test_X, g)
    uniform = mmd2(X[uniform_sample(owner_of, 60, np.random.default_rng(0))], scenario.test_X, g)
    assert greedy < 0.5 * uniform

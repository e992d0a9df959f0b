"""Tests for the applications of the RACE sketch (streams/race/apps.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.typing import NDArray

from dpmarket.streams.race.apps import (
    KdeClassifier,
    anomaly_score,
    error_bound,
    fit_linear_regression,
    kde,
    optimal_rows,
    regression_records,
    surrogate_loss,
)
from dpmarket.streams.race.lsh import L2Lsh, SrpLsh
from dpmarket.streams.race.sketch import RaceRelease, RaceSketch


def _blobs(n: int, centre: float, seed: int) -> NDArray[np.float32]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 2)) + centre).astype(np.float32)


# -------------------------------------------------------------------------------------- KDE
def test_kde_estimates_the_normalised_kernel_sum() -> None:
    family = L2Lsh(2, 1000, bandwidth=1.0, seed=0)
    X, Q = _blobs(4000, 0.0, 1), _blobs(30, 0.0, 2)
    sketch = RaceSketch(family, 1024)
    sketch.update(X)
    exact = family.kernel_sum(X, Q) / len(X)
    # row variance <= f~^2 <= N^2, so the mean of R = 1000 rows is within 5 N/sqrt(R) / N
    assert np.abs(kde(sketch, Q) - exact).max() <= 5 / math.sqrt(1000)
    assert np.corrcoef(kde(sketch, Q), exact)[0, 1] > 0.95


def test_error_bound_of_theorem_3_4_holds_for_a_laplace_release() -> None:
    family = L2Lsh(2, 200, bandwidth=1.0, seed=3)
    X, Q = _blobs(3000, 0.0, 1), _blobs(50, 0.0, 4)
    sketch = RaceSketch(family, 512)
    sketch.update(X)
    release = sketch.release_laplace(2.0, np.random.default_rng(0))
    failure = 0.05
    groups = math.ceil(8 * math.log(1 / failure))
    estimate = release.query(Q, "median_of_means", groups=groups)
    exact = family.kernel_sum(X, Q)
    for q, est, f in zip(Q, estimate, exact, strict=True):
        k = family.collision_probability(X, np.repeat(q[None], len(X), 0))
        bound = error_bound(float(np.sqrt(k).sum()), 200, 2.0, failure)
        assert abs(est - f) <= bound
    assert error_bound(100.0, 10, 1.0, 0.1) == pytest.approx(
        math.sqrt(100**2 / 10 + 20) * math.sqrt(32 * math.log(10))
    )
    with pytest.raises(ValueError, match="failure_probability"):
        error_bound(1.0, 1, 1.0, 1.0)


def test_optimal_rows_minimises_the_bound() -> None:
    f_tilde, eps = 5000.0, 0.5
    best = optimal_rows(f_tilde, eps)
    assert best == math.ceil(f_tilde * eps / math.sqrt(2))
    bounds = {r: error_bound(f_tilde, r, eps, 0.05) for r in (best // 2, best, 2 * best)}
    assert min(bounds, key=bounds.__getitem__) == best


# ------------------------------------------------------------------------------- classifier
def _two_classes(
    n0: int, n1: int, gap: float, seed: int
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    X = np.concatenate([_blobs(n0, 0.0, seed), _blobs(n1, gap, seed + 1)])
    return X, np.repeat(np.array([0, 7]), [n0, n1])


def test_classifier_separates_classes_before_and_after_release() -> None:
    family = L2Lsh(2, 200, bandwidth=1.0, seed=1)
    X, y = _two_classes(3000, 3000, 3.0, 0)
    Q, truth = _two_classes(400, 400, 3.0, 10)
    model = KdeClassifier.fit(family, 256, X, y)
    assert model.classes == (0, 7)
    for rule in ("ml", "map"):
        assert (model.predict(Q, rule) == truth).mean() > 0.9
    private = model.release_laplace(1.0, np.random.default_rng(0))
    assert all(isinstance(s, RaceRelease) for s in private.sketches.values())
    assert (private.predict(Q) == truth).mean() > 0.9
    gauss = model.release_gaussian(20.0, np.random.default_rng(0), delta=1e-6)
    assert (gauss.predict(Q, "map") == truth).mean() > 0.9
    with pytest.raises(ValueError, match="released"):
        private.release_laplace(1.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="cannot be updated"):
        private.update(X[:5], y[:5])


def test_map_favours_the_larger_class_where_ml_does_not() -> None:
    family = L2Lsh(2, 300, bandwidth=1.0, seed=2)
    X, y = _two_classes(4500, 500, 1.0, 0)
    model = KdeClassifier.fit(family, 256, X, y)
    Q = _blobs(500, 0.5, 20)  # between the two centres
    ml, map_ = model.predict(Q, "ml"), model.predict(Q, "map")
    assert (map_ == 0).mean() > (ml == 0).mean() + 0.2
    scores = model.scores(Q, "map")
    assert np.allclose(scores * 5000, model.scores(Q, "ml") * model.class_sizes())


def test_classifier_checks_labels_and_members() -> None:
    family = L2Lsh(2, 20, bandwidth=1.0, seed=1)
    model = KdeClassifier.empty(family, 64, (0, 1))
    with pytest.raises(ValueError, match="not among classes"):
        model.update(_blobs(3, 0.0, 0), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="integer labels"):
        model.update(_blobs(3, 0.0, 0), np.array([0.5, 1, 0]))
    with pytest.raises(ValueError, match="rule"):
        model.scores(_blobs(3, 0.0, 0), "bayes")
    with pytest.raises(ValueError, match="seeds"):
        KdeClassifier({0: RaceSketch(family, 64), 1: RaceSketch(L2Lsh(2, 20, 1.0, seed=2), 64)})
    with pytest.raises(ValueError, match="at least one"):
        KdeClassifier({})


# ------------------------------------------------------------------------------- regression
def _regression_sketch(noise: float = 0.05) -> tuple[RaceSketch, NDArray[np.float64]]:
    rng = np.random.default_rng(0)
    theta = np.array([1.0, -2.0, 0.5])
    X = rng.standard_normal((20_000, 3))
    y = X @ theta + noise * rng.standard_normal(20_000)
    sketch = RaceSketch(SrpLsh(4, 1000, bits=4, seed=5), 16)
    sketch.update(regression_records(X, y))
    return sketch, theta


def test_surrogate_loss_is_smallest_near_the_true_coefficients() -> None:
    # The surrogate is flat near its minimum compared with the sketch's own error (about 4% of
    # the loss here), so compare with clearly worse models only.
    sketch, theta = _regression_sketch()
    directions = np.random.default_rng(1).standard_normal((20, 3))
    far = theta + 3 * directions / np.linalg.norm(directions, axis=1, keepdims=True)
    at_theta = surrogate_loss(sketch, theta)[0]
    assert at_theta < np.median(surrogate_loss(sketch, far))
    assert at_theta < 0.5 * surrogate_loss(sketch, np.zeros(3))[0]
    # with zero residuals every record sits at angle pi/2: k(+v) + k(-v) = 2 (1/2)^4
    assert at_theta == pytest.approx(2 * 20_000 / 16, rel=0.2)
    assert at_theta != pytest.approx(2 * 20_000 / 4, rel=0.2)


def test_derivative_free_fit_recovers_the_coefficients_from_a_release() -> None:
    sketch, theta = _regression_sketch()
    release = sketch.release_laplace(1.0, np.random.default_rng(2))
    for source in (sketch, release):
        fitted = fit_linear_regression(source, np.random.default_rng(3), steps=150)
        cosine = fitted @ theta / np.linalg.norm(fitted) / np.linalg.norm(theta)
        assert cosine > 0.97 and np.linalg.norm(fitted - theta) < 0.35 * np.linalg.norm(theta)
    again = fit_linear_regression(release, np.random.default_rng(3), steps=150)
    assert np.array_equal(
        again, fit_linear_regression(release, np.random.default_rng(3), steps=150)
    )


def test_regression_arguments_are_checked() -> None:
    l2 = RaceSketch(L2Lsh(4, 10, 1.0, seed=0), 16)
    with pytest.raises(ValueError, match="SRP"):
        surrogate_loss(l2, np.zeros(3))
    sketch = RaceSketch(SrpLsh(4, 10, bits=3, seed=0), 8)
    with pytest.raises(ValueError, match="columns"):
        surrogate_loss(sketch, np.zeros(4))
    with pytest.raises(ValueError, match="initial"):
        fit_linear_regression(sketch, np.random.default_rng(0), initial=np.zeros(2))
    with pytest.raises(ValueError, match="shape"):
        regression_records(np.zeros((3, 2)), np.zeros(4))


# ---------------------------------------------------------------------------------- anomaly
def test_anomaly_score_ranks_outliers_above_inliers() -> None:
    family = L2Lsh(2, 300, bandwidth=1.0, seed=4)
    sketch = RaceSketch(family, 512)
    sketch.update(_blobs(5000, 0.0, 0))
    inliers, outliers = _blobs(200, 0.0, 1), _blobs(50, 8.0, 2)
    release = sketch.release_laplace(1.0, np.random.default_rng(0))
    for source in (sketch, release):
        inside, outside = anomaly_score(source, inliers), anomaly_score(source, outliers)
        assert np.median(outside) > np.quantile(inside, 0.95)
    assert anomaly_score(sketch, inliers).min() >= 0  # kde <= 1 without noise
    with pytest.raises(ValueError, match="floor"):
        anomaly_score(sketch, inliers, floor=0.0)

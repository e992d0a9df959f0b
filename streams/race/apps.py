"""Machine learning over RACE sketches and their releases (race-coleman2021, Sections 3-4).

Every function takes a sketch or a release (:class:`~dpmarket.streams.race.sketch.RaceQueries`);
on a release everything here is post-processing and costs no further privacy.

* :func:`kde` -- kernel density estimate ``f_D(q)/N_hat`` (Algorithm 2 with normalisation);
  :func:`error_bound` and :func:`optimal_rows` state Theorem 3.4 and Corollary 3.5.
* :class:`KdeClassifier` -- one sketch per class; maximum likelihood (``f_c(q)/N_c``) or MAP
  (``f_c(q)``, i.e. likelihood times the prior ``N_c/N``) decision rules (Section 4).
* :func:`surrogate_loss` / :func:`fit_linear_regression` -- a sketch of ``[x, y]`` under SRP
  hashing queried at ``+-[theta, -1]`` gives ``sum_z k(z, v) + k(z, -v)``, with
  ``k = (1 - angle/pi)^bits``; for ``bits >= 2`` each term is smallest when ``z`` is orthogonal
  to ``v``, i.e. when the residual ``x.theta - y`` is zero (Section 4, "Constructing Losses").
  It is minimised by a derivative-free method (antithetic random directions).
* :func:`anomaly_score` -- ``-log`` of the density: large where few records are similar.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from dpmarket.streams.race.lsh import LshFamily, SrpLsh, as_points
from dpmarket.streams.race.sketch import RaceQueries, RaceSketch

__all__ = [
    "RULES",
    "KdeClassifier",
    "anomaly_score",
    "error_bound",
    "fit_linear_regression",
    "kde",
    "optimal_rows",
    "regression_records",
    "surrogate_loss",
]

RULES = ("ml", "map")


def kde(
    source: RaceQueries, Q: npt.ArrayLike, estimator: str = "mean", groups: int | None = None
) -> NDArray[np.float64]:
    """``f_hat(q) / N_hat`` for every query: the LSH-kernel density (Algorithm 2)."""
    return source.query(Q, estimator=estimator, normalize=True, groups=groups)


def error_bound(f_tilde: float, rows: int, epsilon: float, failure_probability: float) -> float:
    """Theorem 3.4: with probability ``1 - failure_probability`` the median-of-means estimate
    of an epsilon-DP (Laplace) sketch is within ``(f~^2/R + 2R/eps^2)^(1/2) sqrt(32 ln(1/p))``
    of ``f_D(q)``, where ``f~ = sum_x sqrt k(x, q) <= N`` (use ``math.inf`` eps: no noise)."""
    if not 0 < failure_probability < 1:
        raise ValueError(f"failure_probability must be in (0, 1), got {failure_probability!r}")
    if rows < 1 or not epsilon > 0 or not f_tilde >= 0:
        raise ValueError(f"need rows >= 1, epsilon > 0, f_tilde >= 0; got {rows}, {epsilon}")
    variance = f_tilde**2 / rows + 2.0 * rows / epsilon**2
    return math.sqrt(variance) * math.sqrt(32.0 * math.log(1.0 / failure_probability))


def optimal_rows(f_tilde: float, epsilon: float) -> int:
    """Corollary 3.5: ``R* = ceil(f~ eps / sqrt 2)`` minimises the bound of Theorem 3.4."""
    if not (f_tilde > 0 and epsilon > 0):
        raise ValueError(f"f_tilde and epsilon must be positive, got {f_tilde}, {epsilon}")
    return max(1, math.ceil(f_tilde * epsilon / math.sqrt(2.0)))


def anomaly_score(
    source: RaceQueries, Q: npt.ArrayLike, floor: float = 1e-6
) -> NDArray[np.float64]:
    """``-log(max(kde(q), floor))``: higher means fewer similar records (Section 4).

    ``floor`` bounds the score where the (noisy) density is tiny or negative.
    """
    if not floor > 0:
        raise ValueError(f"floor must be positive, got {floor!r}")
    result: NDArray[np.float64] = -np.log(np.maximum(kde(source, Q), floor))
    return result


class KdeClassifier:
    """Kernel density classifier: one sketch (or release) per class, same family and width.

    Privacy: a record enters only the sketch of its own label, so releasing every class sketch
    with :meth:`release_laplace` (``Lap(R/eps)``) is eps-DP as a whole (parallel composition;
    neighbouring: add/remove one labelled record). Changing a record's label is two such steps.
    """

    def __init__(self, sketches: Mapping[int, RaceQueries]) -> None:
        if not sketches:
            raise ValueError("sketches must hold at least one class")
        first = next(iter(sketches.values()))
        for label, sketch in sketches.items():
            if not isinstance(sketch, RaceQueries):
                raise ValueError(f"class {label!r}: expected a sketch, got {type(sketch)}")
            problem = first._mismatch(sketch)
            if problem is not None:
                raise ValueError(f"class {label!r}: {problem}")
        self.classes: tuple[int, ...] = tuple(sorted(int(c) for c in sketches))
        self.sketches: dict[int, RaceQueries] = {int(c): s for c, s in sketches.items()}

    @classmethod
    def empty(
        cls, family: LshFamily, width: int, classes: tuple[int, ...], backend: str = "auto"
    ) -> KdeClassifier:
        """Empty sketches for the public label set ``classes``."""
        return cls({int(c): RaceSketch(family, width, backend=backend) for c in classes})

    @classmethod
    def fit(
        cls,
        family: LshFamily,
        width: int,
        X: npt.ArrayLike,
        y: npt.ArrayLike,
        backend: str = "auto",
    ) -> KdeClassifier:
        """Sketch every class of ``(X, y)``; the label set is taken from ``y``."""
        labels = np.asarray(y)
        model = cls.empty(family, width, tuple(int(c) for c in np.unique(labels)), backend)
        model.update(X, labels)
        return model

    def update(self, X: npt.ArrayLike, y: npt.ArrayLike) -> None:
        """Route each record to the sketch of its label (labels outside ``classes`` refused)."""
        labels = np.asarray(y)
        first = self.sketches[self.classes[0]]
        points = as_points(X, first.family.dim)
        if labels.shape != (points.shape[0],) or labels.dtype.kind not in "iu":
            raise ValueError(f"y must be integer labels of shape ({points.shape[0]},)")
        unknown = np.setdiff1d(labels, np.asarray(self.classes))
        if unknown.size:
            raise ValueError(f"labels {unknown.tolist()} are not among classes {self.classes}")
        sketches = [self.sketches[c] for c in self.classes]
        if not all(isinstance(s, RaceSketch) for s in sketches):
            raise ValueError("a released classifier cannot be updated")
        for label, sketch in zip(self.classes, sketches, strict=True):
            if isinstance(sketch, RaceSketch):
                sketch.update(points[labels == label])

    def class_sizes(self) -> NDArray[np.float64]:
        """``N_hat_c`` per class (estimated from the possibly noisy counters, at least 1)."""
        return np.array([max(self.sketches[c].estimated_size(), 1.0) for c in self.classes])

    def scores(
        self, Q: npt.ArrayLike, rule: str = "ml", estimator: str = "mean"
    ) -> NDArray[np.float64]:
        """``float64[n, classes]``: ``f_c(q)/N_c`` (``"ml"``) or ``f_c(q)/N`` (``"map"``)."""
        if rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
        sums = np.stack([self.sketches[c].query(Q, estimator) for c in self.classes], axis=1)
        sizes = self.class_sizes()
        return sums / (sizes if rule == "ml" else sizes.sum())

    def predict(
        self, Q: npt.ArrayLike, rule: str = "ml", estimator: str = "mean"
    ) -> NDArray[np.int64]:
        """The label with the highest score for every query row."""
        best = np.argmax(self.scores(Q, rule, estimator), axis=1)
        labels: NDArray[np.int64] = np.asarray(self.classes, dtype=np.int64)[best]
        return labels

    def release_laplace(self, epsilon: float, rng: np.random.Generator) -> KdeClassifier:
        """Every class sketch released with ``Lap(R/eps)``: eps-DP in total (see class doc)."""
        return KdeClassifier(
            {c: self._sketch(c).release_laplace(epsilon, rng) for c in self.classes}
        )

    def release_gaussian(
        self, sigma: float, rng: np.random.Generator, delta: float | None = None
    ) -> KdeClassifier:
        """Every class sketch plus ``N(0, sigma^2)``; L2 sensitivity ``sqrt(R)`` in total."""
        return KdeClassifier(
            {c: self._sketch(c).release_gaussian(sigma, rng, delta=delta) for c in self.classes}
        )

    def _sketch(self, label: int) -> RaceSketch:
        sketch = self.sketches[label]
        if not isinstance(sketch, RaceSketch):
            raise ValueError("the classifier is already released")
        return sketch


# ------------------------------------------------------------------------------ regression
def regression_records(X: npt.ArrayLike, y: npt.ArrayLike) -> NDArray[np.float32]:
    """Records ``z = [x, y]`` for a regression sketch (append a column of ones to ``X``
    beforehand for an intercept)."""
    xs = np.asarray(X, dtype=np.float32)
    ys = np.asarray(y, dtype=np.float32)
    if xs.ndim != 2 or ys.shape != (xs.shape[0],):
        raise ValueError(f"X must have shape (n, d) and y (n,), got {xs.shape} and {ys.shape}")
    return np.concatenate([xs, ys[:, None]], axis=1)


def _check_regression_source(source: RaceQueries) -> None:
    family = source.family
    if not isinstance(family, SrpLsh) or family.bits < 2:
        raise ValueError(f"the regression surrogate needs SRP hashing with bits >= 2, got {family}")


def surrogate_loss(source: RaceQueries, thetas: npt.ArrayLike) -> NDArray[np.float64]:
    """``sum_z k(z, [theta, -1]) + k(z, -[theta, -1])`` estimated from the sketch, per row of
    ``thetas`` (``(m, d)``); minimal where every residual is zero (see the module doc)."""
    _check_regression_source(source)
    params = np.atleast_2d(np.asarray(thetas, dtype=np.float64))
    d = source.family.dim - 1
    if params.shape[1] != d:
        raise ValueError(f"thetas must have {d} columns, got shape {params.shape}")
    v = np.concatenate([params, -np.ones((params.shape[0], 1))], axis=1)
    both = source.query(np.concatenate([v, -v]))
    return both[: params.shape[0]] + both[params.shape[0] :]


def fit_linear_regression(
    source: RaceQueries,
    rng: np.random.Generator,
    steps: int = 300,
    directions: int = 16,
    radius: float = 1.0,
    initial: npt.ArrayLike | None = None,
) -> NDArray[np.float64]:
    """Minimise :func:`surrogate_loss` without derivatives; returns the best ``theta`` seen.

    Each step draws ``directions`` Gaussian directions u, estimates the descent direction from
    ``L(theta + s u) - L(theta - s u)`` (one batched query), moves ``s`` along it and shrinks
    ``s`` geometrically from ``radius`` to ``radius/1000``. Deterministic given ``rng``.
    """
    _check_regression_source(source)
    if steps < 1 or directions < 1 or not radius > 0:
        raise ValueError(f"need steps, directions >= 1 and radius > 0; got {steps}, {directions}")
    d = source.family.dim - 1
    theta = np.zeros(d) if initial is None else np.asarray(initial, dtype=np.float64).copy()
    if theta.shape != (d,):
        raise ValueError(f"initial must have shape ({d},), got {theta.shape}")
    best, best_loss = theta.copy(), float(surrogate_loss(source, theta)[0])
    shrink = 1e-3 ** (1.0 / steps)
    step = radius
    for _ in range(steps):
        u = rng.standard_normal((directions, d))
        losses = surrogate_loss(source, np.concatenate([theta + step * u, theta - step * u]))
        slope = (losses[:directions] - losses[directions:]) @ u
        norm = float(np.linalg.norm(slope))
        if norm > 0:
            theta = theta - step * slope / norm
        loss = float(surrogate_loss(source, theta)[0])
        if loss < best_loss:
            best, best_loss = theta.copy(), loss
        step *= shrink
    return best

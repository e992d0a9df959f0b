"""Synthetic covariate-shift scenarios shared by tests and benchmarks.

A :class:`Scenario` is the data side of one summarisation run (summarization-sarpatwar2019,
Section 2 and Section 4): K owners' labelled pools, the consumer's unlabelled validation set,
a labelled test set from the consumer's (shifted) distribution, a public seed set, and a
suggested RBF ``gamma`` from the median heuristic (PAPER-NOTES item 6).

:func:`gaussian_mixture_shift` builds one from a Gaussian mixture: each owner mixes the
components with its own Dirichlet weights, the consumer draws only a few target components, and
the seed set comes from the uniform mixture (public and data-independent). Pure numpy; all
randomness comes from the generator passed in, so the same seed gives the same scenario.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["Scenario", "gaussian_mixture_shift", "median_heuristic_gamma"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class Scenario:
    """Owners' data, the consumer's validation/test data and the public seed set.

    ``owners[i] = (features, labels)`` of owner ``owner_names[i]``; ``validation`` carries
    features only (the consumer's labels are removed); ``test_X``/``test_y`` come from the
    consumer's distribution and are disjoint from ``validation``; ``seed_set`` is public;
    ``gamma`` is the suggested RBF parameter. Arrays are not copied: treat them as read-only.
    """

    owners: tuple[tuple[FloatArray, IntArray], ...]
    owner_names: tuple[str, ...]
    validation: FloatArray
    test_X: FloatArray
    test_y: IntArray
    seed_set: FloatArray
    gamma: float
    name: str

    def __post_init__(self) -> None:
        if len(self.owners) != len(self.owner_names) or not self.owners:
            raise ValueError(
                f"owners ({len(self.owners)}) and owner_names ({len(self.owner_names)}) "
                "must be non-empty and of equal length"
            )
        if len(set(self.owner_names)) != len(self.owner_names):
            raise ValueError(f"owner_names must be distinct, got {self.owner_names}")
        dim = self.validation.shape[1]
        for owner, (X, y) in zip(self.owner_names, self.owners, strict=True):
            if X.ndim != 2 or X.shape[1] != dim or y.shape != (X.shape[0],):
                raise ValueError(f"owner {owner!r} has features {X.shape} and labels {y.shape}")
        for label, arr in (("test_X", self.test_X), ("seed_set", self.seed_set)):
            if arr.ndim != 2 or arr.shape[1] != dim:
                raise ValueError(f"{label} must have shape (n, {dim}), got {arr.shape}")
        if self.test_y.shape != (self.test_X.shape[0],):
            raise ValueError(f"test_y has shape {self.test_y.shape}, test_X {self.test_X.shape}")
        if not (np.isfinite(self.gamma) and self.gamma > 0):
            raise ValueError(f"gamma must be a finite positive number, got {self.gamma!r}")

    @property
    def dim(self) -> int:
        """Number of features."""
        return int(self.validation.shape[1])

    def pooled(self) -> tuple[FloatArray, IntArray, IntArray]:
        """All owners' rows stacked: ``(features, labels, owner index per row)``."""
        X = np.concatenate([X for X, _ in self.owners], axis=0)
        y = np.concatenate([y for _, y in self.owners]).astype(np.int64)
        owner_of = np.repeat(
            np.arange(len(self.owners), dtype=np.int64), [X.shape[0] for X, _ in self.owners]
        )
        return X, y, owner_of


def median_heuristic_gamma(X: npt.ArrayLike) -> float:
    """``1 / median ||x - y||^2`` over distinct pairs of rows of X (PAPER-NOTES item 6).

    Use it on public data (a seed set) so that it costs no privacy. Needs two rows with a
    positive median distance.
    """
    arr = np.asarray(X, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 2:
        raise ValueError(f"X must be a 2-D array with at least 2 rows, got shape {arr.shape}")
    sq = (arr * arr).sum(axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * arr @ arr.T, 0.0)
    median = float(np.median(d2[np.triu_indices(arr.shape[0], k=1)]))
    if not median > 0:
        raise ValueError("median squared distance of X is 0; gamma is undefined")
    return 1.0 / median


def _component_means(
    rng: np.random.Generator, n_components: int, dim: int, separation: float
) -> FloatArray:
    """Means at pairwise distance exactly ``separation`` (orthonormal directions) when
    ``n_components <= dim``; otherwise random directions at radius ``separation / sqrt(2)``."""
    gauss = rng.standard_normal((max(n_components, dim), dim))
    if n_components <= dim:
        directions = np.linalg.qr(gauss[:dim].T)[0].T[:n_components]
    else:
        directions = gauss / np.linalg.norm(gauss, axis=1, keepdims=True)
    return np.asarray(directions * (separation / np.sqrt(2.0)), dtype=np.float64)


def _draw(
    rng: np.random.Generator, means: FloatArray, weights: FloatArray, n: int
) -> tuple[FloatArray, IntArray]:
    """``n`` points of the mixture with the given component weights (unit covariance)."""
    labels = rng.choice(means.shape[0], size=n, p=weights).astype(np.int64)
    X = means[labels] + rng.standard_normal((n, means.shape[1]))
    return np.asarray(X, dtype=np.float64), labels


def _check_positive_int(name: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_sizes(
    n_points: int,
    n_owners: int,
    n_components: int,
    dim: int,
    n_validation: int,
    n_test: int,
    n_seed: int,
) -> None:
    """Each size must be a positive integer; n_owners is checked first so that n_points can be
    required to be at least n_owners (every owner holds a point)."""
    _check_positive_int("n_owners", n_owners)
    minimum = {"n_components": 2, "n_seed": 2, "n_points": int(n_owners)}
    sizes = {
        "n_points": n_points,
        "n_components": n_components,
        "dim": dim,
        "n_validation": n_validation,
        "n_test": n_test,
        "n_seed": n_seed,
    }
    for name, value in sizes.items():
        _check_positive_int(name, value, minimum.get(name, 1))


def _target_weights(
    n_components: int, components: tuple[int, ...], weights: tuple[float, ...]
) -> FloatArray:
    if len(components) != len(weights) or not components:
        raise ValueError(
            f"target_components {components} and target_weights {weights} "
            "must be non-empty and of equal length"
        )
    if len(set(components)) != len(components) or not all(
        0 <= c < n_components for c in components
    ):
        raise ValueError(f"target_components must be distinct in [0, {n_components}): {components}")
    w = np.asarray(weights, dtype=np.float64)
    if not (np.all(np.isfinite(w)) and np.all(w > 0) and abs(w.sum() - 1.0) < 1e-9):
        raise ValueError(f"target_weights must be positive and sum to 1, got {weights}")
    full = np.zeros(n_components, dtype=np.float64)
    full[list(components)] = w
    return full


def gaussian_mixture_shift(
    rng: np.random.Generator,
    n_points: int = 6000,
    n_owners: int = 6,
    n_components: int = 8,
    dim: int = 20,
    concentration: float = 0.5,
    target_components: tuple[int, ...] = (0, 1),
    target_weights: tuple[float, ...] = (0.7, 0.3),
    n_validation: int = 500,
    n_test: int = 5000,
    n_seed: int = 50,
    separation: float = 4.0,
) -> Scenario:
    """A covariate-shift scenario from a mixture of unit-variance Gaussians in ``dim`` dims.

    Component means are at pairwise distance ``separation`` (see ``_component_means``); the
    label of a point is its component. ``n_points`` are split evenly over ``n_owners`` (the
    remainder to the first owners); owner i mixes components with weights drawn from
    Dirichlet(``concentration``). The consumer's validation and test sets draw only
    ``target_components`` with ``target_weights``; the public seed set draws from the uniform
    mixture. Every set is standardised with the uniform mixture's exact per-coordinate mean and
    standard deviation (a public, data-independent map), so features are O(1). ``gamma`` is the
    median heuristic on the seed set.
    """
    _check_sizes(n_points, n_owners, n_components, dim, n_validation, n_test, n_seed)
    for label, value in (("concentration", concentration), ("separation", separation)):
        if not (np.isfinite(value) and value > 0):
            raise ValueError(f"{label} must be a finite positive number, got {value!r}")
    target = _target_weights(n_components, tuple(target_components), tuple(target_weights))

    means = _component_means(rng, n_components, dim, float(separation))
    center = means.mean(axis=0)
    scale = np.sqrt(1.0 + means.var(axis=0))
    sizes = np.full(n_owners, n_points // n_owners)
    sizes[: n_points % n_owners] += 1
    mixes = rng.dirichlet(np.full(n_components, float(concentration)), size=n_owners)
    owners = []
    for size, mix in zip(sizes, mixes, strict=True):
        X, y = _draw(rng, means, mix, int(size))
        owners.append(((X - center) / scale, y))
    validation, _ = _draw(rng, means, target, n_validation)
    test_X, test_y = _draw(rng, means, target, n_test)
    uniform = np.full(n_components, 1.0 / n_components)
    seed_set = (_draw(rng, means, uniform, n_seed)[0] - center) / scale
    return Scenario(
        owners=tuple(owners),
        owner_names=tuple(f"owner-{i + 1}" for i in range(n_owners)),
        validation=(validation - center) / scale,
        test_X=(test_X - center) / scale,
        test_y=test_y,
        seed_set=seed_set,
        gamma=median_heuristic_gamma(seed_set),
        name="gaussian-mixture-shift",
    )

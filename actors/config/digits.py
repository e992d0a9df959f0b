"""Real-data scenarios: the digits split of summarization-sarpatwar2019, Appendix G.

The paper splits MNIST; we use scikit-learn's bundled 8x8 ``load_digits`` (1797 images, 64
pixels), so the run needs no download. Layout (Appendix G):

* every digit class is split at random into a training part (``train_fraction``) and a held-out
  part;
* five owners ``owner-1``..``owner-5`` hold the training part of digit groups
  [[0, 1], [3, 4], [5, 6], [7, 8], [9, 2]];
* the consumer's test distribution is digits 3 and 4 in ratio 0.7 : 0.3, drawn from the held-out
  part (the largest such set the held-out points allow), and a 25% sample of it is REMOVED to
  form the validation set (features only);
* the public seed set is ``seed_size`` held-out points of the other digits (not 3 or 4).

Owners, test, validation and seed rows are pairwise disjoint (:class:`DigitsRows` lists the
row indices into ``load_digits``). Pixels are scaled to [0, 1] by dividing by 16.

``gamma``: the paper uses 0.1 for features in [0, 1]. The default ``None`` uses the median
heuristic ``1 / median ||x - y||^2`` on the public seed set instead (PAPER-NOTES item 6), which
costs no privacy and on these pixels lands close to 0.1 (0.10-0.12 over 20 seeds, 30 seed
points).
With the default ``train_fraction = 0.5`` the validation set has about 32 points, the size
PAPER-NOTES item 5 refers to.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpmarket.streams.synthetic import Scenario, median_heuristic_gamma

__all__ = ["DIGIT_GROUPS", "DigitsRows", "digits_rows", "digits_split"]

IntArray = npt.NDArray[np.int64]

DIGIT_GROUPS: tuple[tuple[int, ...], ...] = ((0, 1), (3, 4), (5, 6), (7, 8), (9, 2))
"""Digits held by owner-1 .. owner-5 (Appendix G)."""

_TEST_DIGITS = (3, 4)
_TEST_RATIO = (0.7, 0.3)
_VALIDATION_FRACTION = 0.25


@dataclass(frozen=True, eq=False)
class DigitsRows:
    """Row indices into ``load_digits()`` for each part of the split (pairwise disjoint)."""

    owners: tuple[IntArray, ...]
    test: IntArray
    validation: IntArray
    seed: IntArray


def _load() -> tuple[npt.NDArray[np.float64], IntArray]:
    from sklearn.datasets import load_digits  # on use: the market's extra, not an agent's

    bunch = load_digits()
    return (
        np.asarray(bunch.data, dtype=np.float64) / 16.0,
        np.asarray(bunch.target, dtype=np.int64),
    )


def _split_classes(
    labels: IntArray, train_fraction: float, rng: np.random.Generator
) -> tuple[dict[int, IntArray], dict[int, IntArray]]:
    """Per digit: a shuffled training part and a held-out part of its rows."""
    train: dict[int, IntArray] = {}
    held: dict[int, IntArray] = {}
    for digit in range(10):
        rows = rng.permutation(np.flatnonzero(labels == digit)).astype(np.int64)
        cut = round(train_fraction * rows.shape[0])
        train[digit], held[digit] = rows[:cut], rows[cut:]
    return train, held


def _test_rows(held: dict[int, IntArray], rng: np.random.Generator) -> IntArray:
    """Largest test set of held-out 3s and 4s in ratio 0.7 : 0.3 (counts rounded)."""
    available = [held[d].shape[0] for d in _TEST_DIGITS]
    total = int(min(n / r for n, r in zip(available, _TEST_RATIO, strict=True)))
    counts = [min(round(total * r), n) for r, n in zip(_TEST_RATIO, available, strict=True)]
    rows = np.concatenate([held[d][:c] for d, c in zip(_TEST_DIGITS, counts, strict=True)])
    return rng.permutation(rows).astype(np.int64)


def digits_rows(
    rng: np.random.Generator, seed_size: int = 30, train_fraction: float = 0.5
) -> DigitsRows:
    """The Appendix G split as row indices (see the module docstring); deterministic per seed."""
    if not (isinstance(train_fraction, float | int) and 0.0 < train_fraction < 1.0):
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction!r}")
    _, labels = _load()
    train, held = _split_classes(labels, float(train_fraction), rng)
    others = np.concatenate([held[d] for d in range(10) if d not in _TEST_DIGITS])
    if isinstance(seed_size, bool) or not isinstance(seed_size, int) or seed_size < 2:
        raise ValueError(f"seed_size must be an integer >= 2, got {seed_size!r}")
    if seed_size > others.shape[0]:
        raise ValueError(f"seed_size must be <= {others.shape[0]} held-out points, got {seed_size}")
    seed = rng.choice(others, size=seed_size, replace=False).astype(np.int64)
    target = _test_rows(held, rng)
    n_validation = round(_VALIDATION_FRACTION * target.shape[0])
    removed = np.zeros(target.shape[0], dtype=bool)
    removed[rng.choice(target.shape[0], size=n_validation, replace=False)] = True
    owners = tuple(
        np.sort(np.concatenate([train[d] for d in group])).astype(np.int64)
        for group in DIGIT_GROUPS
    )
    return DigitsRows(owners=owners, test=target[~removed], validation=target[removed], seed=seed)


def digits_split(
    rng: np.random.Generator,
    seed_size: int = 30,
    train_fraction: float = 0.5,
    gamma: float | None = None,
) -> Scenario:
    """Appendix G's digits scenario as a :class:`Scenario` (features in [0, 1]).

    ``gamma=None`` means the median heuristic on the seed set (module docstring); pass 0.1 for
    the paper's value. Same generator state, same scenario.
    """
    if gamma is not None and not (np.isfinite(gamma) and gamma > 0):
        raise ValueError(f"gamma must be None or a finite positive number, got {gamma!r}")
    rows = digits_rows(rng, seed_size=seed_size, train_fraction=train_fraction)
    X, y = _load()
    return Scenario(
        owners=tuple((X[r], y[r]) for r in rows.owners),
        owner_names=tuple(f"owner-{i + 1}" for i in range(len(rows.owners))),
        validation=X[rows.validation],
        test_X=X[rows.test],
        test_y=y[rows.test],
        seed_set=X[rows.seed],
        gamma=median_heuristic_gamma(X[rows.seed]) if gamma is None else float(gamma),
        name="digits-appendix-g",
    )

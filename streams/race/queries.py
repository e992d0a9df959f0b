"""Queries of RACE counters (race-coleman2021, Algorithm 2), shared by sketches and releases.

Row ``r`` of the R x W counters counts the records whose code ``l_r(x)`` falls in column
``l_r(x) mod W`` (Section 2.4). ``S[r, l_r(q) mod W]`` is then an unbiased estimator of
``f_D(q) = sum_x k(x, q)`` plus the collisions modulo W (about ``(N - f_D(q))/W`` when the codes
spread over more than W values; none for SRP with ``W >= 2^bits``), with variance at most
``(sum_x sqrt k(x, q))^2`` (Theorem 2.5). :meth:`RaceQueries.query` averages the R rows
(Algorithm 2) or takes the median of group means (Lemma 3.3). Queries of a release cost no
privacy (post-processing).

Speed: one float32 query row with the "mean" estimator takes a single compiled call
(:func:`~dpmarket.streams.race.kernels.mean_of_one`), bit-identical to the general path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from dpmarket.streams.race.kernels import gather_sums, mean_of_one, numba_ready
from dpmarket.streams.race.lsh import LshFamily, as_points

__all__ = ["DEFAULT_GROUPS", "ESTIMATORS", "MAX_WIDTH", "RaceQueries", "check_width"]

ESTIMATORS = ("mean", "median_of_means")
DEFAULT_GROUPS = 24  # median of means: k = ceil(8 ln(1/0.05)) groups (Lemma 3.3, delta = 0.05)
MAX_WIDTH = 2**30
_ALL_ROWS = np.zeros(0, dtype=np.int64)  # row -> group map for one group (never read)


def check_width(width: object) -> int:
    """``width`` as an int if it is an integer in ``[1, MAX_WIDTH]``; ``ValueError`` if not."""
    if isinstance(width, bool) or not isinstance(width, int | np.integer):
        raise ValueError(f"width must be a positive integer, got {width!r}")
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"width must be in [1, {MAX_WIDTH}], got {width!r}")
    return int(width)


def _row_groups(rows: int, groups: int) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Contiguous split of the rows into ``groups`` nearly equal groups: (group of row, sizes)."""
    sizes = np.full(groups, rows // groups, dtype=np.int64)
    sizes[: rows % groups] += 1
    return np.repeat(np.arange(groups, dtype=np.int64), sizes), sizes.astype(np.float64)


class RaceQueries:
    """Queries shared by a sketch and a release (Algorithm 2). Subclasses hold the counters."""

    family: LshFamily
    width: int
    weight_bound: int
    backend: str
    _counts: NDArray[Any]

    @property
    def rows(self) -> int:
        """R, the number of rows (independent hash functions)."""
        return self.family.rows

    @property
    def counts(self) -> NDArray[Any]:
        """The R x W counters (a read-only view)."""
        view = self._counts.view()
        view.setflags(write=False)
        return view

    def estimated_size(self) -> float:
        """``N_hat = sum of all counters / R`` (the optional normalisation of Algorithm 2)."""
        return float(self._counts.sum()) / self.rows

    def columns(self, Q: npt.ArrayLike) -> NDArray[np.int64]:
        """Column ``l_r(q) mod W`` of every query in every row (``int64[n, R]``)."""
        return np.mod(self.family.hash(Q).astype(np.int64), self.width)

    def query(
        self,
        Q: npt.ArrayLike,
        estimator: str = "mean",
        normalize: bool = False,
        groups: int | None = None,
    ) -> NDArray[np.float64]:
        """Estimate ``f_D(q)`` (or the KDE ``f_D(q)/N_hat`` if ``normalize``) per query row.

        ``"mean"``: the average of the R row estimates (Algorithm 2); each row is unbiased for
        the kernel sum plus the mod-W collisions, variance <= ``f~^2`` (Theorem 2.5) plus the
        release noise. ``"median_of_means"``: the median of ``groups`` (default 24) group means;
        with ``groups = 8 ln(1/delta)`` it is within ``sqrt(32 sigma^2 ln(1/delta)/R)`` of the
        mean with probability ``1 - delta`` (Lemma 3.3, Theorem 3.4).
        """
        if estimator == "mean" and not normalize and numba_ready(self.backend):
            single = mean_of_one(Q, self.family, self._counts)  # one float32 row: one call
            if single is not None:
                return single
        points = as_points(Q, self.family.dim, "Q")
        estimate: NDArray[np.float64]
        if estimator == "mean":
            estimate = self._group_sums(points, _ALL_ROWS, 1)[0]
            estimate /= self.family.rows
        elif estimator == "median_of_means":
            k = min(self.rows, DEFAULT_GROUPS) if groups is None else groups
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.rows:
                raise ValueError(f"groups must be an integer in [1, {self.rows}], got {groups!r}")
            row_group, sizes = _row_groups(self.rows, k)
            sums = self._group_sums(points, row_group, k)
            estimate = np.asarray(np.median(sums / sizes[:, None], axis=0), np.float64)
        else:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
        if normalize:
            size = self.estimated_size()
            if not size > 0:
                raise ValueError(f"cannot normalize: estimated size N_hat = {size} is not positive")
            estimate = estimate / size
        return estimate

    def _group_sums(
        self, points: NDArray[np.float32], row_group: NDArray[np.int64], groups: int
    ) -> NDArray[np.float64]:
        return gather_sums(self.family, points, self._counts, row_group, groups, self.backend)

    def _mismatch(self, other: RaceQueries) -> str | None:
        """Which public parameter differs from ``other`` (None when compatible)."""
        mine, theirs = self.family, other.family
        checks: Sequence[tuple[str, object, object]] = (
            ("families", mine.name, theirs.name),
            ("dimensions", mine.dim, theirs.dim),
            ("rows", mine.rows, theirs.rows),
            ("widths", self.width, other.width),
            ("seeds", mine.seed, theirs.seed),
            ("hash parameters", mine.params(), theirs.params()),
            ("weight bounds", self.weight_bound, other.weight_bound),
        )
        for name, a, b in checks:
            if a != b:
                return f"{name} differ ({a!r} != {b!r})"
        return None

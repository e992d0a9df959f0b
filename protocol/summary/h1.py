"""h1 of the summarisation protocol (Sarpatwar et al. 2019, Section 3, Algorithm 1).

``h1`` (:class:`RandomFourierFeatures`) maps a point to ``d`` random Fourier features of the RBF
kernel ``k(x, y) = exp(-gamma ||x - y||^2)`` so that ``h1(x) . h1(y) ~ k(x, y)``. Its seed is
public: curator and owners share the same map. The exact kernel and the argument checks that
:mod:`.h2` shares are here too.

Everything here is pure: the only randomness is the public ``h1`` seed; no global state, no I/O.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

__all__ = [
    "RandomFourierFeatures",
    "positive_float",
    "positive_int",
    "rahimi_recht_bound",
    "rbf_kernel",
    "real_array",
]

_CHUNK_ELEMENTS = 1 << 20  # float32 elements per h1 work chunk (4 MiB)


# --------------------------------------------------------------------------------------------
# Argument checks (shared with h2)
# --------------------------------------------------------------------------------------------


def real_array(value: npt.ArrayLike, name: str) -> NDArray[Any]:
    """``value`` as an array of finite reals; ValueError naming ``name`` otherwise."""
    array = np.asarray(value)
    if not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
        raise ValueError(f"{name} must hold real numbers, got dtype {array.dtype}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return array


def positive_int(value: int, name: str) -> int:
    """``value`` as a positive int (bools refused); ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def positive_float(value: float, name: str) -> float:
    """``value`` as a finite positive float; ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")
    return float(value)


# --------------------------------------------------------------------------------------------
# h1: random Fourier features (Algorithm 1)
# --------------------------------------------------------------------------------------------


class RandomFourierFeatures:
    """``h1`` of Algorithm 1: ``sqrt(2/d) * cos(x @ omega + b)``, Rahimi & Recht (2008).

    ``omega`` (``n_features x d``) is drawn from ``N(0, 2 gamma I)``, the Fourier transform of the
    RBF kernel, and ``b`` (``d``) from ``U[0, 2 pi)``, once, from ``default_rng(seed)``. The seed
    is public (shared by curator and owners). Every output coordinate lies in
    ``[-sqrt(2/d), sqrt(2/d)]``, so ``||h1(x)||_2 <= sqrt(2)``, and ``E[h1(x) . h1(y)] = k(x, y)``;
    for a fixed pair the deviation exceeds :func:`rahimi_recht_bound` ``(d, p)`` with
    probability at most ``p`` (the form used in the paper's Lemma 4).

    ``center`` and ``scale`` (public, e.g. the DP pool means and spreads of the normalise round)
    standardise each feature first: ``h1(x) = features((x - center) / scale)``, so the kernel is
    ``exp(-gamma ||(x - y) / scale||^2)``. :meth:`hash_standardized` hashes points given in the
    standardised coordinates directly. The bound on ``||h1(x)||_2`` is unchanged.
    """

    def __init__(
        self,
        n_features: int,
        d: int,
        gamma: float,
        seed: int,
        center: npt.ArrayLike | None = None,
        scale: npt.ArrayLike | None = None,
    ) -> None:
        self.n_features = positive_int(n_features, "n_features")
        self.d = positive_int(d, "d")
        self.gamma = positive_float(gamma, "gamma")
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.seed = int(seed)
        rng = np.random.default_rng(self.seed)
        omega = rng.normal(0.0, math.sqrt(2.0 * self.gamma), size=(self.n_features, self.d))
        offset = rng.uniform(0.0, 2.0 * math.pi, size=self.d)
        self.omega: NDArray[np.float32] = omega.astype(np.float32)
        self.b: NDArray[np.float32] = offset.astype(np.float32)
        self.omega.setflags(write=False)
        self.b.setflags(write=False)
        self._scale = np.float32(math.sqrt(2.0 / self.d))
        self.center, self.scale = _standardisation(self.n_features, center, scale)

    def __call__(self, X: npt.ArrayLike) -> NDArray[np.float32]:
        """Hash rows of ``X`` (``(n, n_features)`` -> ``(n, d)``; ``(n_features,)`` -> ``(d,)``).

        Computed in float32, in row chunks so the working memory beyond the output is bounded.
        """
        points = real_array(X, "X")
        if points.ndim not in (1, 2) or points.shape[-1] != self.n_features:
            raise ValueError(
                f"X must have shape (n, {self.n_features}) or ({self.n_features},), "
                f"got {points.shape}"
            )
        rows = points.reshape(-1, self.n_features)
        if self.center is not None and self.scale is not None:
            rows = (rows - self.center) / self.scale
        out = self._features(rows)
        return out[0] if points.ndim == 1 else out

    def hash_standardized(self, Z: npt.ArrayLike) -> NDArray[np.float32]:
        """Hash rows already in standardised coordinates (``(x - center) / scale``), ``(n, d)``."""
        rows = real_array(Z, "Z")
        if rows.ndim != 2 or rows.shape[1] != self.n_features:
            raise ValueError(f"Z must have shape (n, {self.n_features}), got {rows.shape}")
        return self._features(rows)

    def _features(self, rows: NDArray[Any]) -> NDArray[np.float32]:
        out = np.empty((rows.shape[0], self.d), dtype=np.float32)
        step = max(1, _CHUNK_ELEMENTS // max(self.d, self.n_features))
        for start in range(0, rows.shape[0], step):
            block = out[start : start + step]
            np.matmul(rows[start : start + step].astype(np.float32), self.omega, out=block)
            block += self.b
            np.cos(block, out=block)
            block *= self._scale
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RandomFourierFeatures):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"RandomFourierFeatures(n_features={self.n_features}, d={self.d}, "
            f"gamma={self.gamma!r}, seed={self.seed})"
        )

    def _key(self) -> tuple[object, ...]:
        standard = None
        if self.center is not None and self.scale is not None:
            standard = (self.center.tobytes(), self.scale.tobytes())
        return (self.n_features, self.d, self.gamma, self.seed, standard)


def _standardisation(
    n_features: int, center: npt.ArrayLike | None, scale: npt.ArrayLike | None
) -> tuple[NDArray[np.float64] | None, NDArray[np.float64] | None]:
    """Checked (center, scale) vectors, or (None, None) for no standardisation."""
    if center is None and scale is None:
        return None, None
    if center is None or scale is None:
        raise ValueError("center and scale: give both or neither")
    c = np.asarray(real_array(center, "center"), dtype=np.float64)
    s = np.asarray(real_array(scale, "scale"), dtype=np.float64)
    if c.shape != (n_features,) or s.shape != (n_features,):
        raise ValueError(
            f"center and scale must have shape ({n_features},), got {c.shape} and {s.shape}"
        )
    if not (s > 0).all():
        raise ValueError("scale: every entry must be positive")
    c.setflags(write=False)
    s.setflags(write=False)
    return c, s


def rahimi_recht_bound(d: int, failure_prob: float) -> float:
    """Deviation ``eps`` with ``P(|h1(x).h1(y) - k(x, y)| >= eps) <= failure_prob`` for one pair.

    Inverts the tail ``exp(-d eps^2 / 4)`` quoted in the paper's Lemma 4 (Appendix D):
    ``eps = sqrt(4 ln(1 / failure_prob) / d)``. For many pairs, divide ``failure_prob`` by the
    number of pairs (union bound).
    """
    dim = positive_int(d, "d")
    if not 0.0 < failure_prob < 1.0:
        raise ValueError(f"failure_prob must lie in (0, 1), got {failure_prob!r}")
    return math.sqrt(4.0 * math.log(1.0 / failure_prob) / dim)


def rbf_kernel(X: npt.ArrayLike, Y: npt.ArrayLike, gamma: float) -> NDArray[np.float64]:
    """Exact kernel matrix ``K[i, j] = exp(-gamma ||X[i] - Y[j]||^2)`` in float64.

    Squared distances use ``||x||^2 + ||y||^2 - 2 x.y`` clipped at 0. 1-D inputs are one row.
    """
    rate = positive_float(gamma, "gamma")
    left = np.atleast_2d(real_array(X, "X")).astype(np.float64)
    right = np.atleast_2d(real_array(Y, "Y")).astype(np.float64)
    if left.ndim != 2 or right.ndim != 2 or left.shape[1] != right.shape[1]:
        raise ValueError(f"X and Y must be 2-D with equal columns, got {left.shape}, {right.shape}")
    squared = (
        np.einsum("ij,ij->i", left, left)[:, None]
        + np.einsum("ij,ij->i", right, right)[None, :]
        - 2.0 * (left @ right.T)
    )
    kernel: NDArray[np.float64] = np.exp(-rate * np.maximum(squared, 0.0))
    return kernel

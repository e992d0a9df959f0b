"""The two hash functions of the summarisation protocol (Sarpatwar et al. 2019, Section 3).

``h1`` (:class:`RandomFourierFeatures`, Algorithm 1) maps a point to ``d`` random Fourier
features of the RBF kernel ``k(x, y) = exp(-gamma ||x - y||^2)`` so that
``h1(x) . h1(y) ~ k(x, y)``. Its seed is public: curator and owners share the same map.

``h2`` (:class:`MwemHash`, Algorithm 2 and Appendix B-C) releases a differentially private
estimate of the mean of a set of ``h1`` vectors: each vector is scaled into ``[-1, 1]^d`` and
stochastically rounded onto the grid ``S = {-1, -1 + eta, ..., 1}`` (:func:`quantize`), then MWEM
over the per-coordinate marginals (the product form of Lemma 1, memory ``O(d / eta)``) fits a
distribution whose coordinate means match the noisy column sums.

Everything here is pure: randomness is a ``numpy.random.Generator`` argument (except the public
``h1`` seed), no global state, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

__all__ = [
    "H2Release",
    "MwemHash",
    "MwemTrace",
    "RandomFourierFeatures",
    "mwem_marginal_means",
    "quantization_grid",
    "quantize",
    "rahimi_recht_bound",
    "rbf_kernel",
]

_CHUNK_ELEMENTS = 1 << 20  # float32 elements per h1 work chunk (4 MiB)
_RANGE_TOLERANCE = 1e-5  # relative slack for float32 round-off at the ends of [-1, 1]


def _real_array(value: npt.ArrayLike, name: str) -> NDArray[Any]:
    array = np.asarray(value)
    if not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
        raise ValueError(f"{name} must hold real numbers, got dtype {array.dtype}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return array


def _positive_int(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _positive_float(value: float, name: str) -> float:
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
        self.n_features = _positive_int(n_features, "n_features")
        self.d = _positive_int(d, "d")
        self.gamma = _positive_float(gamma, "gamma")
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
        points = _real_array(X, "X")
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
        rows = _real_array(Z, "Z")
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
    c = np.asarray(_real_array(center, "center"), dtype=np.float64)
    s = np.asarray(_real_array(scale, "scale"), dtype=np.float64)
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
    dim = _positive_int(d, "d")
    if not 0.0 < failure_prob < 1.0:
        raise ValueError(f"failure_prob must lie in (0, 1), got {failure_prob!r}")
    return math.sqrt(4.0 * math.log(1.0 / failure_prob) / dim)


def rbf_kernel(X: npt.ArrayLike, Y: npt.ArrayLike, gamma: float) -> NDArray[np.float64]:
    """Exact kernel matrix ``K[i, j] = exp(-gamma ||X[i] - Y[j]||^2)`` in float64.

    Squared distances use ``||x||^2 + ||y||^2 - 2 x.y`` clipped at 0. 1-D inputs are one row.
    """
    rate = _positive_float(gamma, "gamma")
    left = np.atleast_2d(_real_array(X, "X")).astype(np.float64)
    right = np.atleast_2d(_real_array(Y, "Y")).astype(np.float64)
    if left.ndim != 2 or right.ndim != 2 or left.shape[1] != right.shape[1]:
        raise ValueError(f"X and Y must be 2-D with equal columns, got {left.shape}, {right.shape}")
    squared = (
        np.einsum("ij,ij->i", left, left)[:, None]
        + np.einsum("ij,ij->i", right, right)[None, :]
        - 2.0 * (left @ right.T)
    )
    kernel: NDArray[np.float64] = np.exp(-rate * np.maximum(squared, 0.0))
    return kernel


# --------------------------------------------------------------------------------------------
# Quantisation (Algorithm 2, lines 10-13; Appendix B)
# --------------------------------------------------------------------------------------------


def _grid_steps(eta: float) -> int:
    if isinstance(eta, bool) or not math.isfinite(eta) or not 0.0 < eta <= 2.0:
        raise ValueError(f"eta must lie in (0, 2], got {eta!r}")
    steps = round(2.0 / eta)
    if abs(steps * eta - 2.0) > 1e-9:
        raise ValueError(f"eta must divide 2 (2/eta an integer), got eta={eta!r}")
    return int(steps)


def quantization_grid(eta: float) -> NDArray[np.float64]:
    """The grid ``S = {-1, -1 + eta, ..., 1}`` (``2/eta + 1`` points); ``2/eta`` must be whole."""
    steps = _grid_steps(eta)
    return np.linspace(-1.0, 1.0, steps + 1)


def quantize(V: npt.ArrayLike, eta: float, rng: np.random.Generator) -> NDArray[np.float64]:
    """Algorithm 2's QUANTIZATION: ``Q(sqrt(d/2) v)`` for every row ``v`` of ``V`` (``q x d``).

    Rows are ``h1`` vectors with entries in ``[-sqrt(2/d), sqrt(2/d)]``; they are scaled into
    ``[-1, 1]`` (float round-off beyond the ends is clipped) and each entry is rounded to one of
    its two neighbouring grid points with the probabilities of Eq. (5), so ``E[Q(x)] = x``
    exactly and ``|Q(x) - x| < eta`` (Lemma 2). Returns the grid values, float64.
    """
    steps = _grid_steps(eta)
    vectors = _real_array(V, "V")
    if vectors.ndim != 2:
        raise ValueError(f"V must be 2-D (q, d), got shape {vectors.shape}")
    scaled = vectors.astype(np.float64) * math.sqrt(vectors.shape[1] / 2.0)
    if scaled.size and np.abs(scaled).max() > 1.0 + _RANGE_TOLERANCE:
        raise ValueError("V has entries outside [-sqrt(2/d), sqrt(2/d)]; pass h1 vectors")
    position = (np.clip(scaled, -1.0, 1.0) + 1.0) * (steps / 2.0)  # in [0, steps]
    lower = np.minimum(np.floor(position), steps - 1)
    round_up = rng.random(position.shape) < (position - lower)
    values: NDArray[np.float64] = -1.0 + (lower + round_up) * (2.0 / steps)
    return values


# --------------------------------------------------------------------------------------------
# h2: MWEM over per-coordinate marginals (Algorithm 2, Lemma 1, Theorem 4)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class MwemTrace:
    """Output of :func:`mwem_marginal_means` (private: the curator's internal state).

    ``average_sums`` is ``w(P_avg, i)``; ``final_logp`` the log marginals of ``P_T`` (``d x |S|``)
    used for a warm start; ``selected`` / ``measurements`` the transcript ``i(t)``, ``mu_i(t)``.
    """

    average_sums: NDArray[np.float64]
    final_logp: NDArray[np.float64]
    selected: NDArray[np.int64]
    measurements: NDArray[np.float64]


def _normalise_log(logp: NDArray[np.float64]) -> NDArray[np.float64]:
    top = logp.max(axis=-1, keepdims=True)
    normalised: NDArray[np.float64] = logp - (
        top + np.log(np.exp(logp - top).sum(axis=-1, keepdims=True))
    )
    return normalised


def _check_core_args(
    column_sums: npt.ArrayLike, q: int, eps: float, iterations: int
) -> tuple[NDArray[np.float64], int, float, int]:
    count = _positive_int(q, "q")
    eps_value = _positive_float(eps, "eps")
    rounds = _positive_int(iterations, "iterations")
    sums = _real_array(column_sums, "column_sums").astype(np.float64)
    if sums.ndim != 1 or sums.size == 0:
        raise ValueError(f"column_sums must be a non-empty 1-D array, got shape {sums.shape}")
    if np.abs(sums).max() > count * (1.0 + _RANGE_TOLERANCE):
        raise ValueError(f"column_sums must lie in [-q, q] = [-{count}, {count}]")
    return sums, count, eps_value, rounds


def mwem_marginal_means(
    column_sums: npt.ArrayLike,
    q: int,
    eps: float,
    iterations: int,
    rng: np.random.Generator,
    eta: float,
    init_logp: npt.ArrayLike | None = None,
) -> MwemTrace:
    """Pure MWEM core of ``h2`` on known quantised column sums ``w(D_Q, i)`` (Algorithm 2).

    ``P`` is a product of per-coordinate marginals over ``S`` (Lemma 1), uniform at start or
    ``exp(init_logp)``. Per iteration, with ``w(P, i) = q * sum_s s P_i(s)``: select ``i(t)``
    with probability proportional to ``exp(eps * |w(P, i) - w(D_Q, i)|)`` (Gumbel-max, exact);
    measure ``mu = w(D_Q, i(t)) + Lap(1/eps)``; tilt ``P_i(t)(s)`` by
    ``exp(s (mu - w(P, i(t))) / (2q))`` in log space. Cost per iteration ``O(d + |S|)``.
    Accuracy (Theorem 4, Hardt et al. 2012): with probability ``>= 1 - 2T/d^c``,
    ``max_i |w(D_Q, i) - w(P_avg, i)| <= 2q sqrt(d log|S| / T) + (3c + 2) log(d) / eps``.
    Privacy: see :class:`MwemHash` (``2 * iterations`` mechanisms; ``q`` is public).
    """
    sums, count, eps_value, rounds = _check_core_args(column_sums, q, eps, iterations)
    grid = quantization_grid(eta)
    dim = sums.size
    if init_logp is None:
        logp = np.full((dim, grid.size), -math.log(grid.size))
    else:
        start = _real_array(init_logp, "init_logp").astype(np.float64)
        if start.shape != (dim, grid.size):
            raise ValueError(f"init_logp must have shape {(dim, grid.size)}, got {start.shape}")
        logp = _normalise_log(start)
    marginal_means = np.exp(logp) @ grid  # sum_s s P_i(s), kept up to date incrementally
    running = np.zeros(dim)
    selected = np.empty(rounds, dtype=np.int64)
    measurements = np.empty(rounds)
    for t in range(rounds):
        scores = np.abs(count * marginal_means - sums)
        chosen = int(np.argmax(eps_value * scores + rng.gumbel(size=dim)))
        measured = sums[chosen] + rng.laplace(0.0, 1.0 / eps_value)
        row = logp[chosen] + grid * ((measured - count * marginal_means[chosen]) / (2.0 * count))
        logp[chosen] = _normalise_log(row)
        marginal_means[chosen] = float(np.exp(logp[chosen]) @ grid)
        running += marginal_means
        selected[t] = chosen
        measurements[t] = measured
    return MwemTrace(count * running / rounds, logp, selected, measurements)


@dataclass(frozen=True, eq=False)
class H2Release:
    """One ``h2`` release: ``mean`` is ``sqrt(2/d) w(P_avg, i) / q``, the DP mean of the inputs.

    Only ``mean`` (with ``eps``, ``iterations`` and the public ``q``) may leave the curator.
    ``selected`` (``i(t)``) and ``measurements`` (the noisy ``mu``) are the private transcript,
    kept for tests and audits: it must NEVER be sent to an owner. The protocol (Algorithm 3) only
    ever broadcasts ``mean``, which is post-processing of the transcript; keep it that way.
    """

    mean: NDArray[np.float64]
    eps: float
    iterations: int
    q: int
    selected: NDArray[np.int64]
    measurements: NDArray[np.float64]

    def __post_init__(self) -> None:
        if self.mean.ndim != 1:
            raise ValueError(f"mean must be 1-D, got shape {self.mean.shape}")
        if self.selected.shape != (self.iterations,) or self.measurements.shape != (
            self.iterations,
        ):
            raise ValueError(f"transcript arrays must have shape ({self.iterations},)")
        for array in (self.mean, self.selected, self.measurements):
            array.setflags(write=False)


class MwemHash:
    """``h2`` of Algorithm 2: quantise ``h1`` vectors, then MWEM over coordinate marginals.

    Privacy. Neighbouring inputs differ by adding or removing one ``h1`` vector; the count ``q``
    is treated as public. A quantised vector lies in ``[-1, 1]^d``, so every column sum
    ``w(D_Q, i)`` has sensitivity 1, and so does every score ``psi_i = |w(P, i) - w(D_Q, i)|``
    (``P`` depends only on earlier private outputs). Selecting ``i(t)`` with probability
    proportional to ``exp(eps * psi_i)`` is the exponential mechanism at ``2 * eps`` (pure DP),
    and the measurement ``w(D_Q, i(t)) + Lap(1/eps)`` is ``eps``-DP. One :meth:`release`
    therefore runs ``2 * iterations`` mechanisms — ``iterations`` exponential mechanisms at
    ``2 eps`` and ``iterations`` Laplace mechanisms at ``eps`` — and the caller must record all of
    them in the privacy ledger. ``mean`` is post-processing. A warm start reuses ``P_T`` of the
    previous call, itself post-processing of earlier (already recorded) releases.

    Accuracy: see :func:`mwem_marginal_means` (Theorem 4) and :func:`quantize` (Lemma 2); Theorem 3
    bounds the expected max coordinate error of ``mean / sqrt(2/d)`` against the true mean.
    """

    def __init__(self, d: int, eta: float, warm_start: bool = False) -> None:
        self.d = _positive_int(d, "d")
        self.eta = float(eta)
        self.grid = quantization_grid(self.eta)
        self.warm_start = bool(warm_start)
        self._logp: NDArray[np.float64] | None = None

    @property
    def marginals(self) -> NDArray[np.float64] | None:
        """Copy of the carried-over marginals ``P_T`` (``d x |S|``), or None (cold state)."""
        return None if self._logp is None else np.exp(self._logp)

    def reset(self) -> None:
        """Forget carried-over marginals: the next release starts from the uniform ``P_0``."""
        self._logp = None

    def release(
        self, hashed: npt.ArrayLike, eps: float, iterations: int, rng: np.random.Generator
    ) -> H2Release:
        """Release the DP mean of ``hashed`` (``q x d`` ``h1`` vectors); see the class privacy.

        The state (warm-start marginals) changes only after a successful release.
        """
        vectors = _real_array(hashed, "hashed")
        if vectors.ndim != 2 or vectors.shape[1] != self.d:
            raise ValueError(f"hashed must have shape (q, {self.d}), got {vectors.shape}")
        count = _positive_int(vectors.shape[0], "q (rows of hashed)")
        eps_value = _positive_float(eps, "eps")
        rounds = _positive_int(iterations, "iterations")
        sums = quantize(vectors, self.eta, rng).sum(axis=0)
        start = self._logp if self.warm_start else None
        trace = mwem_marginal_means(sums, count, eps_value, rounds, rng, self.eta, start)
        if self.warm_start:
            self._logp = trace.final_logp
        mean = math.sqrt(2.0 / self.d) * trace.average_sums / count
        return H2Release(mean, eps_value, rounds, count, trace.selected, trace.measurements)

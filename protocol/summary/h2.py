"""h2 of the summarisation protocol (Sarpatwar et al. 2019, Section 3, Algorithm 2, App. B-C).

``h2`` (:class:`MwemHash`) releases a differentially private estimate of the mean of a set of
:mod:`.h1` vectors: each vector is scaled into ``[-1, 1]^d`` and stochastically rounded onto the
grid ``S = {-1, -1 + eta, ..., 1}`` (:func:`quantize`), then MWEM over the per-coordinate
marginals (the product form of Lemma 1, memory ``O(d / eta)``) fits a distribution whose
coordinate means match the noisy column sums.

Everything here is pure: randomness is a ``numpy.random.Generator`` argument, no global state,
no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from dpmarket.protocol.summary.h1 import positive_float, positive_int, real_array

__all__ = [
    "H2Release",
    "MwemHash",
    "MwemTrace",
    "mwem_marginal_means",
    "quantization_grid",
    "quantize",
]

_RANGE_TOLERANCE = 1e-5  # relative slack for float32 round-off at the ends of [-1, 1]


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
    vectors = real_array(V, "V")
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
    count = positive_int(q, "q")
    eps_value = positive_float(eps, "eps")
    rounds = positive_int(iterations, "iterations")
    sums = real_array(column_sums, "column_sums").astype(np.float64)
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
        start = real_array(init_logp, "init_logp").astype(np.float64)
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
        self.d = positive_int(d, "d")
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
        vectors = real_array(hashed, "hashed")
        if vectors.ndim != 2 or vectors.shape[1] != self.d:
            raise ValueError(f"hashed must have shape (q, {self.d}), got {vectors.shape}")
        count = positive_int(vectors.shape[0], "q (rows of hashed)")
        eps_value = positive_float(eps, "eps")
        rounds = positive_int(iterations, "iterations")
        sums = quantize(vectors, self.eta, rng).sum(axis=0)
        start = self._logp if self.warm_start else None
        trace = mwem_marginal_means(sums, count, eps_value, rounds, rng, self.eta, start)
        if self.warm_start:
            self._logp = trace.final_logp
        mean = math.sqrt(2.0 / self.d) * trace.average_sums / count
        return H2Release(mean, eps_value, rounds, count, trace.selected, trace.measurements)

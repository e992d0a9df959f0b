"""Locality-sensitive hash families for the RACE sketch (race-coleman2021, Section 2.3).

Every family draws ``rows`` independent hash functions from ``numpy.random.default_rng(seed)``
(the seed is public: every party holding it computes the same hashes) and hashes a batch
``X: float32[n, dim]`` to ``int32[n, rows]`` codes, one per row of the sketch. Its
``collision_probability`` is the kernel ``k(x, y) = P[l(x) = l(y)]`` in closed form
(Definition 2.4); ``kernel_sum(X, Q)`` is the exact LSH-kernel sum ``f_D(q)`` of Equation 1
that the sketch estimates.

* :class:`L2Lsh` -- p-stable Euclidean LSH, ``l(x) = floor((a.x + b)/r)``, ``a ~ N(0, I)``,
  ``b ~ U[0, r)``; at distance ``c`` the codes collide with probability
  ``1 - 2 Phi(-r/c) - 2/(sqrt(2 pi) r/c) (1 - exp(-r^2/(2 c^2)))`` (Datar et al. 2004).
* :class:`SrpLsh` -- signed random projections with ``bits`` sign bits per row; codes collide
  with probability ``(1 - theta/pi)^bits``, ``theta`` the angle between the points.

Both families share one parametrisation: ``projections: float32[dim, rows * bits]`` and
``offsets: float32[rows * bits]`` (``a/r`` and ``b/r`` for L2, so ``l(x) = floor(x.a' + b')``;
zeros for SRP), stacked as ``affine: float32[dim + 1, rows * bits]`` (offsets on top). The
projection of record ``x`` on column ``j`` is accumulated in float32 in the fixed order
``((b'_j + x_0 a'_0j) + x_1 a'_1j) + ...`` here and by the compiled kernels of
:mod:`dpmarket.streams.race.kernels`, so they produce identical codes. L2 codes are clamped to
``[-2^30, 2^30]``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

__all__ = [
    "CODE_LIMIT",
    "MAX_ABS_INPUT",
    "L2Lsh",
    "LshFamily",
    "SrpLsh",
    "as_points",
    "l2_collision_probability",
    "make_family",
    "srp_collision_probability",
]

CODE_LIMIT = 2**30  # L2 codes are clamped to [-CODE_LIMIT, CODE_LIMIT]
MAX_ABS_INPUT = 1e15  # larger coordinates are refused (records are clipped upstream)
MAX_PROJECTION_ENTRIES = 2**24  # dim * rows * bits: bounds the memory a peer's frame can ask for
_CHUNK_ELEMENTS = 1 << 22  # numpy fallback: projections computed in blocks of this many floats
_FLOAT32 = np.dtype(np.float32)

# Abramowitz & Stegun 7.1.26: |erf(z) - approx| <= 1.5e-7 for z >= 0.
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def as_points(X: npt.ArrayLike, dim: int, name: str = "X") -> NDArray[np.float32]:
    """``X`` as C-contiguous ``float32[n, dim]``; a 1-d ``(dim,)`` input becomes one row.

    Refuses non-finite values and coordinates above :data:`MAX_ABS_INPUT` in magnitude.
    """
    if type(X) is np.ndarray and X.dtype is _FLOAT32 and X.flags.c_contiguous:
        points: NDArray[np.float32] = X  # the fast path of single queries: no copy
    else:
        raw = np.asarray(X)
        if raw.dtype.kind not in "fiu":
            raise ValueError(f"{name} must be numeric, got dtype {raw.dtype}")
        points = np.ascontiguousarray(raw, dtype=np.float32)
    if points.ndim == 1:
        points = points.reshape(1, -1)
    if points.ndim != 2 or points.shape[1] != dim:
        raise ValueError(f"{name} must have shape (n, {dim}) or ({dim},), got {points.shape}")
    # Tiny inputs (single queries): a sum of magnitudes within the bound implies every one is,
    # and NaN fails the comparison; python floats are faster than numpy reductions here.
    small = points.size <= 64 and sum(map(abs, points.ravel().tolist())) <= MAX_ABS_INPUT
    if not small and points.size and not float(np.abs(points).max()) <= MAX_ABS_INPUT:
        if not bool(np.isfinite(points).all()):
            raise ValueError(f"{name} contains NaN or infinity")
        raise ValueError(f"{name} has a coordinate above {MAX_ABS_INPUT:g} in magnitude")
    return points


def _erf(z: NDArray[np.float64]) -> NDArray[np.float64]:
    """erf for z >= 0 (Abramowitz & Stegun 7.1.26, absolute error <= 1.5e-7)."""
    t = 1.0 / (1.0 + _AS_P * z)
    poly = t * (_AS_A[0] + t * (_AS_A[1] + t * (_AS_A[2] + t * (_AS_A[3] + t * _AS_A[4]))))
    result: NDArray[np.float64] = 1.0 - poly * np.exp(-z * z)
    return result


def l2_collision_probability(distance: npt.ArrayLike, bandwidth: float) -> NDArray[np.float64]:
    """P[l(x) = l(y)] of :class:`L2Lsh` at Euclidean ``distance`` (absolute error <= 3e-7).

    With ``s = r/c``: ``erf(s/sqrt 2) - 2/(sqrt(2 pi) s) (1 - exp(-s^2/2))``; 1 at ``c = 0``.
    """
    c = np.asarray(distance, dtype=np.float64)
    s = np.minimum(bandwidth / np.maximum(c, 1e-300), 1e8)  # beyond 1e8: 1 - 8e-9
    tail = -np.expm1(-0.5 * s * s) * (2.0 / math.sqrt(2.0 * math.pi)) / s
    prob = _erf(s / math.sqrt(2.0)) - tail
    return np.where(c > 0.0, np.clip(prob, 0.0, 1.0), 1.0)


def srp_collision_probability(cosine: npt.ArrayLike, bits: int) -> NDArray[np.float64]:
    """P[l(x) = l(y)] of :class:`SrpLsh`: ``(1 - arccos(cosine)/pi)^bits``."""
    theta = np.arccos(np.clip(np.asarray(cosine, dtype=np.float64), -1.0, 1.0))
    result: NDArray[np.float64] = (1.0 - theta / math.pi) ** bits
    return result


def _positive_int(value: object, name: str, upper: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if upper is not None and value > upper:
        raise ValueError(f"{name} must be at most {upper}, got {value!r}")
    return int(value)


class LshFamily(ABC):
    """``rows`` independent LSH functions of one family; subclasses set the kernel.

    ``mode`` 0 (floor codes, one projection per row) or 1 (``bits`` sign bits per row).
    Instances are immutable and compare equal when their public parameters are equal.
    """

    name: ClassVar[str] = ""
    mode: ClassVar[int] = 0

    def __init__(self, dim: int, rows: int, seed: int, bits: int) -> None:
        self.dim = _positive_int(dim, "dim")
        self.rows = _positive_int(rows, "rows")
        self.bits = _positive_int(bits, "bits", 30)
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.seed = int(seed)
        if self.dim * self.rows * self.bits > MAX_PROJECTION_ENTRIES:
            raise ValueError(
                f"dim * rows * bits = {self.dim * self.rows * self.bits} exceeds "
                f"{MAX_PROJECTION_ENTRIES}"
            )
        projections, offsets = self._draw(np.random.default_rng(self.seed))
        # offsets on top of the projections in one block: what the single-query kernel reads
        affine = np.vstack((offsets[None], projections)).astype(np.float32)
        affine.setflags(write=False)
        self.affine: NDArray[np.float32] = affine
        self.offsets: NDArray[np.float32] = affine[0]
        self.projections: NDArray[np.float32] = affine[1:]

    @abstractmethod
    def _draw(self, rng: np.random.Generator) -> tuple[NDArray[Any], NDArray[Any]]:
        """``(projections[dim, rows * bits], offsets[rows * bits])`` drawn from ``rng``."""

    def params(self) -> tuple[object, ...]:
        """The public parameters that define the hash functions."""
        return (self.name, self.dim, self.rows, self.seed, self.bits)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LshFamily):
            return NotImplemented
        return self.params() == other.params()

    def __hash__(self) -> int:
        return hash(self.params())

    def hash(self, X: npt.ArrayLike) -> NDArray[np.int32]:
        """Codes ``int32[n, rows]`` of the records ``X`` (``float32[n, dim]``), deterministic
        given the seed. The sketch's fused numba kernels compute the same codes."""
        points = as_points(X, self.dim)
        out = np.empty((points.shape[0], self.rows), dtype=np.int32)
        step = max(1, _CHUNK_ELEMENTS // (self.rows * self.bits))
        for start in range(0, points.shape[0], step):
            out[start : start + step] = self.codes(points[start : start + step])
        return out

    def codes(self, points: NDArray[np.float32]) -> NDArray[np.int32]:
        """Codes of a (small) block of points already checked by :func:`as_points`."""
        proj = np.empty((points.shape[0], self.projections.shape[1]), dtype=np.float32)
        proj[:] = self.offsets
        for k in range(self.dim):
            proj += points[:, k : k + 1] * self.projections[k]
        if self.mode == 0:
            np.clip(proj, -CODE_LIMIT, CODE_LIMIT, out=proj)
            return np.floor(proj).astype(np.int32)
        signs = (proj >= 0).reshape(points.shape[0], self.rows, self.bits).astype(np.int32)
        weights = np.left_shift(np.int32(1), np.arange(self.bits, dtype=np.int32))
        codes: NDArray[np.int32] = (signs * weights).sum(axis=2, dtype=np.int32)
        return codes

    def collision_probability(self, X: npt.ArrayLike, Y: npt.ArrayLike) -> NDArray[np.float64]:
        """Closed-form ``k(x_i, y_i)`` for paired rows of ``X`` and ``Y`` (``float64[n]``)."""
        xs = as_points(X, self.dim, "X").astype(np.float64)
        ys = as_points(Y, self.dim, "Y").astype(np.float64)
        if xs.shape != ys.shape:
            raise ValueError(f"X and Y must have equal shapes, got {xs.shape} and {ys.shape}")
        return self._kernel_matrix(xs[:, None, :], ys[:, None, :])[:, 0]

    def kernel_sum(
        self, X: npt.ArrayLike, Q: npt.ArrayLike, weights: npt.ArrayLike | None = None
    ) -> NDArray[np.float64]:
        """Exact ``f_D(q) = sum_x w_x k(x, q)`` (Equation 1) for every query row (``float64``).

        Costs ``O(n_x n_q dim)``; computed in blocks so memory stays bounded.
        """
        xs = as_points(X, self.dim, "X").astype(np.float64)
        qs = as_points(Q, self.dim, "Q").astype(np.float64)
        w = np.ones(xs.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
        if w.shape != (xs.shape[0],):
            raise ValueError(f"weights must have shape ({xs.shape[0]},), got {w.shape}")
        out = np.zeros(qs.shape[0])
        q_step = 256
        x_step = max(1, _CHUNK_ELEMENTS // (q_step * self.dim))
        for qs_start in range(0, qs.shape[0], q_step):
            q_block = qs[qs_start : qs_start + q_step]
            for xs_start in range(0, xs.shape[0], x_step):
                k = self._kernel_matrix(xs[xs_start : xs_start + x_step, None, :], q_block[None])
                out[qs_start : qs_start + q_step] += w[xs_start : xs_start + x_step] @ k
        return out

    @abstractmethod
    def _kernel_matrix(self, A: NDArray[np.float64], B: NDArray[np.float64]) -> NDArray[np.float64]:
        """Kernel between broadcast blocks ``A[:, None|1, dim]`` and ``B[None|1, :, dim]``."""


class L2Lsh(LshFamily):
    """p-stable Euclidean LSH with bandwidth ``r``: ``l(x) = floor((a.x + b)/r)``.

    Kernel: :func:`l2_collision_probability` of ``||x - y||`` (close to an exponential kernel
    of scale ``r``). Codes are unbounded integers; the sketch maps them to columns mod W.
    """

    name: ClassVar[str] = "l2"
    mode: ClassVar[int] = 0

    def __init__(self, dim: int, rows: int, bandwidth: float, seed: int) -> None:
        if isinstance(bandwidth, bool) or not isinstance(bandwidth, int | float):
            raise ValueError(f"bandwidth must be a number, got {bandwidth!r}")
        if not 1e-6 <= bandwidth <= 1e12:
            raise ValueError(f"bandwidth must be a number in [1e-6, 1e12], got {bandwidth!r}")
        self.bandwidth = float(bandwidth)
        super().__init__(dim, rows, seed, 1)

    def _draw(self, rng: np.random.Generator) -> tuple[NDArray[Any], NDArray[Any]]:
        a = rng.standard_normal((self.dim, self.rows)) / self.bandwidth
        b = rng.random(self.rows)
        return a, b

    def params(self) -> tuple[object, ...]:
        return (*super().params(), self.bandwidth)

    def __repr__(self) -> str:
        return (
            f"L2Lsh(dim={self.dim}, rows={self.rows}, bandwidth={self.bandwidth!r}, "
            f"seed={self.seed})"
        )

    def _kernel_matrix(self, A: NDArray[np.float64], B: NDArray[np.float64]) -> NDArray[np.float64]:
        distance = np.sqrt(((A - B) ** 2).sum(axis=-1))
        return l2_collision_probability(distance, self.bandwidth)


class SrpLsh(LshFamily):
    """Signed random projections, ``bits`` sign bits per row packed into codes in [0, 2^bits).

    Kernel: ``(1 - theta(x, y)/pi)^bits`` (:func:`srp_collision_probability`); a zero vector
    has all bits set, so it collides with any other point with probability ``2^-bits``.
    """

    name: ClassVar[str] = "srp"
    mode: ClassVar[int] = 1

    def __init__(self, dim: int, rows: int, bits: int, seed: int) -> None:
        super().__init__(dim, rows, seed, bits)

    def _draw(self, rng: np.random.Generator) -> tuple[NDArray[Any], NDArray[Any]]:
        planes = rng.standard_normal((self.dim, self.rows * self.bits))
        return planes, np.zeros(self.rows * self.bits)

    def __repr__(self) -> str:
        return f"SrpLsh(dim={self.dim}, rows={self.rows}, bits={self.bits}, seed={self.seed})"

    def _kernel_matrix(self, A: NDArray[np.float64], B: NDArray[np.float64]) -> NDArray[np.float64]:
        norm_a = np.sqrt((A * A).sum(axis=-1))
        norm_b = np.sqrt((B * B).sum(axis=-1))
        norms = norm_a * norm_b
        cosine = (A * B).sum(axis=-1) / np.where(norms > 0.0, norms, 1.0)
        kernel = srp_collision_probability(cosine, self.bits)
        both_zero = (norm_a == 0.0) & (norm_b == 0.0)
        return np.where(both_zero, 1.0, kernel)


def make_family(
    name: str, dim: int, rows: int, seed: int, *, bandwidth: float | None = None, bits: int = 1
) -> LshFamily:
    """Rebuild a family from its public parameters (as carried by the sketch's wire body)."""
    if name == L2Lsh.name:
        if bandwidth is None or bits != 1:
            raise ValueError(f"l2 family needs a bandwidth and bits=1, got {bandwidth!r}, {bits}")
        return L2Lsh(dim, rows, bandwidth, seed)
    if name == SrpLsh.name:
        if bandwidth is not None:
            raise ValueError(f"srp family takes no bandwidth, got {bandwidth!r}")
        return SrpLsh(dim, rows, bits, seed)
    raise ValueError(f"family must be 'l2' or 'srp', got {name!r}")

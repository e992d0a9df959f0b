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
zeros for SRP). The projection of record ``x`` on column ``j`` is accumulated in float32 in the
fixed order ``((b'_j + x_0 a'_0j) + x_1 a'_1j) + ...`` by both backends (numba kernel and numpy
fallback), so they produce identical codes. L2 codes are clamped to ``[-2^30, 2^30]``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

numba: Any
try:
    import numba
except ImportError:  # pragma: no cover - numba is a declared dependency
    numba = None

__all__ = [
    "BACKENDS",
    "CODE_LIMIT",
    "MAX_ABS_INPUT",
    "L2Lsh",
    "LshFamily",
    "SrpLsh",
    "as_points",
    "gather_sums",
    "insert_counts",
    "l2_collision_probability",
    "make_family",
    "resolve_backend",
    "srp_collision_probability",
]

BACKENDS = ("auto", "numba", "numpy")
CODE_LIMIT = 2**30  # L2 codes are clamped to [-CODE_LIMIT, CODE_LIMIT]
MAX_ABS_INPUT = 1e15  # larger coordinates are refused (records are clipped upstream)
MAX_PROJECTION_ENTRIES = 2**24  # dim * rows * bits: bounds the memory a peer's frame can ask for
_CHUNK_ELEMENTS = 1 << 22  # numpy fallback: projections computed in blocks of this many floats
_FLOAT32 = np.dtype(np.float32)

# Abramowitz & Stegun 7.1.26: |erf(z) - approx| <= 1.5e-7 for z >= 0.
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def resolve_backend(backend: str) -> str:
    """``"numba"`` or ``"numpy"`` for a requested backend (``"auto"``: numba when available)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "numba" and numba is None:
        raise ValueError("backend 'numba' requested but numba is not importable")
    if backend == "auto":
        return "numpy" if numba is None else "numba"
    return backend


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
        self.projections: NDArray[np.float32] = np.ascontiguousarray(projections, np.float32)
        self.offsets: NDArray[np.float32] = np.ascontiguousarray(offsets, np.float32)
        self.projections.setflags(write=False)
        self.offsets.setflags(write=False)

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


# ----------------------------------------------------- fused kernels: hash, then count/gather
# Both backends compute the projections in the float32 order of ``LshFamily.codes`` and map a
# code to column ``code mod W`` (a mask when W is a power of two, else an exact float
# reciprocal with a one-step correction), so their counts are identical.
def _insert_kernel(
    points_t: Any, projections: Any, offsets: Any, bits: int, mode: int, weights: Any, counts: Any
) -> None:  # pragma: no cover - compiled by numba
    """Add each record's weight to counter ``l_r(x) mod W`` of every row r; rows in parallel."""
    dim, n = points_t.shape
    rows, width = counts.shape
    lo, hi = np.float32(-CODE_LIMIT), np.float32(CODE_LIMIT)
    mask = width - 1
    inverse = 1.0 / width
    for r in numba.prange(rows):
        proj = np.empty(_BLOCK, dtype=np.float32)
        cols = np.empty(_BLOCK, dtype=np.int32)
        for start in range(0, n, _BLOCK):
            m = min(_BLOCK, n - start)
            for b in range(bits):
                c = r * bits + b
                for i in range(m):
                    proj[i] = offsets[c]
                for k in range(dim):
                    a = projections[k, c]
                    column = points_t[k, start : start + m]  # 1-d views vectorise, 2-d do not
                    for i in range(m):
                        proj[i] += column[i] * a
                if mode == 0:
                    for i in range(m):
                        v = min(max(proj[i], lo), hi)
                        code = np.int32(v)
                        cols[i] = code - np.int32(v < code)
                elif b == 0:
                    for i in range(m):
                        cols[i] = np.int32(proj[i] >= 0)
                else:
                    for i in range(m):
                        cols[i] |= np.int32(proj[i] >= 0) << b
            if (width & mask) == 0:
                for i in range(m):
                    cols[i] &= mask
            else:
                for i in range(m):
                    col = cols[i] - np.int32(np.float64(cols[i]) * inverse) * width
                    col = col + width if col < 0 else col
                    cols[i] = col - width if col >= width else col
            row = counts[r]
            if weights.shape[0] == 0:
                for i in range(m):
                    row[cols[i]] += 1
            else:
                for i in range(m):
                    row[cols[i]] += weights[start + i]


def _gather_kernel(
    queries: Any,
    projections: Any,
    offsets: Any,
    bits: int,
    mode: int,
    counts: Any,
    row_group: Any,
    out: Any,
) -> None:  # pragma: no cover - compiled by numba
    """``out[g, i] += S[r, l_r(q_i) mod W]`` for every row r of group g; query blocks in
    parallel. Three phases per query (projections, flat counter indices, gather) so that the
    first two vectorise and the gather issues independent loads."""
    n, dim = queries.shape
    rows, width = counts.shape
    lo, hi = np.float32(-CODE_LIMIT), np.float32(CODE_LIMIT)
    mask = width - 1
    inverse = 1.0 / width
    flat = counts.reshape(-1)
    for block in numba.prange((n + _QUERY_BLOCK - 1) // _QUERY_BLOCK):
        proj = np.empty(offsets.shape[0], dtype=np.float32)
        index = np.empty(rows, dtype=np.int64)
        for i in range(block * _QUERY_BLOCK, min(n, (block + 1) * _QUERY_BLOCK)):
            proj[:] = offsets
            for k in range(dim):
                qk = queries[i, k]
                weights = projections[k]
                for j in range(proj.shape[0]):
                    proj[j] += qk * weights[j]
            if mode == 0:
                for r in range(rows):
                    v = min(max(proj[r], lo), hi)
                    code = np.int32(v)
                    index[r] = code - np.int32(v < code)
            else:
                for r in range(rows):
                    code = np.int32(0)
                    for b in range(bits):
                        code |= np.int32(proj[r * bits + b] >= 0) << b
                    index[r] = code
            if (width & mask) == 0:
                for r in range(rows):
                    index[r] = r * width + (index[r] & mask)
            else:
                for r in range(rows):
                    col = index[r] - np.int64(np.float64(index[r]) * inverse) * width
                    col = col + width if col < 0 else col
                    index[r] = r * width + (col - width if col >= width else col)
            if out.shape[0] == 1:
                total = out[0, i]
                for r in range(rows):
                    total += flat[index[r]]
                out[0, i] = total
            else:
                for r in range(rows):
                    out[row_group[r], i] += flat[index[r]]


_BLOCK = 2048  # records per block of the insert kernel (fits in L1 with the row's counters)
_PARALLEL_FROM = 32  # query batches at least this large use the parallel gather kernel
_QUERY_BLOCK = 16  # queries per parallel task of the gather kernel
_COMPILED: dict[str, Any] = {}


def _compiled(name: str) -> Any:
    """A numba kernel compiled on first use: ``insert``, ``gather`` or ``gather_parallel``."""
    if name not in _COMPILED:
        source = _insert_kernel if name == "insert" else _gather_kernel
        # cache=True: numba keeps the compiled kernel in __pycache__ (its own cache, not a data
        # file of ours), so a new process does not pay the ~10 s compilation again
        kernel = numba.njit(parallel=name != "gather", boundscheck=False, cache=True)
        _COMPILED[name] = kernel(source)
    return _COMPILED[name]


def insert_counts(
    family: LshFamily,
    points: NDArray[np.float32],
    weights: NDArray[np.int64] | None,
    counts: NDArray[np.int64],
    backend: str,
) -> None:
    """``counts[r, l_r(x) mod W] += w_x`` for every checked record x and row r (in place)."""
    if backend == "numba":
        _compiled("insert")(
            np.ascontiguousarray(points.T), family.projections, family.offsets, family.bits,
            family.mode, np.zeros(0, dtype=np.int64) if weights is None else weights, counts,
        )  # fmt: skip
        return
    rows, width = counts.shape
    flat = counts.reshape(-1)
    row_offsets = np.arange(rows, dtype=np.int64) * width
    step = max(1, _CHUNK_ELEMENTS // rows)
    for start in range(0, points.shape[0], step):
        cols = np.mod(family.codes(points[start : start + step]), width)
        index = (cols + row_offsets).ravel()
        if weights is None:
            flat += np.bincount(index, minlength=rows * width)
        else:
            np.add.at(flat, index, np.repeat(weights[start : start + step], rows))


def mean_of_rows(
    family: LshFamily, points: NDArray[np.float32], counts: NDArray[Any], backend: str
) -> NDArray[np.float64] | None:
    """The "mean" estimate of a few checked query points through the compiled kernel with as
    little Python around it as possible (single-query latency); None when it does not apply
    (numpy backend, or a batch large enough for the parallel kernel)."""
    n = points.shape[0]
    if backend != "numba" or n >= _PARALLEL_FROM:
        return None
    out = np.zeros((1, n))
    kernel = _COMPILED.get("gather") or _compiled("gather")
    kernel(points, family.projections, family.offsets, family.bits, family.mode, counts,
           _NO_GROUPS, out)  # fmt: skip
    return np.asarray(out[0] / family.rows, dtype=np.float64)


_NO_GROUPS = np.zeros(0, dtype=np.int64)


def gather_sums(
    family: LshFamily,
    points: NDArray[np.float32],
    counts: NDArray[Any],
    row_group: NDArray[np.int64],
    groups: int,
    backend: str,
) -> NDArray[np.float64]:
    """``float64[groups, n]``: per query, the sum of ``counts[r, l_r(q) mod W]`` over the rows
    r of each group (``row_group`` maps a row to its group, contiguous groups; it is not read
    when ``groups == 1``)."""
    out = np.zeros((groups, points.shape[0]))
    if backend == "numba":
        name = "gather" if points.shape[0] < _PARALLEL_FROM else "gather_parallel"
        _compiled(name)(
            points, family.projections, family.offsets, family.bits, family.mode, counts,
            row_group, out,
        )  # fmt: skip
        return out
    rows, width = counts.shape
    starts = np.flatnonzero(np.diff(row_group, prepend=-1)) if groups > 1 else np.zeros(1, int)
    row_index = np.arange(rows)
    step = max(1, _CHUNK_ELEMENTS // rows)
    for start in range(0, points.shape[0], step):
        values = counts[row_index, np.mod(family.codes(points[start : start + step]), width)]
        out[:, start : start + step] = np.add.reduceat(values.astype(np.float64), starts, 1).T
    return out

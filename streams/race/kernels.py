"""Fused hash-and-count kernels of the RACE sketch: numba, with a numpy fallback.

Theory of operation
-------------------
Every kernel hashes and touches the counters in one pass: the projection of point ``x`` on
column ``j`` of a family's parameters is accumulated in float32 in the fixed order
``((b'_j + x_0 a'_0j) + x_1 a'_1j) + ...`` (the order of :meth:`LshFamily.codes`), a code maps
to column ``code mod W`` (a mask when W is a power of two, else an exact float reciprocal with a
one-step correction), so the numba kernels and the numpy fallback give identical counters and
identical query sums.

* :func:`insert_counts` -- ``counts[r, l_r(x) mod W] += w_x``; rows in parallel, records in
  blocks of column-major input.
* :func:`gather_sums` -- per query, the float64 sum (in row order) of ``counts[r, l_r(q) mod W]``
  over the rows of each group; query blocks in parallel for large batches.
* :func:`mean_of_one` -- the "mean" estimate of one query in one compiled call with four
  arguments (single-query latency). It sums in int64, which equals the float64 row-order sum of
  :func:`gather_sums` bit for bit whenever every partial sum is an integer of magnitude at most
  2^53; the kernel checks a bound that implies it (and checks the query) and otherwise answers
  "not applicable", so the caller takes the general path.

Numba is imported on the first compiled call, never at import: a process that only hashes
with numpy (an owner's agent installed without numba, docs/guide/remote.md) pays neither its
import nor its memory. ``"auto"`` decides per call, as in ski rental: numba once it is loaded
in this process; else numpy until this call's projection work (records x hash functions x
features) added to what numpy has already done here reaches :data:`NUMBA_FROM`, about half a
second of numpy, roughly what importing numba and loading its cached kernels costs; then numba
from then on. A process that hashes little (the owners of a small market, each scanning a few
hundred records once) never loads numba, about 0.8 CPU-seconds and 100 MB saved per process;
one that hashes a lot pays at most about twice the cheaper choice. Both backends give identical
counters, so the choice never changes a result. Kernels compile on first use with
``cache=True``: numba keeps the machine code in its own cache, the module's
``__pycache__`` where that is writable, else the per-user cache (``~/.cache/numba``, or
``NUMBA_CACHE_DIR``), so a later process loads the kernels instead of compiling them
(benchmarks/party_memory.py measures both).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpmarket.streams.race.lsh import CODE_LIMIT, MAX_ABS_INPUT, LshFamily

# the numba module once imported (the kernels' sources name it); None until then
numba: Any = None
_numba_missing = False  # the import was tried and failed: numpy from then on

__all__ = [
    "BACKENDS",
    "NUMBA_FROM",
    "gather_sums",
    "insert_counts",
    "mean_of_one",
    "numba_installed",
    "numba_ready",
    "resolve_backend",
    "use_numba",
    "would_use_numba",
]

BACKENDS = ("auto", "numba", "numpy")
# ``"auto"``: numpy's projection multiply-adds in a process before numba is loaded (module
# docstring): about 0.5 s of numpy on this project's 2-core machine, about what numba's import
# and cached kernels cost a new process
NUMBA_FROM = 1 << 28
_numpy_work = 0  # multiply-adds done with numpy under "auto" in this process
_CHUNK_ELEMENTS = 1 << 22  # numpy fallback: codes computed in blocks of this many values
_BLOCK = 2048  # records per block of the insert kernel (fits in L1 with the row's counters)
_PARALLEL_FROM = 32  # query batches at least this large use the parallel gather kernel
_QUERY_BLOCK = 16  # queries per parallel task of the gather kernel
_EXACT_SUM = 2**53  # integers up to this magnitude are exact float64 values
_FLOAT32 = np.dtype(np.float32)


def numba_installed() -> bool:
    """Whether numba can be imported here, importing it on the first ask (about 100 MB of
    memory and half a second: the market's install has it, an agent's need not)."""
    global numba, _numba_missing, _flat_indices_jit
    if numba is None and not _numba_missing:
        try:
            import numba as module
        except ImportError:
            _numba_missing = True
        else:  # the kernels below call it: compiled (or loaded from the cache) on first use
            numba = module
            _flat_indices_jit = module.njit(boundscheck=False, cache=True)(_flat_indices)
    return numba is not None


def _numba_findable() -> bool:
    """False where numba is known to be missing here (an import that failed, or one blocked by
    a None entry in ``sys.modules``), else True without importing it: ``"auto"`` tries numba
    when it pays and keeps numpy if the import fails."""
    if numba is not None:
        return True
    return not _numba_missing and not ("numba" in sys.modules and sys.modules["numba"] is None)


def resolve_backend(backend: str) -> str:
    """The backend a sketch keeps for a requested one: ``"numba"``, ``"numpy"``, or ``"auto"``
    (decided per call by :func:`use_numba`; ``"numpy"`` where numba is not installed)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "numba" and not numba_installed():
        raise ValueError(
            "backend 'numba' requested but numba is not installed (pip install 'dpmarket[numba]')"
        )
    if backend == "auto":
        return "auto" if _numba_findable() else "numpy"
    return backend


def numba_ready(backend: str) -> bool:
    """Whether a call under ``backend`` runs numba without loading it: ``"numba"``, or
    ``"auto"`` in a process where numba is already imported (by this module or another)."""
    if backend == "numba":
        return True
    if backend != "auto":
        return False
    if numba is None and sys.modules.get("numba") is not None:
        numba_installed()  # imported elsewhere in this process: free to use
    return numba is not None


def use_numba(backend: str, work: int) -> bool:
    """Whether a call of ``work`` projection multiply-adds runs numba (module docstring);
    under ``"auto"`` a numpy call's work is counted towards :data:`NUMBA_FROM`."""
    global _numpy_work
    if backend != "auto":
        return backend == "numba"
    if numba_ready(backend):
        return True
    if _numpy_work + work >= NUMBA_FROM and numba_installed():
        return True
    _numpy_work += work
    return False


def would_use_numba(work: int) -> bool:
    """Whether ``"auto"`` would run numba for a call of ``work`` here now (nothing counted):
    an owner's warm-up loads the kernels before a round only when the round would."""
    return numba_ready("auto") or (_numpy_work + work >= NUMBA_FROM and _numba_findable())


# ------------------------------------------------------------------- compiled kernel sources
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


def _flat_indices(
    proj: Any, bits: int, mode: int, width: int, index: Any
) -> None:  # pragma: no cover - compiled by numba
    """``index[r] = r W + (l_r mod W)`` from the projections of one point (compiled inline)."""
    rows = index.shape[0]
    lo, hi = np.float32(-CODE_LIMIT), np.float32(CODE_LIMIT)
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
    mask = width - 1
    if (width & mask) == 0:
        for r in range(rows):
            index[r] = r * width + (index[r] & mask)
    else:
        inverse = 1.0 / width
        for r in range(rows):
            col = index[r] - np.int64(np.float64(index[r]) * inverse) * width
            col = col + width if col < 0 else col
            index[r] = r * width + (col - width if col >= width else col)


_flat_indices_jit: Any = None  # njit of _flat_indices once numba is imported


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
            _flat_indices_jit(proj, bits, mode, width, index)
            if out.shape[0] == 1:
                total = out[0, i]
                for r in range(rows):
                    total += flat[index[r]]
                out[0, i] = total
            else:
                for r in range(rows):
                    out[row_group[r], i] += flat[index[r]]


def _mean_kernel(q: Any, affine: Any, counts: Any, mode: int) -> Any:  # pragma: no cover
    """Mean over rows of ``S[r, l_r(q) mod W]`` for one query ``q: float32[dim]``, or NaN when
    ``q`` has the wrong length or a coordinate that is NaN or above ``MAX_ABS_INPUT``, or when
    a counter of magnitude above ``2^53 / R`` is met (the int64 sum might then differ from the
    float64 row-order sum). ``affine``: ``float32[dim + 1, R bits]``, offsets then projections."""
    dim = affine.shape[0] - 1
    if q.shape[0] != dim:
        return np.nan
    for k in range(dim):
        if not abs(q[k]) <= MAX_ABS_INPUT:
            return np.nan
    rows, width = counts.shape
    proj = affine[0].copy()
    for k in range(dim):
        qk = q[k]
        weights = affine[k + 1]
        for j in range(proj.shape[0]):
            proj[j] += qk * weights[j]
    index = np.empty(rows, dtype=np.int64)
    _flat_indices_jit(proj, affine.shape[1] // rows, mode, width, index)
    flat = counts.reshape(-1)
    total = 0  # int64 in the kernel
    magnitudes = 0  # OR of |value|: >= the largest |value| (negative if |-2^63|)
    for r in range(rows):
        value = flat[index[r]]
        total += value
        magnitudes |= abs(value)
    if not 0 <= magnitudes <= _EXACT_SUM // rows:
        return np.nan
    return float(total) / rows


# ------------------------------------------------------------------------------ dispatching
_COMPILED: dict[str, Any] = {}
_SOURCES = {"insert": _insert_kernel, "gather": _gather_kernel, "mean": _mean_kernel}


def _compiled(name: str) -> Any:
    """A numba kernel compiled on first use: ``insert``, ``gather``, ``gather_parallel`` or
    ``mean``."""
    if name not in _COMPILED:
        if not numba_installed():
            raise ValueError("the numba kernels need numba (pip install 'dpmarket[numba]')")
        # cache=True: numba keeps the compiled kernel in its cache (module docstring), so a new
        # process does not pay the compilation again
        parallel = name in ("insert", "gather_parallel")
        kernel = numba.njit(parallel=parallel, boundscheck=False, cache=True)
        _COMPILED[name] = kernel(_SOURCES[name.removesuffix("_parallel")])
    return _COMPILED[name]


def insert_counts(
    family: LshFamily,
    points: NDArray[np.float32],
    weights: NDArray[np.int64] | None,
    counts: NDArray[np.int64],
    backend: str,
) -> None:
    """``counts[r, l_r(x) mod W] += w_x`` for every checked record x and row r (in place)."""
    if use_numba(backend, points.shape[0] * family.projections.size):
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


def mean_of_one(q: object, family: LshFamily, counts: NDArray[Any]) -> NDArray[np.float64] | None:
    """``float64[1]``: the "mean" estimate of one raw query through :func:`_mean_kernel`, equal
    to ``gather_sums(...)[0] / R`` bit for bit; None when the fast path does not apply (not a
    1-d float32 array, a query :func:`as_points` would refuse, or counters too large for an
    exact int64 sum): the caller then takes the checked general path, which raises if needed.
    """
    if type(q) is not np.ndarray or q.dtype is not _FLOAT32 or q.ndim != 1:
        return None
    kernel = _COMPILED.get("mean") or _compiled("mean")
    value = kernel(q, family.affine, counts, family.mode)
    if value != value:  # NaN: not applicable
        return None
    out = np.empty(1)
    out[0] = value
    return out


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
    if use_numba(backend, points.shape[0] * family.projections.size):
        name = "gather" if points.shape[0] < _PARALLEL_FROM else "gather_parallel"
        _compiled(name)(
            points, family.projections, family.offsets, family.bits, family.mode, counts,
            row_group, out,
        )  # fmt: skip
        return out
    rows, width = counts.shape
    starts = np.flatnonzero(np.diff(row_group, prepend=-1)) if groups > 1 else np.zeros(1, int)
    bounds = [*starts.tolist(), rows]
    row_index = np.arange(rows)[:, None]
    step = max(1, _CHUNK_ELEMENTS // rows)
    for start in range(0, points.shape[0], step):
        cols = np.mod(family.codes(points[start : start + step]), width).T
        values = counts[row_index, cols]  # [rows, queries]: a row's counters contiguous
        for g in range(groups):
            # row by row, as the compiled kernel adds (np.add.reduce and reduceat add pairwise,
            # which rounds differently once a partial sum is inexact: counters past 2^53 / R)
            total = out[g, start : start + step]
            for r in range(bounds[g], bounds[g + 1]):
                total += values[r]
    return out

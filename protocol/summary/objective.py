"""The MMD summarisation objective, its marginal gains, the owners' bid and the baselines.

Paper: summarization-sarpatwar2019, Section 2 (Eq. 1 and Eq. 3), Section 3 (Algorithm 3, line 6),
Appendix D (Lemma 3, Eq. 12) and Section 4 (the non-private greedy and uniform baselines).

Notation: ``V`` is the consumer's validation set (m rows), ``S`` the summary (q rows), ``k`` the
RBF kernel ``exp(-gamma ||x - y||^2)``. With ``A = sum_{v,s} k(v,s)``, ``B = sum_{s,s'} k(s,s')``,
``a(x) = sum_v k(v,x)`` and ``c(x) = sum_s k(x,s)``,

    J(S)     = 2A/(m q) - B/q^2                                             (Eq. 3)
    J(S + x) = 2(A + a(x))/(m(q+1)) - (B + 2c(x) + k(x,x))/(q+1)^2,

so one marginal gain costs O(m + q) kernel evaluations and all n candidates cost O(n(m + q)).

The owners' bid (PAPER-NOTES item 1): Algorithm 3 line 6 as printed has the sign flipped and the
``l/(l+1)`` weight on the wrong term. When the kernel is a dot product of features ``h`` (the
hashed kernel ``h1(x).h1(y)``) and ``g_v``, ``g_s`` are the MEANS of ``h`` over V and over S,

    J(S + x) - J(S) = 2/(q+1) * b(x) - k(x,x)/(q+1)^2 + C(S),
    b(x) = h(x) . (g_v - q/(q+1) * g_s),
    C(S) = 2A/(m(q+1)) - B/(q+1)^2 - J(S)      (independent of x; C = 0 when q = 0).

For the RBF kernel ``k(x,x) = 1`` for every x, so ranking candidates by ``b`` is ranking them by
the exact gain. The seed set is public and is excluded from ``S`` (PAPER-NOTES item 2).

All arithmetic is float64 and vectorised; nothing here draws randomness except
:func:`uniform_sample`, which takes its generator as an argument.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = [
    "bid_direction",
    "bid_to_gain",
    "greedy_exact",
    "greedy_hashed",
    "hashed_bids",
    "marginal_gains",
    "mmd2",
    "objective_j",
    "rbf_gram",
    "uniform_sample",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_CHUNK_ELEMENTS = 1 << 22
"""Largest kernel block (rows x columns) materialised at once by the row-sum helpers."""


def _as_matrix(
    name: str, X: npt.ArrayLike, n_features: int | None = None, keep_float32: bool = False
) -> FloatArray:
    """Return ``X`` as a finite float64 matrix, or raise ``ValueError`` naming ``name``. With
    ``keep_float32``, a float32 ``X`` (h1's hashes) stays float32: a pool of hashed points is
    the largest array a harness holds, and a float64 copy would double it. Finiteness is
    checked a block of rows at a time."""
    arr = np.asarray(X)
    if not (keep_float32 and arr.dtype == np.float32):
        arr = np.asarray(arr, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array, got shape {arr.shape}")
    if n_features is not None and arr.shape[1] != n_features:
        raise ValueError(f"{name} must have {n_features} columns, got {arr.shape[1]}")
    step = max(1, _CHUNK_ELEMENTS // max(arr.shape[1], 1))
    for i in range(0, arr.shape[0], step):
        if not np.all(np.isfinite(arr[i : i + step])):
            raise ValueError(f"{name} must contain only finite values")
    return arr  # float32 only where the caller asked to keep it


def _rows_dot(H: FloatArray, v: FloatArray) -> FloatArray:
    """``H @ v`` in float64; a float32 ``H`` is widened a block of rows at a time (exactly:
    every float32 is a float64), never whole."""
    if H.dtype == np.float64:
        return np.asarray(H @ v, dtype=np.float64)
    out = np.empty(H.shape[0], dtype=np.float64)
    step = max(1, _CHUNK_ELEMENTS // max(H.shape[1], 1))
    for i in range(0, H.shape[0], step):
        out[i : i + step] = H[i : i + step].astype(np.float64) @ v
    return out


def _check_gamma(gamma: float) -> float:
    if not (np.isfinite(gamma) and gamma > 0):
        raise ValueError(f"gamma must be a finite positive number, got {gamma!r}")
    return float(gamma)


def _gram(X: FloatArray, Y: FloatArray, gamma: float) -> FloatArray:
    """Unchecked RBF Gram matrix; squared distances are clipped at 0 against round-off."""
    sq = (X * X).sum(axis=1)[:, None] + (Y * Y).sum(axis=1)[None, :] - 2.0 * (X @ Y.T)
    np.maximum(sq, 0.0, out=sq)
    return np.asarray(np.exp(-gamma * sq), dtype=np.float64)


def rbf_gram(X: npt.ArrayLike, Y: npt.ArrayLike, gamma: float) -> FloatArray:
    """Exact RBF kernel matrix ``K[i, j] = exp(-gamma ||X_i - Y_j||^2)`` in float64.

    Entries are in (0, 1]; the error against the definition is round-off of the expansion
    ``|x|^2 + |y|^2 - 2 x.y`` (about 1e-15 relative to the squared norms).
    """
    g = _check_gamma(gamma)
    Xm = _as_matrix("X", X)
    return _gram(Xm, _as_matrix("Y", Y, Xm.shape[1]), g)


def _kernel_row_sums(X: FloatArray, Y: FloatArray, gamma: float) -> FloatArray:
    """``sum_j k(X_i, Y_j)`` for every row of X, in blocks of at most ``_CHUNK_ELEMENTS``."""
    out = np.zeros(X.shape[0], dtype=np.float64)
    if Y.shape[0] == 0:
        return out
    step = max(1, _CHUNK_ELEMENTS // Y.shape[0])
    for start in range(0, X.shape[0], step):
        out[start : start + step] = _gram(X[start : start + step], Y, gamma).sum(axis=1)
    return out


def mmd2(X: npt.ArrayLike, Y: npt.ArrayLike, gamma: float) -> float:
    """Biased (V-statistic) squared MMD of Eq. 1: all pairs, diagonals included.

    ``MMD^2 = mean k(X, X) - 2 mean k(X, Y) + mean k(Y, Y)``; it is >= 0 up to round-off because
    the RBF kernel is positive definite. Both sets must be non-empty.
    """
    g = _check_gamma(gamma)
    Xm = _as_matrix("X", X)
    Ym = _as_matrix("Y", Y, Xm.shape[1])
    if Xm.shape[0] == 0 or Ym.shape[0] == 0:
        raise ValueError(f"mmd2 needs non-empty sets, got {Xm.shape[0]} and {Ym.shape[0]} rows")
    xx = _kernel_row_sums(Xm, Xm, g).mean() / Xm.shape[0]
    yy = _kernel_row_sums(Ym, Ym, g).mean() / Ym.shape[0]
    xy = _kernel_row_sums(Xm, Ym, g).mean() / Ym.shape[0]
    return float(xx - 2.0 * xy + yy)


def objective_j(S: npt.ArrayLike, V: npt.ArrayLike, gamma: float) -> float:
    """Eq. 3: ``J(S) = 2/(m|S|) sum_{v,s} k(v,s) - 1/|S|^2 sum_{s,s'} k(s,s')``.

    Equals ``mean k(V, V) - MMD^2(V, S)``. By definition ``J`` of an empty summary is 0 (the
    greedy starts from there; the formula itself is undefined at ``|S| = 0``).
    """
    g = _check_gamma(gamma)
    Vm = _as_matrix("V", V)
    Sm = _as_matrix("S", S, Vm.shape[1])
    q, m = Sm.shape[0], Vm.shape[0]
    if m == 0:
        raise ValueError("V must have at least one row")
    if q == 0:
        return 0.0
    cross = _kernel_row_sums(Sm, Vm, g).sum()
    within = _kernel_row_sums(Sm, Sm, g).sum()
    return float(2.0 * cross / (m * q) - within / q**2)


def marginal_gains(
    candidates: npt.ArrayLike, S: npt.ArrayLike, V: npt.ArrayLike, gamma: float
) -> FloatArray:
    """Exact ``J(S + x) - J(S)`` for every candidate row x (Eq. 12 expansion), in float64.

    Each candidate is added on its own (a candidate equal to a member of S is counted twice, as a
    multiset). Cost O(n (|S| + m)) kernel evaluations; memory O(n) plus bounded kernel blocks.
    """
    g = _check_gamma(gamma)
    Vm = _as_matrix("V", V)
    Cm = _as_matrix("candidates", candidates, Vm.shape[1])
    Sm = _as_matrix("S", S, Vm.shape[1])
    if Vm.shape[0] == 0:
        raise ValueError("V must have at least one row")
    q, m = Sm.shape[0], Vm.shape[0]
    a = _kernel_row_sums(Cm, Vm, g)
    c = _kernel_row_sums(Cm, Sm, g)
    A = float(_kernel_row_sums(Sm, Vm, g).sum())
    B = float(_kernel_row_sums(Sm, Sm, g).sum())
    j_before = 0.0 if q == 0 else 2.0 * A / (m * q) - B / q**2
    j_after = 2.0 * (A + a) / (m * (q + 1)) - (B + 2.0 * c + 1.0) / (q + 1) ** 2
    return np.asarray(j_after - j_before, dtype=np.float64)


def _check_q(q: int) -> int:
    if isinstance(q, bool) or not isinstance(q, int | np.integer) or q < 0:
        raise ValueError(f"q must be a non-negative integer, got {q!r}")
    return int(q)


def bid_direction(g_validation: npt.ArrayLike, g_summary: npt.ArrayLike, q: int) -> FloatArray:
    """The vector ``g_v - q/(q+1) g_s`` every bid is an inner product with (see
    :func:`hashed_bids`). Owners compute it once per epoch and score all their hashed points
    with one matrix-vector product."""
    qq = _check_q(q)
    gv = _as_matrix("g_validation", np.reshape(g_validation, (1, -1)))[0]
    if qq == 0:
        return np.asarray(gv, dtype=np.float64)
    gs = _as_matrix("g_summary", np.reshape(g_summary, (1, -1)), gv.shape[0])[0]
    return np.asarray(gv - (qq / (qq + 1.0)) * gs, dtype=np.float64)


def hashed_bids(
    H: npt.ArrayLike, g_validation: npt.ArrayLike, g_summary: npt.ArrayLike, q: int
) -> FloatArray:
    """Corrected owner bid (PAPER-NOTES item 1): ``b(x) = h(x) . (g_v - q/(q+1) g_s)``.

    ``H`` holds one hashed point ``h1(x)`` per row; ``g_validation`` and ``g_summary`` are the
    MEANS of hashed vectors over D_v and over the summary S (seed set excluded), ``q = |S|``; at
    ``q = 0`` the summary term vanishes and ``g_summary`` is ignored. With exact means and the
    kernel ``h.h``, ``2/(q+1) b(x)`` is the marginal gain up to the terms listed in the module
    docstring (see :func:`bid_to_gain`).
    """
    qq = _check_q(q)
    Hm = _as_matrix("H", H)
    d = Hm.shape[1]
    gv = _as_matrix("g_validation", np.reshape(g_validation, (1, -1)), d)[0]
    if qq == 0:
        return np.asarray(Hm @ gv, dtype=np.float64)
    gs = _as_matrix("g_summary", np.reshape(g_summary, (1, -1)), d)[0]
    return np.asarray(Hm @ (gv - (qq / (qq + 1.0)) * gs), dtype=np.float64)


def bid_to_gain(bid: npt.ArrayLike, q: int, self_kernel: npt.ArrayLike = 1.0) -> FloatArray:
    """Hashed estimate of ``J(S + x) - J(S)`` from a bid: ``2/(q+1) b - k(x,x)/(q+1)^2``.

    The dropped term is ``C(S) = 2A/(m(q+1)) - B/(q+1)^2 - J(S)`` (module docstring), which is
    the same for every candidate, so gain DIFFERENCES and rankings are exact. ``self_kernel`` is
    ``k(x,x)``: 1 for the RBF kernel (the default); pass ``|h(x)|^2`` to be exact for a
    dot-product kernel. The map is strictly increasing in ``bid`` for a fixed ``self_kernel``.
    """
    qq = _check_q(q)
    b = np.asarray(bid, dtype=np.float64)
    kxx = np.asarray(self_kernel, dtype=np.float64)
    return np.asarray(2.0 / (qq + 1) * b - kxx / (qq + 1) ** 2, dtype=np.float64)


def _check_p(p: int, n: int) -> int:
    if isinstance(p, bool) or not isinstance(p, int | np.integer) or not 0 <= p <= n:
        raise ValueError(f"p must be an integer in [0, {n}] (the pool size), got {p!r}")
    return int(p)


def greedy_exact(pool: npt.ArrayLike, V: npt.ArrayLike, p: int, gamma: float) -> IntArray:
    """Non-private greedy on the exact RBF kernel: p pool indices, in the order picked.

    Each step adds the pool point of largest exact marginal gain (ties: lowest index), without
    replacement. Running sums ``a(x)`` (once) and ``c(x)`` (one kernel column per step) make the
    cost O(N (m + p)) kernel evaluations and the memory O(N) plus bounded kernel blocks.
    Nemhauser et al.: a (1 - 1/e) approximation where J is monotone submodular (Theorem 1).
    """
    g = _check_gamma(gamma)
    Vm = _as_matrix("V", V)
    P = _as_matrix("pool", pool, Vm.shape[1])
    k = _check_p(p, P.shape[0])
    if Vm.shape[0] == 0:
        raise ValueError("V must have at least one row")
    m = Vm.shape[0]
    a = _kernel_row_sums(P, Vm, g)
    c = np.zeros(P.shape[0], dtype=np.float64)
    norms = (P * P).sum(axis=1)
    A = B = 0.0
    taken = np.zeros(P.shape[0], dtype=bool)
    picks = np.empty(k, dtype=np.int64)
    for q in range(k):
        gain = 2.0 * (A + a) / (m * (q + 1)) - (B + 2.0 * c + 1.0) / (q + 1) ** 2
        gain[taken] = -np.inf
        best = int(np.argmax(gain))
        picks[q], taken[best] = best, True
        A += a[best]
        B += 2.0 * c[best] + 1.0
        c += np.exp(-g * np.maximum(norms + norms[best] - 2.0 * (P @ P[best]), 0.0))
    return picks


def greedy_hashed(H_pool: npt.ArrayLike, H_validation: npt.ArrayLike, p: int) -> IntArray:
    """Section 4's "non-private greedy": the protocol with exact hashed means instead of h2.

    Each step every pool point bids ``b(x) = h(x) . (g_v - q/(q+1) g_s)`` with the exact means
    ``g_v`` over ``H_validation`` and ``g_s`` over the summary so far (no seed set), and the
    highest bid wins (ties: lowest index), without replacement. Since ``bid_to_gain`` with
    ``k(x,x) = 1`` is increasing in the bid, this is greedy on the hashed kernel with the RBF
    self-kernel 1. Cost O(N d) per step.
    """
    Hv = _as_matrix("H_validation", H_validation)
    Hp = _as_matrix("H_pool", H_pool, Hv.shape[1], keep_float32=True)
    k = _check_p(p, Hp.shape[0])
    if Hv.shape[0] == 0:
        raise ValueError("H_validation must have at least one row")
    gv = Hv.mean(axis=0)
    summary_sum = np.zeros(Hv.shape[1], dtype=np.float64)
    taken = np.zeros(Hp.shape[0], dtype=bool)
    picks = np.empty(k, dtype=np.int64)
    for q in range(k):
        direction = gv if q == 0 else gv - summary_sum / (q + 1)
        bids = _rows_dot(Hp, direction)
        bids[taken] = -np.inf
        best = int(np.argmax(bids))
        picks[q], taken[best] = best, True
        summary_sum += Hp[best]
    return picks


def _quotas(counts: IntArray, p: int, rng: np.random.Generator) -> IntArray:
    """Water-filling: equal shares, remainder to random owners, full owners' deficit moved on."""
    quota = np.zeros(counts.shape[0], dtype=np.int64)
    remaining = p
    while remaining > 0:
        open_ = np.flatnonzero(quota < counts)
        share, extra = divmod(remaining, open_.shape[0])
        add = np.full(open_.shape[0], share, dtype=np.int64)
        add[rng.choice(open_.shape[0], size=extra, replace=False)] += 1
        add = np.minimum(add, counts[open_] - quota[open_])
        quota[open_] += add
        remaining -= int(add.sum())
    return quota


def uniform_sample(owner_of: npt.ArrayLike, p: int, rng: np.random.Generator) -> IntArray:
    """Section 4's uniform baseline: p pool indices, about p/K from each of the K owners.

    ``owner_of[i]`` is the owner id of pool row i (K = number of distinct ids). Every owner gets
    ``p // K``; the remainder goes to owners chosen at random; an owner with fewer points gives
    all of them and its deficit is spread over the others the same way. Rows are drawn without
    replacement; the result is sorted. Same generator state, same output.
    """
    owners = np.asarray(owner_of)
    if owners.ndim != 1 or not np.issubdtype(owners.dtype, np.integer):
        raise ValueError(f"owner_of must be a 1-D integer array, got {owners.dtype} {owners.shape}")
    k = _check_p(p, owners.shape[0])
    if k == 0:
        return np.empty(0, dtype=np.int64)
    _, inverse, counts = np.unique(owners, return_inverse=True, return_counts=True)
    quota = _quotas(counts.astype(np.int64), k, rng)
    order = np.argsort(inverse, kind="stable")
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    chosen = [
        order[start + rng.choice(count, size=want, replace=False)]
        for start, count, want in zip(starts, counts, quota, strict=True)
        if want > 0
    ]
    return np.sort(np.concatenate(chosen)).astype(np.int64)

"""Allocate by score histograms (issue 18): which owners hold the records that score best.

allocate-select's default allocation rule (``CuratorParams.allocation_rule = "histogram"``;
the earlier rule, ``"mixture"``, matches DP means in a public frame, protocol/summary/
allocate_mixture.py). The curator needs to know *where* the points worth buying are; an owner's mean
says little about that when the owner is small (its DP noise) or large (its mean hides a
minority of good records). Here each owner says how many of its records score how well.

Theory of operation
-------------------
* *Score* of a record x: ``s(x) = <h1(x) - c, u>``, with ``c`` the mean of h1 over the public
  seed set and u the unit vector along ``(S + lambda I)^-1 (g_tilde - c)``: how much more x
  resembles the consumer's (released) validation mean than the public seed set. S is the seed
  points' covariance in h1 space and ``lambda = ridge * trace(S) / (n_seed - 1)`` (``ridge``:
  ``CuratorParams.allocation_ridge``; trace(S) / (n_seed - 1) is S's mean non-zero eigenvalue
  when S has rank n_seed - 1, as in h1 space with d > n_seed; 0 keeps the raw direction
  ``g_tilde - c``). This is a ridge-regularised Fisher discriminant between the
  validation mean and the public seed distribution: it shrinks the directions along which
  public data already varies, where g_tilde's noise makes other kinds of records (on digits,
  2s, 8s and 9s) score like the consumer's, and keeps the directions the seed set does not
  explain. Public frame, built by :func:`score_frame` from public values only (g_tilde is a
  release; the seed set is public), so a post-processing with no privacy cost.
* *Bins*: the public edges ``mu + sd * SCORE_EDGES`` where mu and sd are the mean and standard
  deviation of the seed points' own scores (the unit in which "better than public data" is
  measured). An owner counts its records per bin (len(edges) + 1 bins).
* *Release* (:func:`owner_histogram`): the counts plus independent Gaussian noise of standard
  deviation ``z * sqrt(2)`` per bin, from the owner's own noise generator.
* *Allocation* (:func:`histogram_weights`), post-processing only: each noisy histogram is
  projected onto ``{h >= 0, sum h = n_i}`` (n_i is published; the Euclidean projection is the
  least-squares estimate under that constraint), counted from the top bin down, and the
  threshold is lowered until the owners' counts above it reach ``max_points`` (linear
  interpolation inside the last bin). Owner i's weight is its count above that threshold: the
  budget goes where the globally best-scoring records are. :func:`~.allocate.quotas` then
  rounds the weights (capped at n_i).

Privacy (what the ledger charges; neighbouring relation: replace one record of the owner, so
n_i is unchanged): replacing one record moves it from one bin to another, so the histogram has
L2 sensitivity sqrt(2) (whatever the edges, frame and g_tilde: they are public and fixed before
the release). Noise ``z sqrt(2)`` makes it the Gaussian mechanism with noise multiplier z,
charged once per owner as ``gaussian(sigma = z, sensitivity = 1)`` in units of sqrt(2): the
same event, and the same floor check by the owner, as the mixture rule's profile. The weights,
quotas and every later ask are post-processing of the histograms and g_tilde.

Validation release: this rule is planned with ``validation_center = "seed"``
(protocol/summary/releases.py): g_tilde is released around the public seed mean with a clip
from the seed set's spread, which spends the same epsilon on less noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

__all__ = [
    "SCORE_EDGES",
    "SCORE_RIDGE",
    "histogram_scale",
    "histogram_weights",
    "owner_histogram",
    "project_to_simplex",
    "score_frame",
]

F64 = npt.NDArray[np.float64]

SCORE_EDGES = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)
"""Bin edges in units of the seed set's score spread above its mean (public; 7 bins)."""

SCORE_RIDGE = 0.5
"""Default ``allocation_ridge``: lambda = 0.5 trace(S) / (n_seed - 1), half the seed covariance's
mean non-zero eigenvalue at full rank (chosen on digits tuning seeds 100-139; RESULTS.md
"parsimony", session 3)."""


def score_frame(
    g_tilde: npt.ArrayLike, H_seed: npt.ArrayLike, ridge: float = SCORE_RIDGE
) -> tuple[F64, F64, F64]:
    """The public score direction u (unit d-vector), center c (d) and the bin edges in raw
    score units (module docstring); ``ridge`` 0 keeps the raw direction ``g_tilde - c``."""
    g = np.asarray(g_tilde, dtype=np.float64)
    S = np.asarray(H_seed, dtype=np.float64)
    if S.ndim != 2 or len(S) < 2 or S.shape[1] != g.shape[0]:
        raise ValueError(f"need H_seed of shape (n >= 2, {g.shape[0]})")
    if not (np.isfinite(g).all() and np.isfinite(S).all()):
        raise ValueError("g_tilde and H_seed must be finite")
    if not (math.isfinite(ridge) and ridge >= 0):
        raise ValueError(f"ridge must be finite and >= 0, got {ridge!r}")
    center = S.mean(axis=0)
    u = g - center
    if ridge > 0:  # lambda (S + lambda I)^-1 u, through the seed's SVD (rank <= n_seed - 1)
        _, sv, vt = np.linalg.svd(S - center, full_matrices=False)
        variances = sv**2 / len(S)
        lam = ridge * float(variances.sum()) / (len(S) - 1)
        if lam > 0:  # inside the seed's span scaled by lambda / (s + lambda), outside kept
            inside = vt @ u
            u = vt.T @ (lam / (variances + lam) * inside) + (u - vt.T @ inside)
    norm = float(np.linalg.norm(u))
    if not (math.isfinite(norm) and norm > 0):
        raise ValueError("g_tilde equals the seed mean: no score direction")
    u = u / norm
    scores = (S - center) @ u
    spread = max(float(scores.std()), 1e-9)
    edges = float(scores.mean()) + spread * np.asarray(SCORE_EDGES, dtype=np.float64)
    return np.asarray(u, dtype=np.float64), np.asarray(center, dtype=np.float64), edges


def histogram_scale(noise_multiplier: float) -> float:
    """Standard deviation of each bin's noise: ``z * sqrt(2)`` (replace-one L2 sensitivity)."""
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise multiplier must be finite and > 0, got {noise_multiplier!r}")
    return noise_multiplier * math.sqrt(2.0)


def owner_histogram(
    HT: npt.ArrayLike,
    direction: npt.ArrayLike,
    center: npt.ArrayLike,
    edges: npt.ArrayLike,
    noise_multiplier: float,
    rng: np.random.Generator,
) -> F64:
    """The owner's DP score histogram (module docstring): counts of ``<h1(x) - c, u>`` in the
    bins of ``edges`` (bin j holds edges[j-1] <= s < edges[j]), plus Gaussian noise of standard
    deviation ``z sqrt(2)`` per bin. ``HT`` holds h1 rows as columns (d x n); ``rng`` must be
    the owner's secret noise generator."""
    H = np.asarray(HT, dtype=np.float64)
    u = np.asarray(direction, dtype=np.float64).ravel()
    c = np.asarray(center, dtype=np.float64)
    e = np.asarray(edges, dtype=np.float64)
    if H.ndim != 2 or u.shape != (H.shape[0],) or c.shape != (H.shape[0],):
        raise ValueError(f"HT, direction, center: shapes {H.shape}, {u.shape}, {c.shape} disagree")
    if e.ndim != 1 or not len(e) or not np.isfinite(e).all() or np.any(np.diff(e) <= 0):
        raise ValueError("edges: expected finite, strictly increasing values")
    if not abs(float(np.linalg.norm(u)) - 1.0) < 1e-6:
        raise ValueError("direction: the score direction must have norm 1")
    sigma = histogram_scale(noise_multiplier)
    scores = u @ (H - c[:, None]) if H.shape[1] else np.zeros(0)
    counts = np.bincount(np.searchsorted(e, scores, side="right"), minlength=len(e) + 1)
    return np.asarray(counts + rng.normal(0.0, sigma, size=len(e) + 1), dtype=np.float64)


def project_to_simplex(values: npt.ArrayLike, total: float) -> F64:
    """Euclidean projection of ``values`` onto ``{h >= 0, sum h = total}`` (total >= 0)."""
    v = np.asarray(values, dtype=np.float64)
    if total <= 0:
        return np.zeros_like(v)
    desc = np.sort(v)[::-1]
    excess = np.cumsum(desc) - total
    k = int(np.flatnonzero(desc - excess / np.arange(1, len(v) + 1) > 0)[-1])
    return np.asarray(np.maximum(v - excess[k] / (k + 1), 0.0), dtype=np.float64)


def histogram_weights(
    histograms: Mapping[str, npt.ArrayLike], records: Mapping[str, int], budget: int
) -> dict[str, float]:
    """Each owner's (expected) count of records above the highest score threshold at which
    the owners together hold ``budget`` records (module docstring). Keys sorted."""
    names = sorted(histograms)
    if not names:
        return {}
    rows = [project_to_simplex(histograms[o], max(0, int(records.get(o, 0)))) for o in names]
    if len({len(r) for r in rows}) != 1:
        raise ValueError("histograms: every owner must use the same bins")
    above = np.array([np.cumsum(r[::-1])[::-1] for r in rows])  # above[i, j]: bins j.. of i
    total = above.sum(axis=0)
    reach = np.flatnonzero(total >= budget)
    if not len(reach):  # fewer records than the budget: weight by all of them
        weights = above[:, 0]
    else:
        j = int(reach[-1])  # the highest threshold (bin edge) reaching the budget
        if j + 1 < above.shape[1] and total[j] > total[j + 1]:
            f = (budget - total[j + 1]) / (total[j] - total[j + 1])
            weights = above[:, j + 1] + f * (above[:, j] - above[:, j + 1])
        else:
            weights = above[:, j]
    return {o: float(w) for o, w in zip(names, weights, strict=True)}

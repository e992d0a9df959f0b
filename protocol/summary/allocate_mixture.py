"""Allocate by DP means in a public frame (issue 18): allocate-select's mixture rule.

allocate-select's earlier allocation rule (``CuratorParams.allocation_rule = "mixture"``; the
default rule, ``"histogram"``, counts an owner's records by score, protocol/summary/
allocate_rank.py). It fills in steps 1-2 of the theory of operation of protocol/summary/
allocate.py, which keeps the rest: the quotas, the floor, the hedge, local herding and the
curator's side of the cycle.

Theory of operation
-------------------
1. *Profile epoch* (epoch 1, ``EpochBody.profile_sigma > 0``). The curator sends a public
   frame (:func:`profile_frame`: k orthonormal directions spanned by g_tilde and the public seed
   set, a center, a radius r). Every owner maps each record to ``basis @ (h1(x) - center)``,
   clips that to norm r, and releases the mean over its ``n_i`` records plus Gaussian noise of
   standard deviation ``z * 2 r / n_i`` per coordinate (:func:`owner_profile`, drawn from the
   owner's own noise generator), with its record count ``n_i``.
2. *Allocation*, once: the curator finds mixing weights ``w >= 0``, ``sum w = 1``, that make
   ``sum_i w_i mu_i`` closest to g_tilde in the frame (non-negative least squares,
   :func:`mixing_weights`), averaged over re-noised copies of the releases
   (:func:`smoothed_weights`); :func:`~.allocate.quotas` then splits ``max_points`` in
   proportion to w, none above ``n_i``.

Privacy (what the ledger charges; neighbouring relation: replace one record of the owner, so
n_i is fixed and sending it reveals nothing under that relation, allocate.py):
* The profile: a mean of ``n_i`` vectors of norm <= r has L2 sensitivity ``2 r / n_i`` (the
  projection is a contraction and the clip bounds each vector); the noise is ``z`` times that,
  so the release is the Gaussian mechanism with noise multiplier z. Charged once to that
  owner's ledger as ``gaussian(sigma = z, sensitivity = 1)`` (both in units of ``2 r / n_i``),
  when the allocation is computed; a resumed profile epoch receives the owner's cached release
  again and charges nothing new. The curator sees only this DP mean. The frame is built from
  public values only (g_tilde is a release; the seed set is public).
* The weights are post-processing of the profiles and of g_tilde (the re-noising draws are
  public randomness, :func:`smoothing_generator`): no further charge to any party.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "PROFILE_CLIP_QUANTILE",
    "ProfileFrame",
    "mixing_weights",
    "owner_profile",
    "profile_frame",
    "profile_scale",
    "smoothed_weights",
]

F64 = npt.NDArray[np.float64]

SMOOTHING_DRAWS = 64
"""Re-noised solves averaged by :func:`smoothed_weights`."""

_SUM_WEIGHT = 10.0
"""Weight of the row ``sum w = 1`` appended to the least-squares problem (a soft simplex)."""


def profile_scale(noise_multiplier: float, clip: float, n_records: int) -> float:
    """Standard deviation of the profile noise: ``z * 2 r / n`` (replace-one sensitivity of a
    mean of n values of norm <= r = ``clip``)."""
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise multiplier must be finite and > 0, got {noise_multiplier!r}")
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be finite and > 0, got {clip!r}")
    return noise_multiplier * 2.0 * clip / max(1, int(n_records))


@dataclass(frozen=True)
class ProfileFrame:
    """Where a profile lives: ``basis`` (k x d, orthonormal rows), ``center`` (d) and the clip
    ``radius`` r of a record's coordinates ``basis @ (h1(x) - center)``. All public."""

    basis: F64
    center: F64
    radius: float


PROFILE_CLIP_QUANTILE = 0.9
"""The radius r is this quantile of the seed set's coordinate norms (public)."""


def profile_frame(g_tilde: npt.ArrayLike, H_seed: npt.ArrayLike, k: int) -> ProfileFrame:
    """The public frame of the profiles (:class:`ProfileFrame`), from public values only.

    Basis: spanned by g_tilde (released), the mean of h1 over the public seed set and its top
    principal directions, k rows. Center: the seed set's mean. Radius: the
    :data:`PROFILE_CLIP_QUANTILE` quantile of the seed points' coordinate norms. A record's
    coordinates are clipped to norm r, so replacing one record moves an owner's mean by at
    most ``2 r / n_i``; the noise then spreads over k coordinates instead of d, where the
    owners' means differ the most.
    """
    g = np.asarray(g_tilde, dtype=np.float64)
    S = np.asarray(H_seed, dtype=np.float64)
    if S.ndim != 2 or len(S) < 2 or S.shape[1] != g.shape[0] or k < 1:
        raise ValueError(f"need H_seed of shape (n >= 2, {g.shape[0]}) and k >= 1")
    center = S.mean(axis=0)
    _, _, Vt = np.linalg.svd(S - center, full_matrices=False)
    columns = np.column_stack([g, center, Vt.T])
    Q, R = np.linalg.qr(columns)
    keep = np.abs(np.diag(R)) > 1e-9 * max(1.0, float(np.abs(R).max()))
    basis = np.ascontiguousarray(Q[:, keep][:, :k].T, dtype=np.float64)
    norms = np.linalg.norm((S - center) @ basis.T, axis=1)
    radius = float(max(np.quantile(norms, PROFILE_CLIP_QUANTILE), 1e-6))
    return ProfileFrame(basis, center, radius)


def owner_profile(
    HT: npt.ArrayLike, frame: ProfileFrame, noise_multiplier: float, rng: np.random.Generator
) -> F64:
    """The owner's DP profile (module docstring): the mean over its records of
    ``basis @ (h1(x) - center)`` clipped to norm ``radius``, plus Gaussian noise of standard
    deviation ``z * 2 radius / n`` per coordinate. ``HT`` holds h1 rows as columns (d x n);
    with no records the mean is zero and the noise is that of n = 1. ``rng`` must be the
    owner's secret noise generator.
    """
    H = np.asarray(HT, dtype=np.float64)
    U, c = frame.basis, frame.center
    if H.ndim != 2 or U.ndim != 2 or U.shape[1] != H.shape[0] or c.shape != (H.shape[0],):
        raise ValueError(f"HT, basis, center: shapes {H.shape}, {U.shape}, {c.shape} disagree")
    if not np.allclose(U @ U.T, np.eye(len(U)), atol=1e-6):
        raise ValueError("basis: the rows must be orthonormal")
    n = H.shape[1]
    sigma = profile_scale(noise_multiplier, frame.radius, n)
    if n:
        Z = U @ (H - c[:, None])
        norms = np.linalg.norm(Z, axis=0)
        mean = (Z * np.minimum(1.0, frame.radius / np.maximum(norms, 1e-300))).mean(axis=1)
    else:
        mean = np.zeros(len(U))
    return np.asarray(mean + rng.normal(0.0, sigma, size=len(U)), dtype=np.float64)


def mixing_weights(
    profiles: Mapping[str, npt.ArrayLike], target: npt.ArrayLike
) -> dict[str, float]:
    """Weights ``w >= 0`` summing to one with ``sum_i w_i profile_i`` closest to ``target``.

    Non-negative least squares with the sum constraint as a heavily weighted extra row;
    uniform weights if the solver returns all zeros. Keys in sorted order.
    """
    names = sorted(profiles)
    if not names:
        return {}
    g = np.asarray(target, dtype=np.float64)
    M = np.column_stack([np.asarray(profiles[o], dtype=np.float64) for o in names])
    if M.shape[0] != g.shape[0] or not (np.isfinite(M).all() and np.isfinite(g).all()):
        raise ValueError("profiles and target must be finite vectors of one length")
    A = np.vstack([M, np.full((1, len(names)), _SUM_WEIGHT)])
    b = np.concatenate([g, [_SUM_WEIGHT]])
    from scipy.optimize import nnls  # on use: its import is ~50 MB an owner need not hold

    w, _ = nnls(A, b)
    total = float(np.sum(w))
    if not total > 0:
        return {o: 1.0 / len(names) for o in names}
    return {o: float(v) / total for o, v in zip(names, w, strict=True)}


def smoothing_generator(h1_seed: int) -> np.random.Generator:
    """The public generator of :func:`smoothed_weights`' re-noising: seeded by h1's public seed
    only (post-processing of released values; a resumed allocation draws the same)."""
    return np.random.default_rng([int(h1_seed) & (2**63 - 1), 18])


def smoothed_weights(
    profiles: Mapping[str, npt.ArrayLike],
    target: npt.ArrayLike,
    profile_sd: Mapping[str, float],
    target_sd: float,
    rng: np.random.Generator,
    draws: int = SMOOTHING_DRAWS,
) -> dict[str, float]:
    """:func:`mixing_weights` averaged over ``draws`` re-noised copies of the inputs.

    Each draw adds fresh Gaussian noise of the releases' own scales (``profile_sd`` per owner,
    ``target_sd`` for g_tilde) to every input and solves again: where the releases cannot tell
    owners apart, the weights spread over them instead of betting the whole budget on one.
    Post-processing of released values (``rng`` may be public).
    """
    names = sorted(profiles)
    total = dict.fromkeys(names, 0.0)
    g = np.asarray(target, dtype=np.float64)
    for _ in range(draws):
        noisy = {
            o: np.asarray(profiles[o], dtype=np.float64)
            + rng.normal(0.0, profile_sd[o], size=len(g))
            for o in names
        }
        w = mixing_weights(noisy, g + rng.normal(0.0, target_sd, size=len(g)))
        for o in names:
            total[o] += w[o] / draws
    return total

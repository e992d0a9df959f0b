"""Allocate, then select (issue 18): a parsimonious purchase of about ``max_points`` points.

Theory of operation
-------------------
With ``CuratorParams.allocate`` the run has three steps, and the curator never receives more
than ``max_points`` distinct owner points (protocol/summary/epochs.py enforces the budget):

1. *Profile epoch* (epoch 1, ``EpochBody.profile_sigma > 0``). Every owner clips each of its
   h1 rows to L2 norm ``clip`` and releases the mean over its ``n_i`` records with Gaussian
   noise of standard deviation ``z * 2 clip / n_i`` per coordinate (:func:`owner_profile`,
   drawn by the owner from its own noise generator; ``n_i`` is not sent).
2. *Allocation*, once: the curator finds mixing weights ``w >= 0``, ``sum w = 1``, that make
   ``sum_i w_i mu_i`` closest to g_tilde (non-negative least squares; :func:`mixing_weights`)
   and splits ``max_points`` into integer quotas in proportion to w (:func:`quotas`).
3. *Local herding*: in every later epoch the curator sends owner i (and only owner i) the exact
   mean of h1 over the points owner i has delivered so far and their count q_i; owner i bids by
   the usual rule ``h1(x) . (g_tilde - q_i/(q_i+1) g_i)``, i.e. kernel herding of its own
   points toward g_tilde, and is asked while its quota lasts (no auction). The curator's exact
   final selection (protocol/summary/selection.py) then keeps p of the purchased points.

Privacy (what the ledger charges; neighbouring relation: replace one record of the owner, n_i
fixed):
* The profile: the mean of ``n_i`` rows of norm <= clip has L2 sensitivity ``2 clip / n_i``;
  the noise is ``z`` times that, so the release is the Gaussian mechanism with noise multiplier
  z. Charged once to that owner's ledger as ``gaussian(sigma = z, sensitivity = 1)`` (both in
  units of ``2 clip / n_i``), when the allocation is computed; a resumed profile epoch receives
  the owner's cached release again and charges nothing new. The curator sees only this DP mean.
* The quotas, and hence every later ask, are post-processing of the profiles and of g_tilde:
  no further charge to any party. No auction runs (nothing charged per epoch).
* What owner i receives in a herding epoch (g_i, q_i, being asked) is a function of its own
  delivered points and of the quotas: nothing about another owner beyond the quotas.
* The points sold are the purchase itself, as in every mechanism: they are delivered to the
  curator in the clear (trusted mode) and are not a DP release; the budget bounds how many.
* g_tilde: the validation set's one Gaussian release (releases.py), charged there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import nnls

from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.summary.auction import TransferCounter
from dpmarket.protocol.summary.messages import EpochBody
from dpmarket.protocol.summary.params import CuratorParams
from dpmarket.protocol.summary.plan import gaussian_noise_multiplier
from dpmarket.protocol.summary.selection import PurchasedPool
from dpmarket.protocol.wire.errors import RemoteProtocolError

__all__ = [
    "AllocationCycle",
    "mixing_weights",
    "owner_profile",
    "plan_allocation",
    "profile_scale",
    "quotas",
]

F64 = npt.NDArray[np.float64]

_SUM_WEIGHT = 10.0
"""Weight of the row ``sum w = 1`` appended to the least-squares problem (a soft simplex)."""


def profile_scale(noise_multiplier: float, clip: float, n_records: int) -> float:
    """Standard deviation of the profile noise: ``z * 2 clip / n`` (replace-one sensitivity)."""
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise multiplier must be finite and > 0, got {noise_multiplier!r}")
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be finite and > 0, got {clip!r}")
    return noise_multiplier * 2.0 * clip / max(1, int(n_records))


def owner_profile(
    HT: npt.ArrayLike, clip: float, noise_multiplier: float, rng: np.random.Generator
) -> F64:
    """The owner's DP mean of its h1 rows (columns of the d x n ``HT``), module docstring.

    Each row is clipped to L2 norm ``clip``; with no records the mean is zero and the noise is
    that of n = 1. ``rng`` must be the owner's secret noise generator.
    """
    H = np.asarray(HT, dtype=np.float64)
    if H.ndim != 2:
        raise ValueError(f"HT: expected a d x n array, got shape {H.shape}")
    d, n = H.shape
    sigma = profile_scale(noise_multiplier, clip, n)
    if n:
        norms = np.linalg.norm(H, axis=0)
        factor = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
        mean = (H * factor).mean(axis=1)
    else:
        mean = np.zeros(d)
    return np.asarray(mean + rng.normal(0.0, sigma, size=d), dtype=np.float64)


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
    w, _ = nnls(A, b)
    total = float(np.sum(w))
    if not total > 0:
        return {o: 1.0 / len(names) for o in names}
    return {o: float(v) / total for o, v in zip(names, w, strict=True)}


def quotas(weights: Mapping[str, float], budget: int) -> dict[str, int]:
    """Split ``budget`` points into integers proportional to ``weights`` (largest remainder;
    ties to the smaller name). The quotas sum to ``budget``."""
    if budget < 0 or not weights:
        raise ValueError(f"need budget >= 0 and at least one owner, got {budget}, {weights}")
    names = sorted(weights)
    share = np.array([max(0.0, float(weights[o])) for o in names])
    share = share / share.sum() if share.sum() > 0 else np.full(len(names), 1.0 / len(names))
    exact = share * budget
    base = np.floor(exact).astype(np.int64)
    order = sorted(range(len(names)), key=lambda i: (-(exact[i] - base[i]), names[i]))
    for i in order[: budget - int(base.sum())]:
        base[i] += 1
    return {o: int(k) for o, k in zip(names, base, strict=True)}


def plan_allocation(
    eps_owner: float, delta: float, p: int, max_points: int | None = None
) -> dict[str, Any]:
    """CuratorParams overrides of allocate-select on top of a herding plan (plan.py).

    The profile is the only owner event of the run, so its noise multiplier is the one that
    spends ``eps_owner`` at ``delta`` (analytic Gaussian, a 1e-4 margin for the PLD's
    round-off); ``max_points`` defaults to ``ceil(1.5 p)``.
    """
    budget = math.ceil(1.5 * p) if max_points is None else int(max_points)
    if budget < p:
        raise ValueError(f"max_points must be >= p = {p}, got {budget}")
    return {
        "allocate": True,
        "allocation_sigma": gaussian_noise_multiplier(eps_owner * (1.0 - 1e-4), delta),
        "max_points": budget,
        "final_selection": "exact",
        "explore_share": 0.0,
    }


class AllocationCycle:
    """The curator's side of allocate-select (module docstring); state owned by the Curator."""

    params: CuratorParams
    owners: list[str]
    live: set[str]
    ledgers: dict[str, PrivacyLedger]
    pool: PurchasedPool
    transfers: TransferCounter
    _g_validation: F64
    profiles: dict[str, F64]
    quotas: dict[str, int] | None

    def _profiling(self, number: int) -> bool:
        """Epoch 1 of an allocate run collects the owners' DP profiles."""
        return self.params.allocate and number == 1

    def _epoch_body(
        self, owner: str, number: int, g_summary: F64, q: int, explore: bool
    ) -> EpochBody:
        """What ``owner`` receives when epoch ``number`` opens (or is re-sent on resume)."""
        p = self.params
        if not p.allocate:
            return EpochBody(g_summary, q, explore=explore)
        if number == 1:
            zeros = np.zeros(p.d)
            return EpochBody(zeros, 0, profile_sigma=p.allocation_sigma, profile_clip=p.clip_norm)
        g, q_own = self._own_direction(owner, number)
        return EpochBody(g, q_own)

    def _own_direction(self, owner: str, number: int) -> tuple[F64, int]:
        """Mean h1 of the points ``owner`` delivered before epoch ``number``, and their count."""
        rows = [e.hashed for e in self.pool.entries if e.owner == owner and e.epoch < number]
        if not rows:
            return np.zeros(self.params.d), 0
        H = np.asarray(rows, dtype=np.float64)
        return np.asarray(H.mean(axis=0), dtype=np.float64), len(rows)

    def _take_profile(self, owner: str, mean: npt.ArrayLike) -> None:
        """Keep ``owner``'s profile (the first one received counts; a resend is ignored)."""
        g = np.asarray(mean, dtype=np.float64)
        if g.shape != (self.params.d,) or not np.isfinite(g).all():
            raise RemoteProtocolError(
                f"summary.profile.mean: expected {self.params.d} finite values, got {g.shape}"
            )
        self.profiles.setdefault(owner, g)

    def _allocate(self) -> None:
        """Charge every profile received and fix the quotas (once)."""
        if self.quotas is not None:
            return
        p = self.params
        for owner in sorted(self.profiles):
            self.ledgers[owner].gaussian(
                p.allocation_sigma, 1.0, label="allocation profile: mean h1, sensitivity "
                "2 clip / n_i (units)", neighbouring="replace one record of this owner",
            )  # fmt: skip
        budget = p.max_points if p.max_points is not None else math.ceil(1.5 * p.p)  # checked
        weights = mixing_weights(self.profiles, self._g_validation) if self.profiles else {}
        for owner in self.owners:  # an owner without a profile gets no quota
            weights.setdefault(owner, 0.0)
        self.quotas = quotas(weights, budget)

    def _quota_left(self, owner: str) -> int:
        if self.quotas is None:
            return 0
        used = sum(1 for o, _ in self.transfers.deliveries if o == owner)
        return self.quotas.get(owner, 0) - used

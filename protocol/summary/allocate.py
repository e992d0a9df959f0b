"""Allocate, then select (issue 18): a parsimonious purchase of about ``max_points`` points.

Theory of operation -- with ``CuratorParams.allocate`` the run has three steps, and the curator
never receives more than ``max_points`` distinct owner points (protocol/summary/epochs.py
enforces the budget). The allocation rule (``allocation_rule``) fills in steps 1-2, each in its
own module with its privacy argument beside the code: the default ``"histogram"`` (DP score
histograms, allocate_rank.py) or the earlier ``"mixture"`` (DP means in a public frame and
non-negative mixing weights, allocate_mixture.py).

1. *Profile epoch* (epoch 1, ``EpochBody.profile_sigma > 0``). The curator sends a public
   frame, built from public values only; every owner releases one Gaussian DP profile of its
   records in that frame (drawn from the owner's own noise generator), with its record count
   ``n_i``.
2. *Allocation*, once: the curator turns the profiles into weights w (post-processing) and
   splits ``max_points`` into integer quotas in proportion to w, none above ``n_i``
   (:func:`quotas`). With ``allocation_floor`` f > 0, a share f of the weights goes to the
   owners in proportion to their counts n_i first (:func:`floored_weights`): an owner whose
   noisy release hides the records the consumer wants keeps about f n_i / N of the budget and
   herds its best points toward g_tilde (issue 30, the wine failure). With
   ``random_share`` s > 0 (the hedge; the plan's :data:`RANDOM_SHARE`: the budget beyond p),
   round(s max_points) points are split first as random-select splits its budget
   (random_select.py :func:`~.random_select.hedge_split`: quotas from the counts by the
   curator's coins) and the weights split only the rest, each owner capped at its records left.
3. *Random draws, then local herding*: an owner with a random quota first delivers that many
   records drawn uniformly by its secret key (``EpochBody.explore``, as random-select's owners
   do). Then, in every later epoch the curator sends owner i (and only owner i) the exact
   mean of h1 over the points owner i has delivered so far and their count q_i; owner i bids by
   the usual rule ``h1(x) . (g_tilde - q_i/(q_i+1) g_i)``, i.e. kernel herding of its own
   points toward g_tilde, and is asked while its quota lasts (no auction). The curator's exact
   final selection (protocol/summary/selection.py) then keeps p of the purchased points.

Privacy (what the ledger charges; neighbouring relation: replace one record of the owner, so
n_i is fixed and sending it reveals nothing under that relation; the run's one relation, so
every other release of the run, the secure sums included, is charged under it too. Under
``neighbouring = "add_remove"`` the exact n_i would be an unbounded release: CuratorParams
refuses allocate-select with it):
* The profile: the Gaussian mechanism with noise multiplier z, its sensitivity the rule's unit
  (``2 r / n_i`` for the mixture's mean, allocate_mixture.py; sqrt(2) for the histogram,
  allocate_rank.py). Charged once to that owner's ledger as ``gaussian(sigma = z,
  sensitivity = 1)`` in that unit, when the allocation is computed; a resumed profile epoch
  receives the owner's cached release again and charges nothing new. The curator sees only
  this DP release.
* The quotas, and hence every later ask, are post-processing of the profiles and of g_tilde
  (any re-noising draws are public randomness): no further charge to any party. The floor
  (``allocation_floor``) is a function of the counts n_i, fixed under replace-one: it spends
  nothing, so nothing is charged for it. The hedge's random quotas are a function of the same
  counts and of the curator's coins, and the records an owner draws for them a function of its
  own secret key: nothing about another owner's records, so nothing is charged for them either
  (random_select.py; a test finds the ledgers of a hedged run equal to an unhedged one's). No
  auction runs (nothing charged per epoch).
* What owner i receives in a herding epoch (g_i, q_i, being asked) is a function of its own
  delivered points and of the quotas: nothing about another owner beyond the quotas
  (tests/protocol/summary/test_allocate.py holds one owner's profile fixed, changes its
  records, and finds another owner's frames byte-identical).
* The points sold are the purchase itself, as in every mechanism: they are delivered to the
  curator in the clear (trusted mode) and are not a DP release; the budget bounds how many.
* The noise multiplier the curator sends is checked by the owner against the operator's floor
  (``CuratorParams.profile_floor``, given to the owner at construction, protocol/summary/
  owner.py): a lower one, or a profile the plan does not contain, is refused and nothing drawn.
* g_tilde: the validation set's one Gaussian release (releases.py), charged there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.summary.allocate_mixture import (
    ProfileFrame,
    profile_frame,
    profile_scale,
    smoothed_weights,
    smoothing_generator,
)
from dpmarket.protocol.summary.allocate_rank import SCORE_EDGES, histogram_weights, score_frame
from dpmarket.protocol.summary.auction import TransferCounter
from dpmarket.protocol.summary.messages import EpochBody
from dpmarket.protocol.summary.params import CuratorParams
from dpmarket.protocol.summary.plan import gaussian_noise_multiplier
from dpmarket.protocol.summary.random_select import hedge_split, random_quotas
from dpmarket.protocol.summary.releases import relation, validation_frame
from dpmarket.protocol.summary.selection import PurchasedPool
from dpmarket.protocol.wire.errors import RemoteProtocolError

__all__ = [
    "ALLOCATION_FLOOR",
    "RANDOM_SHARE",
    "AllocationCycle",
    "floored_weights",
    "plan_allocation",
    "quotas",
]

F64 = npt.NDArray[np.float64]


def floored_weights(
    weights: Mapping[str, float], records: Mapping[str, int], floor: float
) -> dict[str, float]:
    """``(1 - floor) w_i / sum w + floor n_i / sum n``: the share ``floor`` of the budget split in
    proportion to the owners' record counts (public under replace-one), the rest by ``weights``
    (normalised; all to the counts when every weight is zero). Keys of ``weights``."""
    if not (math.isfinite(floor) and 0 <= floor <= 1):
        raise ValueError(f"floor must be in [0, 1], got {floor!r}")
    names = sorted(weights)
    w = np.array([max(0.0, float(weights[o])) for o in names])
    n = np.array([max(0, int(records.get(o, 0))) for o in names], dtype=np.float64)
    if not n.sum() > 0:
        return {o: float(v) for o, v in zip(names, w, strict=True)}
    share = n / n.sum()
    steer = w / w.sum() if w.sum() > 0 else share
    out = (1.0 - floor) * steer + floor * share
    return {o: float(v) for o, v in zip(names, out, strict=True)}


def quotas(
    weights: Mapping[str, float], budget: int, caps: Mapping[str, int] | None = None
) -> dict[str, int]:
    """Split ``budget`` points into integers proportional to ``weights`` (largest remainder;
    ties to the smaller name), no owner above its cap (its record count): what a capped owner
    cannot supply goes to the others in proportion to their weights (water-filling; owners of
    weight zero share it equally when nobody else can take it). The quotas sum to
    ``min(budget, sum of caps)``."""
    if budget < 0 or not weights:
        raise ValueError(f"need budget >= 0 and at least one owner, got {budget}, {weights}")
    names = sorted(weights)
    cap = np.array([budget if caps is None else max(0, int(caps.get(o, 0))) for o in names])
    share = np.array([max(0.0, float(weights[o])) for o in names])
    out = np.zeros(len(names), dtype=np.int64)
    left = min(budget, int(cap.sum()))
    while left > 0:
        open_ = out < cap
        w = np.where(open_, share, 0.0)
        if not w.sum() > 0:
            w = open_.astype(np.float64)
        exact = w / w.sum() * left
        add = np.minimum(np.floor(exact).astype(np.int64), cap - out)
        if add.sum() == 0:  # hand out the remainder one by one, largest remainder first
            order = sorted(np.flatnonzero(open_), key=lambda i: (-(exact[i] % 1), names[i]))
            add[order[0]] = 1
        out += add
        left -= int(add.sum())
    return {o: int(k) for o, k in zip(names, out, strict=True)}


ALLOCATION_FLOOR = 0.0
"""Default ``allocation_floor`` of the plan: the share of ``max_points`` split by the owners'
record counts before the histograms split the rest (benchmarks/utility_vs_random.py)."""

RANDOM_SHARE: float | None = None
"""Default ``random_share`` of the plan: None, the budget beyond p, ``(max_points - p) /
max_points`` (a third at 1.5 p, two thirds at 3 p), bought uniformly at random (the hedge,
protocol/summary/random_select.py), while p points stay steered. Chosen on the tuning seeds of
benchmarks/utility_vs_random.py (0-2) and the issue 18 digits goal of benchmarks/parsimony.py
(RESULTS.md "utility_vs_random", session 2): a fixed 0.75 was as close to random-select's
floor but cut digits at p = 50, 1.5 p to 0.57 of the gap, this rule keeps it at 0.73."""


def plan_allocation(
    eps_owner: float,
    delta: float,
    p: int,
    max_points: int | None = None,
    rule: str = "histogram",
    floor: float = ALLOCATION_FLOOR,
    random_share: float | None = RANDOM_SHARE,
) -> dict[str, Any]:
    """CuratorParams overrides of allocate-select on top of a herding plan (plan.py); ``rule``
    "histogram" (allocate_rank.py, g_tilde centred on the seed mean) or "mixture".

    The profile is the only owner event of the run, so its noise multiplier is the one that
    spends ``eps_owner`` at ``delta`` (analytic Gaussian, a 1e-4 margin for the PLD's
    round-off); ``max_points`` defaults to ``ceil(1.5 p)``, and the epoch limit lets one owner
    deliver the whole budget; ``floor`` is ``allocation_floor`` (:func:`floored_weights`);
    ``random_share`` the hedge's random share (random_select.py :func:`hedge_split`); None:
    the budget beyond p, ``(max_points - p) / max_points`` (the steered part can still hold a
    whole summary, the rest is bought at random).
    """
    budget = math.ceil(1.5 * p) if max_points is None else int(max_points)
    if budget < p:
        raise ValueError(f"max_points must be >= p = {p}, got {budget}")
    return {
        "allocate": True,
        "allocation_rule": rule,
        "validation_center": "seed" if rule == "histogram" else "origin",
        "allocation_sigma": gaussian_noise_multiplier(eps_owner * (1.0 - 1e-4), delta),
        "max_points": budget,
        "allocation_floor": floor,
        "random_share": (budget - p) / budget if random_share is None else random_share,
        "final_selection": "exact",
        "explore_share": 0.0,
        "max_deliveries": 1,  # a re-delivery would add an uncharged, data-dependent epoch
        "max_epochs": budget + 10,  # one owner may hold the whole budget, one point per epoch
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
    _H_seed: npt.NDArray[np.float32]
    validation_size: int
    profiles: dict[str, F64]
    records: dict[str, int]
    quotas: dict[str, int] | None
    random_quotas: dict[str, int]  # the hedge's random part (random_select.py), within quotas
    _rng: np.random.Generator

    def _frame(self) -> ProfileFrame:
        """The public profile frame (:func:`profile_frame`), recomputed from public values."""
        cached: ProfileFrame | None = getattr(self, "_frame_cache", None)
        if cached is None:
            dims = min(self.params.allocation_dims, self.params.d)
            cached = profile_frame(self._g_validation, self._H_seed, dims)
            self._frame_cache = cached
        return cached

    def _profiling(self, number: int) -> bool:
        """Epoch 1 of an allocate run collects the owners' DP profiles."""
        return self.params.allocate and number == 1

    def _counting(self, number: int) -> bool:
        """Epoch 1 of a random-select run collects the owners' record counts
        (protocol/summary/random_select.py)."""
        return self.params.random_purchase and number == 1

    def _take_count(self, owner: str, records: int) -> None:
        """Keep ``owner``'s record count (the first one received counts)."""
        self.records.setdefault(owner, int(records))

    def _epoch_body(
        self, owner: str, number: int, g_summary: F64, q: int, explore: bool
    ) -> EpochBody:
        """What ``owner`` receives when epoch ``number`` opens (or is re-sent on resume)."""
        p = self.params
        if p.random_purchase:  # random_select.py: count, then uniform draws by the owners
            if number == 1:
                return EpochBody(np.zeros(p.d), 0, count=True)
            g, q_own = self._own_direction(owner, number)
            return EpochBody(g, q_own, explore=True)
        if not p.allocate:
            return EpochBody(g_summary, q, explore=explore)
        if number == 1 and p.allocation_rule == "histogram":  # allocate_rank.py
            u, c, edges = score_frame(self._g_validation, self._H_seed, p.allocation_ridge)
            return EpochBody(
                np.zeros(p.d), 0, profile_sigma=p.allocation_sigma, profile_clip=1.0,
                profile_basis=u, profile_center=c, profile_edges=edges,
            )  # fmt: skip
        if number == 1:
            frame = self._frame()
            return EpochBody(
                np.zeros(p.d), 0, profile_sigma=p.allocation_sigma, profile_clip=frame.radius,
                profile_basis=frame.basis.ravel(), profile_center=frame.center,
            )  # fmt: skip
        g, q_own = self._own_direction(owner, number)
        # the hedge (random_select.py): an owner's random quota first, drawn uniformly by its
        # secret key; a function of deliveries before this epoch, so a resend is the same
        return EpochBody(g, q_own, explore=q_own < self.random_quotas.get(owner, 0))

    def _own_direction(self, owner: str, number: int) -> tuple[F64, int]:
        """Mean h1 of the points ``owner`` delivered before epoch ``number``, and their count."""
        rows = [e.hashed for e in self.pool.entries if e.owner == owner and e.epoch < number]
        if not rows:
            return np.zeros(self.params.d), 0
        H = np.asarray(rows, dtype=np.float64)
        return np.asarray(H.mean(axis=0), dtype=np.float64), len(rows)

    def _take_profile(self, owner: str, mean: npt.ArrayLike, records: int) -> None:
        """Keep ``owner``'s profile (the first one received counts; a resend is ignored)."""
        g = np.asarray(mean, dtype=np.float64)
        histogram = self.params.allocation_rule == "histogram"
        k = len(SCORE_EDGES) + 1 if histogram else 0
        k = k or len(self._frame().basis)
        if g.shape != (k,) or not np.isfinite(g).all():
            raise RemoteProtocolError(
                f"summary.profile.mean: expected {k} finite values, got shape {g.shape}"
            )
        self.profiles.setdefault(owner, g)
        self.records.setdefault(owner, int(records))

    def _allocate(self) -> None:
        """Charge every profile received and fix the quotas (once)."""
        if self.quotas is not None:
            return
        p = self.params
        budget = p.max_points if p.max_points is not None else math.ceil(1.5 * p.p)  # checked
        if p.random_purchase:  # random_select.py: the curator's coins, no release, no charge
            counts = {o: self.records.get(o, 0) for o in self.owners}
            self.quotas = random_quotas(counts, budget, self._rng)
            return
        histogram = p.allocation_rule == "histogram"
        label = (
            "allocation score histogram, sensitivity sqrt(2) (units)" if histogram
            else "allocation profile: mean h1, sensitivity 2 clip / n_i (units)"
        )  # fmt: skip
        for owner in sorted(self.profiles):
            self.ledgers[owner].gaussian(
                p.allocation_sigma,
                1.0,
                label=label,
                neighbouring=relation(p),  # replace-one: allocate-select refuses add_remove
            )
        # the hedge (random_select.py): its random share from the public counts and the
        # curator's coins, no charge; the histograms or profiles split what is left
        counts = {o: self.records.get(o, 0) for o in self.owners}
        self.random_quotas, steered, caps = hedge_split(counts, budget, p.random_share, self._rng)
        weights = self._weights(steered) if self.profiles else {}
        for owner in self.owners:  # an owner without a profile gets no steered quota
            weights.setdefault(owner, 0.0)
        if p.allocation_floor > 0:  # the counts' share (public n_i): no charge
            weights = floored_weights(weights, self.records, p.allocation_floor)
        split = quotas(weights, steered, caps)
        self.quotas = {o: k + self.random_quotas.get(o, 0) for o, k in split.items()}

    def _weights(self, budget: int) -> dict[str, float]:
        """The owners' steering weights from their releases (post-processing, no charge)."""
        p = self.params
        if p.allocation_rule == "histogram":
            return histogram_weights(self.profiles, self.records, budget)
        frame = self._frame()
        target = frame.basis @ (self._g_validation - frame.center)
        sd = {
            o: profile_scale(p.allocation_sigma, frame.radius, self.records.get(o, 0))
            for o in self.profiles
        }
        v_clip = validation_frame(p, self._H_seed)[1]
        target_sd = p.validation_sigma * p.sensitivity * v_clip / self.validation_size
        public = smoothing_generator(p.h1_seed)
        return smoothed_weights(self.profiles, target, sd, target_sd, public)

    def _quota_left(self, owner: str) -> int:
        if self.quotas is None:
            return 0
        used = sum(1 for o, _ in self.transfers.deliveries if o == owner)
        return self.quotas.get(owner, 0) - used

"""Planning the release mechanisms (protocol/summary/releases.py, channels.py) at a privacy budget.

:func:`plan_releases` splits (eps_owner, eps_validation) at delta between the mechanisms that
run: the validation set's whole budget goes to its one Gaussian release; the owners' budget to
the auction and the summary releases, with noise multipliers solved numerically with the same
PLD ledger that later reports the run, so the reported epsilon cannot exceed the plan.
:func:`dimension_rule` picks d from m and the validation noise. With ``select`` the plan adds
exploration epochs and the curator's exact final selection (protocol/summary/selection.py):
neither is an event in any ledger, so the split is unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.summary.params import SUMMARY_RELEASES

__all__ = [
    "EXPLORE_SHARE",
    "HERDING_ASCENT_STEPS",
    "NOMINAL_EPS_AUCTION",
    "ReleasePlan",
    "dimension_rule",
    "gaussian_noise_multiplier",
    "plan_releases",
]


HERDING_ASCENT_STEPS = 30
"""Gradient steps per herding point in the plan (:class:`HerdingChannel`); on the digits split
they raised the gap closed at every p in {50, 100, 200} over 16 seeds (benchmarks/utility.py)."""

EXPLORE_SHARE = 1.0
"""Exploration points per summary point under ``select`` (:func:`plan_releases`)."""

NOMINAL_EPS_AUCTION = 1e-6
"""eps_auc charged per epoch when tau = 1 forces every bidder to be asked (the asked bit is then
constant and reveals nothing; the ledger still charges this nominal amount)."""


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _gaussian_delta(z: float, eps: float) -> float:
    """delta(eps) of a Gaussian mechanism with noise multiplier z (Balle & Wang 2018, Thm 8)."""
    return _phi(0.5 / z - eps * z) - math.exp(eps) * _phi(-0.5 / z - eps * z)


def _bisect(fits: Any, low: float, high: float, steps: int = 60) -> float:
    """Smallest x in [low, high] (geometric bisection) with fits(x) true; fits is monotone."""
    if not fits(high):
        raise ValueError(f"no value up to {high} meets the budget")
    for _ in range(steps):
        mid = math.sqrt(low * high)
        low, high = (low, mid) if fits(mid) else (mid, high)
    return high


def gaussian_noise_multiplier(eps: float, delta: float, count: int = 1) -> float:
    """z such that ``count`` Gaussian releases of multiplier z compose to (eps, delta)-DP.

    k Gaussians of multiplier z compose exactly to one of multiplier z / sqrt(k), so
    ``z = sqrt(count) z_1(eps, delta)``, z_1 from the analytic Gaussian mechanism.
    """
    if not (eps > 0 and 0 < delta < 1 and count >= 1):
        raise ValueError(f"need eps > 0, delta in (0, 1), count >= 1; got {eps}, {delta}, {count}")
    single = _bisect(lambda z: _gaussian_delta(z, eps) <= delta, 1e-3, 1e4)
    return math.sqrt(count) * single


def dimension_rule(
    m: int, noise_multiplier: float, clip_norm: float, bounds: tuple[int, int]
) -> int:
    """d so that the random-feature error of a bid stays under half its DP noise.

    The DP noise of ``h1(x) . g_tilde`` has standard deviation ``s = z clip_norm / m`` whatever d
    is; the random-feature error of a mean kernel value is about ``1/sqrt(2 d)``. Asking
    ``1/sqrt(2d) <= s/2`` gives ``d >= 2 / s^2``, rounded up to a multiple of 16 and clamped to
    ``bounds`` (memory and time grow linearly in d).
    """
    low, high = bounds
    if not (1 <= low <= high) or m < 1:
        raise ValueError(f"need 1 <= bounds[0] <= bounds[1] and m >= 1, got {bounds}, {m}")
    noise = noise_multiplier * clip_norm / m
    wanted = 16 * math.ceil(2.0 / noise**2 / 16)
    return int(min(high, max(low, wanted)))


@dataclass(frozen=True)
class ReleasePlan:
    """CuratorParams values that meet the budgets, and the planned per-owner event counts."""

    d: int
    clip_norm: float
    validation_sigma: float
    summary_release: str
    summary_sigma: float
    auction_variant: str
    eps_auction: float
    tau: int
    max_epochs: int
    summary_events: int
    neighbouring: str = "replace"
    max_deliveries: int = 3
    herding_ascent_steps: int = 0
    final_selection: str = "none"
    explore_share: float = 0.0

    def overrides(self) -> dict[str, Any]:
        """Keyword arguments for ``dataclasses.replace(CuratorParams(...), **overrides)``."""
        names = ("d", "clip_norm", "validation_sigma", "summary_release", "summary_sigma")
        out: dict[str, Any] = {name: getattr(self, name) for name in names}
        out.update(
            validation_release="gaussian",
            auction_variant=self.auction_variant,
            eps_auction=self.eps_auction,
            tau=self.tau,
            max_epochs=self.max_epochs,
            neighbouring=self.neighbouring,
            max_deliveries=self.max_deliveries,
            herding_ascent_steps=self.herding_ascent_steps,
            final_selection=self.final_selection,
            explore_share=self.explore_share,
        )
        return out


def _owner_epsilon(
    z: float | None, events: int, delta_l2: float, eps_auc: float, epochs: int, delta: float
) -> float:
    ledger = PrivacyLedger("plan")
    ledger.auction(eps_auc, "pure", count=epochs)
    if z is not None and events:
        ledger.gaussian(z * delta_l2, delta_l2, count=events)
    return ledger.epsilon(delta)


def plan_releases(
    p: int,
    m: int,
    n_owners: int,
    eps_owner: float = 1.0,
    eps_validation: float = 3.0,
    delta: float = 1e-5,
    summary: str = "herding",
    auction: str = "all",
    replace: bool = True,
    d_bounds: tuple[int, int] = (64, 256),
    auction_share: float = 0.5,
    select: bool = False,
    explore_share: float = EXPLORE_SHARE,
) -> ReleasePlan:
    """Split (eps_owner, eps_validation) at delta between the mechanisms that run.

    Validation: its only release, one Gaussian at eps_validation. Owners: ``max_epochs = 2p + 10``
    auction steps of the pure variant; ``auction="all"`` sets tau = 1 (every bidder asked, the
    asked bit carries no information; charged :data:`NOMINAL_EPS_AUCTION`), ``"pure"`` solves
    eps_auc so the auction alone spends ``auction_share`` of eps_owner (all of it when the
    summary release is free). The summary releases ("gaussian": p - 1 events; "tree":
    ``(p - 1).bit_length()`` levels) take the rest: their multiplier is the smallest that keeps
    the composed PLD epsilon within eps_owner. "herding" costs owners nothing; it withdraws a
    point after one delivery (``max_deliveries = 1``, module docstring), the others after three,
    and moves each virtual point by :data:`HERDING_ASCENT_STEPS` gradient steps.

    ``replace`` (the default): charge and calibrate under replace-one neighbours (sensitivity
    2 clip of every released sum: m and p are public, protocol/summary/releases.py); ``False``
    gives the
    paper's add/remove accounting with public counts, which under-charges.

    ``select``: oversample, then select (protocol/summary/selection.py): the run opens with
    ``ceil(explore_share p / n_owners)`` exploration epochs (every owner asked for a uniformly
    drawn point: about ``explore_share p`` points, no ledger event; they come on top of
    ``max_epochs``, which bounds the steering epochs whatever K turns out to be) and returns the
    p purchased points exact greedy picks against D_v (no ledger event: never sent to an owner).
    """
    if summary not in SUMMARY_RELEASES[1:] or auction not in ("all", "pure"):
        raise ValueError(f"summary must be gaussian, tree or herding and auction all or pure, got "
                         f"{summary!r}, {auction!r}")  # fmt: skip
    if p < 2 or m < 1 or n_owners < 1 or not (0 < auction_share < 1):
        raise ValueError("need p >= 2, m >= 1, n_owners >= 1, 0 < auction_share < 1")
    if not (math.isfinite(explore_share) and explore_share >= 0):
        raise ValueError(f"explore_share must be a finite number >= 0, got {explore_share!r}")
    sensitivity = 2.0 if replace else 1.0
    clip = 1.1
    z_v = gaussian_noise_multiplier(eps_validation * (1.0 - 1e-4), delta)  # PLD round-off margin
    d = dimension_rule(m, z_v, clip * sensitivity, d_bounds)
    clip = min(math.sqrt(2.0), 1.0 + 2.0 / math.sqrt(2.0 * d))  # 4 sd of ||h1|| above 1
    delta_l2 = clip * sensitivity
    epochs = 2 * p + 10  # steering epochs, one auction step each (exploration: none, extra)
    events = {"gaussian": p - 1, "tree": (p - 1).bit_length(), "herding": 0}[summary]
    if auction == "all":
        tau, eps_auc = 1, NOMINAL_EPS_AUCTION
    else:
        tau = math.ceil(n_owners ** (2.0 / 3.0))
        share = eps_owner * (auction_share if events else 0.999)
        eps_auc = 1.0 / _bisect(
            lambda inv: _owner_epsilon(None, 0, 1.0, 1.0 / inv, epochs, delta) <= share,
            1.0,
            1e7,
            30,
        )
    z_s = 1.0
    if events:
        z_s = _bisect(
            lambda z: _owner_epsilon(z, events, delta_l2, eps_auc, epochs, delta) <= eps_owner,
            0.1, 1e4, steps=26,
        )  # fmt: skip
    relation = "replace" if replace else "add_remove"
    herding = summary == "herding"
    return ReleasePlan(
        d, clip, z_v, summary, z_s, "pure", eps_auc, tau, epochs, events, relation,
        max_deliveries=1 if herding else 3,
        herding_ascent_steps=HERDING_ASCENT_STEPS if herding else 0,
        final_selection="exact" if select else "none",
        explore_share=explore_share if select else 0.0,
    )  # fmt: skip

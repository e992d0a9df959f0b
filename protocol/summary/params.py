"""Public parameters of one summarisation run (:class:`CuratorParams`) and the names they accept.

Everything here is public: it is sent to owners (the h1 parameters, tau, max_deliveries), written
into report.json and journaled. Defaults are the paper's Table 1 where it has one; the release
mechanisms of protocol/summary/releases.py (g_tilde) and protocol/summary/channels.py (g_l) are
selected by name, from the tuples below. Validation happens at construction, and an invalid
field is named in the error.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpmarket.protocol.summary.selection import FINAL_SELECTIONS
from dpmarket.protocol.wire.checks import MAX_ARRAY_BYTES

__all__ = [
    "ALLOCATION_RULES",
    "CANDIDATE_DISTRIBUTIONS",
    "MARKET_MECHANISMS",
    "MAX_D",
    "SUMMARY_RELEASES",
    "VALIDATION_CENTERS",
    "VALIDATION_RELEASES",
    "CuratorParams",
    "ParamError",
]

VALIDATION_RELEASES = ("mwem", "gaussian")
SUMMARY_RELEASES = ("mwem", "gaussian", "tree", "herding")
CANDIDATE_DISTRIBUTIONS = ("gaussian", "uniform")
ALLOCATION_RULES = ("mixture", "histogram")
VALIDATION_CENTERS = ("origin", "seed")
MARKET_MECHANISMS = ("herding-select", "allocate-select", "random-select")
"""The purchase mechanisms a market config names (``[summary].mechanism``, actors/config/
inputs.py): herding-select (steered epochs with exploration, then the exact selection; the
default without ``max_points``), allocate-select (``allocate``: owners' DP score histograms split
``max_points``, protocol/summary/allocate.py) and random-select (``random_purchase``:
``max_points`` points bought uniformly at random, protocol/summary/random_select.py); the last
two keep the curator's exact final selection of p (protocol/summary/selection.py)."""


# The largest d: g_tilde, g_l and a hashed point are d-vectors of float64 in one frame.
MAX_D = MAX_ARRAY_BYTES // 8


class ParamError(ValueError):
    """An invalid :class:`CuratorParams` field; ``field`` names it (the config layer maps it to
    the key a user wrote)."""

    def __init__(self, field: str, detail: str, passing: tuple[str, Any] | None = None) -> None:
        super().__init__(f"CuratorParams.{field}: {detail}")
        self.field, self.detail = field, detail
        # (field, value) that would pass this check, when one value does
        self.passing = passing


# field -> (kind, low, high, low_open, optional): "int" is an integer in [low, high]; "real" a
# finite number in [low, high] ((low, high] with low_open); "bool"; a tuple: one of its names.
_Spec = tuple[Any, float, float, bool, bool]
_INF = math.inf
_FIELD_CHECKS: dict[str, _Spec] = {
    "p": ("int", 1, _INF, False, False),
    "d": ("int", 1, _INF, False, False),
    "gamma": ("real", 0, _INF, True, False),
    "h1_seed": ("int", 0, 2**64 - 1, False, False),
    "eps_validation": ("real", 0, _INF, True, False),
    "validation_iterations": ("int", 1, _INF, False, False),
    "seed_iterations": ("int", 1, _INF, False, False),
    "eps_seed": ("real", 0, _INF, True, False),
    "eps_summary": ("real", 0, _INF, True, False),
    "summary_iterations": ("int", 1, _INF, False, False),
    "eta": ("real", 0, 2, True, True),
    "warm_start": ("bool", 0, 0, False, False),
    "allocate": ("bool", 0, 0, False, False),
    "random_purchase": ("bool", 0, 0, False, False),
    "allocation_floor": ("real", 0, 1, False, False),
    "random_share": ("real", 0, 1, False, False),
    "eps_auction": ("real", 0, _INF, True, False),
    "auction_variant": (("paper", "pure"), 0, 0, False, False),
    "tau": ("int", 1, _INF, False, False),
    "phase_timeout": ("real", 0, _INF, True, False),
    "max_epochs": ("int", 1, _INF, False, True),
    "less_trusted": ("bool", 0, 0, False, False),
    "verify_tolerance": ("real", 0, _INF, False, False),
    "neighbouring": (("add_remove", "replace"), 0, 0, False, False),
    "max_deliveries": ("int", 1, _INF, False, False),
    "max_lost": ("int", 0, _INF, False, True),
    "known_colluders": ("int", 0, _INF, False, False),
    "validation_release": (VALIDATION_RELEASES, 0, 0, False, False),
    "summary_release": (SUMMARY_RELEASES, 0, 0, False, False),
    "validation_sigma": ("real", 0, _INF, True, False),
    "summary_sigma": ("real", 0, _INF, True, False),
    "clip_norm": ("real", 0, math.sqrt(2.0) + 1e-12, True, False),
    "n_candidates": ("int", 1, MAX_D, False, False),
    "candidate_distribution": (CANDIDATE_DISTRIBUTIONS, 0, 0, False, False),
    "candidate_center": ("real", -_INF, _INF, False, False),
    "candidate_scale": ("real", 0, _INF, True, False),
    "herding_residual_weight": ("real", 0, _INF, False, False),
    "herding_ascent_steps": ("int", 0, _INF, False, False),
    "final_selection": (FINAL_SELECTIONS, 0, 0, False, False),
    "explore_share": ("real", 0, _INF, False, False),
    "max_points": ("int", 1, _INF, False, True),
    "allocation_sigma": ("real", 0, _INF, True, False),
    "allocation_dims": ("int", 1, _INF, False, False),
    "allocation_rule": (ALLOCATION_RULES, 0, 0, False, False),
    "allocation_ridge": ("real", 0, _INF, False, False),
    "validation_center": (VALIDATION_CENTERS, 0, 0, False, False),
}
_RELATIONS = {
    "d": "expected an integer in 1..{max_d} (a d-vector of float64 fills one frame's array "
    "limit), got {self.d!r}",
    "eta": "2 / eta must be a whole number (the quantisation grid), got {self.eta!r}",
    "explore_share": "{self.explore_share!r} > 0 needs final_selection = 'exact'",
    "max_points": "{self.max_points!r} is below p = {self.p}: the summary could not be bought",
    "allocate": "allocate-select needs max_points, final_selection = 'exact', explore_share = "
    "0 and max_deliveries = 1 (a record delivered again would add an epoch every owner sees, "
    "an uncharged function of that owner's records beyond its histogram; exploration steers "
    "nothing it does not already buy at random); allocate = false keeps herding-select under "
    "max_points",
    "steered": "random_share = {self.random_share!r} leaves no point of max_points = "
    "{self.max_points} to steer, yet every owner would pay the histogram: use random-select "
    "(random_purchase = true) to buy every point at random",
    "random_share": "random_share = {self.random_share!r} > 0 is a share of allocate-select's "
    "budget (allocate = true); random-select buys all of it at random",
    "random_purchase": "random-select needs max_points, final_selection = 'exact', "
    "explore_share = 0 and allocate = false; a steering key in [summary] or mechanism = "
    '"herding-select" keeps herding-select',
    "scale": "center and scale must be given together, scale > 0",
    "neighbouring": "'add_remove' refused with {self._exact_counts}: each sends an owner's exact "
    "record count n_i to the curator, an unbounded release under add/remove of one record; "
    "keep neighbouring = 'replace' (the default), or turn them off",
}


# The mechanisms' required settings, checked key by key so a refusal names the key that fails
# and the value that passes: (what selected it, ((field, test), ...)).
_COMBINATIONS: dict[str, tuple[str, tuple[tuple[str, Any], ...]]] = {
    "allocate": (
        "allocate-select (allocate = true, or max_points or an allocation key without "
        "allocate = false)",
        (
            ("max_points", lambda v: v is not None),
            ("final_selection", lambda v: v == "exact"),
            ("explore_share", lambda v: v == 0),
            ("max_deliveries", lambda v: v == 1),
        ),
    ),
    "random_purchase": (
        'random-select (random_purchase = true, mechanism = "random-select", or a [summary] '
        "without steering keys)",
        (
            ("max_points", lambda v: v is not None),
            ("final_selection", lambda v: v == "exact"),
            ("explore_share", lambda v: v == 0),
            ("allocate", lambda v: not v),
        ),
    ),
}
_PASSING: dict[str, Any] = {
    "final_selection": "exact",
    "explore_share": 0.0,
    "max_deliveries": 1,
    "allocate": False,
}


def _problem(
    value: object, kind: Any, low: float, high: float, low_open: bool, optional: bool
) -> str | None:
    """What is wrong with ``value`` under its spec (``None``: nothing)."""
    if value is None and optional:
        return None
    if kind == "bool":
        return None if isinstance(value, bool) else f"expected true or false, got {value!r}"
    if isinstance(kind, tuple):
        if isinstance(value, str) and value in kind:
            return None
        return f"expected one of {list(kind)}, got {value!r}"
    if kind == "int":
        ok = isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
        if ok and low <= value <= high:  # type: ignore[operator]
            return None
        top = "" if high == _INF else f" and <= {high:g}"
        return f"expected an integer >= {low:g}{top}, got {value!r}"
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        x = float(value)
        if math.isfinite(x) and (low < x if low_open else low <= x) and x <= high:
            return None
    bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]"
    if high == _INF:
        bounds = f"{'> ' if low_open else '>= '}{low:g}"
    return f"expected a finite number {bounds}, got {value!r}"


def _divides_two(eta: float) -> bool:
    steps = round(2.0 / eta)
    return abs(steps * eta - 2.0) <= 1e-9


@dataclass(frozen=True)
class CuratorParams:
    """Public parameters of one summarisation run (defaults: the paper's Table 1 where it has one).

    ``eta`` defaults to 1/d (Theorem 2 asks eta <= 1/d; Table 1 does not give it).
    """

    p: int
    d: int = 140
    gamma: float = 0.1
    h1_seed: int = 0
    eps_validation: float = 0.01
    validation_iterations: int = 1656
    seed_iterations: int = 1656
    eps_seed: float = 0.05
    eps_summary: float = 0.01 / np.sqrt(5 * 100)
    summary_iterations: int = 5
    eta: float | None = None
    warm_start: bool = True
    eps_auction: float = 0.05
    auction_variant: str = "paper"
    tau: int = 3
    phase_timeout: float = 5.0
    max_epochs: int | None = None  # steering epochs (auction steps); exploration comes on top
    less_trusted: bool = False
    verify_tolerance: float = 1e-4
    neighbouring: str = "replace"  # m and q are public: replace-one is the honest relation
    max_deliveries: int = 3
    max_lost: int | None = None
    known_colluders: int = 0
    # Release mechanisms (protocol/summary/releases.py and channels.py); the defaults are the
    # paper's MWEM h2.
    validation_release: str = "mwem"  # "mwem" | "gaussian"
    summary_release: str = "mwem"  # "mwem" | "gaussian" | "tree" | "herding"
    validation_sigma: float = 1.0  # Gaussian noise multiplier of g_tilde (sigma / Delta)
    summary_sigma: float = 1.0  # Gaussian noise multiplier per summary release / tree node
    clip_norm: float = float(np.sqrt(2.0))  # L2 clip of h1 rows; sqrt(2) never clips
    n_candidates: int = 20000  # herding: public random candidates
    candidate_distribution: str = "gaussian"  # "gaussian" N(c, s^2) | "uniform" U[c - s, c + s]
    candidate_center: float = 0.0
    candidate_scale: float = 1.0
    herding_residual_weight: float = 1.0
    herding_ascent_steps: int = 0  # herding: gradient steps per virtual point (0: candidates)
    # Oversample, then select (protocol/summary/selection.py): the first ceil(explore_share p / K)
    # epochs ask every owner for a uniformly drawn point; "exact" returns the p purchased points
    # exact greedy picks against D_v (never sent to an owner: no ledger event).
    final_selection: str = "none"  # "none" | "exact"
    explore_share: float = 0.0
    # Parsimony (issue 18): the most distinct owner points the curator may receive (validation
    # set not counted; None: no budget). The curator never asks beyond it (epochs.py).
    max_points: int | None = None
    # Allocate, then select (protocol/summary/allocate.py): each owner releases a Gaussian DP
    # mean of its h1 rows (noise multiplier allocation_sigma), the curator splits max_points
    # across owners once, and each owner herds its share locally against g_tilde.
    allocate: bool = False
    allocation_sigma: float = 1.0
    allocation_dims: int = 8  # the public profile basis: g_tilde, seed mean, seed PCs
    # "mixture": DP means in that basis, mixing weights (allocate_mixture.py); "histogram": DP
    # histograms of the records' scores against g_tilde (allocate_rank.py)
    allocation_rule: str = "mixture"
    # "histogram": the score direction's ridge, a multiple of the public seed covariance's mean
    # eigenvalue (allocate_rank.py; 0: the raw direction from the seed mean to g_tilde)
    allocation_ridge: float = 0.5
    # The share of max_points split in proportion to the owners' record counts n_i (public under
    # replace-one, sent with the histograms) before the histograms split the rest: no owner is
    # starved by a noisy histogram (issue 30, the wine failure); post-processing, no charge.
    allocation_floor: float = 0.0
    # The hedge (issue 30): the share of max_points bought uniformly at random (quotas drawn by
    # the curator's coins from the public n_i, each owner's records by its secret key, as
    # random-select) before the histograms split the rest; the exact final selection chooses
    # among the union. No release, so no charge beyond allocate-select's histogram.
    random_share: float = 0.0
    # random-select (protocol/summary/random_select.py): max_points points bought uniformly at
    # random from the pool (owners in proportion to n_i), then the exact final selection; no
    # release to any owner and no validation release.
    random_purchase: bool = False
    # g_tilde around the origin (clip clip_norm) or around the public seed mean, clipped at
    # the seed set's spread (releases.py)
    validation_center: str = "origin"
    # Public standardisation of the features before h1 (the normalise round's DP means and
    # spreads; None: raw features). Set through Curator.standardize before the run starts.
    center: tuple[float, ...] | None = None
    scale: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("center", "scale"):  # a journal's JSON hands lists back
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(float(v) for v in value))
        for name, spec in _FIELD_CHECKS.items():
            problem = _problem(getattr(self, name), *spec)
            if problem:
                raise ParamError(name, problem)
        relations = {
            "d": self.d <= MAX_D,
            "eta": self.eta is None or _divides_two(self.eta),
            "explore_share": self.explore_share == 0 or self.final_selection == "exact",
            "max_points": self.max_points is None or self.max_points >= self.p,
            "allocate": not self.allocate
            or (
                self.max_points is not None
                and self.final_selection == "exact"
                and self.explore_share == 0
                and self.max_deliveries == 1
            ),
            "random_share": self.random_share == 0 or self.allocate,
            "steered": not self.allocate
            or self.max_points is None
            or round(self.random_share * self.max_points) < self.max_points,
            "random_purchase": not self.random_purchase
            or (
                self.max_points is not None
                and self.final_selection == "exact"
                and self.explore_share == 0
                and not self.allocate
            ),
            "scale": (self.center is None) == (self.scale is None)
            and (self.scale is None or min(self.scale, default=1.0) > 0),
            "neighbouring": self.neighbouring != "add_remove" or not self._exact_counts,
        }
        for name, ok in relations.items():
            if not ok and name in _COMBINATIONS:
                raise self._combination_error(name)
            if not ok:
                raise ParamError(name, _RELATIONS[name].format(self=self, max_d=MAX_D))
        mwem = "mwem" in (self.validation_release, self.summary_release)
        cells = self.d * (round(2.0 / self.grid_step) + 1)
        if mwem and cells > MAX_D:
            raise ParamError(
                "d",
                f"d = {self.d} with grid step {self.grid_step:g} gives MWEM marginals of {cells} "
                f"cells, more than one journal array holds ({MAX_D}); lower d or raise eta",
            )

    def _combination_error(self, flag: str) -> ParamError:
        """A mechanism's refused combination, naming the first key that fails, its value and
        the value that would pass (``ParamError.passing``), and why the mechanism needs it."""
        what, needs = _COMBINATIONS[flag]
        for key, passes in needs:
            current = getattr(self, key)
            if passes(current):
                continue
            value: Any = math.ceil(1.5 * self.p) if key == "max_points" else _PASSING[key]
            return ParamError(
                key,
                f"{key} = {current!r} cannot be used with {what}; {key} = {value!r} passes "
                f"({_RELATIONS[flag].format(self=self, max_d=MAX_D)})",
                passing=(key, value),
            )
        raise AssertionError(f"{flag}: no failing key")  # pragma: no cover - relations agree

    @property
    def sensitivity(self) -> float:
        """Sensitivity (in units of one clipped record) of the curator's released sums.

        2 under ``"replace"``, the default: m = |D_v| and q = |S| are published (report.json's
        ``validation_size``, the divisor of every released mean), so two neighbouring data sets
        have the same size and differ in one substituted record. 1 under ``"add_remove"`` (the
        paper's Theorems 2 and 6), which is honest only if the count itself is never released
        exactly; kept selectable to reproduce the paper's accounting (and refused with the
        settings that send an owner's exact count, ``_exact_counts``). ``neighbouring`` is the
        run's one relation: the secure sums (actors/run/phases.py), allocate-select and the auction
        are charged under it too, so no party's ledger mixes relations."""
        return 1.0 if self.neighbouring == "add_remove" else 2.0

    @property
    def _exact_counts(self) -> str:
        """The settings that send an owner's exact record count n_i to the curator ("" if none).

        allocate-select: the owner's histogram (or profile) goes with n_i (allocate.py,
        allocate_rank.py). Exploration (explore_share > 0): the point an owner delivers is drawn
        uniformly (under the owner's secret key) from its biddable records, and its token is its
        arrival position, so the tokens bound n_i from below and estimate it. Both are honest
        under replace-one (n_i fixed by the relation) and refused under add/remove."""
        found = []
        if self.allocate:
            found.append("allocate-select (allocate = true, or max_points or an allocation key)")
        if self.random_purchase:
            found.append("random-select (random_purchase = true)")
        if self.explore_share > 0:
            found.append(f"exploration (explore_share = {self.explore_share:g})")
        return " and ".join(found)

    @property
    def mechanism(self) -> str:
        """The purchase mechanism's name (:data:`MARKET_MECHANISMS`, or "herding"/"paper" ...:
        the summary release without the final selection)."""
        if self.random_purchase:
            return "random-select"
        if self.allocate:
            return "allocate-select"
        if self.final_selection == "exact":
            return f"{self.summary_release}-select"
        return self.summary_release

    @property
    def profile_floor(self) -> float | None:
        """The noise multiplier an owner requires of its allocation profile (given to it at
        construction by the operator, protocol/summary/owner.py); None: no profile planned."""
        return self.allocation_sigma if self.allocate else None

    @property
    def grid_step(self) -> float:
        if self.eta is not None:
            return self.eta
        return 2.0 / (2 * self.d)  # eta = 1/d, and 2/eta an integer

    @property
    def epoch_limit(self) -> int:
        """The most steering epochs (each one auction step); exploration epochs are extra."""
        if self.max_epochs is not None:
            return self.max_epochs
        return 4 * self.p + 10

    def explore_epochs(self, n_owners: int) -> int:
        """Exploration epochs of a run with ``n_owners`` owners: ceil(explore_share p / K)."""
        return math.ceil(self.explore_share * self.p / max(1, n_owners))

"""Public parameters of one summarisation run (:class:`CuratorParams`) and the names they accept.

Everything here is public: it is sent to owners (the h1 parameters, tau, max_deliveries), written
into report.json and journaled. Defaults are the paper's Table 1 where it has one; the release
mechanisms of protocol/summary/releases.py (g_tilde) and protocol/summary/channels.py (g_l) are
selected by name, from the tuples below. Validation happens at construction, and an invalid
field is named in the error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpmarket.protocol.summary.selection import FINAL_SELECTIONS

__all__ = [
    "CANDIDATE_DISTRIBUTIONS",
    "SUMMARY_RELEASES",
    "VALIDATION_RELEASES",
    "CuratorParams",
]

VALIDATION_RELEASES = ("mwem", "gaussian")
SUMMARY_RELEASES = ("mwem", "gaussian", "tree", "herding")
CANDIDATE_DISTRIBUTIONS = ("gaussian", "uniform")


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
    # Public standardisation of the features before h1 (the normalise round's DP means and
    # spreads; None: raw features). Set through Curator.standardize before the run starts.
    center: tuple[float, ...] | None = None
    scale: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("center", "scale"):  # a journal's JSON hands lists back
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(float(v) for v in value))
        checks = {
            "p": self.p >= 1,
            "d": self.d >= 1,
            "gamma": self.gamma > 0,
            "eps_validation": self.eps_validation > 0,
            "eps_summary": self.eps_summary > 0,
            "eps_auction": self.eps_auction > 0,
            "eps_seed": self.eps_seed > 0,
            "validation_iterations": self.validation_iterations >= 1,
            "seed_iterations": self.seed_iterations >= 1,
            "summary_iterations": self.summary_iterations >= 1,
            "tau": self.tau >= 1,
            "max_deliveries": self.max_deliveries >= 1,
            "max_lost": self.max_lost is None or self.max_lost >= 0,
            "known_colluders": self.known_colluders >= 0,
            "phase_timeout": self.phase_timeout > 0,
            "auction_variant": self.auction_variant in ("paper", "pure"),
            "neighbouring": self.neighbouring in ("add_remove", "replace"),
            "validation_release": self.validation_release in VALIDATION_RELEASES,
            "summary_release": self.summary_release in SUMMARY_RELEASES,
            "validation_sigma": self.validation_sigma > 0,
            "summary_sigma": self.summary_sigma > 0,
            "clip_norm": 0 < self.clip_norm <= np.sqrt(2.0) + 1e-12,
            "n_candidates": self.n_candidates >= 1,
            "candidate_distribution": self.candidate_distribution in CANDIDATE_DISTRIBUTIONS,
            "candidate_scale": self.candidate_scale > 0,
            "herding_residual_weight": self.herding_residual_weight >= 0,
            "herding_ascent_steps": self.herding_ascent_steps >= 0,
            "final_selection": self.final_selection in FINAL_SELECTIONS,
            "explore_share": bool(np.isfinite(self.explore_share))
            and self.explore_share >= 0
            and (self.explore_share == 0 or self.final_selection == "exact"),
            "center, scale": (self.center is None) == (self.scale is None)
            and (self.scale is None or min(self.scale, default=1.0) > 0),
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"CuratorParams: invalid {', '.join(bad)} ({self})")

    @property
    def sensitivity(self) -> float:
        """Sensitivity (in units of one clipped record) of the curator's released sums.

        2 under ``"replace"``, the default: m = |D_v| and q = |S| are published (report.json's
        ``validation_size``, the divisor of every released mean), so two neighbouring data sets
        have the same size and differ in one substituted record. 1 under ``"add_remove"`` (the
        paper's Theorems 2 and 6), which is honest only if the count itself is never released
        exactly; kept selectable to reproduce the paper's accounting."""
        return 1.0 if self.neighbouring == "add_remove" else 2.0

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

"""PRIVAUCTION: the curator's private winner notification, and the parsimony count.

Paper: summarization-sarpatwar2019, Algorithm 3 lines 11-16, Theorem 6's auction argument and
Lemma 5 (Appendix D); Section 2 for the parsimonious curator (rho-parsimony).

Theory of operation
-------------------
Each epoch every owner submits one bid (its best point's approximate marginal gain). The curator
ranks owners by decreasing bid (ties by owner name) and asks the owner at rank r (1-based) for its
point independently with probability

    "paper":  P_r = exp(-eps_auc (r - 1))                     (rank 1 always asked)
    "pure":   P_r = c exp(-eps_auc (r - 1)),  c = 1 / (1 + exp(-eps_auc)).

Independently of the coin, an owner whose current point has been its bid in ``tau`` or more
epochs (this one included) is asked (the tau rule, line 14). Among the delivered points the
curator keeps the one whose verified bid is largest (:func:`choose_winner`); the others go back
to their owners, who may bid them again (line 16).

Privacy of the asked bit. Adding or removing one point of another owner moves an owner's rank by
at most one. Whether owner i is asked is a coin with bias P_r, so the likelihood ratios of
"asked" and of "not asked" between adjacent ranks bound its privacy loss.
* "paper": asked ratios are exactly e^eps_auc, but "not asked" has probability 0 at rank 1 and
  1 - e^-eps_auc at rank 2, so the bit is only (eps_auc, 1 - e^-eps_auc)-DP per rank step: an
  additive delta of 1 - e^-eps_auc, not the pure eps_auc the paper's proof claims.
* "pure": P_r / P_{r+1} = e^eps_auc and, with x = e^{-eps_auc (r-1)},
  e^eps_auc (1 - P_r) - (1 - P_{r+1}) = (e^eps_auc - 1)(1 - x) >= 0, with equality at r = 1;
  both ratios are <= e^eps_auc, so the asked bit is pure eps_auc-DP per rank step. The price:
  rank 1 is asked only with probability c >= 1/2, so an epoch can end with nobody asked and the
  caller must run the auction again (with fresh bids or coins).
The tau rule is a deterministic function of the owner's own bidding history; the paper charges
the epochs in which a point is bid but not taken ("bad" epochs, at most tau per point).

Parsimony (Lemma 5): the expected number of asks per epoch is sum_r P_r <= 1/(1 - e^-eps_auc);
note the lemma prints e^{+(i-1) eps_auc} where e^{-(i-1) eps_auc} is meant. Points re-bid after
losing are delivered again, so :class:`TransferCounter` counts total transfers and distinct
points separately (PAPER-NOTES item 7).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "VARIANTS",
    "AuctionBid",
    "AuctionDecision",
    "TransferCounter",
    "ask_probabilities",
    "choose_winner",
    "expected_asks",
    "run_auction",
]

VARIANTS = ("paper", "pure")
"""Ask-probability rules: the paper's (rank 1 always asked) and the pure-DP rescaling."""


def _check_owner(owner: object) -> str:
    if not isinstance(owner, str) or not owner:
        raise ValueError(f"owner must be a non-empty string, got {owner!r}")
    return owner


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True, slots=True)
class AuctionBid:
    """One owner's bid in one epoch.

    ``token`` names the bid point inside the owner's store; ``times_bid`` counts the epochs,
    this one included, in which this owner has bid this token (drives the tau rule).
    """

    owner: str
    token: int
    bid: float
    times_bid: int

    def __post_init__(self) -> None:
        _check_owner(self.owner)
        _check_int("token", self.token, 0)
        _check_int("times_bid", self.times_bid, 1)
        if not isinstance(self.bid, float | int | np.floating) or not math.isfinite(self.bid):
            raise ValueError(f"bid must be a finite number, got {self.bid!r}")


@dataclass(frozen=True, slots=True)
class AuctionDecision:
    """Outcome of one auction: who ranks where, who is asked for a point, and why.

    ``ranking`` lists owners by decreasing bid (ties by name); ``probabilities[i]`` is the
    rank rule's ask probability of ``ranking[i]``; ``forced`` lists (in rank order) the owners
    whose ``times_bid >= tau`` and who are therefore asked whatever their coin; ``asked`` lists
    every asked owner in rank order (forced ones included).
    """

    ranking: tuple[str, ...]
    asked: tuple[str, ...]
    forced: tuple[str, ...]
    probabilities: tuple[float, ...]


def _check_eps(eps_auc: float) -> float:
    if not (isinstance(eps_auc, float | int) and math.isfinite(eps_auc) and eps_auc > 0):
        raise ValueError(f"eps_auc must be a finite positive number, got {eps_auc!r}")
    return float(eps_auc)


def _check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    return variant


def ask_probabilities(n_bidders: int, eps_auc: float, variant: str = "paper") -> tuple[float, ...]:
    """Ask probability of ranks 1..n_bidders under ``variant`` (module docstring)."""
    n = _check_int("n_bidders", n_bidders, 0)
    eps = _check_eps(eps_auc)
    scale = 1.0 if _check_variant(variant) == "paper" else 1.0 / (1.0 + math.exp(-eps))
    return tuple(float(v) for v in scale * np.exp(-eps * np.arange(n, dtype=np.float64)))


def expected_asks(n_bidders: int, eps_auc: float, variant: str = "paper") -> float:
    """Expected number of coin-asked owners per epoch (Lemma 5, sign corrected).

    ``sum_r P_r = scale (1 - e^{-n eps}) / (1 - e^{-eps}) <= scale / (1 - e^{-eps})``, with
    scale 1 ("paper") or ``1/(1 + e^-eps)`` ("pure"); tau-rule asks come on top.
    """
    n = _check_int("n_bidders", n_bidders, 0)
    eps = _check_eps(eps_auc)
    scale = 1.0 if _check_variant(variant) == "paper" else 1.0 / (1.0 + math.exp(-eps))
    return scale * -math.expm1(-n * eps) / -math.expm1(-eps)


def run_auction(
    bids: Sequence[AuctionBid],
    eps_auc: float,
    tau: int,
    rng: np.random.Generator,
    variant: str = "paper",
) -> AuctionDecision:
    """PRIVAUCTION's ask step (Algorithm 3, lines 12-14) for one epoch.

    Draws exactly one uniform per bidder in rank order, so the same generator state gives the
    same decision. Privacy: the asked bit of each owner is eps_auc-DP per rank step under
    "pure" and (eps_auc, 1 - e^-eps_auc)-DP under "paper" (module docstring). Raises
    ``ValueError`` for eps_auc <= 0, tau < 1, an unknown variant or a repeated owner.
    """
    eps = _check_eps(eps_auc)
    limit = _check_int("tau", tau, 1)
    _check_variant(variant)
    for bid in bids:
        if not isinstance(bid, AuctionBid):
            raise ValueError(f"bids must be AuctionBid instances, got {type(bid).__name__}")
    owners = [bid.owner for bid in bids]
    if len(set(owners)) != len(owners):
        dupes = sorted({o for o in owners if owners.count(o) > 1})
        raise ValueError(f"bids must come from distinct owners, repeated: {dupes}")
    ranked = sorted(bids, key=lambda b: (-float(b.bid), b.owner))
    probabilities = ask_probabilities(len(ranked), eps, variant)
    coins = rng.random(len(ranked))
    forced = tuple(b.owner for b in ranked if b.times_bid >= limit)
    asked = tuple(
        b.owner
        for b, coin, prob in zip(ranked, coins, probabilities, strict=True)
        if coin < prob or b.times_bid >= limit
    )
    return AuctionDecision(
        ranking=tuple(b.owner for b in ranked),
        asked=asked,
        forced=forced,
        probabilities=probabilities,
    )


def choose_winner(verified: Mapping[str, float]) -> str | None:
    """The asked owner whose delivered point has the largest verified bid (line 15).

    Ties go to the smallest owner name; ``None`` when nobody delivered a point.
    """
    for owner, value in verified.items():
        _check_owner(owner)
        if not math.isfinite(value):
            raise ValueError(f"verified bid of {owner!r} must be finite, got {value!r}")
    if not verified:
        return None
    return min(verified, key=lambda owner: (-float(verified[owner]), owner))


@dataclass
class TransferCounter:
    """Parsimony bookkeeping: every (owner, token) the curator received, with multiplicity.

    ``total_transfers`` counts deliveries (a losing point that is re-bid and asked again counts
    again); ``distinct_points`` counts distinct (owner, token) pairs, i.e. points the curator
    has seen (PAPER-NOTES item 7).
    """

    deliveries: dict[tuple[str, int], int] = field(default_factory=dict)

    def record(self, owner: str, token: int) -> None:
        """Count one delivery of ``token`` from ``owner``."""
        key = (_check_owner(owner), _check_int("token", token, 0))
        self.deliveries[key] = self.deliveries.get(key, 0) + 1

    @property
    def total_transfers(self) -> int:
        """Number of deliveries recorded, repeats included."""
        return sum(self.deliveries.values())

    @property
    def distinct_points(self) -> int:
        """Number of distinct (owner, token) points delivered."""
        return len(self.deliveries)

    def ratio(self, p: int, m: int) -> float:
        """Parsimony rho of Section 2: points the curator accessed over the minimum ``p + m``.

        The curator accesses the ``m`` validation points and every distinct owner point
        delivered, so ``rho = (distinct_points + m) / (p + m)``; 1 is the lower bound reached
        when only the p summary points were ever delivered.
        """
        summary = _check_int("p", p, 0)
        validation = _check_int("m", m, 0)
        if summary + validation == 0:
            raise ValueError("p + m must be positive")
        return (self.distinct_points + validation) / (summary + validation)

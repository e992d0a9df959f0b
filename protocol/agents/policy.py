"""An owner's acceptance policy: what it releases to one purchase, decided by the owner alone.

A remote owner (actors/remote/owneragent.py) reads its policy from its own configuration, never
from the market. When a market offers a purchase (its secure-sum plan and the curator's public
parameters), :func:`review` lists every way the offer exceeds the policy; any reason at all
makes the owner decline the whole purchase: it takes no part, is charged nothing, and counts
against T like a lost owner. Within an accepted purchase the same bounds hold call by call:
the plan's round counts and sigma floors (protocol/securesum/plan.py ``RoundAllowance``, the
owner's copy of the plan it accepted), the profile's noise floor (protocol/summary/owner.py
``profile_floor``) and the points it delivers (``point_limit``), so a market that later asks
for more than it offered gets nothing.

Noise multipliers are ``sigma / L2 sensitivity`` of a Gaussian release under the plan's
neighbouring relation: ``normalise``, ``scan`` and ``refresh`` (secure-sum rounds, the plan's
``sigma_floor / sensitivity``), ``profile`` (allocate-select's profile, ``allocation_sigma``)
and ``summary`` (Gaussian or tree summary releases, ``summary_sigma``). The purchase's whole
planned charge (:func:`planned_purchase`: every planned round at the owner's own price and
count, and the
summary phase's planned events) must also fit the owner's persistent cap, which its store's
filter decides (actors/budgets/gate.py).

The owner prices every round itself (:func:`price_rounds`), never with the market's numbers:

- **sensitivity**: from what it will send (the round's contribution kind, d, clip bound and
  sketch shape, over its own records' k features), by protocol/summary/snr.py
  ``contribution_sensitivity``, the function the market plans with; an offer declaring another
  sensitivity, d or options is declined naming both figures;
- **relation**: the policy's own (``neighbouring``, default replace-one); an offer under another
  relation (the plan's rounds or the curator's parameters) is declined naming both;
- **noise**: each owner's share is ``sigma / sqrt(K - T - 1)`` at the offer's roster K and
  tolerance T (protocol/privacy/dgauss.py ``client_sigma``, Theorem 1). A released round
  includes at least K - T owners (an honest compute node aborts otherwise); the market picks
  which T are absent and may have owners on its side: with at most ``max_colluders`` = C of
  them, K - T - C shares (the owner's own included) are unknown to it, so the noise the owner
  counts on is ``sigma sqrt((K - T - C) / (K - T - 1))``: the plan's floor at C = 1 (the
  Theorem's one curious owner), less beyond. Every pinned compute node attests, under the pair
  key it shares with the owner, the session's digest (so it enforces the same K and T) and the
  owners registered with it, having checked each one's signature
  (protocol/securesum/node.py ``ComputeNode.attest``); the owner takes part in no round before
  that, and declines when fewer than K - T are registered (no round could be released). T
  must be at least the policy's ``min_tolerance``. The guaranteed sigma over its own
  sensitivity on the session's fixed-point grid is the multiplier checked against
  ``min_noise``, and that event is what its ledger is charged.

Guarantee (per owner, as long as one compute node is honest and at most T owners are absent
and C collude): each round this owner contributes to is the Gaussian mechanism with L2
sensitivity :func:`price_rounds`'s ``charged`` under the policy's relation, at a noise
standard deviation no smaller than the price's sigma; the owner's store is charged exactly
that event per round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dpmarket.protocol.privacy.ledger import RELATIONS, MechanismEvent, PrivacyLedger
from dpmarket.protocol.securesum.fixedpoint import grid_sensitivity
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.securesum.spec import DcaConfig
from dpmarket.protocol.summary.counts import count_exposure
from dpmarket.protocol.summary.params import CuratorParams
from dpmarket.protocol.summary.snr import contribution_sensitivity, planned_owner_ledger

__all__ = [
    "HIDDEN_RECORDS",
    "NOISE_KINDS",
    "ROUND_LABELS",
    "OwnerPolicy",
    "RoundPrice",
    "planned_purchase",
    "price_rounds",
    "review",
]

HIDDEN_RECORDS = 2**62
"""The record count ``hide_count`` decides with: never the owner's own, so the decline depends on
public parameters only. An owner whose records can run out under herding-select (protocol/
summary/counts.py) is therefore not declined for it: whether it would be is a function of its
count, which a decline seen by the market would reveal (docs/guide/remote.md)."""

ROUND_LABELS = ("normalise", "scan", "refresh")
NOISE_KINDS = (*ROUND_LABELS, "profile", "summary")


@dataclass(frozen=True)
class OwnerPolicy:
    """An owner's own limits (module docstring). ``epsilon``/``delta``: its persistent cap
    (the Rényi filter of its ledger store); ``max_points``: the most distinct records it
    delivers to one purchase; ``purchases``: how many purchases it joins while serving (None:
    as many as its cap admits); ``rounds``: secure-sum rounds admitted per purchase by label
    (a label not listed: none); ``min_noise``: the smallest noise multiplier per kind;
    ``neighbouring``: the relation its guarantee is stated in ("replace": one record replaced,
    counts public; "add_remove"); ``min_tolerance``: the fewest dropped-or-colluding owners
    the secure sum must tolerate (an offer's T below it is declined); ``max_colluders``: the
    most owners it assumes take the market's side beyond the T absent ones (1: DCA Theorem 1's
    one curious owner; the price is then the plan's floor); ``attested_roster``: no round before
    every pinned compute node has attested the roster, having checked every owner's signature
    (False: a trial whose nodes take the market's word for the owners' keys; the roster is then
    the market's word too); ``hide_count``: decline every purchase under which the other owners
    and report.json's readers learn a function of its record count (protocol/summary/counts.py
    ``count_exposure``), decided from the offer's public parameters alone (module docstring)."""

    epsilon: float
    delta: float
    max_points: int
    purchases: int | None = None
    rounds: dict[str, int] = field(default_factory=dict)
    min_noise: dict[str, float] = field(default_factory=dict)
    neighbouring: str = "replace"
    min_tolerance: int = 0
    max_colluders: int = 1
    attested_roster: bool = True
    hide_count: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"policy.epsilon: expected a positive number, got {self.epsilon!r}")
        if not 0 < self.delta < 1:
            raise ValueError(f"policy.delta: expected a number in (0, 1), got {self.delta!r}")
        if isinstance(self.max_points, bool) or not self.max_points >= 0:
            raise ValueError(
                f"policy.max_points: expected an integer >= 0, got {self.max_points!r}"
            )
        if self.purchases is not None and not self.purchases >= 1:
            raise ValueError(f"policy.purchases: expected an integer >= 1, got {self.purchases!r}")
        for label, count in self.rounds.items():
            if label not in ROUND_LABELS:
                raise ValueError(f"policy.rounds.{label}: not a secure-sum round {ROUND_LABELS}")
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(f"policy.rounds.{label}: expected an integer >= 0, got {count!r}")
        for kind, floor in self.min_noise.items():
            if kind not in NOISE_KINDS:
                raise ValueError(f"policy.min_noise.{kind}: not a release kind {NOISE_KINDS}")
            if not (math.isfinite(floor) and floor > 0):
                raise ValueError(f"policy.min_noise.{kind}: expected a positive number")
        if self.neighbouring not in RELATIONS:
            raise ValueError(
                f"policy.neighbouring: expected one of {sorted(RELATIONS)}, "
                f"got {self.neighbouring!r}"
            )
        for key in ("min_tolerance", "max_colluders"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"policy.{key}: expected an integer >= 0, got {value!r}")
        if not isinstance(self.hide_count, bool):
            raise ValueError(f"policy.hide_count: expected true or false, got {self.hide_count!r}")
        if not isinstance(self.attested_roster, bool):
            raise ValueError(
                f"policy.attested_roster: expected true or false, got {self.attested_roster!r}"
            )


@dataclass(frozen=True)
class RoundPrice:
    """One planned secure-sum round as the owner prices it: its own L2 ``sensitivity`` of what
    it sends, ``charged``, that sensitivity on the session's fixed-point grid (one step per
    coordinate added, protocol/securesum/fixedpoint.py ``grid_sensitivity``: what the release
    really has, and what the owner's store is charged), the noise ``sigma`` its share guarantees
    at the plan's floor, and ``ratio``, that sigma over the plan's (1.0 exactly at the
    Theorem's one curious owner); a round opened above the floor guarantees
    ``spec.sigma_std * ratio``."""

    label: str
    sensitivity: float
    charged: float
    sigma: float
    ratio: float

    @property
    def multiplier(self) -> float:
        return self.sigma / self.charged


def price_rounds(
    policy: OwnerPolicy,
    plan: SecureSumPlan | None,
    dca: DcaConfig | None,
    n_features: int,
    roster: int | None = None,
) -> tuple[dict[str, RoundPrice], list[str]]:
    """The owner's own price of every round ``plan`` offers in session ``dca`` (module
    docstring) over records of ``n_features`` features, and every reason to decline (empty:
    the rounds are within the policy; the cap is checked separately). ``roster``: the owners
    its pinned nodes attest as registered (None: not attested yet); fewer than K - T of them
    and no round could be released, so the owner declines before paying for one.

    Noise: a released round includes at least K - T owners (an honest node aborts otherwise,
    and the session digest each node attests binds the K and T the owner priced with), each
    adding ``sigma / sqrt(K - T - 1)``; with at most ``max_colluders`` of them on the market's
    side, K - T - C shares (the owner's own among them) are unknown to the adversary, so the
    noise it can count on is ``sigma sqrt((K - T - C) / (K - T - 1))``."""
    if plan is None or dca is None:
        return {}, []
    reasons: list[str] = []
    relation = RELATIONS[policy.neighbouring]
    k, t, c = len(dca.clients), dca.tolerance, policy.max_colluders
    if t < policy.min_tolerance:
        reasons.append(
            f"tolerance: the session tolerates T = {t} dropped or colluding owners, "
            f"the policy needs at least {policy.min_tolerance}"
        )
    if roster is not None and roster < k - t:
        reasons.append(
            f"roster: the pinned compute nodes attest {roster} registered owner(s) of the {k} "
            f"the offer names; a round needs K - T = {k - t}, so none could be released"
        )
    honest = k - t - c
    if honest < 1:
        reasons.append(
            f"roster: K = {k} owners, T = {t} absent and {c} colluding (max_colluders) leave "
            f"no share of noise the market does not know"
        )
        return {}, reasons
    ratio = math.sqrt(honest / (k - t - 1))  # exactly 1.0 at C = 1
    prices: dict[str, RoundPrice] = {}
    for label, planned in sorted(plan.rounds.items()):
        admitted = policy.rounds.get(label, 0)
        if planned.max_rounds > admitted:
            reasons.append(
                f"secure sum {label!r}: the market plans {planned.max_rounds} round(s), "
                f"the policy admits {admitted}"
            )
        if planned.neighbouring != relation:
            reasons.append(
                f"secure sum {label!r}: relation {planned.neighbouring!r}, this owner's is "
                f"{relation!r}"
            )
            continue
        try:
            own = contribution_sensitivity(
                planned.what, planned.d, planned.options, n_features,
                neighbouring=policy.neighbouring,
            )  # fmt: skip
        except ValueError as exc:
            reasons.append(f"secure sum {label!r}: {exc}")
            continue
        if not math.isclose(planned.sensitivity, own, rel_tol=1e-12):
            reasons.append(
                f"secure sum {label!r}: the market declares L2 sensitivity "
                f"{planned.sensitivity:.6g}, this owner's own figure for what it sends is "
                f"{own:.6g}"
            )
            continue
        charged = grid_sensitivity(own, planned.d, dca.frac_bits)
        price = RoundPrice(label, own, charged, planned.sigma_floor * ratio, ratio)
        prices[label] = price
        floor = policy.min_noise.get(label)
        if floor is not None and price.multiplier < floor:
            reasons.append(
                f"secure sum {label!r}: noise multiplier {price.multiplier:.4g} (sigma "
                f"{price.sigma:.4g} from {honest} unknown share(s): K = {k}, T = {t}, "
                f"{c} colluding; sensitivity {charged:.4g} on the grid) is below the "
                f"policy's {floor:g}"
            )
    return prices, reasons


def review(
    policy: OwnerPolicy,
    plan: SecureSumPlan | None,
    params: CuratorParams,
    dca: DcaConfig | None = None,
    n_features: int = 0,
) -> list[str]:
    """Every way an offered purchase exceeds ``policy`` (empty: acceptable in itself; the cap
    is checked against the owner's store separately): the secure-sum rounds as the owner prices
    them (:func:`price_rounds`, at the offer's roster), the curator's relation, and the
    profile's and summary's noise multipliers (the curator's parameters; the owner's own code
    computes those releases' sensitivities)."""
    reasons = price_rounds(policy, plan, dca, n_features)[1]
    if params.neighbouring != policy.neighbouring:
        reasons.append(
            f"relation: the curator's parameters say {params.neighbouring!r}, this owner's is "
            f"{policy.neighbouring!r}"
        )
    if policy.hide_count:  # public parameters only: a decline that read the records would
        # itself tell the market about them (HIDDEN_RECORDS: as if it never ran out)
        owners = len(dca.clients) if dca is not None else 1
        exposure = count_exposure(params, owners, HIDDEN_RECORDS)
        if exposure:
            reasons.append(f"hide_count: {exposure}")
    floor = policy.min_noise.get("profile")
    if params.allocate and floor is not None and params.allocation_sigma < floor:
        reasons.append(
            f"profile: noise multiplier {params.allocation_sigma:.4g} is below the policy's "
            f"{floor:g}"
        )
    floor = policy.min_noise.get("summary")
    gaussian = params.summary_release in ("gaussian", "tree")
    if gaussian and floor is not None and params.summary_sigma < floor:
        reasons.append(
            f"summary: noise multiplier {params.summary_sigma:.4g} is below the policy's {floor:g}"
        )
    return reasons


def planned_purchase(
    prices: dict[str, RoundPrice],
    plan: SecureSumPlan | None,
    params: CuratorParams,
    neighbouring: str = "replace",
) -> list[MechanismEvent]:
    """Every event one purchase may charge the owner: each planned secure-sum round at the
    owner's own price (:func:`price_rounds`), as many times as planned, under its relation, and
    the summary phase's planned events (an upper bound)."""
    ledger = PrivacyLedger("owner")
    for label, planned in sorted((plan.rounds if plan is not None else {}).items()):
        price = prices[label]
        ledger.gaussian(
            price.sigma,
            price.charged,
            count=planned.max_rounds,
            label=label,
            neighbouring=RELATIONS[neighbouring],
        )
    return [*ledger.events, *planned_owner_ledger(params).events]

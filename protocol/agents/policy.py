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
planned charge (:func:`planned_purchase`: every planned round at its floor and count, and the
summary phase's planned events) must also fit the owner's persistent cap, which its store's
filter decides (actors/budgets/gate.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dpmarket.protocol.privacy.ledger import MechanismEvent, PrivacyLedger
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.summary.params import CuratorParams
from dpmarket.protocol.summary.snr import planned_owner_ledger

__all__ = ["NOISE_KINDS", "ROUND_LABELS", "OwnerPolicy", "planned_purchase", "review"]

ROUND_LABELS = ("normalise", "scan", "refresh")
NOISE_KINDS = (*ROUND_LABELS, "profile", "summary")


@dataclass(frozen=True)
class OwnerPolicy:
    """An owner's own limits (module docstring). ``epsilon``/``delta``: its persistent cap
    (the Rényi filter of its ledger store); ``max_points``: the most distinct records it
    delivers to one purchase; ``purchases``: how many purchases it joins while serving (None:
    as many as its cap admits); ``rounds``: secure-sum rounds admitted per purchase by label
    (a label not listed: none); ``min_noise``: the smallest noise multiplier per kind."""

    epsilon: float
    delta: float
    max_points: int
    purchases: int | None = None
    rounds: dict[str, int] = field(default_factory=dict)
    min_noise: dict[str, float] = field(default_factory=dict)

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


def review(policy: OwnerPolicy, plan: SecureSumPlan | None, params: CuratorParams) -> list[str]:
    """Every way an offered purchase exceeds ``policy`` (empty: acceptable in itself; the cap
    is checked against the owner's store separately)."""
    reasons = []
    for label, planned in sorted((plan.rounds if plan is not None else {}).items()):
        admitted = policy.rounds.get(label, 0)
        if planned.max_rounds > admitted:
            reasons.append(
                f"secure sum {label!r}: the market plans {planned.max_rounds} round(s), "
                f"the policy admits {admitted}"
            )
        multiplier = planned.sigma_floor / planned.sensitivity
        floor = policy.min_noise.get(label)
        if floor is not None and multiplier < floor:
            reasons.append(
                f"secure sum {label!r}: noise multiplier {multiplier:.4g} is below the "
                f"policy's {floor:g}"
            )
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


def planned_purchase(plan: SecureSumPlan | None, params: CuratorParams) -> list[MechanismEvent]:
    """Every event one purchase may charge the owner: each planned secure-sum round at its
    floor, as many times as planned, and the summary phase's planned events (an upper bound)."""
    ledger = PrivacyLedger("owner")
    for label, planned in sorted((plan.rounds if plan is not None else {}).items()):
        ledger.gaussian(
            planned.sigma_floor,
            planned.sensitivity,
            count=planned.max_rounds,
            label=label,
            neighbouring=planned.neighbouring,
        )
    return [*ledger.events, *planned_owner_ledger(params).events]

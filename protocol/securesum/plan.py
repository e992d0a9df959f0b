"""SecureSumPlan: the operator's fixed plan of secure-sum rounds, which the relay cannot change.

The aggregator (the curator, in a market) chooses each round's :class:`RoundSpec` and asks the
clients for contributions. Unchecked, it could open a round at ``sigma_std = 0``, or the same
round twice with one client dropped, and read that client's exact vector from the difference;
or repeat a round and average the noise away. A plan, computed by the operator from the public
configuration and handed to every client and compute node before the session, names per round
label the contribution kind (``what``), d, the L2 sensitivity and neighbouring relation, the
least sigma_std (the calibration :meth:`DcaConfig.spec` applies to the round's epsilon and
delta), the options that fix clipping and sketch shape, and how many rounds may carry the label.

Guarantee (per client): every round a client contributes to under a plan is the Gaussian
mechanism at a sigma_std no smaller than the plan's floor for its label, at the plan's
sensitivity, over a vector computed with the plan's clipping and shape, and at most
``max_rounds`` such rounds per label; so the client's total loss is at most the composition of
those rounds whatever specs, options or repetitions the relay asks for (with the session's T
holding in each round, Theorem 1). :meth:`SecureSumPlan.admit` is the check, pure and
stateless; :class:`RoundAllowance` adds the count per label.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dpmarket.protocol.securesum.spec import REPLACE_ONE, DcaConfig, RoundSpec

__all__ = ["PlannedRound", "RoundAllowance", "SecureSumPlan"]


@dataclass(frozen=True)
class PlannedRound:
    """One label of a plan. ``options`` must be matched exactly (keys and values), except the
    keys in ``per_round``, which only say which of the client's records a round covers
    (e.g. ``base_rounds`` of a sketch delta) and change neither the noise nor the sensitivity."""

    what: str
    d: int
    sigma_floor: float
    sensitivity: float
    max_rounds: int
    options: dict[str, Any] = field(default_factory=dict)
    neighbouring: str = REPLACE_ONE
    per_round: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.sigma_floor > 0:  # a plan never admits a round without noise
            raise ValueError(f"sigma_floor must be > 0, got {self.sigma_floor!r}")
        if isinstance(self.max_rounds, bool) or not self.max_rounds >= 1:
            raise ValueError(f"max_rounds must be an integer >= 1, got {self.max_rounds!r}")
        object.__setattr__(self, "options", dict(self.options))


@dataclass(frozen=True)
class SecureSumPlan:
    """The rounds a session may run, by label (module docstring)."""

    rounds: dict[str, PlannedRound]

    @classmethod
    def calibrated(
        cls,
        config: DcaConfig,
        delta: float,
        rounds: Mapping[str, tuple[str, int, float, float, int, dict[str, Any]]],
        *,
        neighbouring: str = REPLACE_ONE,
        per_round: Mapping[str, tuple[str, ...]] | None = None,
        method: str = "analytic",
    ) -> SecureSumPlan:
        """A plan from each label's (what, d, epsilon, sensitivity, max_rounds, options): the
        floor is the sigma_std :meth:`DcaConfig.spec` calibrates for (epsilon, delta)."""
        planned = {}
        for label, (what, d, eps, sens, count, options) in rounds.items():
            sigma = config.spec(1, d, eps, delta, sens, method, label, neighbouring).sigma_std
            extra = (per_round or {}).get(label, ())
            planned[label] = PlannedRound(
                what, d, sigma, float(sens), count, options, neighbouring, extra
            )
        return cls(planned)

    def spec(self, label: str, round_: int) -> RoundSpec:
        """The round ``round_`` of ``label`` at the plan's floor (what an honest relay opens)."""
        p = self._planned(label)
        return RoundSpec(round_, p.d, p.sigma_floor, p.sensitivity, label, p.neighbouring)

    def options(self, label: str) -> dict[str, Any]:
        return dict(self._planned(label).options)

    def admit_open(self, spec: RoundSpec) -> PlannedRound:
        """``ValueError`` naming the label and the bound unless ``spec`` is a round of the plan:
        a known label, its d, sensitivity and neighbouring exactly, sigma_std >= its floor."""
        p, label = self._planned(spec.label), spec.label
        if spec.d != p.d:
            raise ValueError(f"plan: round {label!r}: d = {spec.d}, the plan fixes {p.d}")
        if not spec.sigma_std >= p.sigma_floor:
            raise ValueError(
                f"plan: round {label!r}: sigma_std = {spec.sigma_std:g} is below the plan's "
                f"floor {p.sigma_floor:g}"
            )
        if spec.sensitivity != p.sensitivity or spec.neighbouring != p.neighbouring:
            raise ValueError(
                f"plan: round {label!r}: sensitivity {spec.sensitivity:g} "
                f"({spec.neighbouring}), the plan fixes {p.sensitivity:g} ({p.neighbouring})"
            )
        return p

    def admit(self, spec: RoundSpec, what: str, options: Mapping[str, Any]) -> None:
        """``ValueError`` unless a client may contribute ``what`` with ``options`` to ``spec``
        (:meth:`admit_open`, the label's contribution kind, and its options exactly)."""
        p, label = self.admit_open(spec), spec.label
        if what != p.what:
            raise ValueError(
                f"plan: round {label!r}: contribution {what!r}, the plan fixes {p.what!r}"
            )
        fixed = {k: v for k, v in options.items() if k not in p.per_round}
        if fixed != p.options:
            wrong = sorted(
                k
                for k in set(fixed) | set(p.options)
                if k not in fixed or k not in p.options or fixed[k] != p.options[k]
            )
            raise ValueError(f"plan: round {label!r}: options {wrong} differ from the plan")

    def _planned(self, label: str) -> PlannedRound:
        p = self.rounds.get(label)
        if p is None:
            raise ValueError(f"plan: no round labelled {label!r} (planned: {sorted(self.rounds)})")
        return p


class RoundAllowance:
    """A plan with its count: each admitted round uses one of its label's ``max_rounds``."""

    def __init__(self, plan: SecureSumPlan) -> None:
        self.plan = plan
        self.used: Counter[str] = Counter()

    def take(
        self, spec: RoundSpec, what: str | None = None, options: Mapping[str, Any] | None = None
    ) -> None:
        """Admit ``spec`` (with ``what`` and ``options`` when given: a client's contribution;
        without them, a compute node's open) and count it, or raise ``ValueError``."""
        if what is None:
            p = self.plan.admit_open(spec)
        else:
            self.plan.admit(spec, what, options or {})
            p = self.plan.rounds[spec.label]
        if self.used[spec.label] >= p.max_rounds:
            raise ValueError(
                f"plan: round {spec.label!r}: the plan allows {p.max_rounds} such rounds, all used"
            )
        self.used[spec.label] += 1

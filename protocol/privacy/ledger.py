"""Privacy ledger: describe every release as a :class:`MechanismEvent`, then account for it.

In the style of ``dp_accounting``: an event only *describes* what ran (mechanism, noise scale,
sensitivity, how often); a :class:`PrivacyLedger` (one per protected party) groups identical
events and re-accounts them by three methods:

* ``"pld"`` -- numerical privacy-loss-distribution composition (dp_accounting 0.6.0, pessimistic
  rounding, so the result is an upper bound on the true epsilon at the requested delta);
* ``"theorem7"`` -- the heterogeneous composition bound of Kairouz et al. (2017) as quoted in
  Theorem 7, Appendix D of Sarpatwar et al. (2019) (:mod:`.composition`);
* ``"paper"`` -- what Section 4 of Sarpatwar et al. reports: only events carrying a
  ``paper_epsilon``, composed with the loose form ``sum eps (e^eps - 1) + sqrt(2 ln(1/delta)
  sum eps^2)`` that reproduces the paper's 1.4 (validation set) and 0.043 (summary)
  (:mod:`.composition`).

The paper under-counts (PAPER-NOTES, Summarization item 3): one h2 iteration is an exponential
mechanism (2*eps-DP for the form used) plus a Laplace step (eps-DP), and the private auction
(Algorithm 3) is not pure-DP and is missing from the totals. The ledger counts what runs.

One relation per party (issue 24). Composition adds privacy losses measured against the *same*
pair of neighbouring data sets: an event charged under add/remove of one record and one charged
under replace-one do not compose into a guarantee against either relation (replace-one is two
add/remove steps, so an add/remove epsilon bounds a replace-one loss only after doubling; and a
release that is exact under one relation, e.g. a record count under replace-one, is unbounded
under the other). A :class:`PrivacyLedger` therefore refuses (``ValueError`` naming both) an
event whose ``neighbouring`` differs from the relation of the events it already holds;
:meth:`PrivacyLedger.relations` lists the relations a ledger holds (at most one).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from dpmarket.protocol.privacy.composition import (
    check_delta,
    kairouz_theorem7,
    paper_composition,
)

__all__ = [
    "ADD_REMOVE",
    "AUCTION_VARIANTS",
    "MECHANISMS",
    "METHODS",
    "RELATIONS",
    "REPLACE_ONE_RECORD",
    "EventMeta",
    "MechanismEvent",
    "PrivacyLedger",
    "record_relation",
]

MECHANISMS = ("laplace", "gaussian", "exponential", "auction", "approx_dp")
METHODS = ("pld", "theorem7", "paper")
AUCTION_VARIANTS = ("paper", "pure")
ADD_REMOVE = "add/remove one record"
REPLACE_ONE_RECORD = "replace one record (the count is public)"
RELATIONS = {"add_remove": ADD_REMOVE, "replace": REPLACE_ONE_RECORD}
"""A run's configured relation (``CuratorParams.neighbouring``) -> the string its events carry."""
_REQUIRED: dict[str, tuple[str, ...]] = {
    "laplace": ("scale",),
    "gaussian": ("sigma",),
    "exponential": ("eps_score",),
    "auction": ("eps_auc",),
    "approx_dp": ("delta", "epsilon"),
}
_PLD = Any  # dp_accounting ships no type information


class EventMeta(TypedDict, total=False):
    """Optional descriptive fields accepted by the :class:`PrivacyLedger` recorders."""

    label: str  # what was released, e.g. "h2(validation) Laplace step"
    neighbouring: str  # default "add/remove one record"
    paper_epsilon: float | None  # how the paper charges one occurrence; None: not counted


def record_relation(neighbouring: str) -> str:
    """The event relation of a run configured with ``neighbouring`` ("replace" or "add_remove");
    ``ValueError`` for any other name."""
    if neighbouring not in RELATIONS:
        raise ValueError(f"neighbouring must be one of {sorted(RELATIONS)}, got {neighbouring!r}")
    return RELATIONS[neighbouring]


def _check_positive(value: float, name: str) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite positive number, got {value!r}")


@dataclass(frozen=True)
class MechanismEvent:
    """One kind of release, ``count`` identical times, against one neighbouring relation.

    ``parameters`` holds ``(name, value)`` pairs, sorted by name: ``scale`` (laplace),
    ``sigma`` (gaussian), ``eps_score`` (exponential), ``eps_auc`` (auction), ``epsilon`` and
    ``delta`` (approx_dp). Per occurrence:

    * laplace: noise scale b, L1 sensitivity s: pure ``s/b``-DP; PLD: Laplace mechanism.
    * gaussian: sigma, L2 sensitivity s: no pure epsilon; PLD: Gaussian mechanism.
    * exponential: sample with probability proportional to ``exp(eps_score * score)``, score of
      sensitivity s: pure ``2 eps_score s``-DP (the h2 form of Algorithm 2, line 5); PLD: the
      worst-case pure-DP PLD. The paper does not count it (``paper_epsilon`` None).
    * auction: one owner's asked/not-asked bit in PRIVAUCTION (Algorithm 3); neighbouring data
      (one record added, removed or replaced: ``neighbouring`` names the run's record relation)
      move that owner's rank by at most one. ``variant="paper"``: ``(eps_auc, 1 - e^-eps_auc)``-DP
      (the paper claims pure eps_auc); ``"pure"``: pure eps_auc-DP (asks scaled by
      ``1/(1 + e^-eps_auc)``). PLD: worst-case (eps, delta) PLD.
    * approx_dp: a generic ``(epsilon, delta)``-DP mechanism; PLD: worst-case (eps, delta) PLD.

    ``paper_epsilon`` is how the paper charges one occurrence (None: not counted).
    """

    mechanism: str
    parameters: tuple[tuple[str, float], ...]
    sensitivity: float = 1.0
    count: int = 1
    neighbouring: str = ADD_REMOVE
    label: str = ""
    paper_epsilon: float | None = None
    variant: str = ""

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        params = tuple(sorted((str(k), float(v)) for k, v in self.parameters))
        object.__setattr__(self, "parameters", params)
        names = tuple(k for k, _ in params)
        if names != _REQUIRED[self.mechanism]:
            raise ValueError(
                f"parameters of {self.mechanism} must be {_REQUIRED[self.mechanism]}, got {names}"
            )
        for name, value in params:
            if name == "delta":
                if not 0.0 <= value < 1.0:
                    raise ValueError(f"delta must be in [0, 1), got {value!r}")
            else:
                _check_positive(value, name)
        _check_positive(self.sensitivity, "sensitivity")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"count must be an integer >= 1, got {self.count!r}")
        if self.paper_epsilon is not None:
            _check_positive(self.paper_epsilon, "paper_epsilon")
        allowed = AUCTION_VARIANTS if self.mechanism == "auction" else ("",)
        if self.variant not in allowed:
            raise ValueError(
                f"variant of {self.mechanism} must be one of {allowed}, got {self.variant!r}"
            )

    def param(self, name: str) -> float:
        """The value of parameter ``name``."""
        for key, value in self.parameters:
            if key == name:
                return value
        raise ValueError(f"{self.mechanism} event has no parameter {name!r}")

    def accounted(self) -> MechanismEvent:
        """The event as the accountant sees it: the fields its privacy loss depends on
        (mechanism, parameters, sensitivity, count, variant); label, relation and the paper's
        figure reset, so that equal losses compare equal (:func:`_pld_epsilon`'s cache)."""
        return MechanismEvent(
            self.mechanism, self.parameters, self.sensitivity, self.count, variant=self.variant
        )

    def group_key(self) -> tuple[Any, ...]:
        """Every field but ``count``: events with equal keys are grouped by adding counts."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "count")

    def dp_parameters(self, gaussian_delta: float | None = None) -> tuple[float, float]:
        """Per-occurrence ``(epsilon, delta)``.

        A Gaussian has no pure epsilon: pass ``gaussian_delta`` and get the exact (analytic,
        Balle & Wang 2018) epsilon at that delta, tighter than the classical
        ``s sqrt(2 ln(1.25/delta))/sigma`` and valid at any epsilon.
        """
        s = self.sensitivity
        if self.mechanism == "laplace":
            return s / self.param("scale"), 0.0
        if self.mechanism == "exponential":
            return 2.0 * self.param("eps_score") * s, 0.0
        if self.mechanism == "auction":
            eps_auc = self.param("eps_auc")
            return eps_auc, (-math.expm1(-eps_auc) if self.variant == "paper" else 0.0)
        if self.mechanism == "approx_dp":
            return self.param("epsilon"), self.param("delta")
        if gaussian_delta is None:
            raise ValueError(
                f"gaussian event {self.label!r} has no pure epsilon: "
                "pass gaussian_delta or use the PLD accountant"
            )
        check_delta(gaussian_delta, "gaussian_delta")
        from dp_accounting import gaussian_mechanism  # on use: ~1 s of imports for every actor

        eps = gaussian_mechanism.get_epsilon_gaussian(self.param("sigma") / s, gaussian_delta)
        return float(eps), gaussian_delta

    def single_pld(self, value_discretization_interval: float = 1e-4) -> _PLD:
        """The dp_accounting PLD of one occurrence (pessimistic estimate)."""
        from dp_accounting.pld import common  # on use, as in dp_parameters
        from dp_accounting.pld import privacy_loss_distribution as pld_lib

        _check_positive(value_discretization_interval, "value_discretization_interval")
        vdi = value_discretization_interval
        if self.mechanism == "laplace":
            return pld_lib.from_laplace_mechanism(
                self.param("scale"), sensitivity=self.sensitivity, value_discretization_interval=vdi
            )
        if self.mechanism == "gaussian":
            return pld_lib.from_gaussian_mechanism(
                self.param("sigma"), sensitivity=self.sensitivity, value_discretization_interval=vdi
            )
        eps, delta = self.dp_parameters()
        return pld_lib.from_privacy_parameters(
            common.DifferentialPrivacyParameters(eps, delta), value_discretization_interval=vdi
        )

    def pld(self, value_discretization_interval: float = 1e-4) -> _PLD:
        """The PLD of all ``count`` occurrences (self-composition); computed once per process
        for equal losses (:func:`_event_pld`)."""
        return _event_pld(self.accounted(), value_discretization_interval)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (parameters as a name -> value mapping). Built field by field:
        ``dataclasses.asdict`` deep-copies recursively, and a curator's journal checkpoint turns
        every owner's ledger into a dict twice an epoch."""
        out = {name: getattr(self, name) for name in _EVENT_FIELDS}
        out["parameters"] = dict(self.parameters)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MechanismEvent:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError``."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown MechanismEvent fields {sorted(unknown)}")
        fields = dict(data)
        fields["parameters"] = tuple(dict(fields.get("parameters", {})).items())
        return cls(**fields)


_EVENT_FIELDS = tuple(f.name for f in dataclasses.fields(MechanismEvent))
"""MechanismEvent's fields in order (its ``to_dict``: each a scalar but ``parameters``)."""


class PrivacyLedger:
    """All releases that concern one protected party (e.g. ``"owner-2"``, ``"validation"``).

    Events are grouped: recording an event identical to an earlier one except for ``count``
    adds the counts. :meth:`epsilon` re-accounts the whole ledger by any of :data:`METHODS`.
    Every event of one ledger has the same ``neighbouring`` relation (module docstring): an
    event under another relation is refused and the ledger is left untouched.
    """

    def __init__(
        self,
        party: str,
        events: Iterable[MechanismEvent] = (),
        value_discretization_interval: float = 1e-4,
    ) -> None:
        if not isinstance(party, str) or not party:
            raise ValueError(f"party must be a non-empty string, got {party!r}")
        _check_positive(value_discretization_interval, "value_discretization_interval")
        self.party = party
        self.value_discretization_interval = float(value_discretization_interval)
        self._events: dict[tuple[Any, ...], MechanismEvent] = {}
        for event in events:
            self.record(event)

    @property
    def events(self) -> tuple[MechanismEvent, ...]:
        """Grouped events in first-recorded order."""
        return tuple(self._events.values())

    def relations(self) -> tuple[str, ...]:
        """The neighbouring relations of the ledger's events, in first-recorded order: at most
        one (:meth:`record` refuses a second); empty for an empty ledger."""
        return tuple(dict.fromkeys(e.neighbouring for e in self._events.values()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PrivacyLedger):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def record(self, event: MechanismEvent) -> MechanismEvent:
        """Add ``event`` (grouping with an identical one); returns the stored group."""
        if not isinstance(event, MechanismEvent):
            raise ValueError(f"event must be a MechanismEvent, got {type(event).__name__}")
        held = self.relations()
        if held and event.neighbouring != held[0]:
            raise ValueError(
                f"ledger {self.party!r}: event {event.label or event.mechanism!r} is charged "
                f"under {event.neighbouring!r}, the ledger's events under {held[0]!r}; one "
                "party's releases compose only under one neighbouring relation"
            )
        key = event.group_key()
        previous = self._events.get(key)
        grouped = (
            event
            if previous is None
            else dataclasses.replace(previous, count=previous.count + event.count)
        )
        self._events[key] = grouped
        return grouped

    def laplace(
        self, scale: float, sensitivity: float = 1.0, count: int = 1, **meta: Unpack[EventMeta]
    ) -> MechanismEvent:
        """Record ``count`` Laplace releases (pure ``sensitivity/scale``-DP each)."""
        return self.record(
            MechanismEvent("laplace", (("scale", scale),), sensitivity, count, **meta)
        )

    def gaussian(
        self, sigma: float, sensitivity: float = 1.0, count: int = 1, **meta: Unpack[EventMeta]
    ) -> MechanismEvent:
        """Record ``count`` Gaussian releases (L2 ``sensitivity``, noise ``sigma``)."""
        return self.record(
            MechanismEvent("gaussian", (("sigma", sigma),), sensitivity, count, **meta)
        )

    def exponential(
        self, eps_score: float, sensitivity: float = 1.0, count: int = 1, **meta: Unpack[EventMeta]
    ) -> MechanismEvent:
        """Record ``count`` exponential-mechanism draws (``2 eps_score sensitivity``-DP each)."""
        params = (("eps_score", eps_score),)
        return self.record(MechanismEvent("exponential", params, sensitivity, count, **meta))

    def auction(
        self, eps_auc: float, variant: str, count: int = 1, **meta: Unpack[EventMeta]
    ) -> MechanismEvent:
        """Record ``count`` PRIVAUCTION steps seen by one owner (see :class:`MechanismEvent`);
        ``neighbouring`` is the run's record relation (a neighbour moves the rank by <= 1)."""
        params = (("eps_auc", eps_auc),)
        return self.record(MechanismEvent("auction", params, 1.0, count, variant=variant, **meta))

    def approx_dp(
        self, epsilon: float, delta: float, count: int = 1, **meta: Unpack[EventMeta]
    ) -> MechanismEvent:
        """Record ``count`` generic ``(epsilon, delta)``-DP releases."""
        params = (("epsilon", epsilon), ("delta", delta))
        return self.record(MechanismEvent("approx_dp", params, 1.0, count, **meta))

    def epsilon(
        self, delta: float, method: str = "pld", gaussian_delta: float | None = None
    ) -> float:
        """Total epsilon of the ledger at total ``delta``; ``math.inf`` when none is reachable.

        ``"pld"``: dp_accounting PLD composition (self-compose per event, compose across).
        ``"theorem7"``: :func:`kairouz_theorem7` on every occurrence's ``(eps_l, delta_l)``;
        ``delta_tilde = 1 - (1 - delta)/prod(1 - delta_l)``, inf if that is <= 0, clamped to 1/e
        (a smaller delta_tilde only strengthens the guarantee). Each Gaussian occurrence is
        charged its analytic epsilon at ``gaussian_delta`` (default ``delta / (2 n)``, n the
        number of Gaussian occurrences, so Gaussians take about half of the delta budget).
        ``"paper"``: :func:`paper_composition` of the events with a ``paper_epsilon``.
        """
        check_delta(delta)
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if method == "paper":
            counted = [e for e in self.events if e.paper_epsilon is not None]
            return paper_composition(
                [float(e.paper_epsilon or 0.0) for e in counted], [e.count for e in counted], delta
            )
        if not self._events:
            return 0.0
        if method == "pld":
            return self._pld_epsilon(delta)
        return self._theorem7_epsilon(delta, gaussian_delta)

    def _pld_epsilon(self, delta: float) -> float:
        accounted = tuple(e.accounted() for e in self.events)
        return _pld_epsilon(accounted, self.value_discretization_interval, delta)

    def _theorem7_epsilon(self, delta: float, gaussian_delta: float | None) -> float:
        n_gauss = sum(e.count for e in self.events if e.mechanism == "gaussian")
        if gaussian_delta is None and n_gauss:
            gaussian_delta = delta / (2.0 * n_gauss)
        params = [e.dp_parameters(gaussian_delta) for e in self.events]
        counts = [e.count for e in self.events]
        log_keep = sum(c * math.log1p(-d) for (_, d), c in zip(params, counts, strict=True))
        delta_tilde = -math.expm1(math.log1p(-delta) - log_keep)
        if delta_tilde <= 0.0:
            return math.inf
        delta_tilde = min(delta_tilde, math.exp(-1.0))
        return kairouz_theorem7([p[0] for p in params], counts, delta_tilde)

    def summary(self, delta: float, gaussian_delta: float | None = None) -> dict[str, Any]:
        """JSON-safe totals by every method (``None`` where epsilon is infinite)."""
        totals: dict[str, float | None] = {}
        for method in METHODS:
            eps = self.epsilon(delta, method, gaussian_delta)
            totals[method] = eps if math.isfinite(eps) else None
        return {
            "party": self.party,
            "delta": delta,
            "epsilon": totals,
            "events": len(self._events),
            "occurrences": sum(e.count for e in self.events),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form; :meth:`from_dict` restores an equal ledger."""
        return {
            "party": self.party,
            "value_discretization_interval": self.value_discretization_interval,
            "events": [e.to_dict() for e in self.events],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyLedger:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError``."""
        unknown = set(data) - {"party", "value_discretization_interval", "events"}
        if unknown:
            raise ValueError(f"unknown PrivacyLedger fields {sorted(unknown)}")
        events = [MechanismEvent.from_dict(e) for e in data.get("events", [])]
        return cls(
            str(data.get("party", "")),
            events,
            float(data.get("value_discretization_interval", 1e-4)),
        )


@functools.lru_cache(maxsize=256)
def _event_pld(event: MechanismEvent, vdi: float) -> _PLD:
    """The PLD of ``event``'s ``count`` occurrences. A pure function of the event as the
    accountant sees it (``MechanismEvent.accounted``), computed once per process: one release
    is in the preflight's planned ledgers and in the run's, and a Gaussian's PLD at the default
    discretisation takes about half a second. dp_accounting's PLDs are not changed by
    composing or querying them (each returns a new object), so one may be shared."""
    single = event.single_pld(vdi)
    return single if event.count == 1 else single.self_compose(event.count)


@functools.lru_cache(maxsize=512)
def _pld_epsilon(events: tuple[MechanismEvent, ...], vdi: float, delta: float) -> float:
    """PLD epsilon at ``delta`` of ``events`` composed in this order (each self-composed
    ``count`` times). A pure function of its arguments, computed once per process: a run's
    owners hold equal ledgers, and a report accounts each ledger several times (reconciling,
    the privacy section, each party's epsilon), each PLD composition taking about a second."""
    plds = [e.pld(vdi) for e in events]
    total = plds[0]
    for other in plds[1:]:
        total = total.compose(other)
    return float(total.get_epsilon_for_delta(delta))

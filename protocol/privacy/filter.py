"""A Rényi privacy filter: does one more charge fit an owner's cap, whatever came before?

An owner that takes part in many purchases keeps every charge it paid (a
:class:`~dpmarket.protocol.privacy.ledger.MechanismEvent` per release, in its own store) and a
cap ``(epsilon_cap, delta_cap)``. Before contributing to a new release it asks
:meth:`RenyiFilter.admits`; a release that does not fit is declined. Pure functions of their
arguments: no I/O, no clock.

**Which filter, and why it is valid under adaptive composition.** The releases an owner pays
for are chosen adaptively: which purchase comes next, its noise and its size may depend on
every earlier output. A PLD composition computed for a sequence fixed in advance does not
cover a sequence whose later parameters depend on earlier outputs, and stopping "when the PLD
epsilon exceeds the cap" is not by itself a proof. This filter composes in Rényi DP instead:

* every admitted event has a Rényi curve ``rho_i(alpha)`` on a fixed grid of ``m`` orders
  (:data:`ORDERS`): Gaussian ``alpha s^2 / (2 sigma^2)``; Laplace (scale b, L1 sensitivity s)
  Mironov's closed form (2017, Prop. 6); a pure ``eps``-DP mechanism (exponential mechanism,
  the ``pure`` auction, ``approx_dp`` with delta 0) ``min(eps, alpha eps^2 / 2)`` (Bun &
  Steinke 2016: eps-DP implies eps^2/2-zCDP);
* the filter admits event ``n`` only if, with it, SOME order keeps
  ``S_n(alpha) = sum_i rho_i(alpha) <= B(alpha) = epsilon_cap - ln(m / delta_cap)/(alpha - 1)``.

Proof sketch (the argument of Feldman & Zrnic 2021 for one order, with a union bound over
the grid as in Lécuyer 2021). Let ``L_n`` be the privacy loss of the first ``n`` outputs on
neighbouring data. Because each ``rho_i`` is fixed before release ``i`` is drawn (it is a
function of earlier outputs only), ``exp((alpha - 1)(L_n - S_n(alpha)))`` is a non-negative
supermartingale for every order, and Ville's inequality bounds, for each ``alpha``, the
probability that it ever exceeds ``exp((alpha - 1)(epsilon_cap - B(alpha))) = m / delta_cap``
by ``delta_cap / m``. Sums only grow, so at every time some order satisfies
``S(alpha) <= B(alpha)``; on that order ``L > epsilon_cap`` implies the supermartingale's
excess. A union bound over the ``m`` orders gives ``P(L > epsilon_cap) <= delta_cap``, hence
``(epsilon_cap, delta_cap)``-DP for the whole, adaptively chosen and adaptively stopped,
sequence. The cap is never exceeded: not in expectation, for every sequence.

Events with ``delta > 0`` (the paper's auction variant, ``approx_dp`` with delta) have no
Rényi curve; the filter refuses them (:class:`NotAccountable`): an owner with a persistent
budget takes part only in releases it can account. ``spent`` is the smallest epsilon at
``delta_cap`` that the admitted events fit under by the same rule (monotone in the events),
so ``admits(e) == spent(events + e) <= epsilon_cap``. It is an upper bound on, and usually
larger than, the PLD epsilon the curator's ledger reports for the same events (PLD composition
is tighter for a fixed sequence, and the filter pays ``ln m`` for choosing the order late).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dpmarket.protocol.privacy.composition import check_delta
from dpmarket.protocol.privacy.ledger import ADD_REMOVE, MechanismEvent

__all__ = ["ORDERS", "NotAccountable", "RenyiFilter", "rdp_curve"]

ORDERS: tuple[float, ...] = (
    1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0,
    48.0, 64.0, 128.0, 256.0,
)  # fmt: skip


class NotAccountable(ValueError):
    """An event the Rényi filter cannot account (an (epsilon, delta) mechanism with delta > 0)."""


def _laplace_rdp(lam: float, orders: NDArray[np.float64]) -> NDArray[np.float64]:
    """Rényi divergence of Laplace(b) at L1 sensitivity s, lam = b/s (Mironov 2017, Prop. 6):
    ``1/(a-1) log(a/(2a-1) e^{(a-1)/lam} + (a-1)/(2a-1) e^{-a/lam})``, in log space."""
    a = orders
    first = np.log(a / (2 * a - 1)) + (a - 1) / lam
    second = np.log((a - 1) / (2 * a - 1)) - a / lam
    out: NDArray[np.float64] = np.logaddexp(first, second) / (a - 1)
    return np.minimum(out, 1.0 / lam)  # never above the pure epsilon s/b


def rdp_curve(
    event: MechanismEvent, orders: Sequence[float] = ORDERS, group: int = 1
) -> NDArray[np.float64]:
    """The Rényi DP of all ``event.count`` occurrences at each order (upper bounds, see module
    docstring), for neighbours ``group`` steps of the event's own relation apart (2: an
    add/remove event composed under replace-one, which is a removal and an addition; the L2 or
    L1 sensitivity at most doubles, a pure epsilon doubles); :class:`NotAccountable` for an
    event with delta > 0."""
    a = np.asarray(orders, dtype=np.float64)
    if np.any(a <= 1.0):
        raise ValueError(f"Rényi orders must be > 1, got {orders!r}")
    s = event.sensitivity * group
    if event.mechanism == "gaussian":
        one = a * s**2 / (2.0 * event.param("sigma") ** 2)
    elif event.mechanism == "laplace":
        one = _laplace_rdp(event.param("scale") / s, a)
    else:
        eps, delta = event.dp_parameters()
        if delta > 0.0:
            raise NotAccountable(
                f"{event.mechanism} event {event.label!r} is ({eps:g}, {delta:g})-DP with "
                "delta > 0: no Rényi curve, the filter cannot admit it"
            )
        eps *= group
        one = np.minimum(eps, a * eps**2 / 2.0)
    out: NDArray[np.float64] = event.count * one
    return out


@dataclass(frozen=True)
class RenyiFilter:
    """An owner's cap ``(epsilon, delta)`` enforced over any adaptively chosen sequence of
    events (module docstring: the rule and its proof)."""

    epsilon: float
    delta: float
    orders: tuple[float, ...] = ORDERS

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon)):
            raise ValueError(f"cap epsilon must be a finite number, got {self.epsilon!r}")
        if self.epsilon <= 0:
            raise ValueError(f"cap epsilon must be > 0, got {self.epsilon!r}")
        check_delta(self.delta, "cap delta")
        if not self.orders or min(self.orders) <= 1.0:
            raise ValueError(f"orders must be non-empty and > 1, got {self.orders!r}")

    def _slack(self) -> NDArray[np.float64]:
        a = np.asarray(self.orders, dtype=np.float64)
        out: NDArray[np.float64] = math.log(len(self.orders) / self.delta) / (a - 1.0)
        return out

    def rdp(self, events: Iterable[MechanismEvent]) -> NDArray[np.float64]:
        """``S(alpha)``: the summed Rényi curves of ``events`` on the filter's orders. Events
        charged under different relations (a store kept across the change to one relation per
        run, issue 24) are composed under replace-one: an add/remove event among them counts as
        two steps of its own relation (``rdp_curve``'s ``group``), which bounds it under
        replace-one (group privacy); events of one relation compose as they are."""
        events = list(events)
        relations = {e.neighbouring == ADD_REMOVE for e in events}
        mixed = len(relations) > 1
        total = np.zeros(len(self.orders), dtype=np.float64)
        for event in events:
            group = 2 if mixed and event.neighbouring == ADD_REMOVE else 1
            total += rdp_curve(event, self.orders, group)
        return total

    def spent(self, events: Iterable[MechanismEvent]) -> float:
        """The epsilon at ``delta`` that ``events`` have used: ``min_alpha S(alpha) +
        ln(m/delta)/(alpha - 1)`` (0.0 for no events; ``inf`` if one is not accountable)."""
        events = list(events)
        if not events:
            return 0.0
        try:
            return float(np.min(self.rdp(events) + self._slack()))
        except NotAccountable:
            return math.inf

    def remaining(self, events: Iterable[MechanismEvent]) -> float:
        """How much of the cap is left (never negative)."""
        return max(0.0, self.epsilon - self.spent(events))

    def admits(self, past: Iterable[MechanismEvent], new: MechanismEvent) -> bool:
        """Whether ``new`` fits the cap after ``past`` (which the filter admitted before)."""
        try:
            rdp_curve(new, self.orders)
        except NotAccountable:
            return False
        return self.spent([*past, new]) <= self.epsilon

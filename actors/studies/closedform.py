"""A cell's completion probability in closed form, where the trial's model has one; bounds else.

What a trial does (``actors/studies/trial.py``), and so what this module computes from:

- D, the number of dropping owners, is Binomial(K, q) (``draw_faults``; ``who_fails`` only
  chooses *which* owners drop, never how many). Each drop's phase is normalise, scan or an
  epoch (the ``[timing]`` weights), its epoch uniform over ``epoch_range``.
- c = min(colluders, K - D) colluders are drawn among the others; then each remaining owner is
  slow with probability s (``slow_fraction``).
- The run refuses as soon as lost + colluding owners exceed T: a secure sum whose missing
  clients plus colluders exceed T releases nothing (``refuse_round``), and the curator refuses
  when a deadline leaves more than T - c owners lost (``Curator.lose``). Drops before a secure
  sum stay absent from every later phase, so the count only grows, and the run completes iff
  the owners lost by its end, plus c, are at most T.
- Every drop before the summary, and every drop at epoch 1, is lost by the end of epoch 1 (the
  curator waits for every live owner's bid in every epoch). A drop at a later epoch e is lost
  only if the run reaches epoch e, and how many epochs a run takes depends on the data, the
  noise and the drops themselves: there is no closed form then, only the bounds below.
- A slow owner (``slow_delay`` seconds before each reply) misses its first deadline when the
  delay exceeds the deadline (``[run].deadline_seconds``) and then counts as lost; one whose
  delay is well inside the deadline is never lost. Between the two (here: from half the
  deadline to 1.5 times it) the latency and the deadline's arming decide; only bounds again.

So with L the owners surely lost (drops before the summary or at epoch 1, plus slow owners
past the deadline), each owner independently in L with probability r:

    P(complete) = sum over d of Binom(d; K, q) * BinomCDF(T - d - c_d; K - d - c_d, s_lost),
    c_d = min(colluders, K - d), s_lost = s if the slow owners are lost else 0,

which for s_lost = 0 is BinomCDF(T - c; K, q) (c <= T; the run never completes when c > T).
Without a closed form: the upper bound counts only what is surely lost (drops before the
summary or at epoch 1; slow owners only from 1.5 times the deadline), the lower bound everything
that may be lost (every drop, every slow owner whose delay is over half the deadline).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from dpmarket.actors.studies.config import Cell

__all__ = ["CompletionForm", "completion_form", "completion_probability"]


@dataclass(frozen=True)
class CompletionForm:
    """``exact`` when the cell's model has a closed form (``low == high`` then); ``why`` names
    what prevents one otherwise."""

    low: float
    high: float
    exact: bool
    why: str


def completion_probability(
    owners: int, tolerance: int, dropout: float, colluders: int = 0, slow_lost: float = 0.0
) -> float:
    """P(D + S + c_D <= T) with D ~ Binomial(K, q), c_D = min(colluders, K - D) and, given D,
    S ~ Binomial(K - D - c_D, slow_lost): the module docstring's sum."""
    d = np.arange(owners + 1)
    c = np.minimum(colluders, owners - d)
    left = tolerance - d - c  # slow owners still allowed
    weight = stats.binom.pmf(d, owners, dropout)
    if slow_lost <= 0.0:
        return float(weight[left >= 0].sum())
    tail = stats.binom.cdf(left, owners - d - c, slow_lost)  # 0 where left < 0
    return float(np.clip((weight * tail).sum(), 0.0, 1.0))


def completion_form(
    cell: Cell, timing: dict[str, float], epoch_range: tuple[int, int], deadline: float
) -> CompletionForm:
    """The closed form of ``cell``'s completion probability, or bounds (module docstring)."""
    first, last = epoch_range
    epochs = timing.get("epochs", 0.0)
    at_epoch_one = 1.0 / (last - first + 1) if first == 1 else 0.0
    surely = 1.0 - epochs + epochs * at_epoch_one  # a drop's chance to be lost for sure
    why = []
    if epochs > 0 and surely < 1.0:
        why.append(f"drops at epochs up to {last} count only if the run gets that far")
    slow, delay = cell.slow_fraction, cell.slow_delay
    slow_sure = slow if delay >= 1.5 * deadline else 0.0
    slow_may = slow if delay > 0.5 * deadline else 0.0
    if slow_sure != slow_may:
        why.append(f"slow owners' {delay:g} s is near the {deadline:g} s deadline")
    K, T, c, q = cell.owners, cell.tolerance, cell.colluders, cell.dropout
    high = completion_probability(K, T, q * surely, c, slow_sure)
    if not why:
        return CompletionForm(high, high, True, "")
    low = completion_probability(K, T, q, c, slow_may)
    return CompletionForm(low, high, False, "; ".join(why))

"""Closed-form composition bounds on epsilon: Kairouz et al.'s Theorem 7 and the paper's form.

Two of the three accounting methods of :class:`~dpmarket.protocol.privacy.ledger.PrivacyLedger`
(``"theorem7"`` and ``"paper"``; the third, PLD, is numerical). Each takes per-mechanism epsilons
and how many times each ran, and returns the epsilon of their adaptive composition at a delta.
Pure functions of their arguments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

__all__ = ["check_delta", "kairouz_theorem7", "paper_composition"]


def check_delta(delta: float, name: str = "delta") -> None:
    """ValueError naming ``name`` unless ``delta`` is a number in (0, 1)."""
    if not (isinstance(delta, int | float) and 0.0 < delta < 1.0):
        raise ValueError(f"{name} must be in (0, 1), got {delta!r}")


def _as_arrays(
    epsilons: Sequence[float], counts: Sequence[int]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    eps = np.asarray(epsilons, dtype=np.float64)
    cnt = np.asarray(counts, dtype=np.float64)
    if eps.ndim != 1 or eps.shape != cnt.shape:
        raise ValueError(
            f"epsilons and counts must be 1-d of equal length, got {eps.shape}, {cnt.shape}"
        )
    if np.any(~np.isfinite(eps)) or np.any(eps < 0):
        raise ValueError(f"epsilons must be finite and >= 0, got {epsilons!r}")
    if np.any(cnt < 0) or np.any(cnt != np.round(cnt)):
        raise ValueError(f"counts must be non-negative integers, got {counts!r}")
    return eps, cnt


def kairouz_theorem7(epsilons: Sequence[float], counts: Sequence[int], delta_tilde: float) -> float:
    """Theorem 7 (Kairouz et al. 2017, quoted in Appendix D of Sarpatwar et al. 2019).

    ``counts[l]`` mechanisms that are each ``(epsilons[l], delta_l)``-DP compose adaptively to
    ``(eps, 1 - (1 - delta_tilde) prod (1 - delta_l))``-DP, with eps the minimum of
    ``sum eps_l``, ``A + sqrt(2 S ln(1/delta_tilde))`` and
    ``A + sqrt(2 S ln(e + sqrt(2 S)/delta_tilde))`` where ``S = sum eps_l^2`` and
    ``A = sum eps_l (e^eps_l - 1)/(e^eps_l + 1)``. The third term follows the paper's print
    (``sqrt(sum 2 eps_l^2)`` inside the log, a larger argument than Kairouz's own statement, so
    still a valid, slightly looser bound). Requires ``0 < delta_tilde <= 1/e``.
    """
    if not (isinstance(delta_tilde, int | float) and 0.0 < delta_tilde <= math.exp(-1.0)):
        raise ValueError(f"delta_tilde must be in (0, 1/e], got {delta_tilde!r}")
    eps, cnt = _as_arrays(epsilons, counts)
    total = float(np.sum(cnt * eps))
    sum_sq = float(np.sum(cnt * eps**2))
    if sum_sq == 0.0:
        return 0.0
    drift = float(np.sum(cnt * eps * np.tanh(eps / 2.0)))  # (e^x - 1)/(e^x + 1) = tanh(x/2)
    second = drift + math.sqrt(2.0 * sum_sq * math.log(1.0 / delta_tilde))
    third = drift + math.sqrt(
        2.0 * sum_sq * math.log(math.e + math.sqrt(2.0 * sum_sq) / delta_tilde)
    )
    return min(total, second, third)


def paper_composition(epsilons: Sequence[float], counts: Sequence[int], delta: float) -> float:
    """The composition the paper's Section 4 figures were computed with.

    ``sum_l eps_l (e^eps_l - 1) + sqrt(2 ln(1/delta) sum_l eps_l^2)`` over every occurrence
    (Dwork-Rothblum-Vadhan advanced composition). With 1656 mechanisms at 0.01 and delta 0.01
    it gives the paper's 1.40; with 5p mechanisms at ``0.01/sqrt(5p)`` and delta 1e-4, 0.043.
    """
    check_delta(delta)
    eps, cnt = _as_arrays(epsilons, counts)
    drift = float(np.sum(cnt * eps * np.expm1(eps)))
    return drift + math.sqrt(2.0 * math.log(1.0 / delta) * float(np.sum(cnt * eps**2)))

"""random-select (issue 30): buy ``max_points`` points uniformly at random, then select p.

The honest baseline of every steered mechanism, and a mechanism of its own: a purchase that
reads nothing of the owners' data to decide what to buy, followed by the curator's exact final
selection of p points against the consumer's validation set D_v (protocol/summary/selection.py).

Theory of operation (``CuratorParams.random_purchase``)
------------------------------------------------------
1. *Count epoch* (epoch 1, ``EpochBody.count``): every owner answers with its number of
   sellable records n_i (``CountBody``). No g_tilde is released: owners receive a zero vector
   in its place (a public constant).
2. *Quotas*, once (:func:`random_quotas`): the curator draws how many of the ``max_points``
   points each owner sells from the multivariate hypergeometric distribution over the n_i,
   with its own generator (the mechanism's coins). Together with step 3 that is a uniformly
   random subset of ``max_points`` records of the pooled data: owners are sampled in
   proportion to their size.
3. *Random epochs*: every owner with quota left bids a record drawn uniformly, under its own
   secret key, from the records it has not yet delivered (``max_deliveries = 1`` withdraws a
   delivered record; protocol/summary/owner.py ``_exploration_draw``), and is asked for it. The
   bid is scored against the owner's own delivered points only (the curator verifies the
   delivery against it, as in allocate-select). The run ends when every quota is delivered.
4. *Final selection*: exact greedy of p among the purchased points against D_v.

Privacy (what the ledger charges: nothing, to any party):
* The counts n_i are fixed under the run's relation (replace one record; allocate-select sends
  them too, and CuratorParams refuses random-select under add/remove, where they would be an
  unbounded release).
* The quotas are a function of the public counts and the curator's coins; which record an owner
  delivers is a function of its own secret key and of its own deliveries: nothing any owner
  receives depends on another owner's records, so no release to an owner is made beyond what
  every run sends (setup, the finish). No auction runs, no summary release is made.
* The validation set: no g_tilde is released; the final selection reads D_v exactly and goes to
  the consumer only (selection.py), so the validation ledger is empty too.
* What owners do pay is the purchase itself: ``max_points`` of their records are delivered to
  the trusted curator in the clear (as in every mechanism; the budget bounds how many). The
  secure sums a market run makes before the summary (normalise, scan: actors/run/phases.py)
  are charged as in every run.
* The counts reach every owner: every owner is sent every epoch until the largest quota is
  delivered, so it sees 1 + max_j q_j epochs, and its own quota q_i (mean max_points n_i / N)
  estimates the pool's size. Not a charge under replace-one, but not hidden either
  (protocol/summary/counts.py; an owner that hides its count declines random-select).

The hedge (``CuratorParams.random_share``, issue 30): allocate-select buys the share
``random_share`` of its budget exactly as above (:func:`hedge_split`: quotas from the counts by
the curator's coins; in its epochs each owner draws uniformly by its secret key) and steers only
the rest; the exact final selection chooses p among the union, so a steered part aimed by a
noisy g_tilde cannot take the random part's points away. The random share is charged nothing,
by the argument above (the counts come with the histograms, fixed under replace-one); the
steered part is charged allocate-select's histogram (protocol/summary/allocate.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["default_budget", "hedge_split", "plan_random_select", "random_quotas"]


def random_quotas(
    records: Mapping[str, int], budget: int, rng: np.random.Generator
) -> dict[str, int]:
    """How many of ``budget`` points each owner sells: one multivariate hypergeometric draw
    over the owners' record counts (``min(budget, sum n_i)`` in all), so that a uniform draw
    inside each owner makes a uniformly random subset of the pooled records. ``rng``: the
    curator's own generator (its coins). Keys sorted; an owner with no records gets 0."""
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    names = sorted(records)
    counts = np.array([max(0, int(records[o])) for o in names], dtype=np.int64)
    if not names:
        return {}
    total = int(min(budget, int(counts.sum())))
    if total == 0:
        return dict.fromkeys(names, 0)
    drawn = rng.multivariate_hypergeometric(counts, total)
    return {o: int(k) for o, k in zip(names, drawn, strict=True)}


def default_budget(p: int, owners: int) -> int:
    """The market's default budget, (K + 1) p: the points herding-select accessed unbounded
    (about p exploration points, then each of about p steering epochs asks every owner), at which
    issue 30 compared the mechanisms and found random-select as good or better in 10 of 12
    held-out cells (benchmarks/RESULTS.md "utility_vs_random", "the default"). A market without
    ``[summary]`` buys this many points by random-select (actors/config/checks.py
    ``selected_mechanism``)."""
    if p < 1 or owners < 1:
        raise ValueError(f"need p >= 1 and owners >= 1, got p = {p}, owners = {owners}")
    return (owners + 1) * p


def plan_random_select(p: int, max_points: int | None = None) -> dict[str, Any]:
    """CuratorParams overrides of random-select: ``max_points`` (default ``ceil(1.5 p)``,
    allocate-select's default budget, the harnesses' comparison; a market passes its own, by
    default :func:`default_budget`), the exact final selection, one delivery per record (so
    the owners' draws are without replacement), and an epoch limit that lets one owner deliver
    the whole budget one point per epoch."""
    budget = math.ceil(1.5 * p) if max_points is None else int(max_points)
    if budget < p:
        raise ValueError(f"max_points must be >= p = {p}, got {budget}")
    return {
        "random_purchase": True,
        "allocate": False,
        "max_points": budget,
        "final_selection": "exact",
        "explore_share": 0.0,
        "max_deliveries": 1,
        "max_epochs": budget + 10,
    }


def hedge_split(
    records: Mapping[str, int], budget: int, share: float, rng: np.random.Generator
) -> tuple[dict[str, int], int, dict[str, int]]:
    """The hedge's random part (module docstring): ``round(share * budget)`` points drawn by
    :func:`random_quotas` over the owners' counts with the curator's generator ``rng``. Returns
    the random quotas, the budget left to steer and each owner's records left to steer from
    (its count less its random quota). ``share`` 0 draws nothing from ``rng``."""
    if not (math.isfinite(share) and 0 <= share <= 1):
        raise ValueError(f"share must be in [0, 1], got {share!r}")
    counts = {o: max(0, int(n)) for o, n in records.items()}
    drawn = random_quotas(counts, round(share * budget), rng) if share > 0 else {}
    spent = sum(drawn.values())
    left = {o: n - drawn.get(o, 0) for o, n in counts.items()}
    return drawn, max(0, budget - spent), left

"""What a purchase mechanism reveals about an owner's record count n_i to the other parties.

The run's relation, replace one record, treats every n_i as public (protocol/summary/params.py
``sensitivity``), so nothing below is an uncharged DP release. It is still what an owner may
want to keep to itself, and report.json promises to print no count (actors/run/report.py).
This module states, from the curator's public parameters alone, which mechanisms let the
others learn an owner's count, so an owner's policy can decline them (``[policy].hide_count``;
docs/guide/remote.md "What other parties learn about an owner's record count").

Theory of operation (by mechanism, :func:`mechanism_of`):

* random-select (random_select.py): the owners send n_i; the curator's coins draw the quotas
  q_i from the hypergeometric distribution over the n_i, and every owner is sent every epoch
  until the largest quota is delivered. So every owner sees 1 + max_j q_j epochs (report.json's
  ``outcome.epochs``), a function of every count, and its own quota, whose mean is
  ``max_points n_i / N``: ``n_i max_points / q_i`` estimates the pool's size N.
* allocate-select (allocate.py): the owners send n_i with their DP histograms; the quotas
  depend on the counts beyond the DP releases (the hedge draws its random share as
  random-select does, the histograms are projected onto sum n_i, the floor splits by n_i,
  every quota is capped at n_i), and the run again lasts 1 + max_j q_j epochs. With or
  without the hedge.
* herding-select (plan.py, channels.py): every broadcast is a function of g_tilde and public
  candidates, every bidder is asked (tau = 1), and the run lasts a public number of epochs:
  nothing any other owner observes depends on n_i while the owner has a record left to bid.
  An owner whose records run out (each record withdrawn after ``max_deliveries`` deliveries)
  passes; under ``max_points`` the budget is then reached later (more epochs, more auction
  steps in every ledger), and if every owner passes the run ends early. An owner with
  ``records * max_deliveries`` at least the most epochs it can be sent
  (:func:`most_epochs`) never passes for want of records. The plan withdraws a record after
  one delivery; with ``max_deliveries`` > 1 under ``max_points`` a repeated delivery (an
  exploration draw repeats with a probability set by n_i) buys no new point, so the budget
  is reached later: revealing too.
* Every other name (the harness's mwem-select, gaussian-select, ...; a market config cannot
  select them): not stated, so treated as revealing.

What every mechanism shows (not a choice of mechanism, so no decline avoids it): the curator
receives exact counts (random-select's count epoch, allocate-select's histograms, exploration
tokens that are arrival positions, and the owner's status after the run); the secure sums
release the pool's count with Gaussian noise (normalise) and its RACE sketch (scan, refreshes);
wall-clock timings grow with the records read.

Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

from dpmarket.protocol.summary.params import MARKET_MECHANISMS, CuratorParams

__all__ = ["COUNT_REVEALING_MECHANISMS", "count_exposure", "mechanism_of", "most_epochs"]

COUNT_REVEALING_MECHANISMS: frozenset[str] = frozenset({"random-select", "allocate-select"})
"""The market mechanisms (:data:`~.params.MARKET_MECHANISMS`) under which the other owners and
report.json's readers learn a function of every owner's record count (module docstring)."""


def mechanism_of(params: CuratorParams) -> str:
    """The purchase mechanism's public name from the curator's parameters: the name report.json
    writes (``parsimony.mechanism``) and a market config selects (actors/config/checks.py
    ``selected_mechanism``), :attr:`CuratorParams.mechanism`."""
    return params.mechanism


def most_epochs(params: CuratorParams, owners: int) -> int:
    """The most epochs a run of ``owners`` owners can send an owner: its exploration epochs and
    the steering epoch limit (epochs.py ``_open_epoch``). An owner bids at most once per epoch."""
    if owners < 1:
        raise ValueError(f"owners must be >= 1, got {owners}")
    return params.explore_epochs(owners) + params.epoch_limit


def count_exposure(params: CuratorParams, owners: int, records: int) -> str:
    """Why the other owners (and report.json's readers) would learn a function of this owner's
    record count in a purchase with ``params`` among ``owners`` owners, naming the mechanism;
    "" when they would not. ``records``: the records the owner can sell in this purchase."""
    if records < 0:
        raise ValueError(f"records must be >= 0, got {records}")
    name = mechanism_of(params)
    if name in COUNT_REVEALING_MECHANISMS:
        return (
            f"{name}: every owner sees the epochs (the largest quota + 1) and its own quota, "
            "both functions of every owner's record count"
        )
    if name not in MARKET_MECHANISMS:
        return f"{name}: not a market mechanism; what it reveals of a record count is not stated"
    if params.max_points is not None and params.max_deliveries > 1:
        return (
            f"{name}: max_deliveries = {params.max_deliveries} under max_points: a repeated "
            "delivery, likelier from fewer records, moves the epoch the budget is reached"
        )
    most = most_epochs(params, owners)
    if records * params.max_deliveries < most:
        return (
            f"{name}: {records} records, each sold at most {params.max_deliveries}x, can run "
            f"out within the {most} epochs the run may last; an owner that runs out passes, "
            "which changes the epochs under max_points"
        )
    return ""

"""The curator's epoch cycle (Algorithm 3, lines 3-12): open an epoch, collect bids, run the
private auction, collect and verify deliveries, buy, add the winner, release the next g_l.

A mixin of :class:`~dpmarket.protocol.summary.curator.Curator`, which owns the state declared
below (set in its ``__init__``) and the transitions of loss, refusal and resume; the theory of
operation and both transition tables are in :mod:`dpmarket.protocol.summary.owner`.

Privacy (what this cycle charges): one auction step per steering epoch to every owner's ledger
(exploration epochs run no auction and charge nothing), and every event of the summary
channel's release after a point joins the summary. Under allocate-select (allocate.py) the
profile epoch charges each owner its profile once, and the allocation epochs run no auction
and charge nothing; random-select (random_select.py) charges nothing at all. ``max_points``
caps the distinct points received: asks past it are cut in a public owner order
(post-processing of the ask set), and the run ends when it is reached.
Verification compares the delivered point's bid with the claimed one; a rejection's recorded
reason carries no value of the point.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.summary.allocate import AllocationCycle
from dpmarket.protocol.summary.auction import (
    AuctionBid,
    TransferCounter,
    choose_winner,
    run_auction,
)
from dpmarket.protocol.summary.channels import SummaryChannel, make_summary_channel
from dpmarket.protocol.summary.h1 import RandomFourierFeatures
from dpmarket.protocol.summary.h2 import MwemHash
from dpmarket.protocol.summary.messages import (
    AskBody,
    BidBody,
    CountBody,
    DeliverBody,
    EpochBody,
    FinishBody,
    ProfileBody,
)
from dpmarket.protocol.summary.objective import hashed_bids
from dpmarket.protocol.summary.params import CuratorParams
from dpmarket.protocol.summary.releases import relation
from dpmarket.protocol.summary.selection import PoolEntry, PurchasedPool
from dpmarket.protocol.summary.state import Provenance, _Epoch
from dpmarket.protocol.wire.codec import Message
from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.protocol.wire.parties import Outbox, body_of

__all__ = ["EpochCycle"]

F64 = npt.NDArray[np.float64]


class EpochCycle(AllocationCycle):
    """Bidding and asking phases of the curator (state owned by the Curator)."""

    params: CuratorParams
    owners: list[str]
    live: set[str]
    back: set[str]
    returns: dict[str, int]
    state: str
    reason: str
    epoch: _Epoch
    checkpoint_due: bool
    ledgers: dict[str, PrivacyLedger]
    provenance: list[Provenance]
    pool: PurchasedPool
    transfers: TransferCounter
    value: dict[str, float]
    rejected: list[tuple[int, str, str]]
    h1: RandomFourierFeatures
    _h2: MwemHash
    _H_seed: npt.NDArray[np.float32]
    _rng: np.random.Generator
    _out: Outbox
    _g_validation: F64
    _summary_channel: SummaryChannel
    _summary_H: list[npt.NDArray[np.float32]]
    _summary_X: list[F64]
    _labels: list[float]
    _members: set[tuple[str, int]]
    _times_bid: dict[tuple[str, int], int]

    def _exploring(self, number: int) -> bool:
        """Epochs 1 .. ceil(explore_share p / K) explore (protocol/summary/selection.py)."""
        return number <= self.params.explore_epochs(len(self.owners))

    def _open_epoch(self, g_summary: F64) -> list[Message]:
        number = self.epoch.number + 1
        if number - self.params.explore_epochs(len(self.owners)) > self.params.epoch_limit:
            return self._finish("epoch limit reached")
        if self._points_left() == 0:
            return self._finish("point budget reached")
        if self.quotas is not None and not any(self._quota_left(o) > 0 for o in self.live):
            return self._finish("allocation delivered")
        self.epoch = _Epoch(number, g_summary, len(self.provenance))
        self.state, self.checkpoint_due = "bidding", True
        for owner in self.back - self.live:  # counted: at most MAX_RETURNS (curator.py)
            self.returns[owner] = self.returns.get(owner, 0) + 1
        self.live |= self.back  # lost owners back again take part from this epoch on
        self.back = set()
        return [self._out.make(o, number, self._epoch_message(o)) for o in sorted(self.live)]

    def _epoch_message(self, owner: str) -> EpochBody:
        ep = self.epoch
        return self._epoch_body(owner, ep.number, ep.g_summary, ep.q, self._exploring(ep.number))

    def _points_left(self) -> int | None:
        """Distinct points the curator may still receive under ``max_points`` (None: no cap)."""
        cap = self.params.max_points
        return None if cap is None else max(0, cap - self.transfers.distinct_points)

    def _within_budget(self, pending: list[str]) -> list[str]:
        """The asks of ``pending`` that keep the distinct points received within ``max_points``.

        A re-asked point already received costs nothing; new points are kept in a public order
        (owner names rotated by the epoch number), so the cut is post-processing of the ask set
        and depends on no bid.
        """
        left, ep = self._points_left(), self.epoch
        if left is None:
            return pending
        names = sorted(self.owners)
        shift = ep.number % len(names)
        rank = {o: (i - shift) % len(names) for i, o in enumerate(names)}
        kept = []
        for owner in sorted(pending, key=rank.__getitem__):
            new = (owner, ep.bids[owner].token) not in self.transfers.deliveries
            if new and left <= 0:
                continue
            left -= int(new)
            kept.append(owner)
        return sorted(kept)

    def _waiting(self) -> set[str]:
        ep = self.epoch
        if self.state == "bidding":
            return self.live - set(ep.bids) - ep.passed
        return (ep.asked - ep.answered) & self.live

    def _all_answered(self) -> bool:
        """``not self._waiting()``, settled by counting while answers are short: each of an
        epoch's K answers asked for the waiting set (O(K)), so an epoch cost O(K^2). Sound
        without any invariant: answers (bids + passes; asks - deliveries) fewer than the live
        owners (more than the lost ones) leave a live owner waited for."""
        ep = self.epoch
        if self.state == "bidding":
            if len(ep.bids) + len(ep.passed) < len(self.live):
                return False
        elif len(ep.asked) - len(ep.answered) > len(self.owners) - len(self.live):
            return False
        return not self._waiting()

    def _on_bid(self, msg: Message) -> list[Message]:
        body = body_of(msg, BidBody)
        if msg.sender in self.epoch.bids or msg.sender in self.epoch.passed:
            raise RemoteProtocolError(f"summary.bid: {msg.sender} already answered this epoch")
        self.epoch.bids[msg.sender] = body
        return self._close_bidding() if self._all_answered() else []

    def _on_pass(self, msg: Message) -> list[Message]:
        if msg.sender in self.epoch.bids or msg.sender in self.epoch.passed:
            raise RemoteProtocolError(f"summary.pass: {msg.sender} already answered this epoch")
        self.epoch.passed.add(msg.sender)
        return self._close_bidding() if self._all_answered() else []

    def _on_profile(self, msg: Message) -> list[Message]:
        body = body_of(msg, ProfileBody)
        if not self._profiling(self.epoch.number):
            raise RemoteProtocolError("summary.profile: this epoch asks for bids, not a profile")
        if msg.sender in self.epoch.passed:
            raise RemoteProtocolError(f"summary.profile: {msg.sender} already answered")
        self._take_profile(msg.sender, body.mean, body.records)
        self.epoch.passed.add(msg.sender)
        return self._close_bidding() if self._all_answered() else []

    def _on_count(self, msg: Message) -> list[Message]:
        body = body_of(msg, CountBody)
        if not self._counting(self.epoch.number):
            raise RemoteProtocolError("summary.count: this epoch asks for bids, not a count")
        if msg.sender in self.epoch.passed:
            raise RemoteProtocolError(f"summary.count: {msg.sender} already answered")
        self._take_count(msg.sender, body.records)
        self.epoch.passed.add(msg.sender)
        return self._close_bidding() if self._all_answered() else []

    def _close_bidding(self) -> list[Message]:
        ep, p = self.epoch, self.params
        if self._profiling(ep.number) or self._counting(ep.number):
            # allocate.py: charge the profiles, fix the quotas; random_select.py: draw them
            self._allocate()
            self.checkpoint_due = True
            return self._open_epoch(ep.g_summary)
        if not ep.bids:
            return self._finish("no owner has points left to bid")
        if not ep.decided and self._exploring(ep.number):
            # exploration: every bidder asked, no auction run, nothing charged (selection.py)
            ep.asked, ep.decided, self.checkpoint_due = set(ep.bids), True, True
        if not ep.decided and self.quotas is not None:
            # allocate.py: owners with quota left are asked, no auction run, nothing charged
            ep.asked = {o for o in ep.bids if self._quota_left(o) > 0}
            ep.decided, self.checkpoint_due = True, True
        if not ep.decided:
            bids = []
            for owner, b in sorted(ep.bids.items()):
                key = (owner, b.token)
                self._times_bid[key] = self._times_bid.get(key, 0) + 1
                bids.append(AuctionBid(owner, b.token, b.bid, self._times_bid[key]))
            decision = run_auction(bids, p.eps_auction, p.tau, self._rng, variant=p.auction_variant)
            for owner in self.owners:
                self.ledgers[owner].auction(
                    p.eps_auction, p.auction_variant, label="auction step",
                    neighbouring=relation(p),  # the run's record relation
                )  # fmt: skip
            ep.asked, ep.decided, self.checkpoint_due = set(decision.asked), True, True
        # a resumed epoch reuses its auction; owners that no longer bid are not asked again
        ep.asked &= set(ep.bids) | ep.answered
        ep.deadline = None
        self.state = "asking"
        pending = self._within_budget(sorted(ep.asked - ep.answered))  # max_points
        ep.asked = ep.answered | set(pending)
        if not pending:
            return self._close_asking()
        return [self._out.make(o, ep.number, AskBody(ep.bids[o].token)) for o in pending]

    def _on_deliver(self, msg: Message) -> list[Message]:
        body = body_of(msg, DeliverBody)
        ep, owner = self.epoch, msg.sender
        if owner not in ep.asked or owner in ep.answered:
            raise RemoteProtocolError(
                f"summary.deliver: {owner} was not asked or already delivered"
            )
        if body.token != ep.bids[owner].token:
            raise RemoteProtocolError(
                f"summary.deliver.token: {body.token} was not asked of {owner}"
            )
        try:  # check first: a point the curator cannot hash is refused, nothing changes
            why = self._verify(owner, body)
        except (ValueError, ArithmeticError) as exc:
            raise RemoteProtocolError(
                f"summary.deliver: {owner}'s point is unusable: {exc}"
            ) from None
        ep.answered.add(owner)
        self.transfers.record(owner, body.token)
        if why:
            self.rejected.append((ep.number, owner, why))
        else:
            ep.verified[owner] = (ep.bids[owner].bid, body)
        return self._close_asking() if self._all_answered() else []

    def _verify(self, owner: str, body: DeliverBody) -> str:
        """Empty string if the delivered point matches its bid, else why it does not."""
        p, ep = self.params, self.epoch
        if p.less_trusted:
            if body.hashed is None or body.hashed.shape != (p.d,):
                return f"expected hashed vector of shape ({p.d},)"
            if np.abs(body.hashed).max() > np.sqrt(2.0 / p.d) * (1 + 1e-5):
                return "hashed vector outside the range of h1"
            h = np.asarray(body.hashed, dtype=np.float32)
        else:
            if body.point is None or body.point.shape != (self.h1.n_features,):
                return f"expected a point of shape ({self.h1.n_features},)"
            with np.errstate(all="ignore"):  # an extreme point hashes to inf/nan: refused below
                h = self.h1(np.asarray(body.point, dtype=np.float64))
        if not np.isfinite(h).all():
            return "point outside the range h1 can hash"
        if body.label is None:
            return "missing label"
        if (owner, body.token) in self._members:
            return "point is already in the summary"
        claimed = ep.bids[owner].bid
        g, q = (
            (ep.g_summary, ep.q) if self.quotas is None else self._own_direction(owner, ep.number)
        )
        actual = float(hashed_bids(h[None, :], self._g_validation, g, q)[0])
        if not abs(actual - claimed) <= p.verify_tolerance * (1.0 + abs(claimed)):  # nan: refused
            return "bid does not match the delivered point"  # no values: the reason is reported
        return ""

    def _close_asking(self) -> list[Message]:
        ep = self.epoch
        bought = {o: self._purchase(o, bid, body) for o, (bid, body) in sorted(ep.verified.items())}
        if self._exploring(ep.number) or self.quotas is not None:  # the pool grew; S and g_l stay
            return self._open_epoch(ep.g_summary)
        winner = choose_winner({o: bid for o, (bid, _) in ep.verified.items()})
        if winner is None:  # nothing added: repeat with the same release, no new charge
            return self._open_epoch(ep.g_summary)
        self._add(bought[winner])
        if len(self.provenance) >= self.params.p:
            return self._finish("complete")
        return self._open_epoch(self._release_summary())

    def _purchase(self, owner: str, bid: float, body: DeliverBody) -> PoolEntry:
        """A verified delivery as a pool entry (hashed once), kept in the purchased pool."""
        point = None if body.point is None else np.asarray(body.point, dtype=np.float64)
        h = self.h1(point) if point is not None else np.asarray(body.hashed, dtype=np.float32)
        label = float(body.label if body.label is not None else 0.0)
        entry = PoolEntry(owner, body.token, self.epoch.number, bid, point, h, label)
        self.pool.add(entry)
        return entry

    def _add(self, entry: PoolEntry) -> None:
        """The epoch's winner joins the summary S."""
        if entry.point is not None:
            self._summary_X.append(entry.point)
        self._summary_H.append(entry.hashed)
        self._labels.append(entry.label)
        self._members.add((entry.owner, entry.token))
        gain = 2.0 / (self.epoch.q + 1) * entry.bid
        self.value[entry.owner] += gain
        self.provenance.append(Provenance(entry.owner, entry.token, entry.epoch, entry.bid, gain))

    def _release_summary(self) -> F64:
        """g_l for the next epoch by ``params.summary_release`` (protocol/summary/channels.py):
        every event the channel ran is charged to every owner's ledger (per point of the
        summary)."""
        if getattr(self, "_summary_channel", None) is None:  # restored from a journal, no start()
            self._summary_channel = make_summary_channel(
                self.params, self.h1, self._h2, self._H_seed, self._g_validation, self._rng,
                warm_up=False,
            )  # fmt: skip
        summary_H = np.array(self._summary_H, dtype=np.float32).reshape(-1, self.params.d)
        release = self._summary_channel.release(summary_H, self._rng)
        for owner in self.owners:
            for event in release.events:
                self.ledgers[owner].record(event)
        return release.g_summary

    def _finish(self, reason: str) -> list[Message]:
        self.state, self.reason, self.checkpoint_due = "done", reason, True
        body = FinishBody(self.epoch.number, reason)
        return [self._out.make(o, self.epoch.number, body) for o in sorted(self.live)]

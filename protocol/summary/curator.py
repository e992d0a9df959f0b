"""The curator of private summarisation (Algorithm 3): releases, auction, verification, ledger.

See :mod:`dpmarket.protocol.summary.owner` for the theory of operation and both transition tables.

The two broadcasts are made by the mechanisms of :mod:`dpmarket.protocol.summary.releases`
(g_tilde) and :mod:`dpmarket.protocol.summary.channels` (g_l), chosen by
``validation_release`` and ``summary_release`` (defaults: the paper's MWEM h2); each records the
events it ran. With the defaults, the ledger charges as follows.

Privacy (what the ledger charges, per protected party; delta and neighbouring as stated):
- ``validation``: one h2 release of mean h1 over D_v, ``validation_iterations`` MWEM steps at
  ``eps_validation``; each step = exponential mechanism on a sensitivity-1 score sampled with
  probability proportional to exp(eps psi) (charged 2 eps, pure) + Laplace(1/eps) (eps, pure).
  Neighbouring: the run's relation (below); m = |D_v| is public.
- ``owner-k`` (owner k's data as seen by any single other owner): every h2 release of the summary
  sum (``summary_iterations`` steps at ``eps_summary`` each, charged as above; the first epoch's
  release covers only the public seed set and costs nothing), and one auction step per epoch in
  which owners bid (``AuctionEvent`` of the chosen variant). Neighbouring: one relation for
  every event of a run (``params.neighbouring``; protocol/summary/releases.py ``relation``),
  the secure sums' and allocate-select's included. ``"replace"``, the default: two fixed-size
  data sets that differ by one substituted point (m, q and the owners' n_i are public),
  sensitivity 2 for the quantised coordinate sums. ``"add_remove"``: the paper's Theorem 6,
  sensitivity 1, kept to reproduce the paper (refused where an exact count is sent). An epoch
  that adds nothing re-sends the previous release unchanged (no charge).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.summary.auction import (
    TransferCounter,
)
from dpmarket.protocol.summary.channels import make_summary_channel
from dpmarket.protocol.summary.epochs import EpochCycle
from dpmarket.protocol.summary.h1 import RandomFourierFeatures
from dpmarket.protocol.summary.h2 import MwemHash
from dpmarket.protocol.summary.messages import (
    FinishBody,
    SetupBody,
    ValidationBody,
)
from dpmarket.protocol.summary.params import CuratorParams
from dpmarket.protocol.summary.releases import release_validation
from dpmarket.protocol.summary.selection import PurchasedPool
from dpmarket.protocol.summary.state import Provenance, SummaryResult, _Epoch
from dpmarket.protocol.wire.codec import Message
from dpmarket.protocol.wire.errors import LocalProtocolError, RemoteProtocolError
from dpmarket.protocol.wire.parties import Handler, Outbox, dispatch

__all__ = ["MAX_RETURNS", "Curator", "CuratorParams", "Provenance", "SummaryResult"]

F64 = npt.NDArray[np.float64]
CURATOR = "curator"
MAX_RETURNS = 3
"""Times one owner is taken back in a run (:meth:`Curator.returned`). Each return of an owner
that then misses the deadline again costs the run one phase deadline; an owner that comes back
and is lost again this many times stays lost (it still counts against T in every epoch it is
absent), so no owner can slow a run by more than this many deadlines by coming and going."""


class Curator(EpochCycle):
    """The trusted, parsimonious curator (Algorithm 3) as a sans-I/O state machine."""

    def __init__(
        self,
        run: str,
        owners: list[str],
        validation: npt.ArrayLike,
        seed_set: npt.ArrayLike,
        params: CuratorParams,
        rng: np.random.Generator,
    ) -> None:
        V = np.asarray(validation, dtype=np.float64)
        D0 = np.asarray(seed_set, dtype=np.float64)
        if V.ndim != 2 or len(V) == 0:
            raise ValueError(f"validation: expected a non-empty 2-D array, got shape {V.shape}")
        if D0.ndim != 2 or len(D0) == 0 or D0.shape[1] != V.shape[1]:
            raise ValueError(f"seed_set: expected shape (n, {V.shape[1]}), got {D0.shape}")
        if len(set(owners)) != len(owners) or not owners or CURATOR in owners:
            raise ValueError(f"owners: expected distinct names other than 'curator': {owners}")
        self.name, self.run, self.params, self.owners = CURATOR, run, params, list(owners)
        self._owner_set = frozenset(owners)  # a frame's sender checked in O(1), not O(K)
        self._rng = rng
        self._out = Outbox(run, CURATOR)
        self._V, self._D0 = V, D0
        self.validation_size = len(V)
        self._hash_inputs()
        self._h2 = MwemHash(params.d, params.grid_step, warm_start=params.warm_start)
        self.ledgers = {o: PrivacyLedger(o) for o in owners}
        self.ledgers["validation"] = PrivacyLedger("validation")
        self.live = set(owners)
        self.state = "new"
        self._g_validation = np.zeros(params.d)
        self._summary_H: list[npt.NDArray[np.float32]] = []
        self._summary_X: list[F64] = []
        self._labels: list[float] = []
        self._members: set[tuple[str, int]] = set()
        self.provenance: list[Provenance] = []
        self.pool = PurchasedPool()  # every verified delivery (protocol/summary/selection.py)
        self._final: SummaryResult | None = None
        self._times_bid: dict[tuple[str, int], int] = {}
        self.profiles: dict[str, F64] = {}  # allocate-select (protocol/summary/allocate.py)
        self.records: dict[str, int] = {}
        self.quotas: dict[str, int] | None = None
        self.random_quotas: dict[str, int] = {}  # the hedge's random part (random_select.py)
        self.transfers = TransferCounter()
        self.value = dict.fromkeys(owners, 0.0)
        self.dropped: list[tuple[int, str, str]] = []
        self.rejected: list[tuple[int, str, str]] = []
        self.late_frames = 0
        self.epoch = _Epoch(0, np.zeros(params.d), 0)
        self.reason = ""
        self.lost: dict[str, int] = {}  # owner -> epoch at which it missed a deadline
        self.back: set[str] = set()  # lost owners reachable again: live from the next epoch
        self.returns: dict[str, int] = {}  # owner -> times taken back (MAX_RETURNS at most)
        self.refusal: dict[str, object] = {}
        self.checkpoint_due = False  # a release or an auction happened: journal the state now
        self._table: dict[tuple[str, str], Handler] = {
            ("bidding", "summary.bid"): self._on_bid,
            ("bidding", "summary.pass"): self._on_pass,
            ("asking", "summary.deliver"): self._on_deliver,
            ("bidding", "summary.profile"): self._on_profile,
            ("bidding", "summary.count"): self._on_count,
        }

    def _hash_inputs(self) -> None:
        p = self.params
        self.h1 = RandomFourierFeatures(
            self._V.shape[1], p.d, p.gamma, p.h1_seed, center=p.center, scale=p.scale
        )
        self._H_validation = self.h1(self._V)
        self._H_seed = self.h1(self._D0)
        self._seed_sum = self._H_seed.astype(np.float64).sum(axis=0)

    def standardize(self, center: npt.ArrayLike, scale: npt.ArrayLike, gamma: float) -> None:
        """Hash standardised features, ``(x - center) / scale``, with kernel width ``gamma`` in
        those units; only before :meth:`start`. ``center`` and ``scale`` must be public (the
        normalise round's DP release, already charged): using them is post-processing."""
        if self.state != "new":
            raise LocalProtocolError(f"standardize: only before start (state {self.state})")
        params = dataclasses.replace(
            self.params,
            center=tuple(float(v) for v in np.asarray(center).ravel()),
            scale=tuple(float(v) for v in np.asarray(scale).ravel()),
            gamma=float(gamma),
        )
        previous = self.params
        self.params = params
        try:
            self._hash_inputs()
        except ValueError:
            self.params = previous
            self._hash_inputs()
            raise

    def _setup_body(self) -> SetupBody:
        p = self.params
        standard = p.center is not None and p.scale is not None
        return SetupBody(
            self.h1.n_features,
            p.d,
            p.gamma,
            p.h1_seed,
            p.tau,
            p.less_trusted,
            p.max_deliveries,
            center=np.asarray(p.center, dtype=np.float64) if standard else None,
            scale=np.asarray(p.scale, dtype=np.float64) if standard else None,
        )

    # ------------------------------------------------------------------------------ start
    def start(self) -> list[Message]:
        """Publish the parameters and g_tilde, then open epoch 1."""
        if self.state != "new":
            raise LocalProtocolError(f"start: curator already started (state {self.state})")
        p = self.params
        setup = self._setup_body()
        # g_tilde and the summary channel (protocol/summary/releases.py, channels.py; both record
        # their events). The "mwem" channel warms h2 up on the public seed set here, free of
        # privacy cost.
        seed = (self._H_seed,) if p.validation_center == "seed" else ()  # the public seed set
        if p.random_purchase:  # random_select.py: nothing released; a public zero in its place
            g_validation = np.zeros(p.d)
        else:
            g_validation = release_validation(
                self._H_validation, p, self.ledgers["validation"], self._rng, *seed
            )
            self._summary_channel = make_summary_channel(
                p, self.h1, self._h2, self._H_seed, g_validation, self._rng
            )
        self._g_validation = g_validation
        out = [self._out.make(o, 0, setup) for o in self.owners]
        out += [self._out.make(o, 0, ValidationBody(g_validation)) for o in self.owners]
        return out + self._open_epoch(np.zeros(p.d))

    # ------------------------------------------------------------------------- interface
    def receive(self, msg: Message) -> list[Message]:
        if msg.sender not in self._owner_set:
            raise RemoteProtocolError(f"from: {msg.sender!r} is not an owner of this run")
        if msg.sender not in self.live or self._is_late(msg):
            self.late_frames += 1
            return []
        if msg.round != self.epoch.number:
            raise RemoteProtocolError(
                f"round: {msg.round} is not the open epoch {self.epoch.number}"
            )
        return dispatch(self.name, self.run, self.state, self._table, msg)

    def returned(self, owners: set[str]) -> None:
        """``owners`` are reachable again (the runtime's word: a remote owner that took the
        offer and whose link is back). Those of them that were lost are asked again from the
        next epoch on (:meth:`_open_epoch`); T counts the owners absent from each epoch
        (:meth:`lose`), so a returning owner no longer counts once it is back (and counts again
        if it misses that epoch's deadline too). An owner already taken back
        :data:`MAX_RETURNS` times is not taken back again (:meth:`kept_out`)."""
        again = {o for o in owners if o in self.lost} - self.live
        self.back |= {o for o in again if self.returns.get(o, 0) < MAX_RETURNS}

    def kept_out(self) -> dict[str, str]:
        """The lost owners not taken back again, and why (report.json ``faults``)."""
        return {
            o: f"lost again after coming back {n} times (at most {MAX_RETURNS}): not taken back"
            for o, n in sorted(self.returns.items())
            if n >= MAX_RETURNS and o not in self.live
        }

    def _is_late(self, msg: Message) -> bool:
        """An answer to a phase that has already closed (deadline passed or run finished)."""
        if self.state in ("done", "refused"):
            return True
        if msg.round < self.epoch.number:
            return True
        return self.state == "asking" and msg.kind in ("summary.bid", "summary.pass")

    def expire(self, now: float) -> list[Message]:
        ep = self.epoch
        if self.state not in ("bidding", "asking"):
            return []
        if ep.deadline is None:
            ep.deadline = now + self.params.phase_timeout
            return []
        if now < ep.deadline:
            return []
        return self.lose(self._waiting())

    @property
    def deadline(self) -> float | None:
        """When the open phase's deadline fires (None: not armed yet, or no phase open)."""
        return self.epoch.deadline if self.state in ("bidding", "asking") else None

    def lose(self, owners: set[str]) -> list[Message]:
        """Count ``owners`` as dropped now (deadline missed, or their process is known dead):
        the run goes on without them while lost + colluding <= T, and refuses otherwise."""
        ep, phase = self.epoch, self.state
        owners = owners & self.live
        if phase not in ("bidding", "asking"):
            return []
        for owner in sorted(owners):
            self.dropped.append((ep.number, owner, phase))
            self.lost.setdefault(owner, ep.number)
        self.live -= owners
        self.back -= owners
        budget = self.params.max_lost
        absent = set(self.owners) - self.live  # absent from this epoch (T counts per epoch)
        if budget is not None and len(absent) + self.params.known_colluders > budget:
            return self._refuse(phase)
        if not self._all_answered():
            return []
        return self._close_bidding() if phase == "bidding" else self._close_asking()

    def _refuse(self, phase: str) -> list[Message]:
        """More owners lost (plus known colluders) than T: stop before any further release."""
        ep, p = self.epoch, self.params
        lost = sorted(set(self.owners) - self.live)  # absent from this epoch
        self.refusal = {
            "epoch": ep.number,
            "phase": phase,
            "lost": lost,
            "colluders": p.known_colluders,
            "tolerance": p.max_lost,
        }
        self.state, self.checkpoint_due = "refused", True
        self.reason = (
            f"refused at epoch {ep.number} ({phase}): {len(lost)} owner(s) lost "
            f"({', '.join(lost)}) + {p.known_colluders} colluding > T = {p.max_lost}; "
            "no further release was made"
        )
        body = FinishBody(ep.number, "refused")
        return [self._out.make(o, ep.number, body) for o in sorted(self.live)]

    def refuse_round(self, phase: str, reason: str, missing: list[str]) -> list[Message]:
        """A secure-sum round fell short (missing + known colluders > T; the aggregator
        released and charged nothing): refuse the run before any further release, as for epochs.
        Before :meth:`start` (normalise, scan) nothing was published, so no owner is told and
        the refusal cannot be resumed (``before_start``): the run starts again."""
        if self.state in ("done", "refused"):
            return []
        ep, p, started = self.epoch, self.params, self.state != "new"
        self.refusal = {
            "epoch": ep.number,
            "phase": phase,
            "lost": sorted(missing),
            "colluders": p.known_colluders,
            "tolerance": p.max_lost,
            "before_start": not started,
        }
        self.state, self.checkpoint_due = "refused", True
        self.reason = f"refused at epoch {ep.number} ({phase}): {reason}; no release was made"
        body = FinishBody(ep.number, "refused")
        return [self._out.make(o, ep.number, body) for o in sorted(self.live)] if started else []

    def resume(self) -> list[Message]:
        """Continue a refused run when its owners are back: re-send the journaled releases
        (g_tilde and the open epoch's g_l) without drawing new noise, and reopen the epoch. An
        auction that already ran in this epoch is reused, not redrawn (its charge stands)."""
        if self.state not in ("refused", "bidding", "asking"):
            raise LocalProtocolError(f"resume: nothing to resume in state {self.state}")
        if self.refusal.get("before_start"):
            raise LocalProtocolError("resume: refused before the summarisation started; run again")
        ep = self.epoch
        self.live, self.state, self.reason, self.refusal = set(self.owners), "bidding", "", {}
        self.lost.clear()
        self.back.clear()
        ep.bids.clear()
        ep.passed.clear()
        ep.deadline = None
        setup = self._setup_body()
        out = [self._out.make(o, ep.number, setup) for o in self.owners]
        out += [
            self._out.make(o, ep.number, ValidationBody(self._g_validation)) for o in self.owners
        ]
        return out + [self._out.make(o, ep.number, self._epoch_message(o)) for o in self.owners]

    @property
    def done(self) -> bool:
        return self.state == "done"

    def result(self) -> SummaryResult:
        """The summary: the epoch winners, or (``final_selection = "exact"``) the pool points
        exact greedy picks against D_v (computed once the run is done, then kept)."""
        if self.params.final_selection == "exact" and len(self.pool):
            if self.state != "done":  # a refused run may still resume: nothing kept
                return self._selected_result()
            if self._final is None:
                self._final = self._selected_result()
            return self._final
        return self._winners_result()

    def _winners_result(self) -> SummaryResult:
        d = self.params.d
        hashed = np.array(self._summary_H, dtype=np.float32).reshape(-1, d)
        points = None if self.params.less_trusted else np.array(self._summary_X, dtype=np.float64)
        return SummaryResult(
            points=points,
            hashed=hashed,
            labels=np.array(self._labels, dtype=np.float64),
            provenance=list(self.provenance),
            epochs=self.epoch.number,
            reason=self.reason,
            value=dict(self.value),
            transfers=self.transfers,
            ledgers=self.ledgers,
            dropped=list(self.dropped),
            rejected=list(self.rejected),
            late_frames=self.late_frames,
        )

    def _selected_result(self) -> SummaryResult:
        """Exact greedy over the purchased pool against D_v (protocol/summary/selection.py):
        returned
        to the consumer, never sent to an owner, so no ledger event."""
        p = self.params
        standard = None
        if p.center is not None and p.scale is not None:
            standard = (np.asarray(p.center, dtype=np.float64), np.asarray(p.scale, np.float64))
        order, gains = self.pool.select(p.p, self._V, self._H_validation, p.gamma, standard)
        picked = [self.pool.entries[i] for i in order]
        provenance = [
            Provenance(e.owner, e.token, e.epoch, e.bid, float(g))
            for e, g in zip(picked, gains, strict=True)
        ]
        value = dict.fromkeys(self.owners, 0.0)
        for prov in provenance:
            value[prov.owner] += prov.gain
        points = None if p.less_trusted else np.array([e.point for e in picked], dtype=np.float64)
        return dataclasses.replace(
            self._winners_result(), points=points, provenance=provenance, value=value,
            hashed=np.array([e.hashed for e in picked], dtype=np.float32).reshape(-1, p.d),
            labels=np.array([e.label for e in picked], dtype=np.float64),
        )  # fmt: skip

"""An owner's budget gate: it charges its own durable ledger before it contributes, or declines.

The owner actor (actors/parties/owner.py) holds one :class:`OwnerGate` per owner that has a store
(``[owners.NAME].ledger`` or ``[privacy].ledger_dir``). What the owner pays for, and when:

- **a secure-sum round** (normalise, scan, each refresh): one Gaussian event at the round's
  sigma and L2 sensitivity, under the run's one neighbouring relation (replace one record by
  default), the event the curator's ledger records for a released round. It is charged after
  the owner's share frames are built and before they leave the actor (the hub sends what
  ``dca_contribute`` returns); release id ``RUN:SESSION:ROUND`` (the session named by the
  operator's pinned node-key fingerprints, fresh for every session). A round without noise
  (sigma 0) is declined.
- **the summary phase** (auction steps and summary releases of Algorithm 3): its whole planned
  upper bound (``planned_owner_ledger``: every steering epoch used), fixed by the operator
  before the run and handed over at construction, charged once before the owner answers its
  first summary frame; release id ``RUN:summary`` (a resumed run continues the same phase).

Because each charge's parameters are fixed before the release it pays for (the round's spec,
the operator's plan), the owner's :class:`~dpmarket.protocol.privacy.filter.RenyiFilter` is
valid over the adaptive sequence of runs (protocol/privacy/filter.py). A declined secure-sum
round makes ``dca_contribute`` fail, so the hub counts the owner absent from that round; a
declined summary phase makes the owner silent, so the curator counts it lost at the deadline:
both count against T, and a run with more than T refuses (exit 3). A decline depends only on
public parameters and the owner's own past charges, never on its records.

**Blocks** (``[privacy].block_records = N``; Sage, SOSP 2019): records are grouped by arrival
into blocks of N; or (``[privacy].block_seconds = W``, Sage's time windows) by the window of W
seconds in which they first arrived, stamped by the owner actor's clock when their batch is
taken in (records taken in before the owner's gate exists are stamped when it is made). A
record's block is assigned once, in the store, when it arrives and before any release reads it
(:meth:`OwnerGate.arrived`, protocol/privacy/blocks.py), under block ids the store allocates;
every later run reads it from the store, whatever its own N or W (a new size groups only
records that arrive after it). Each block has the owner's cap as its own budget.
A release is charged to each live block it reads
(a secure-sum round: the blocks holding the records it covers, for a refresh only those added
since its base round; the summary plan: every block, each the first time it holds records in
the run, so blocks arriving mid-run pay when they arrive). A block whose filter does not admit
a release is retired in the same transaction and never read again: its records leave every
later sketch and are never bid or delivered (``Owner.retire``). New blocks arrive with full
budgets. The guarantee is parallel composition over disjoint blocks: neighbouring data differ
by one record in one block (a record's block is fixed by its arrival, public metadata, as
Sage's time windows; the owner's inputs are append-only and read in the same order by every
run), a release that does not read a block does not depend on it, so that record's loss
composes only the whole-store charges made before blocks were switched on (which every block
pays) and the releases charged to its block, which its filter keeps within ``(epsilon,
delta)``; the owner's ``spent`` is the largest block's. **Per record, whatever the
configuration** (issue 24): a store that holds charges to blocks refuses a run without blocks
(:class:`~dpmarket.actors.budgets.store.StoreError`, naming the store and the keys; the config
check says the same before Ray starts), since such a run would charge records against the
whole-store budget alone. With blocks an owner never declines: which blocks exist depends on
its record count, so a decline (seen by the curator) would reveal that count; an owner whose
blocks are all spent contributes no records to a secure sum (its share of the noise still goes
in) and passes in the summary. For the same reason a retired block is no decline:
``declines`` stays empty with blocks, and which blocks retired is in the owner's store.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.actors.budgets.store import BLOCKS_KEY, LedgerStore, StoreError
from dpmarket.protocol.agents.policy import RoundPrice
from dpmarket.protocol.privacy.blocks import Grouping, record_digests
from dpmarket.protocol.privacy.filter import RenyiFilter
from dpmarket.protocol.privacy.ledger import MechanismEvent
from dpmarket.protocol.securesum.spec import RoundSpec
from dpmarket.protocol.summary.params import CuratorParams
from dpmarket.protocol.summary.snr import planned_owner_ledger

__all__ = [
    "BudgetDeclined",
    "BudgetGate",
    "OwnerBudget",
    "OwnerGate",
    "session_id",
    "summary_plan",
]

# the plan's round labels -> the labels the curator's ledger gives the same releases
ROUND_LABELS = {
    "normalise": "normalise (secure sum)",
    "scan": "scan (secure sum)",
    "refresh": "scan refresh (secure sum)",
}


class BudgetDeclined(RuntimeError):
    """The owner's cap does not admit the release: it takes no part in it."""


@dataclass(frozen=True)
class OwnerBudget:
    """One owner's store (an absolute path) and cap (epsilon at delta)."""

    ledger: str
    epsilon: float
    delta: float
    block_records: int = 0  # > 0: blocks of this many records (arrival order), own budgets
    block_seconds: float = 0.0  # > 0: blocks by arrival-time windows of this many seconds


@dataclass(frozen=True)
class BudgetGate:
    """What the operator hands an owner actor at construction: the owner's store and cap,
    the run's ledger id, and the summary phase's planned events (an upper bound)."""

    budget: OwnerBudget
    run: str
    summary: tuple[MechanismEvent, ...] = ()
    block_records: int = 0  # > 0: records grouped by arrival into blocks with their own budgets
    block_seconds: float = 0.0  # > 0: ... by windows of arrival time (protocol/privacy/blocks.py)


def summary_plan(params: CuratorParams) -> tuple[MechanismEvent, ...]:
    """The summary phase's planned events under ``params`` (``planned_owner_ledger``, every
    steering epoch used), labelled as what they are: the plan's upper bound, charged up front."""
    return tuple(
        dataclasses.replace(e, label=f"summary plan: {e.label or e.mechanism}")
        for e in planned_owner_ledger(params).events
    )


def session_id(pins: dict[str, str]) -> str:
    """A secure-sum session's name from the node-key fingerprints the operator pinned (fresh
    keys per session, so fresh names)."""
    text = ",".join(f"{node}={fp}" for node, fp in sorted(pins.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class OwnerGate:
    """One owner's store and filter inside its actor (module docstring: what is charged).
    With blocks every record has the block its store gave it on arrival and every block has
    its own budget (module docstring, "Blocks")."""

    def __init__(self, owner: str, gate: BudgetGate) -> None:
        self.owner, self.gate = owner, gate
        self.store = LedgerStore(
            gate.budget.ledger, owner, RenyiFilter(gate.budget.epsilon, gate.budget.delta)
        )
        if not self.blocked and self.store.block_charges():
            self.store.close()
            raise StoreError(
                f"{gate.budget.ledger}: {owner}'s store holds charges to blocks of its records; "
                f"a run without blocks would charge them against the whole-store budget alone: "
                f"set {BLOCKS_KEY} again (any size: records keep their blocks) or use another store"
            )
        self.store.begin_run(gate.run)
        self._summary: bool | None = None
        self._summary_blocks: set[int] = set()  # blocks asked to pay this run's summary plan
        self._summary_read: set[int] = set()  # ... and those that paid it
        self.declines: list[str] = []
        # a remote owner's own price of each round label (protocol/agents/policy.py
        # price_rounds): charged instead of the spec's declared sigma, sensitivity, relation
        self.prices: dict[str, RoundPrice] | None = None

    @property
    def blocked(self) -> bool:
        return self.gate.block_records > 0 or self.gate.block_seconds > 0

    @property
    def grouping(self) -> Grouping | None:
        """How this run groups records that arrive (None: no blocks)."""
        if self.gate.block_seconds > 0:
            return Grouping("seconds", self.gate.block_seconds)
        if self.gate.block_records > 0:
            return Grouping("records", self.gate.block_records)
        return None

    def arrived(
        self, first: int, count: int, at: float, features: npt.ArrayLike | None = None
    ) -> None:
        """Records at positions ``first .. first + count - 1`` arrived at ``at`` (the actor's
        clock): with blocks, each one not yet in a block is given one in the store now, before
        any release reads it (protocol/privacy/blocks.py), and with ``features`` (their rows)
        each position is tied to its record, so that a later run re-reading other records at
        known positions is refused (:class:`StoreError`); nothing to do without blocks."""
        grouping = self.grouping
        if grouping is not None and count > 0:
            digests = None if features is None else record_digests(features)
            self.store.assign(first, count, at, grouping, digests)

    def _of(self, n: int) -> npt.NDArray[np.int64]:
        """The block of each record position ``0 .. n - 1``, as the store assigned it."""
        return self.store.blocks().of(n)

    def _blocks(self, n: int, start: int = 0) -> list[int]:
        return sorted({int(b) for b in self._of(n)[start:]}) if n > start else []

    def _mask(self, n: int, blocks: set[int]) -> npt.NDArray[np.bool_]:
        return np.isin(self._of(n), sorted(blocks - self.store.retired()))

    def _round_event(self, spec: RoundSpec, release: str) -> MechanismEvent:
        if spec.sigma_std <= 0:
            self.declines.append(f"{release}: no noise")
            raise BudgetDeclined(f"{self.owner}: round {spec.round} has no noise; declined")
        label = ROUND_LABELS.get(spec.label, spec.label or f"secure sum round {spec.round}")
        sigma, sensitivity = spec.sigma_std, spec.sensitivity
        if self.prices is not None:  # the owner's own figures (a round it never priced: none)
            price = self.prices.get(spec.label)
            if price is None:
                self.declines.append(f"{release}: not priced")
                raise BudgetDeclined(f"{self.owner}: round {spec.label!r} was never priced")
            sensitivity = price.charged
            sigma = spec.sigma_std * price.ratio  # exactly the spec's at ratio 1
        return MechanismEvent(
            "gaussian", (("sigma", sigma),), sensitivity,
            neighbouring=spec.neighbouring, label=label,
        )  # fmt: skip

    def secure_round(
        self, spec: RoundSpec, session: str, n_records: int = 0, start: int = 0
    ) -> npt.NDArray[np.bool_] | None:
        """Charge a secure-sum round before its frames are sent; BudgetDeclined otherwise.
        With blocks: charged to the live blocks holding records ``start:n_records`` (the ones
        it reads), retiring those that cannot pay; returns which records it may read."""
        release = f"{self.gate.run}:{session}:{spec.round}"
        event = self._round_event(spec, release)
        if self.blocked:
            read = self.store.charge_blocks(
                release, self.gate.run, [event], self._blocks(n_records, start)
            )
            # never a decline: whether a block exists depends on the record count, so a
            # decline would reveal it; with every block spent the owner contributes no records
            # (its share of the noise still goes in)
            return self._mask(n_records, set(read))
        decision = self.store.charge(release, self.gate.run, event)
        if not decision.admitted:
            self.declines.append(release)
            raise BudgetDeclined(
                f"{self.owner}: round {spec.round} does not fit the cap "
                f"(spent {decision.spent:.4g} of {self.gate.budget.epsilon:g}); declined"
            )
        return None

    def summary_gate(self, n_records: int) -> npt.NDArray[np.bool_] | None:
        """Before answering a summary frame: the records the owner may bid and deliver, or
        None (declined: stay silent). The summary plan is charged once per run, to each block
        the first time it holds records (blocks arriving during the run pay when they arrive)."""
        if not self.blocked:
            return np.ones(n_records, dtype=np.bool_) if self.summary_admitted() else None
        new = [b for b in self._blocks(n_records) if b not in self._summary_blocks]
        first, self._summary = self._summary is None, True
        if (new or first) and self.gate.summary:  # first: recorded even if nothing is read
            release = f"{self.gate.run}:summary"
            read = self.store.charge_blocks(release, self.gate.run, self.gate.summary, new)
            self._summary_read.update(read)  # a block that cannot pay retires: no decline
        elif new:
            self._summary_read.update(new)
        self._summary_blocks.update(new)
        return self._mask(n_records, self._summary_read)  # none live: the owner passes

    def summary_admitted(self) -> bool:
        """Charge the summary phase's planned events once (before the first answer)."""
        if self._summary is None:
            release = f"{self.gate.run}:summary"
            if not self.gate.summary:
                self._summary = True
            else:
                decision = self.store.charge(release, self.gate.run, self.gate.summary)
                self._summary = decision.admitted
                if not decision.admitted:
                    self.declines.append(release)
        return self._summary

    def view(self) -> dict[str, Any]:
        """This run's decisions and the store's totals, for the end-of-run comparison. With
        blocks, ``spent`` is the most any block has spent (its records' guarantee)."""
        rows = self.store.rows(self.gate.run)
        out: dict[str, Any] = {
            "run": self.gate.run,
            "cap": self.gate.budget.epsilon,
            "delta": self.gate.budget.delta,
            "spent": self.store.filter.spent(self.store.events()),
            "rows": rows,
            "declines": list(self.declines),
        }
        if self.blocked:  # per record: the whole-store history plus its block's charges
            blocks = [s.block for s in self.store.blocks().starts]
            spent = {b: self.store.filter.spent(self.store.record_events(b)) for b in blocks}
            out |= {
                "spent": max(spent.values(), default=self.store.filter.spent(self.store.history())),
                "retired": sorted(self.store.retired()),
            }
        return out

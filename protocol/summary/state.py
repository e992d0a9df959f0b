"""The curator's records: provenance of summary points, the result, one epoch's state."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.summary.auction import TransferCounter
from dpmarket.protocol.summary.messages import BidBody, DeliverBody

__all__ = ["Provenance", "SummaryResult"]

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Provenance:
    """Where a summary point came from and what it was worth when it won."""

    owner: str
    token: int
    epoch: int
    bid: float
    # approximate marginal gain 2/(q+1) * bid (constant dropped; objective.py), or under
    # final_selection = "exact" the exact marginal gain in J where the selection picked it
    gain: float


@dataclass
class SummaryResult:
    """What the curator ends with: the summary, its provenance and the bookkeeping."""

    points: F64 | None
    hashed: npt.NDArray[np.float32]
    labels: F64
    provenance: list[Provenance]
    epochs: int
    reason: str
    value: dict[str, float]
    transfers: TransferCounter
    ledgers: dict[str, PrivacyLedger]
    dropped: list[tuple[int, str, str]]  # (epoch, owner, phase)
    rejected: list[tuple[int, str, str]]  # (epoch, owner, why)
    late_frames: int


@dataclass
class _Epoch:
    number: int
    g_summary: F64
    q: int
    bids: dict[str, BidBody] = field(default_factory=dict)
    passed: set[str] = field(default_factory=set)
    asked: set[str] = field(default_factory=set)
    verified: dict[str, tuple[float, DeliverBody]] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)
    deadline: float | None = None
    decided: bool = False  # the auction of this epoch has run (and was charged)

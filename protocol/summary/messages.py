"""Wire bodies of private summarisation (Algorithm 3 of Sarpatwar et al.): curator <-> owners.

Registered with the codec of :mod:`.messages` on import, under the evolution rules stated there
(fields are only ever added, with defaults). :mod:`.curator` and :mod:`.summarize` import this
module, so any process that runs either party decodes these kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import numpy.typing as npt

from dpmarket.protocol.wire.checks import (
    FLOAT32_MAX,
    MAX_COUNTER,
    Count,
    Positive,
    Range,
    Token,
    Vector,
)
from dpmarket.protocol.wire.codec import Body, register

__all__ = [
    "AskBody",
    "BidBody",
    "CountBody",
    "DeliverBody",
    "EpochBody",
    "FinishBody",
    "PassBody",
    "ProfileBody",
    "SetupBody",
    "ValidationBody",
]

Array = npt.NDArray[Any]
# Value rules (protocol/wire/checks.py): each tightens what a field accepts, never its meaning.
Size = Annotated[int, Range(1, MAX_COUNTER)]
Reals = Annotated[Array, Vector(1)]  # a 1-D real vector (its length is the party's check)
Coordinates = Annotated[Array, Vector(1, bound=FLOAT32_MAX)]  # h1 hashes points in float32


@register("summary.setup")
@dataclass(frozen=True, slots=True)
class SetupBody(Body):
    """Curator -> owner: the public parameters of the run (h1 is shared by everybody).

    ``max_deliveries``: an owner withdraws a point after delivering it this many times.
    ``center`` and ``scale`` (added later, optional): h1 hashes ``(x - center) / scale``."""

    n_features: Size
    d: Size
    gamma: Annotated[float, Positive()]
    h1_seed: int
    tau: Size
    less_trusted: bool = False
    max_deliveries: Size = 3
    center: Reals | None = None
    scale: Reals | None = None


@register("summary.validation")
@dataclass(frozen=True, slots=True)
class ValidationBody(Body):
    """Curator -> owner: g_tilde, the DP release of the mean of h1 over the validation set."""

    g_validation: Reals


@register("summary.epoch")
@dataclass(frozen=True, slots=True)
class EpochBody(Body):
    """Curator -> owner: epoch l opens; g_summary estimates the mean of h1 over the summary S
    (seed removed), ``summary_size`` is q = |S|. ``explore`` (added later, optional): bid a
    point drawn uniformly by the public exploration generator instead of the best one
    (protocol/summary/selection.py). ``profile_sigma`` > 0 (added later, optional): instead of
    bidding, release the DP profile: the mean of ``profile_basis @ (h1(x) - profile_center)``
    (k x d, row-major) clipped to norm ``profile_clip``, with that noise multiplier
    (protocol/summary/allocate_mixture.py). ``profile_edges`` (added later, optional): release
    instead the DP histogram of ``profile_basis . (h1(x) - profile_center)`` (1 x d) over these
    bin edges (protocol/summary/allocate_rank.py). ``count`` (added later, optional): instead of
    bidding, send the number of records the owner holds (random-select's first epoch,
    protocol/summary/random_select.py; public under replace-one neighbours)."""

    g_summary: Reals
    summary_size: Count
    explore: bool = False
    profile_sigma: float = 0.0
    profile_clip: float = 0.0
    profile_basis: Reals | None = None
    profile_center: Reals | None = None
    profile_edges: Reals | None = None
    count: bool = False


@register("summary.profile")
@dataclass(frozen=True, slots=True)
class ProfileBody(Body):
    """Owner -> curator: its DP mean of h1 in the profile basis (allocate_mixture.py)
    or its DP score histogram (allocate_rank.py), noise included, and its record count (fixed
    under replace-one neighbours)."""

    mean: Reals
    records: Count = 0


@register("summary.count")
@dataclass(frozen=True, slots=True)
class CountBody(Body):
    """Owner -> curator: the number of records it may sell (random-select,
    protocol/summary/random_select.py); fixed under replace-one neighbours, so no release."""

    records: Count = 0


@register("summary.bid")
@dataclass(frozen=True, slots=True)
class BidBody(Body):
    """Owner -> curator: its best point's approximate marginal gain and an opaque token."""

    token: Token
    bid: float


@register("summary.pass")
@dataclass(frozen=True, slots=True)
class PassBody(Body):
    """Owner -> curator: nothing left to bid this epoch."""

    reason: str = "exhausted"


@register("summary.ask")
@dataclass(frozen=True, slots=True)
class AskBody(Body):
    """Curator -> owner: deliver the point behind ``token`` (private auction)."""

    token: Token


@register("summary.deliver")
@dataclass(frozen=True, slots=True)
class DeliverBody(Body):
    """Owner -> curator: the asked point. Trusted mode sends ``point``; the less-trusted mode
    of appendix F sends only ``hashed`` = h1(x) and the label."""

    token: Token
    point: Coordinates | None = None
    hashed: Reals | None = None
    label: float | None = None


@register("summary.finish")
@dataclass(frozen=True, slots=True)
class FinishBody(Body):
    """Curator -> owner: the summary is complete (or the run was stopped)."""

    epochs: Count
    reason: str = "complete"

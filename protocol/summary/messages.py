"""Wire bodies of private summarisation (Algorithm 3 of Sarpatwar et al.): curator <-> owners.

Registered with the codec of :mod:`.messages` on import, under the evolution rules stated there
(fields are only ever added, with defaults). :mod:`.curator` and :mod:`.summarize` import this
module, so any process that runs either party decodes these kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

from dpmarket.protocol.wire.codec import Body, register

__all__ = [
    "AskBody",
    "BidBody",
    "DeliverBody",
    "EpochBody",
    "FinishBody",
    "PassBody",
    "SetupBody",
    "ValidationBody",
]

Array = npt.NDArray[Any]


@register("summary.setup")
@dataclass(frozen=True, slots=True)
class SetupBody(Body):
    """Curator -> owner: the public parameters of the run (h1 is shared by everybody).

    ``max_deliveries``: an owner withdraws a point after delivering it this many times.
    ``center`` and ``scale`` (added later, optional): h1 hashes ``(x - center) / scale``."""

    n_features: int
    d: int
    gamma: float
    h1_seed: int
    tau: int
    less_trusted: bool = False
    max_deliveries: int = 3
    center: Array | None = None
    scale: Array | None = None


@register("summary.validation")
@dataclass(frozen=True, slots=True)
class ValidationBody(Body):
    """Curator -> owner: g_tilde, the DP release of the mean of h1 over the validation set."""

    g_validation: Array


@register("summary.epoch")
@dataclass(frozen=True, slots=True)
class EpochBody(Body):
    """Curator -> owner: epoch l opens; g_summary estimates the mean of h1 over the summary S
    (seed removed), ``summary_size`` is q = |S|. ``explore`` (added later, optional): bid a
    point drawn uniformly by the public exploration generator instead of the best one
    (protocol/summary/selection.py)."""

    g_summary: Array
    summary_size: int
    explore: bool = False


@register("summary.bid")
@dataclass(frozen=True, slots=True)
class BidBody(Body):
    """Owner -> curator: its best point's approximate marginal gain and an opaque token."""

    token: int
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

    token: int


@register("summary.deliver")
@dataclass(frozen=True, slots=True)
class DeliverBody(Body):
    """Owner -> curator: the asked point. Trusted mode sends ``point``; the less-trusted mode
    of appendix F sends only ``hashed`` = h1(x) and the label."""

    token: int
    point: Array | None = None
    hashed: Array | None = None
    label: float | None = None


@register("summary.finish")
@dataclass(frozen=True, slots=True)
class FinishBody(Body):
    """Curator -> owner: the summary is complete (or the run was stopped)."""

    epochs: int
    reason: str = "complete"

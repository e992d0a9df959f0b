"""The summary channels: how the curator broadcasts g_l after each point joins the summary S.

Paper: summarization-sarpatwar2019, Algorithm 3 and Theorem 6; PAPER-NOTES "Summarization"
items 3 and 5 (issue 6). :mod:`dpmarket.protocol.summary.curator` builds one channel with
:func:`make_summary_channel` and calls it after every point it adds; each release carries the
events its mechanism ran. Clipping, Delta, the neighbouring relation and the planning of the
budget are those of :mod:`dpmarket.protocol.summary.releases`.

Theory of operation
-------------------
g_l, broadcast after the q-th point joins the summary S (party ``owner-k``, per point of S):
* ``"mwem"``: h2 over seed + S, the seed's exact sum removed (paper; 2 * iterations events each).
* ``"gaussian"``: noisy sum of S every time; the first point of S is in all p - 1 releases.
* ``"tree"``: binary-tree aggregation (Dwork et al. 2010; Chan, Shi & Song 2011). Node (j, k)
  holds the noisy sum of points ``k 2^j + 1 .. (k + 1) 2^j`` and is drawn once, when its last
  point arrives; the prefix sum of q points adds the ``popcount(q)`` nodes of q's binary
  decomposition. A point lies in one node per level, so after q points no point is in more
  than ``q.bit_length()`` drawn nodes, and the ledger charges one Gaussian(z Delta, Delta)
  each time that maximum grows (q a power of two): adaptive composition over the nodes that
  contain the point; the other nodes do not depend on it.
* ``"herding"``: no summary data at all. The curator runs kernel herding toward g_tilde over
  public random candidates (its "virtual summary" z_1, z_2, ...) and steers the owners with
  ``w = h1(z_{q+1}) + beta (g_tilde - V_q / (q + 1))``, V_q the sum of the first q virtual
  points: each owner bids its point nearest (in the kernel) to the next virtual point, pulled
  toward what the candidates could not cover. The plan moves each chosen candidate by gradient
  ascent of ``h1(z) . residual`` in the public domain (:class:`HerdingChannel`). The broadcast
  is post-processing of g_tilde (already charged to the validation set) and of public
  candidates: no owner event. The curator sends ``g = (q + 1)/q (g_tilde - w)``, so the owners' bid
  ``h1(x) . (g_tilde - q/(q + 1) g)`` (PAPER-NOTES item 1) equals ``h1(x) . w``.

Why herding: at eps_owner <= 1 the bid's diversity term ``h1(x) . G/(q+1)`` sees noise of
about ``z Delta / (q + 1)`` (z >= 10 for the tree at p = 200), far above the kernel differences
it must resolve for p <= 200 (benchmarks/utility.py measures it).

Herding and ``max_deliveries``: no broadcast tells an owner that its point joined S (the steering
is a function of g_tilde and public candidates only), so a kept point keeps its high score. With
the default ``max_deliveries = 3`` the owner nearest to the target re-bids its kept point, the
curator refuses it as a duplicate and a worse point from another owner wins the epoch (on the
digits split most of the summary then came from the wrong digits). :func:`plan_releases`
therefore sets ``max_deliveries = 1`` for herding: an owner withdraws a point once delivered,
a decision on what it already saw (being asked), so it costs no privacy.

Herding's limit, and what lifts it: every steering broadcast is a function of g_tilde, whose
noise on the digits split (m = 32, eps 3) is as large as its signal, so herding steers most
owners toward the mode of the target. Even greedy over *all* pooled points toward the noisy
g_tilde closes only 0.62 of the uniform-to-greedy gap there at p = 50 (15 seeds,
benchmarks/steering_ceiling.py), whatever the steering. The curator, though, holds D_v
exactly, and its final choice among the points it bought is never sent to an owner:
protocol/summary/selection.py ("oversample, then select") keeps every delivered point and returns
the p that exact greedy picks, with a share of exploration epochs so that the pool is not all mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.privacy.ledger import MechanismEvent
from dpmarket.protocol.summary.h1 import RandomFourierFeatures
from dpmarket.protocol.summary.h2 import MwemHash
from dpmarket.protocol.summary.params import SUMMARY_RELEASES, CuratorParams
from dpmarket.protocol.summary.releases import (
    candidate_box,
    clip_rows,
    gaussian_delta,
    public_candidates,
    relation,
)

__all__ = [
    "GaussianChannel",
    "HerdingChannel",
    "MwemChannel",
    "SummaryChannel",
    "SummaryRelease",
    "TreeAggregator",
    "TreeChannel",
    "make_summary_channel",
]

F64 = npt.NDArray[np.float64]
F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class SummaryRelease:
    """One g_l broadcast and the events each owner's ledger must record for it."""

    g_summary: F64
    events: tuple[MechanismEvent, ...] = ()


class SummaryChannel(Protocol):
    """Releases g_l from the whole current summary (``q x d`` h1 rows, q >= 1)."""

    def release(self, summary_H: F32, rng: np.random.Generator) -> SummaryRelease: ...


class MwemChannel:
    """The paper's g_l: h2 over seed + S, the seed's exact (public) sum removed (PAPER-NOTES 2)."""

    def __init__(self, params: CuratorParams, h2: MwemHash, H_seed: F32) -> None:
        self.params, self.h2, self.H_seed = params, h2, H_seed
        self.seed_sum = H_seed.astype(np.float64).sum(axis=0)

    def start(self, rng: np.random.Generator) -> None:
        """Warm h2 up on the public seed set (no privacy cost: the seed set is public)."""
        p = self.params
        self.h2.release(self.H_seed, p.eps_seed, p.seed_iterations, rng)

    def release(self, summary_H: F32, rng: np.random.Generator) -> SummaryRelease:
        p = self.params
        H = np.concatenate([self.H_seed, summary_H.astype(np.float32)])
        out = self.h2.release(H, p.eps_summary, p.summary_iterations, rng)
        params = (("eps_score", p.eps_summary),)
        select = MechanismEvent(
            "exponential", params, p.sensitivity, p.summary_iterations,
            neighbouring=relation(p), label="h2(summary) selection",
        )  # fmt: skip
        measure = MechanismEvent(
            "laplace", (("scale", 1.0 / p.eps_summary),), p.sensitivity, p.summary_iterations,
            neighbouring=relation(p), label="h2(summary) measure", paper_epsilon=p.eps_summary,
        )  # fmt: skip
        q = len(summary_H)
        g = (out.mean * len(H) - self.seed_sum) / q
        return SummaryRelease(np.asarray(g, dtype=np.float64), (select, measure))


class GaussianChannel:
    """Noisy sum of S at every release: Gaussian(summary_sigma * Delta, Delta), count 1 each."""

    def __init__(self, params: CuratorParams) -> None:
        self.delta_l2 = gaussian_delta(params)
        self.sigma = params.summary_sigma * self.delta_l2
        self.clip_norm = params.clip_norm
        self.relation = relation(params)

    def release(self, summary_H: F32, rng: np.random.Generator) -> SummaryRelease:
        total = clip_rows(summary_H, self.clip_norm).sum(axis=0)
        noisy = total + rng.normal(0.0, self.sigma, total.shape)
        event = MechanismEvent(
            "gaussian", (("sigma", self.sigma),), self.delta_l2,
            neighbouring=self.relation, label="gaussian(summary sum)",
        )  # fmt: skip
        return SummaryRelease(np.asarray(noisy / len(summary_H), dtype=np.float64), (event,))


@dataclass
class TreeAggregator:
    """Binary-tree continual release of a growing sum of d-vectors (module docstring).

    ``append`` adds one vector and draws the nodes it completes; ``prefix()`` is the noisy sum of
    everything appended (``popcount(t)`` nodes, noise variance ``popcount(t) sigma^2`` per
    coordinate); ``levels`` is the most drawn nodes any single vector lies in (``t.bit_length()``).
    """

    d: int
    sigma: float
    t: int = 0
    _cumulative: list[F64] = field(default_factory=list)
    _nodes: dict[tuple[int, int], F64] = field(default_factory=dict)

    def append(self, vector: npt.ArrayLike, rng: np.random.Generator) -> None:
        v = np.asarray(vector, dtype=np.float64)
        if v.shape != (self.d,):
            raise ValueError(f"vector must have shape ({self.d},), got {v.shape}")
        last = self._cumulative[-1] if self._cumulative else np.zeros(self.d)
        self._cumulative.append(last + v)
        self.t += 1
        level = 0
        while self.t % (1 << level) == 0:
            start = self.t - (1 << level)
            exact = self._cumulative[-1] - (self._cumulative[start - 1] if start else 0.0)
            noise = rng.normal(0.0, self.sigma, self.d)
            self._nodes[(level, self.t // (1 << level) - 1)] = exact + noise
            level += 1

    def prefix(self) -> F64:
        total, start = np.zeros(self.d), 0
        for level in reversed(range(self.t.bit_length())):
            if self.t & (1 << level):
                total = total + self._nodes[(level, start >> level)]
                start += 1 << level
        return total

    @property
    def levels(self) -> int:
        return self.t.bit_length()


class TreeChannel:
    """g_l from a :class:`TreeAggregator` over the clipped h1 rows of S, in order of addition."""

    def __init__(self, params: CuratorParams) -> None:
        self.delta_l2 = gaussian_delta(params)
        self.clip_norm = params.clip_norm
        self.relation = relation(params)
        self.tree = TreeAggregator(params.d, params.summary_sigma * self.delta_l2)

    def release(self, summary_H: F32, rng: np.random.Generator) -> SummaryRelease:
        before = self.tree.levels
        for row in clip_rows(summary_H[self.tree.t :], self.clip_norm):
            self.tree.append(row, rng)
        grown = self.tree.levels - before
        events: tuple[MechanismEvent, ...] = ()
        if grown:
            params = (("sigma", self.tree.sigma),)
            label = "tree(summary sum) node"
            events = (
                MechanismEvent("gaussian", params, self.delta_l2, grown,
                               neighbouring=self.relation, label=label),
            )  # fmt: skip
        g = self.tree.prefix() / self.tree.t
        return SummaryRelease(np.asarray(g, dtype=np.float64), events)


class HerdingChannel:
    """Steer the owners with a public virtual summary (module docstring): no owner event.

    Candidates are used without replacement; ``residual_weight`` is beta. With ``ascent`` set
    (``(h1, Z, steps, low, high)``, Z the candidates in h1's standardised coordinates) each
    chosen candidate is then moved by up to ``steps`` normalised gradient steps that increase
    ``h1(z) . residual`` inside the box ``[low, high]`` (the first step half the box wide; a step
    that does not increase it is halved instead): herding's argmax over the whole public
    domain, started from the best candidate. The virtual point is the moved one. It uses only
    g_tilde and public data (no owner event) and is deterministic, so a replay is identical.
    """

    def __init__(
        self,
        g_validation: F64,
        H_candidates: npt.ArrayLike,
        residual_weight: float,
        ascent: tuple[RandomFourierFeatures, F64, int, float, float] | None = None,
    ):
        self.g = np.asarray(g_validation, dtype=np.float64)
        self.H = np.asarray(H_candidates, dtype=np.float32)
        if self.H.ndim != 2 or self.H.shape[1] != self.g.shape[0] or len(self.H) == 0:
            raise ValueError(f"H_candidates must have shape (n, {self.g.shape[0]}), n >= 1")
        if ascent is not None and ascent[1].shape != (len(self.H), ascent[0].n_features):
            raise ValueError("ascent candidates must have one row of n_features per H row")
        self.beta = float(residual_weight)
        self.ascent = ascent
        self._free = np.ones(len(self.H), dtype=bool)
        self._virtual = np.zeros_like(self.g)
        self._sequence: list[int] = []  # candidate indices, in herding order
        self._points: list[F32] = []  # h1 of the virtual points (moved by the ascent)

    def _next_residual(self) -> F64:
        return np.asarray(self.g - self._virtual / (len(self._sequence) + 1), dtype=np.float64)

    def _extend(self) -> F64:
        """Append the next herding point; return the residual it was chosen against."""
        residual = self._next_residual()
        if not self._free.any():
            self._free[:] = True  # every candidate used: start another pass
        scores = np.where(self._free, self.H @ residual.astype(np.float32), -np.inf)
        best = int(np.argmax(scores))
        self._free[best] = False
        h = self.H[best] if self.ascent is None else self._ascend(best, residual)
        self._sequence.append(best)
        self._points.append(h)
        self._virtual = self._virtual + h
        return residual

    def _ascend(self, index: int, residual: F64) -> F32:
        """h1 of candidate ``index`` after gradient ascent of ``h1(z) . residual`` (class doc)."""
        assert self.ascent is not None
        h1, Z, steps, low, high = self.ascent
        omega, b = h1.omega.astype(np.float64), h1.b.astype(np.float64)
        amp = math.sqrt(2.0 / h1.d)
        z, step = Z[index].astype(np.float64), (high - low) / 2.0

        def value(point: F64) -> float:
            return float(amp * np.cos(point @ omega + b) @ residual)

        current = value(z)
        for _ in range(steps):
            grad = -amp * omega @ (residual * np.sin(z @ omega + b))
            trial = np.clip(z + step * grad / max(float(np.linalg.norm(grad)), 1e-12), low, high)
            if (score := value(trial)) > current:
                z, current = trial, score
            else:
                step /= 2.0
        return np.asarray(h1.hash_standardized(z[None, :])[0], dtype=np.float32)

    def release(self, summary_H: F32, rng: np.random.Generator) -> SummaryRelease:
        q = len(summary_H)
        while len(self._sequence) < q:
            self._extend()
        residual = self._extend()  # virtual point q + 1
        w = self._points[q].astype(np.float64) + self.beta * residual
        return SummaryRelease(np.asarray((q + 1) / q * (self.g - w), dtype=np.float64))


def make_summary_channel(
    params: CuratorParams,
    h1: RandomFourierFeatures,
    h2: MwemHash,
    H_seed: F32,
    g_validation: F64,
    rng: np.random.Generator,
    warm_up: bool = True,
) -> SummaryChannel:
    """Build the channel ``params`` asks for; "mwem" warms h2 up on the seed set (``warm_up``).

    A curator restored from a journal rebuilds its channel with ``warm_up=False``: h2's state
    comes from the journal, herding replays its public sequence, and a tree re-draws every node
    of the points it is given (a fresh release, charged again by its events: safe, not tight).
    """
    kind = params.summary_release
    if kind == "mwem":
        channel = MwemChannel(params, h2, H_seed)
        if warm_up:
            channel.start(rng)
        return channel
    if kind == "gaussian":
        return GaussianChannel(params)
    if kind == "tree":
        return TreeChannel(params)
    if kind == "herding":
        Z = public_candidates(params, h1.n_features)
        ascent = None
        if params.herding_ascent_steps:
            low, high = candidate_box(params)
            ascent = (h1, Z, params.herding_ascent_steps, low, high)
        return HerdingChannel(
            g_validation, h1.hash_standardized(Z), params.herding_residual_weight, ascent
        )
    raise ValueError(f"summary_release must be one of {SUMMARY_RELEASES}, got {kind!r}")

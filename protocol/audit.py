"""Empirical privacy audit: a lower bound on epsilon from many runs on two neighbouring inputs.

Issue 6, Deliver 5 (the method of Jagielski, Ullman & Oprea 2020 and Nasr et al. 2021).

Theory of operation
-------------------
A mechanism M is (eps, delta)-DP only if, for neighbouring inputs D, D' and EVERY set S of
outputs, ``P[M(D) in S] <= e^eps P[M(D') in S] + delta`` and the same with D and D' swapped. An
audit runs M ``trials`` times on each input, maps every output to a scalar score (ideally the
likelihood ratio), and considers the threshold sets ``S = {score > t}`` and their complements.
Each set gives ``eps >= ln((P_in - delta) / P_out)``; replacing P_in by its Clopper-Pearson
lower and P_out by its upper confidence limit turns the estimate into a lower bound that holds
with probability at least ``confidence`` (each limit one-sided at ``1 - (1 - confidence)/2``,
Bonferroni). The threshold and orientation are chosen on the first ``selection`` fraction of
the runs and the bound is computed on the rest, so the choice does not bias the bound.

A correct mechanism yields a bound below its ledger's epsilon (with probability >= confidence;
tests use fixed seeds); a mechanism whose noise is N times too small (the RACE authors' public
code) yields a bound far above it. A bound far below the ledger's value does not prove the
ledger loose: the score or the pair may simply not be the worst case.

Scenarios below build the neighbouring pair for mechanisms of ``protocol/``: the Gaussian
validation release and the summary channels of :mod:`.releases`, and the private auction;
the audit command of the runtime layer (actors/audit.py) adds the RACE and secure-sum
releases. Pure: randomness in, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

from dpmarket.protocol.accounting import PrivacyLedger
from dpmarket.protocol.auction import AuctionBid, run_auction
from dpmarket.protocol.curator import CuratorParams
from dpmarket.protocol.hashing import RandomFourierFeatures
from dpmarket.protocol.releases import (
    GaussianChannel,
    SummaryChannel,
    TreeChannel,
    clip_rows,
    release_validation,
)

__all__ = [
    "AuditResult",
    "AuditScenario",
    "auction_scenario",
    "audit_scores",
    "clopper_pearson",
    "epsilon_lower_bound",
    "gaussian_validation_scenario",
    "laplace_count_scenario",
    "run_audit",
    "summary_channel_scenario",
]

F64 = npt.NDArray[np.float64]
Sampler = Callable[[bool, int, np.random.Generator], F64]
_MAX_THRESHOLDS = 400


def clopper_pearson(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """Exact two-sided binomial interval: each tail has probability ``(1 - confidence)/2``."""
    if trials < 1 or not 0 <= successes <= trials or not 0 < confidence < 1:
        raise ValueError(f"need 0 <= successes <= trials, trials >= 1, confidence in (0, 1); "
                         f"got {successes}, {trials}, {confidence}")  # fmt: skip
    tail = (1.0 - confidence) / 2.0
    low = 0.0 if successes == 0 else float(stats.beta.ppf(tail, successes, trials - successes + 1))
    high = (
        1.0
        if successes == trials
        else float(stats.beta.ppf(1.0 - tail, successes + 1, trials - successes))
    )
    return low, high


def _bounds(k_in: F64, k_out: F64, n: int, delta: float, confidence: float) -> F64:
    """Vectorised ``ln((CP_low(k_in) - delta) / CP_high(k_out))``; 0 where nothing is shown."""
    tail = (1.0 - confidence) / 2.0
    low = np.where(k_in > 0, stats.beta.ppf(tail, np.maximum(k_in, 1), n - k_in + 1), 0.0)
    high = np.where(k_out < n, stats.beta.ppf(1.0 - tail, k_out + 1, np.maximum(n - k_out, 1)), 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.log((low - delta) / high)
    return np.asarray(np.where(low > delta, np.maximum(value, 0.0), 0.0), dtype=np.float64)


def epsilon_lower_bound(
    k_in: int, k_out: int, trials: int, delta: float, confidence: float = 0.95
) -> float:
    """Lower confidence bound on eps from one set S: S fired ``k_in`` times of ``trials`` on one
    input and ``k_out`` times on its neighbour (``ln((P_in - delta)/P_out)``, module docstring)."""
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    return float(_bounds(np.array([k_in]), np.array([k_out]), trials, delta, confidence)[0])


@dataclass(frozen=True)
class AuditResult:
    """Outcome of one audit: the bound, the test that achieved it and the run counts.

    ``epsilon_lower`` holds with probability >= ``confidence``; ``epsilon_estimate`` is the
    plain ``ln((p_in - delta)/p_out)`` of the same test on the same runs (inf if p_out = 0).
    The test fires when the score is above ``threshold`` (``above``) or at most it, and is more
    likely on the neighbour (``favours_neighbour``) or on the original input.
    """

    epsilon_lower: float
    epsilon_estimate: float
    threshold: float
    above: bool
    favours_neighbour: bool
    fired_in: int
    fired_out: int
    trials: int
    delta: float
    confidence: float


def _candidate_counts(a: F64, b: F64, thresholds: F64) -> tuple[F64, F64]:
    """How often ``score > t`` on each sample, for every threshold t."""
    above_a = len(a) - np.searchsorted(np.sort(a), thresholds, side="right")
    above_b = len(b) - np.searchsorted(np.sort(b), thresholds, side="right")
    return above_a.astype(np.float64), above_b.astype(np.float64)


def _all_tests(
    a: F64, b: F64, thresholds: F64, delta: float, confidence: float
) -> tuple[F64, F64, F64]:
    """Bounds of the four orientations (rows) at every threshold, and the matching counts."""
    n = len(a)
    up_a, up_b = _candidate_counts(a, b, thresholds)
    ins = np.stack([up_b, up_a, n - up_b, n - up_a])  # above&favours b, above&a, below&b, below&a
    outs = np.stack([up_a, up_b, n - up_a, n - up_b])
    return _bounds(ins, outs, n, delta, confidence), ins, outs


def audit_scores(
    scores: F64,
    neighbour_scores: F64,
    delta: float,
    confidence: float = 0.95,
    selection: float = 0.5,
) -> AuditResult:
    """Best threshold test on the scores of M(D) and M(D') (module docstring).

    The first ``selection`` fraction of each sample picks the threshold and orientation (by
    their bound on that part); the rest gives the reported bound. Samples must be equal-sized.
    """
    a, b = np.asarray(scores, dtype=np.float64), np.asarray(neighbour_scores, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 20:
        raise ValueError(f"need two equal 1-D samples of >= 20 scores, got {a.shape}, {b.shape}")
    if not 0 < selection < 1:
        raise ValueError(f"selection must be in (0, 1), got {selection!r}")
    cut = int(len(a) * selection)
    pooled = np.concatenate([a[:cut], b[:cut]])
    grid = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, _MAX_THRESHOLDS)))
    grid = np.concatenate([[-np.inf], grid])
    chosen, _, _ = _all_tests(a[:cut], b[:cut], grid, delta, confidence)
    row, col = np.unravel_index(int(np.argmax(chosen)), chosen.shape)
    bound, ins, outs = _all_tests(a[cut:], b[cut:], grid[col : col + 1], delta, confidence)
    n = len(a) - cut
    k_in, k_out = int(ins[row, 0]), int(outs[row, 0])
    with np.errstate(divide="ignore"):
        estimate = math.log(max(k_in / n - delta, 1e-300) / (k_out / n)) if k_out else math.inf
    return AuditResult(
        epsilon_lower=float(bound[row, 0]),
        epsilon_estimate=max(0.0, estimate) if k_in / n > delta else 0.0,
        threshold=float(grid[col]),
        above=row in (0, 1),
        favours_neighbour=row in (0, 2),
        fired_in=k_in,
        fired_out=k_out,
        trials=n,
        delta=delta,
        confidence=confidence,
    )


@dataclass(frozen=True)
class AuditScenario:
    """A neighbouring pair for one mechanism and what its ledger claims.

    ``sample(neighbour, n, rng)`` runs the mechanism n times on D (``neighbour=False``) or on
    D' and returns one score per run; ``claimed_epsilon`` is the ledger's epsilon at ``delta``
    (``math.inf`` when it has none).
    """

    name: str
    sample: Sampler
    claimed_epsilon: float
    delta: float
    description: str


def run_audit(
    scenario: AuditScenario, trials: int, rng: np.random.Generator, confidence: float = 0.95
) -> AuditResult:
    """Run ``trials`` times on each input and audit the scores (:func:`audit_scores`)."""
    if trials < 40:
        raise ValueError(f"trials must be >= 40, got {trials!r}")
    a = scenario.sample(False, trials, rng)
    b = scenario.sample(True, trials, rng)
    return audit_scores(a, b, scenario.delta, confidence)


# --------------------------------------------------------------------------------------------
# Scenarios for mechanisms of protocol/
# --------------------------------------------------------------------------------------------


def _hashed_pair(n: int, d: int, seed: int) -> tuple[F64, F64, RandomFourierFeatures]:
    """n public-random h1 vectors (the fixed data) and one extra h1 vector (the neighbour)."""
    h1 = RandomFourierFeatures(4, d, 0.5, seed)
    points = np.random.default_rng([seed, 1]).normal(size=(n + 1, 4))
    H = h1(points).astype(np.float64)
    return H[:n], H[n], h1


def gaussian_validation_scenario(
    noise_multiplier: float, clip_norm: float = 1.1, d: int = 32, m: int = 8, delta: float = 1e-5
) -> AuditScenario:
    """g_tilde by :func:`~.releases.release_validation` ("gaussian") on D_v and on D_v plus one
    point; the score is the released SUM (mean times the public count) along that point."""
    params = CuratorParams(
        p=1, d=d, validation_release="gaussian", validation_sigma=noise_multiplier,
        clip_norm=clip_norm,
    )  # fmt: skip
    H, extra, _ = _hashed_pair(m, d, 11)
    direction = clip_rows(extra, clip_norm)[0]
    direction /= np.linalg.norm(direction)
    ledger = PrivacyLedger("validation")
    release_validation(H, params, ledger, np.random.default_rng(0))

    def sample(neighbour: bool, n: int, rng: np.random.Generator) -> F64:
        data = np.vstack([H, extra]) if neighbour else H
        runs = [release_validation(data, params, PrivacyLedger("x"), rng) for _ in range(n)]
        return np.asarray(np.array(runs) @ direction * len(data), dtype=np.float64)

    return AuditScenario(
        "validation-gaussian", sample, ledger.epsilon(delta), delta,
        f"Gaussian g_tilde, multiplier {noise_multiplier:g}, clip {clip_norm:g}, d {d}, m {m}",
    )  # fmt: skip


def summary_channel_scenario(
    kind: str, noise_multiplier: float, releases: int = 8, clip_norm: float = 1.1, d: int = 16,
    delta: float = 1e-5,
) -> AuditScenario:  # fmt: skip
    """The summary channel ``kind`` ("tree" or "gaussian") over ``releases`` releases where the
    first summary point is present (D') or zero (D: removed, positions kept). The score sums
    the released sums along that point over the releases that contain it: for the tree the
    ``log2`` nodes (releases at q = 1, 2, 4, ...), which is the likelihood-ratio statistic."""
    params = CuratorParams(p=releases + 1, d=d, summary_sigma=noise_multiplier, clip_norm=clip_norm)
    if kind not in ("tree", "gaussian"):
        raise ValueError(f"kind must be 'tree' or 'gaussian', got {kind!r}")
    make: Callable[[CuratorParams], SummaryChannel] = (
        TreeChannel if kind == "tree" else GaussianChannel
    )
    stream, first, _ = _hashed_pair(releases, d, 23)
    stream[0] = first
    direction = clip_rows(first, clip_norm)[0]
    direction /= np.linalg.norm(direction)
    used = [q for q in range(1, releases + 1) if kind == "gaussian" or q & (q - 1) == 0]

    def one_run(data: F64, rng: np.random.Generator, ledger: PrivacyLedger | None) -> float:
        channel, total = make(params), 0.0
        for q in range(1, releases + 1):
            out = channel.release(data[:q].astype(np.float32), rng)
            if ledger is not None:
                for event in out.events:
                    ledger.record(event)
            total += float(out.g_summary @ direction) * q if q in used else 0.0
        return total

    ledger = PrivacyLedger("owner")
    one_run(stream, np.random.default_rng(0), ledger)
    removed = stream.copy()
    removed[0] = 0.0

    def sample(neighbour: bool, n: int, rng: np.random.Generator) -> F64:
        data = stream if neighbour else removed
        return np.array([one_run(data, rng, None) for _ in range(n)], dtype=np.float64)

    return AuditScenario(
        f"summary-{kind}", sample, ledger.epsilon(delta), delta,
        f"{kind} summary channel, multiplier {noise_multiplier:g}, {releases} releases, d {d}",
    )  # fmt: skip


def auction_scenario(
    eps_auc: float, variant: str, rank: int = 1, n_bidders: int = 4, delta: float = 1e-5
) -> AuditScenario:
    """Whether an owner is asked, at ``rank`` (D) or ``rank + 1`` (D': another owner's bid
    moved above it), by :func:`~.auction.run_auction` (tau too large to force anyone)."""
    owners = [f"o{i}" for i in range(n_bidders)]

    def bids(at: int) -> list[AuctionBid]:
        order = [o for o in owners if o != "o0"]
        order.insert(at - 1, "o0")
        return [AuctionBid(o, 0, float(n_bidders - i), 1) for i, o in enumerate(order)]

    def sample(neighbour: bool, n: int, rng: np.random.Generator) -> F64:
        ranked = bids(rank + 1 if neighbour else rank)
        asked = ["o0" in run_auction(ranked, eps_auc, 10**6, rng, variant).asked for _ in range(n)]
        return np.asarray(asked, dtype=np.float64)

    ledger = PrivacyLedger("owner")
    ledger.auction(eps_auc, variant)
    return AuditScenario(
        f"auction-{variant}", sample, ledger.epsilon(delta), delta,
        f"asked bit, {variant} variant, eps_auc {eps_auc:g}, rank {rank} vs {rank + 1}",
    )  # fmt: skip


def laplace_count_scenario(
    epsilon: float, noise_factor: float = 1.0, delta: float = 1e-5
) -> AuditScenario:
    """A count released with ``Lap(1 / (noise_factor * epsilon))`` while the ledger claims
    ``Lap(1/epsilon)``: ``noise_factor`` > 1 is a deliberately mis-calibrated mechanism (noise
    N times too small, as in the RACE authors' code), which an audit must catch."""
    scale = 1.0 / (noise_factor * epsilon)

    def sample(neighbour: bool, n: int, rng: np.random.Generator) -> F64:
        return np.asarray(float(neighbour) + rng.laplace(0.0, scale, n), dtype=np.float64)

    ledger = PrivacyLedger("record")
    ledger.laplace(1.0 / epsilon, 1.0)
    name = "laplace" if noise_factor == 1.0 else f"laplace-noise/{noise_factor:g}"
    return AuditScenario(
        name, sample, ledger.epsilon(delta), delta,
        f"count + Lap(1/({noise_factor:g} eps)), ledger charges Lap(1/eps), eps {epsilon:g}",
    )  # fmt: skip

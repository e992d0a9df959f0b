"""Empirical privacy audit: a lower bound on epsilon from many runs on two neighbouring inputs.

Issue 6, Deliver 5 and issue 12, part 6 (the method of Jagielski, Ullman & Oprea 2020 and Nasr
et al. 2021).

Theory of operation
-------------------
A mechanism M is (eps, delta)-DP only if, for neighbouring inputs D, D' and EVERY set S of
outputs, ``P[M(D) in S] <= e^eps P[M(D') in S] + delta`` and the same with D and D' swapped. An
audit runs M ``trials`` times on each input, maps every output to a scalar score, and considers
the threshold sets ``S = {score > t}`` and their complements. Each set gives
``eps >= ln((P_in - delta) / P_out)``; replacing P_in by its Clopper-Pearson lower and P_out by
its upper confidence limit turns the estimate into a lower bound that holds with probability at
least ``confidence`` (each limit one-sided at ``1 - (1 - confidence)/2``, Bonferroni). The
threshold and orientation are chosen on the first ``selection`` fraction of the runs (on a grid
of pooled quantiles that is dense in both tails, where the best sets of a Gaussian mechanism
lie) and the bound is computed on the rest, so the choice does not bias the bound.

Power. The bound can only be as high as the score allows: the score should be the
log-likelihood ratio of the pair (Neyman-Pearson: its threshold sets are the most powerful).
For a Gaussian mechanism and a one-record difference v that is the projection of the release
onto v; for the Laplace mechanism on R counters it is the sum of the per-counter ratios. The
scenarios (:mod:`.audit_scenarios`, :mod:`.audit_securesum`, actors/commands/audit.py) use these
scores
on the worst-case pair and enough runs that each correct mechanism reaches at least half its
claimed epsilon at eps = 1: that bound is the audit's *power*, printed beside each verdict.
Mis-calibrated variants must then be refuted (bound above the claim); a bound below the claim
proves nothing by itself, which is why the power matters.

A correct mechanism yields a bound below its ledger's epsilon (with probability >= confidence;
tests use fixed seeds). Pure: randomness in, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "AuditResult",
    "AuditScenario",
    "audit_scores",
    "clopper_pearson",
    "epsilon_lower_bound",
    "run_audit",
    "threshold_grid",
]

F64 = npt.NDArray[np.float64]
Sampler = Callable[[bool, int, np.random.Generator], F64]
_BULK_THRESHOLDS = 400  # evenly spaced pooled quantiles
_TAIL_THRESHOLDS = 200  # per tail, log-spaced tail probabilities down to 1e-7
_MIN_FIRED = 100  # selection: a set's counts on each input (see audit_scores)


def clopper_pearson(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """Exact two-sided binomial interval: each tail has probability ``(1 - confidence)/2``."""
    if trials < 1 or not 0 <= successes <= trials or not 0 < confidence < 1:
        raise ValueError(f"need 0 <= successes <= trials, trials >= 1, confidence in (0, 1); "
                         f"got {successes}, {trials}, {confidence}")  # fmt: skip
    tail = (1.0 - confidence) / 2.0
    from scipy import stats  # on use: the audit command only, not every importer of privacy/

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
    from scipy import stats  # on use, as in clopper_pearson

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


def threshold_grid(pooled: F64) -> F64:
    """Candidate thresholds: -inf and the pooled sample's quantiles, evenly spaced in the bulk
    and log-spaced in both tails (tail probabilities 0.5 down to 1e-7)."""
    tails = np.geomspace(1e-7, 0.5, _TAIL_THRESHOLDS)
    probs = np.concatenate([np.linspace(0.0, 1.0, _BULK_THRESHOLDS), tails, 1.0 - tails])
    grid = np.unique(np.quantile(pooled, np.clip(probs, 0.0, 1.0)))
    return np.asarray(np.concatenate([[-np.inf], grid]), dtype=np.float64)


def audit_scores(
    scores: F64,
    neighbour_scores: F64,
    delta: float,
    confidence: float = 0.95,
    selection: float = 0.2,
) -> AuditResult:
    """Best threshold test on the scores of M(D) and M(D') (module docstring).

    The first ``selection`` fraction of each sample picks the threshold and orientation (by
    their bound on that part, among sets that fired at least 100 times on each input there
    when any such set shows something); the rest gives the reported bound, so the choice does
    not bias it. Samples must be equal-sized.
    """
    a, b = np.asarray(scores, dtype=np.float64), np.asarray(neighbour_scores, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 20:
        raise ValueError(f"need two equal 1-D samples of >= 20 scores, got {a.shape}, {b.shape}")
    if not 0 < selection < 1:
        raise ValueError(f"selection must be in (0, 1), got {selection!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    cut = int(len(a) * selection)
    pooled = np.concatenate([a[:cut], b[:cut]])
    grid = threshold_grid(pooled)
    chosen, ins, outs = _all_tests(a[:cut], b[:cut], grid, delta, confidence)
    # Winner's curse: a far-tail set that fired a handful of times on the selection runs can
    # look best by luck. Prefer sets that fired >= _MIN_FIRED times on each input there (or
    # never on the disfavoured one); fall back to every set when none of those shows anything.
    steady = np.where((outs >= _MIN_FIRED) | ((outs == 0) & (ins >= _MIN_FIRED)), chosen, 0.0)
    if steady.max() > 0.0:
        chosen = steady
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
    (``math.inf`` when it has none). When ``sample`` is a vectorised form of a mechanism that
    the real code runs one release at a time, ``reference`` runs the real code (one call per
    trial) and draws the same values from the same generator state; tests check the two agree.
    """

    name: str
    sample: Sampler
    claimed_epsilon: float
    delta: float
    description: str
    reference: Sampler | None = None


def run_audit(
    scenario: AuditScenario, trials: int, rng: np.random.Generator, confidence: float = 0.95
) -> AuditResult:
    """Run ``trials`` times on each input and audit the scores (:func:`audit_scores`)."""
    if trials < 40:
        raise ValueError(f"trials must be >= 40, got {trials!r}")
    a = scenario.sample(False, trials, rng)
    b = scenario.sample(True, trials, rng)
    return audit_scores(a, b, scenario.delta, confidence)

"""Signal against noise of a run's releases, from public numbers only, before budget is spent.

Pure functions (no data is read here): the caller passes what is public before a run starts, the
validation set's size m, the expected number of pooled records (the config's ``n_points`` or
the input files' line counts; never a released value), the clip bounds, the budgets and the
:class:`CuratorParams`. Each :class:`ReleaseCheck` states one release's expected signal, the
standard deviation (or norm) of its noise, and what it costs at delta. A release whose noise
exceeds its signal spends budget on (almost) nothing; the CLI warns, or refuses with
``--strict``.

Privacy: none of this releases anything. The proxies are public constants or public sizes, so
printing them costs no budget; the post-round :func:`standardisation_verdict` reads only the
normalise round's DP release (post-processing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dpmarket.protocol.privacy.dgauss import gaussian_sigma
from dpmarket.protocol.privacy.ledger import PrivacyLedger, record_relation
from dpmarket.protocol.summary.params import CuratorParams

__all__ = [
    "STANDARDIZE_MIN_SNR",
    "STEER_MAX_FACTOR",
    "STEER_MIN_SNR",
    "VALIDATION_SIGNAL",
    "ReleaseCheck",
    "contribution_sensitivity",
    "moments_sensitivity",
    "normalise_check",
    "owners_check",
    "owners_total",
    "planned_owner_ledger",
    "planned_validation_ledger",
    "recommend_mechanism",
    "scan_check",
    "scan_sigma",
    "sketch_sensitivity",
    "standardisation_verdict",
    "unbounded_reason",
    "validation_check",
]

VALIDATION_SIGNAL = 1.0 / math.sqrt(2.0)
"""Public proxy of ||mean of h1 over D_v||: h1 rows have norm about 1 and the norm of their
mean is sqrt(mean kernel value over pairs), below 1; at the median-heuristic kernel width it is
about 0.6. 1/sqrt(2) is on the generous side, so a release flagged against it is really weak."""

STANDARDIZE_MIN_SNR = 3.0
"""Standardisation uses the normalise round's means and spreads only when its released DP count
is at least this many noise standard deviations (below, means and spreads are mostly noise)."""


def _replace_moment_pair(bound: float) -> float:
    """sup of ``(u - v)^2 + (u^2 - v^2)^2`` over u, v in [-b, b]: one feature's (sum, sum of
    squares) moved by replacing one clipped value v with u.

    With a = u - v, s = u + v the square is a^2 (1 + s^2) on |a| + |s| <= 2b, largest on the
    edge |a| = 2b - |s|: g(s) = (2b - s)^2 (1 + s^2), s in [0, 2b], with
    g'(s) = 2 (2b - s)(2bs - 2s^2 - 1). For b^2 <= 2 the last factor is never positive (its
    maximum is b^2/2 - 1), so g decreases and the sup is g(0) = 4 b^2 (u = b, v = -b). For
    b^2 > 2, g has a local maximum at s+ = (b + sqrt(b^2 - 2)) / 2 and the sup is
    max(g(0), g(s+)) (for large b about b^2 + b^4, near u = b, v = 0)."""
    b = float(bound)
    best = 4.0 * b * b
    if b * b > 2.0:
        s = (b + math.sqrt(b * b - 2.0)) / 2.0
        best = max(best, (2.0 * b - s) ** 2 * (1.0 + s * s))
    return best


def moments_sensitivity(n_features: int, bound: float, *, neighbouring: str) -> float:
    """L2 sensitivity of one owner's normalise vector (sum x, sum x^2, count), features clipped
    to ``[-bound, bound]`` (actors/parties/dcaowner.py ``contribution``), under the run's relation.

    ``"add_remove"``: one record adds (x, x^2, 1): sqrt(k b^2 + k b^4 + 1).
    ``"replace"`` (the default relation of a run: an owner's count n_i is public): the count
    does not move; each feature's pair (x, x^2) moves by (u - v, u^2 - v^2), and the features
    of a record range over the box independently, so the exact sup is sqrt(k c(b)) with c(b)
    from :func:`_replace_moment_pair` (4 b^2 for b <= sqrt 2, about b^2 + b^4 for large b:
    the sums of squares move by at most b^2, not 2 b^2, since x^2 >= 0)."""
    if neighbouring == "add_remove":
        return math.sqrt(n_features * bound**2 + n_features * bound**4 + 1.0)
    if neighbouring == "replace":
        return math.sqrt(n_features * _replace_moment_pair(bound))
    raise ValueError(f"neighbouring must be 'replace' or 'add_remove', got {neighbouring!r}")


def sketch_sensitivity(rows: int, *, neighbouring: str) -> float:
    """L2 sensitivity of one owner's RACE counter vector (R rows, records of weight 1; the scan
    round and each refresh delta), under the run's relation.

    ``"add_remove"``: one record moves one counter per row by 1: sqrt(R) (streams/race/sketch.py
    ``l2_sensitivity``). ``"replace"``: in each row the old record's counter drops by 1 and the
    new one's rises by 1 (nothing moves when both hash to the same counter), so sqrt(2) per row
    and sqrt(2 R) over R rows. A refresh delta holds the records added since its base round; a
    replaced record keeps its position, so it is in the same (one) delta: sqrt(2 R) as well."""
    if neighbouring == "add_remove":
        return math.sqrt(rows)
    if neighbouring == "replace":
        return math.sqrt(2.0 * rows)
    raise ValueError(f"neighbouring must be 'replace' or 'add_remove', got {neighbouring!r}")


SKETCH_OPTIONS = frozenset({"family", "rows", "width", "seed", "bandwidth"})
CONTRIBUTIONS = ("moments", "sketch", "sketch_delta")


def contribution_sensitivity(
    what: str, d: int, options: dict[str, object], n_features: int, *, neighbouring: str
) -> float:
    """L2 sensitivity of the vector an owner adds to a secure-sum round of kind ``what`` with
    ``options`` (actors/parties/dcaowner.py ``contribution``) over records of ``n_features``
    features, under ``neighbouring``; ``ValueError`` naming the mismatch when ``d`` or the
    options are not what that vector has. The market plans every round with it
    (actors/run/phases.py) and a remote owner prices every offered round with it from what it
    will itself send (protocol/agents/policy.py), so neither takes the other's number.

    ``moments``: d = 2k + 1, options exactly ``{"bound"}`` (the clip bound the owner applies):
    :func:`moments_sensitivity`. ``sketch`` / ``sketch_delta``: d = rows x width, options
    exactly the sketch's (family, rows, width, seed, bandwidth; a delta's ``base_rounds`` is
    per round and does not enter): :func:`sketch_sensitivity` of ``rows``."""
    if what == "moments":
        if set(options) != {"bound"}:
            raise ValueError(f"moments: options {sorted(options)}, expected ['bound']")
        bound = options["bound"]
        if isinstance(bound, bool) or not isinstance(bound, int | float):
            raise ValueError(f"moments: bound {bound!r} is not a number")
        if not (math.isfinite(bound) and bound > 0):
            raise ValueError(f"moments: bound {bound!r} is not a finite positive number")
        if d != 2 * n_features + 1:
            raise ValueError(
                f"moments: d = {d}, but {n_features} features give 2k + 1 = {2 * n_features + 1}"
            )
        return moments_sensitivity(n_features, float(bound), neighbouring=neighbouring)
    if what not in CONTRIBUTIONS:
        raise ValueError(f"contribution {what!r} is not one of {CONTRIBUTIONS}")
    fixed = set(options) - {"base_rounds"} if what == "sketch_delta" else set(options)
    if fixed != SKETCH_OPTIONS:
        raise ValueError(f"{what}: options {sorted(fixed)}, expected {sorted(SKETCH_OPTIONS)}")
    rows, width = options["rows"], options["width"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (rows, width)):
        raise ValueError(f"{what}: rows {rows!r} and width {width!r} must be integers >= 1")
    assert isinstance(rows, int) and isinstance(width, int)
    if d != rows * width:
        raise ValueError(f"{what}: d = {d}, but the sketch has rows x width = {rows * width}")
    return sketch_sensitivity(rows, neighbouring=neighbouring)


@dataclass(frozen=True)
class ReleaseCheck:
    """One release: expected ``signal``, ``noise`` (same units), ``epsilon`` at ``delta`` charged
    to ``protects`` (``math.inf``: no finite bound). ``signal``/``noise`` None: not applicable."""

    name: str
    protects: str
    signal: float | None
    noise: float | None
    epsilon: float
    delta: float
    what: str
    gate: bool = True  # a weak release warns (or refuses under --strict); False: shown only
    weak_below: float = 1.0  # the SNR under which it is weak (g_tilde under allocate-select:
    # STEER_MIN_SNR, where its histograms were measured to still find the consumer's records)

    @property
    def snr(self) -> float | None:
        if self.signal is None or self.noise is None:
            return None
        return math.inf if self.noise == 0 else self.signal / self.noise

    @property
    def weak(self) -> bool:
        """The noise drowns the signal (SNR below ``weak_below``): the release spends budget
        on (almost) nothing."""
        snr = self.snr
        return self.gate and snr is not None and snr < self.weak_below


def planned_validation_ledger(params: CuratorParams) -> PrivacyLedger:
    """Every event the validation set's ledger is charged under ``params``: the one release
    g_tilde (Gaussian on the clipped sum, or MWEM's exponential and Laplace steps), under the
    run's relation (``params.neighbouring``)."""
    ledger = PrivacyLedger("validation")
    if params.random_purchase:  # random_select.py: no g_tilde is released
        return ledger
    s, relation = params.sensitivity, record_relation(params.neighbouring)
    if params.validation_release == "gaussian":
        delta_l2 = params.clip_norm * s
        ledger.gaussian(params.validation_sigma * delta_l2, delta_l2, neighbouring=relation)
    else:
        eps, rounds = params.eps_validation, params.validation_iterations
        ledger.exponential(eps, s, count=rounds, neighbouring=relation)
        ledger.laplace(1.0 / eps, s, count=rounds, neighbouring=relation)
    return ledger


def validation_check(params: CuratorParams, m: int, delta: float) -> ReleaseCheck:
    """The validation release g_tilde (protocol/summary/releases.py ``release_validation``).

    Gaussian: noise sigma = validation_sigma * clip_norm * sensitivity on the sum, so the
    released mean carries noise of norm about ``sigma sqrt(d) / m``, against a mean of norm about
    :data:`VALIDATION_SIGNAL`. MWEM: its epsilon only (its error is not a simple norm).
    """
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    ledger = planned_validation_ledger(params)
    if params.random_purchase:
        what = f"none: random-select reads D_v only in the consumer's final selection (m = {m})"
        return ReleaseCheck("validation", "validation", None, None, 0.0, delta, what)
    if params.validation_release == "gaussian":
        sigma = params.validation_sigma * params.clip_norm * params.sensitivity
        noise: float | None = sigma * math.sqrt(params.d) / m
        what = f"||mean h1|| ~ {VALIDATION_SIGNAL:.2f} vs noise norm sigma sqrt(d)/m (m = {m})"
    else:
        rounds = params.validation_iterations
        noise, what = None, f"MWEM, {rounds} iterations (m = {m})"
    signal = VALIDATION_SIGNAL if noise is not None else None
    epsilon = ledger.epsilon(delta)
    weak_below = STEER_MIN_SNR if params.allocate else 1.0  # one threshold with the plan's
    return ReleaseCheck(  # recommendation (recommend_mechanism)
        "validation", "validation", signal, noise, epsilon, delta, what, weak_below=weak_below
    )


def normalise_check(
    n_features: int, bound: float, eps: float, delta: float, records: float, *, neighbouring: str
) -> ReleaseCheck:
    """The normalise secure sum (actors/parties/dca.py): the pool's record count against its noise.

    sigma is calibrated as ``DcaConfig.spec`` does (analytic Gaussian at the moments'
    sensitivity under the run's relation; the grid adds at most sqrt(2k+1) 2^-f to the
    sensitivity, negligible here).
    """
    sens = moments_sensitivity(n_features, bound, neighbouring=neighbouring)
    sigma = gaussian_sigma(eps, delta, sens)
    what = f"records ~ {records:g} vs sigma of the DP count (bound {bound:g}, k = {n_features})"
    return ReleaseCheck("normalise", "each owner", records, sigma, eps, delta, what)


def scan_check(
    rows: int, width: int, eps: float, delta: float, records: float, *, neighbouring: str
) -> ReleaseCheck:
    """The scan secure sum: a point at the pool's average density sees ``records / width``
    per counter, averaged over ``rows`` counters with independent noise sigma.

    Shown, not gated: the scan steers nothing (its coverage score goes to the consumer's report
    only) and that score also averages over the m validation points, so its noise is lower.
    """
    sigma = scan_sigma(rows, eps, delta, neighbouring=neighbouring)
    signal, noise = records / width, sigma / math.sqrt(rows)
    what = f"mean counter {signal:.3g} vs sigma/sqrt(R) (R x W = {rows} x {width})"
    return ReleaseCheck("scan", "each owner", signal, noise, eps, delta, what, gate=False)


def scan_sigma(rows: int, eps: float, delta: float, *, neighbouring: str) -> float:
    """Noise sigma per counter of a scan or refresh round (:func:`sketch_sensitivity`)."""
    return gaussian_sigma(eps, delta, sketch_sensitivity(rows, neighbouring=neighbouring))


def planned_owner_ledger(params: CuratorParams) -> PrivacyLedger:
    """Every event one owner's ledger is charged under ``params`` if the run uses all its
    steering epochs (an upper bound: exploration epochs charge nothing), all under the run's
    relation (``params.neighbouring``): the owner's store is charged these events before the
    summary phase (actors/run/budgets.py), beside the secure sums' under the same relation."""
    ledger = PrivacyLedger("owner")
    if params.random_purchase:  # random_select.py: no auction, no summary or profile release
        return ledger
    relation = record_relation(params.neighbouring)
    if params.allocate:  # allocate-select's profile (allocate_*.py): sensitivity 1 in its units
        ledger.gaussian(params.allocation_sigma, 1.0, neighbouring=relation)
    epochs, s, p = params.epoch_limit, params.sensitivity, params.p
    ledger.auction(params.eps_auction, params.auction_variant, count=epochs, neighbouring=relation)
    delta_l2 = params.clip_norm * s
    releases = max(1, p - 1)
    sigma = params.summary_sigma * delta_l2
    if params.summary_release == "gaussian":
        ledger.gaussian(sigma, delta_l2, count=releases, neighbouring=relation)
    elif params.summary_release == "tree":
        ledger.gaussian(sigma, delta_l2, count=releases.bit_length(), neighbouring=relation)
    elif params.summary_release == "mwem":
        count = params.summary_iterations * releases
        ledger.exponential(params.eps_summary, s, count=count, neighbouring=relation)
        ledger.laplace(1.0 / params.eps_summary, s, count=count, neighbouring=relation)
    return ledger


def owners_check(params: CuratorParams, delta: float) -> ReleaseCheck:
    """The auction and the summary releases, charged to each owner (planned upper bound)."""
    epsilon = planned_owner_ledger(params).epsilon(delta)
    what = (
        f"auction {params.auction_variant} x {params.epoch_limit} steps, "
        f"summary release {params.summary_release}"
    )
    if params.random_purchase:
        what = (
            f"none: random-select buys {params.max_points} points uniformly at random; owners "
            "pay the delivered points only"
        )
    return ReleaseCheck("auction + summary", "each owner", None, None, epsilon, delta, what)


def owners_total(
    params: CuratorParams, delta: float, gaussians: tuple[tuple[float, float, int], ...]
) -> ReleaseCheck:
    """Each owner's whole planned ledger: the auction and summary releases plus the secure
    sums' Gaussian events ``(sigma, L2 sensitivity, count)``, under the run's relation (PLD
    composition)."""
    ledger = planned_owner_ledger(params)
    relation = record_relation(params.neighbouring)
    for sigma, sensitivity, count in gaussians:
        if count:
            ledger.gaussian(sigma, sensitivity, count=count, neighbouring=relation)
    what = "every release above composed (upper bound: all steering epochs used)"
    return ReleaseCheck("owner total", "each owner", None, None, ledger.epsilon(delta), delta, what)


def unbounded_reason(params: CuratorParams, delta: float) -> str | None:
    """Why an owner's planned ledger has no finite epsilon at ``delta``, or None if it has one.

    The paper's auction always asks the top bidder: each step is (eps_auc, 1 - e^-eps_auc)-DP,
    and that per-step delta alone exceeds any usual target delta.
    """
    if math.isfinite(planned_owner_ledger(params).epsilon(delta)):
        return None
    if params.auction_variant == "paper":
        step = -math.expm1(-params.eps_auction)
        return (
            f'auction_variant = "paper" always asks the top bidder: each of up to '
            f"{params.epoch_limit} auction steps is (eps {params.eps_auction:g}, delta "
            f"{step:.3g})-DP, so no owner has a finite epsilon at delta {delta:g}"
        )
    return f"the planned owner ledger has no finite epsilon at delta {delta:g}"


STEER_MAX_FACTOR = 3.0
"""At ``max_points >= STEER_MAX_FACTOR p`` a random purchase followed by the exact selection
already holds most of what the consumer wants (benchmarks/RESULTS.md "utility_vs_random": at
3 p random-select closes 0.55-0.99 of the gap, the hedged allocate-select leads by 0.1-0.3 only
where the target is rare, and at the (K + 1) p points herding-select accesses unbounded
random-select is as good as either steered mechanism within the spread in most cells), so
random-select, which makes no summary release (owners still pay the secure sums every run
makes, and every owner learns a function of the others' record counts: protocol/summary/
counts.py), is recommended there: a judgement of privacy (each owner's whole eps_owner for the
histogram) against a small gain."""

STEER_MIN_SNR = 0.4
"""Below this SNR of g_tilde the plan recommends random-select. The histograms' discriminant
(allocate_rank.py) still found the consumer's records at SNRs of 0.45-0.88 (benchmarks/
RESULTS.md "utility_vs_random": m = 20-60 at eps_validation 3, the hedged allocate-select above
random-select beyond its spread where the target is rare); nothing was measured below 0.45, and
there a steered purchase would mostly spend the owners' budget on noise."""


def recommend_mechanism(
    params: CuratorParams,
    validation: ReleaseCheck,
    owners: int,
    secure_cost: float | None = None,
) -> tuple[str, str]:
    """The mechanism the plan expects to do best, and why, from public numbers only: p,
    ``max_points`` (unbounded: herding-select accesses about (K + 1) p points), and the SNR of
    g_tilde, the release every steered mechanism aims with (:func:`validation_check`; the
    caller passes one computed for the data, the same whatever mechanism is configured).
    ``secure_cost``: each owner's epsilon for the secure sums every mechanism pays (None:
    the run has none), stated in the reason so a random purchase is never called free.

    The rule (issue 30, measured in benchmarks/RESULTS.md "utility_vs_random"): steering can
    only help if what it steers by carries some signal, and only when the budget is tight. So
    random-select when g_tilde's SNR is below :data:`STEER_MIN_SNR` (a steered purchase would
    aim with noise and spend the owners' budget for it), or when the budget reaches
    :data:`STEER_MAX_FACTOR` p (a random purchase that size already contains what the exact
    selection needs, with no summary release: owners pay only the secure sums); else
    allocate-select, hedged (a tight budget and a release with signal: its histograms find the
    owners that hold a rare target, and its random share keeps it level with random-select
    where the target is common). MWEM's g_tilde has no simple SNR: judged by the budget alone.
    """
    budget = params.max_points if params.max_points is not None else (owners + 1) * params.p
    factor = budget / params.p
    snr = validation.snr
    pays = (
        f"owners pay only the secure sums, eps {secure_cost:.3g} each"
        if secure_cost is not None
        else "owners pay nothing beyond the points"
    )
    if snr is not None and snr < STEER_MIN_SNR:
        return "random-select", (
            f"g_tilde's SNR is {snr:.2f} < {STEER_MIN_SNR:g} (too few validation points for its "
            f"noise): a steered purchase aims with noise; random-select makes no summary "
            f"release ({pays})"
        )
    if factor >= STEER_MAX_FACTOR:
        signal = f" (g_tilde's SNR is {snr:.2f}; the budget decides)" if snr is not None else ""
        return "random-select", (
            f"a budget of {budget} points = {factor:.1f} p >= {STEER_MAX_FACTOR:g} p{signal}: "
            "a random purchase that large holds nearly what steering finds (within 0.1-0.3 of "
            "the gap where the consumer's target is rare, level elsewhere), with no summary "
            f"release ({pays})"
        )
    why = f"g_tilde's SNR is {snr:.2f}" if snr is not None else "(MWEM g_tilde: SNR not computed)"
    return "allocate-select", (
        f"a tight budget ({budget} points = {factor:.1f} p) and {why}: the owners' DP "
        "histograms place the steered share where the consumer's records are (ahead where its "
        "target is rare), the random share keeps it level with random-select elsewhere"
    )


def standardisation_verdict(count: float, sigma: float) -> tuple[bool, str]:
    """Whether to standardise from a normalise release with DP ``count`` and noise ``sigma``.

    Decided from the release only (post-processing): below :data:`STANDARDIZE_MIN_SNR` sigma the
    DP means and spreads are mostly noise, and standardising by them would distort h1.
    """
    if sigma > 0 and count < STANDARDIZE_MIN_SNR * sigma:
        return False, (
            f"normalise release too noisy: DP count {count:.0f} < {STANDARDIZE_MIN_SNR:g} sigma "
            f"({STANDARDIZE_MIN_SNR:g} x {sigma:.0f}); h1 hashes raw features"
        )
    return True, f"DP count {count:.0f} >= {STANDARDIZE_MIN_SNR:g} sigma ({sigma:.0f})"

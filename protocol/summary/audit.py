"""Audit scenarios for the mechanisms of protocol/: the worst-case pair and the optimal score.

Each builder returns an :class:`~.audit.AuditScenario` (theory in :mod:`.audit`). Pure:
randomness comes in as ``numpy.random.Generator`` arguments (or, for the seeded-noise variant,
as a factory of the published generator); nothing here constructs a generator.

Gaussian releases (the validation release and the Gaussian and tree summary channels): the
neighbouring pair differs in one clipped h1 vector v, added to D' (add/remove, sensitivity
``clip_norm``) or replaced by -v (replace-one, sensitivity ``2 clip_norm``), whichever relation
the parameters' ledger charges. The release is ``exact + N(0, sigma^2 I)``, so the
log-likelihood ratio is a monotone function of the release's projection onto v (summed over the
releases that contain v): that projection is the score. The real code draws one release per
call (about 40 us); ``sample`` draws the same values vectorised (the same ``rng.normal`` stream,
the noise scale the real code uses, the real ``clip_rows``), and ``reference`` runs the real
function once per trial; tests/test_audit.py checks that the two agree draw for draw.

Broken variants: ``noise_factor`` divides the noise scale while the claim stays that of the
correct mechanism (half noise: ``noise_factor = 2``), and :func:`seeded_noise_scenario` draws
the noise from a generator whose seed is published; the adversary regenerates that noise and
subtracts it (against the correct mechanism, whose noise comes from the audit's secret-keyed
generator, the same adversary only adds independent noise to its score).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.privacy.audit import AuditScenario
from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.summary.auction import AuctionBid, run_auction
from dpmarket.protocol.summary.channels import GaussianChannel, SummaryChannel, TreeChannel
from dpmarket.protocol.summary.curator import CuratorParams
from dpmarket.protocol.summary.h1 import RandomFourierFeatures
from dpmarket.protocol.summary.releases import clip_rows, release_validation

__all__ = [
    "auction_scenario",
    "gaussian_validation_scenario",
    "laplace_count_scenario",
    "seeded_noise_scenario",
    "summary_channel_scenario",
    "tree_draw_order",
]

F64 = npt.NDArray[np.float64]
GeneratorFactory = Callable[[], np.random.Generator]


class _NoNoise:
    """Stands in for a generator where only a release's ledger events are wanted (the release
    itself is discarded): draws zeros, so no generator is built here."""

    def normal(self, loc: float, scale: float, size: int | tuple[int, ...]) -> F64:
        return np.zeros(size)


_ZERO: np.random.Generator = _NoNoise()  # type: ignore[assignment]


def _hashed_pair(n: int, d: int, seed: int) -> tuple[F64, F64]:
    """n public-random h1 vectors (the fixed data) and one extra vector (the neighbour): the
    worst case, an h1 direction at the largest h1 norm sqrt(2) (every cosine at +-1), so that
    clipping leaves it at norm ``clip_norm`` (<= sqrt(2)) and the sum moves by the full Delta."""
    h1 = RandomFourierFeatures(4, d, 0.5, seed)
    points = np.random.default_rng([seed, 1]).normal(size=(n + 1, 4))  # public data, not noise
    H = h1(points).astype(np.float64)
    extra = H[n] * (np.sqrt(2.0) / np.linalg.norm(H[n]))
    return H[:n], extra


def _validation_inputs(params: CuratorParams, m: int) -> tuple[F64, F64, F64]:
    """(D, D', unit direction) for the validation release under the parameters' relation."""
    H, extra = _hashed_pair(m, params.d, 11)
    direction = clip_rows(extra, params.clip_norm)[0]
    direction /= np.linalg.norm(direction)
    if params.sensitivity == 1.0:  # add/remove: D' has one more point (m is public)
        return H, np.vstack([H, extra]), direction
    # replace-one: the point v becomes -v, the clipped sum moves by 2 clip_norm along v
    return np.vstack([H, -extra]), np.vstack([H, extra]), direction


def _validation_sigma(data: F64, params: CuratorParams, ledger: PrivacyLedger) -> float:
    """The noise scale the real release uses (one real call; its event records the sigma)."""
    event = PrivacyLedger("probe")
    release_validation(data, params, event, _ZERO)
    for e in event.events:
        ledger.record(e)
    return event.events[0].param("sigma")


def gaussian_validation_scenario(
    noise_multiplier: float, clip_norm: float = 1.1, d: int = 8, m: int = 8, delta: float = 1e-5,
    noise_factor: float = 1.0, claimed_multiplier: float | None = None,
) -> AuditScenario:  # fmt: skip
    """g_tilde by :func:`~.releases.release_validation` ("gaussian"); the score is the released
    SUM (mean times the public count) projected on the differing point (module docstring).
    The mechanism runs with ``noise_multiplier / noise_factor``; the claim is the ledger of
    ``claimed_multiplier`` (default ``noise_multiplier``)."""

    def make(z: float) -> CuratorParams:
        return CuratorParams(
            p=1, d=d, validation_release="gaussian", validation_sigma=z, clip_norm=clip_norm
        )

    params = make(noise_multiplier / noise_factor)
    base, plus, direction = _validation_inputs(params, m)
    claim = PrivacyLedger("validation")
    _validation_sigma(base, make(claimed_multiplier or noise_multiplier), claim)
    sigma = _validation_sigma(base, params, PrivacyLedger("actual"))

    def reference(neighbour: bool, n: int, rng: np.random.Generator) -> F64:
        data = plus if neighbour else base
        runs = [release_validation(data, params, PrivacyLedger("x"), rng) for _ in range(n)]
        return np.asarray(np.array(runs) @ direction * len(data), dtype=np.float64)

    def sample(neighbour: bool, n: int, rng: np.random.Generator) -> F64:
        data = plus if neighbour else base
        exact = clip_rows(data, clip_norm).sum(axis=0)
        noisy = (exact + rng.normal(0.0, sigma, (n, d))) / len(data)
        return np.asarray(noisy @ direction * len(data), dtype=np.float64)

    suffix = "" if noise_factor == 1.0 else f"-noise/{noise_factor:g}"
    return AuditScenario(
        f"validation-gaussian{suffix}", sample, claim.epsilon(delta), delta,
        f"Gaussian g_tilde, multiplier {noise_multiplier:g}/{noise_factor:g}, clip "
        f"{clip_norm:g}, d {d}, m {m}; vectorised (= real release_validation draw for draw)",
        reference,
    )  # fmt: skip


def seeded_noise_scenario(
    noise_multiplier: float, published: GeneratorFactory, seeded: bool, clip_norm: float = 1.1,
    d: int = 8, m: int = 8, delta: float = 1e-5,
) -> AuditScenario:  # fmt: skip
    """The validation release attacked by an adversary who knows a published noise seed.

    ``published()`` returns a fresh generator from the published seed. With ``seeded`` the
    mechanism draws its noise from it (the bug: epsilon is infinite, because the adversary
    regenerates the noise and subtracts it); otherwise the mechanism draws from the audit's
    ``rng`` (secret-keyed in ``dpmarket audit``) and the same subtraction only adds independent
    noise. Score: the projected release minus the projected regenerated noise."""
    params = CuratorParams(
        p=1, d=d, validation_release="gaussian", validation_sigma=noise_multiplier,
        clip_norm=clip_norm,
    )  # fmt: skip
    base, plus, direction = _validation_inputs(params, m)
    claim = PrivacyLedger("validation")
    sigma = _validation_sigma(base, params, claim)

    def sample(neighbour: bool, n: int, rng: np.random.Generator) -> F64:
        data = plus if neighbour else base
        exact = clip_rows(data, clip_norm).sum(axis=0)
        noise = (published() if seeded else rng).normal(0.0, sigma, (n, d))
        released = (exact + noise) / len(data)
        regenerated = published().normal(0.0, sigma, (n, d))
        return np.asarray((released * len(data) - regenerated) @ direction, dtype=np.float64)

    name = "validation-gaussian-" + ("seeded-noise" if seeded else "vs-seed-adversary")
    source = "np.random.default_rng(published seed)" if seeded else "the audit's secure generator"
    return AuditScenario(
        name, sample, claim.epsilon(delta), delta,
        f"Gaussian g_tilde, noise from {source}; the adversary regenerates the published "
        "seed's noise and subtracts it (vectorised)",
    )  # fmt: skip


def tree_draw_order(releases: int) -> list[tuple[int, int]]:
    """The (level, index) of every node :class:`~.releases.TreeAggregator` draws, in order,
    over ``releases`` appends (node (j, k) is drawn when its last point arrives)."""
    order = []
    for t in range(1, releases + 1):
        level = 0
        while t % (1 << level) == 0:
            order.append((level, t // (1 << level) - 1))
            level += 1
    return order


def summary_channel_scenario(
    kind: str, noise_multiplier: float, releases: int = 4, clip_norm: float = 1.1, d: int = 4,
    delta: float = 1e-5, noise_factor: float = 1.0,
) -> AuditScenario:  # fmt: skip
    """The summary channel ``kind`` ("tree" or "gaussian") over ``releases`` releases whose
    first summary point differs (D': v; D: zero under add/remove, -v under replace-one; the
    positions are kept). The score sums the released SUMS projected on v over the releases
    whose noise is independent of the others and contain v: every release for "gaussian",
    q = 1, 2, 4, ... (the ``log2`` tree nodes holding v) for "tree": the likelihood ratio."""
    if kind not in ("tree", "gaussian"):
        raise ValueError(f"kind must be 'tree' or 'gaussian', got {kind!r}")

    def make_params(z: float) -> CuratorParams:
        return CuratorParams(p=releases + 1, d=d, summary_sigma=z, clip_norm=clip_norm)

    params = make_params(noise_multiplier / noise_factor)
    make: Callable[[CuratorParams], SummaryChannel] = (
        TreeChannel if kind == "tree" else GaussianChannel
    )
    stream, first = _hashed_pair(releases, d, 23)
    stream[0] = first
    direction = clip_rows(first, clip_norm)[0]
    direction /= np.linalg.norm(direction)
    other = stream.copy()
    other[0] = 0.0 if params.sensitivity == 1.0 else -first
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

    claim = PrivacyLedger("owner")
    claim_params = make_params(noise_multiplier)
    claim_channel = make(claim_params)
    for q in range(1, releases + 1):  # the claim: the correct channel's events
        for event in claim_channel.release(stream[:q].astype(np.float32), _ZERO).events:
            claim.record(event)
    channel = make(params)
    sigma = channel.tree.sigma if isinstance(channel, TreeChannel) else params.summary_sigma
    if isinstance(channel, GaussianChannel):
        sigma = channel.sigma
    clipped = [clip_rows(x.astype(np.float32), clip_norm) for x in (other, stream)]
    order = tree_draw_order(releases)

    def reference(neighbour: bool, n: int, rng: np.random.Generator) -> F64:
        data = stream if neighbour else other
        return np.array([one_run(data, rng, None) for _ in range(n)], dtype=np.float64)

    def sample(neighbour: bool, n: int, rng: np.random.Generator) -> F64:
        prefix = np.cumsum(clipped[int(neighbour)], axis=0)
        draws = len(order) if kind == "tree" else releases
        noise = rng.normal(0.0, sigma, (n, draws, d))
        total = np.zeros(n)
        for q in used:  # for q = 2^j the tree's prefix is the one node (j, 0)
            at = order.index((q.bit_length() - 1, 0)) if kind == "tree" else q - 1
            total += ((prefix[q - 1] + noise[:, at]) / q) @ direction * q
        return total

    suffix = "" if noise_factor == 1.0 else f"-noise/{noise_factor:g}"
    return AuditScenario(
        f"summary-{kind}{suffix}", sample, claim.epsilon(delta), delta,
        f"{kind} summary channel, multiplier {noise_multiplier:g}/{noise_factor:g}, "
        f"{releases} releases, d {d}; vectorised (= real channel draw for draw)",
        reference,
    )  # fmt: skip


def auction_scenario(
    eps_auc: float, variant: str, rank: int = 1, n_bidders: int = 4, delta: float = 1e-5
) -> AuditScenario:
    """Whether an owner is asked, at ``rank`` (D) or ``rank + 1`` (D': another owner's bid
    moved above it), by :func:`~.auction.run_auction` (tau too large to force anyone). The
    asked bit is the whole output that concerns the owner, so it is the optimal score."""
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
        f"asked bit, {variant} variant, eps_auc {eps_auc:g}, rank {rank} vs {rank + 1}; "
        "real run_auction per trial",
    )  # fmt: skip


def laplace_count_scenario(
    epsilon: float, noise_factor: float = 1.0, delta: float = 1e-5
) -> AuditScenario:
    """A count released with ``Lap(1 / (noise_factor * epsilon))`` while the ledger claims
    ``Lap(1/epsilon)``: ``noise_factor`` > 1 is a deliberately mis-calibrated mechanism (noise
    N times too small, as in the RACE authors' code), which an audit must catch. The release
    itself is the likelihood-ratio statistic (monotone for a shift of one)."""
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

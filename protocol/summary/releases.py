"""Release of g_tilde (the validation broadcast) and what every release shares.

Paper: summarization-sarpatwar2019, Algorithms 2-3 and Theorem 6; PAPER-NOTES "Summarization"
items 3 and 5 (issue 6). :mod:`dpmarket.protocol.summary.curator` calls :func:`release_validation`
once, and after every point it adds a summary channel of :mod:`dpmarket.protocol.summary.channels`
(g_l); both record every mechanism they run. The clipping, the sensitivity Delta, the
neighbouring relation and herding's public candidates below are shared by the two.

Theory of operation
-------------------
``||h1(x)||_2 <= sqrt(2)`` for every x (each of the d coordinates is ``sqrt(2/d) cos(.)``), and in
practice ``||h1(x)||^2 = 1 +- 1/sqrt(2d)``. The Gaussian releases first clip every h1 vector to
L2 norm ``clip_norm`` (``sqrt(2)`` never clips), so one record moves a sum of h1 vectors by at
most ``Delta = 2 clip_norm`` under replace-one, the default (``neighbouring = "replace"``), and
``clip_norm`` under add/remove. Noise is ``N(0, (z Delta)^2 I_d)``, ``z`` the noise multiplier.

Neighbouring relation: m = |D_v| and q = |S| are published (report.json's ``validation_size``;
the divisor of every released mean; the summary's size), so the honest relation is replace-one:
two data sets of the same, public size that differ in one substituted record. Add/remove with
a public count (the paper's Theorems 2 and 6) under-charges by about a factor of two in
epsilon; it stays selectable (``neighbouring = "add_remove"``) only to reproduce the paper.
Every event records the relation it was charged under.

g_tilde, mean of h1 over the validation set D_v (party ``validation``):
* ``"mwem"``: h2 of Algorithm 2 (``validation_iterations`` exponential + Laplace steps).
* ``"gaussian"``: ``(sum clip(h1(v)) + N(0, (z Delta)^2 I)) / m``: one Gaussian event. The noise
  a bid ``h1(x) . g_tilde`` sees is ``N(0, (z Delta / m)^2 ||h1(x)||^2)``, independent of d.
  With ``validation_center = "seed"`` (allocate-select's histogram rule): ``c + (sum clip(h1(v)
  - c, r) + N(0, (z Delta)^2 I)) / m``, c the mean of h1 over the public seed set and r the
  :data:`VALIDATION_CLIP_QUANTILE` quantile of the seed points' distances to c (public), so
  Delta = 2 r (replace-one; r instead of clip_norm): h1 vectors lie about 0.8 from c but have
  norm 1, so the same epsilon buys less noise. Same event, charged at that Delta.

Planning (protocol/summary/plan.py, ``plan_releases``): the validation set's whole budget goes
to its one release; each owner's budget is shared by the summary releases (if any) and the
auction, and the split is solved numerically with the same PLD ledger that later reports the
run, over the planned number of events (``max_epochs`` auction steps, p - 1 releases or
``(p - 1).bit_length()`` tree levels), so the reported epsilon cannot exceed the plan.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.privacy.ledger import PrivacyLedger, record_relation
from dpmarket.protocol.summary.h2 import MwemHash
from dpmarket.protocol.summary.params import (
    CANDIDATE_DISTRIBUTIONS,
    VALIDATION_RELEASES,
    CuratorParams,
)

__all__ = [
    "candidate_box",
    "clip_rows",
    "gaussian_delta",
    "public_candidates",
    "relation",
    "release_validation",
    "validation_frame",
]

VALIDATION_CLIP_QUANTILE = 0.9
"""validation_center = "seed": the clip r is this quantile of the seed's distances to c."""

F64 = npt.NDArray[np.float64]


def clip_rows(H: npt.ArrayLike, clip_norm: float) -> F64:
    """Rows of ``H`` scaled down to L2 norm at most ``clip_norm`` (others unchanged), float64."""
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"clip_norm must be a finite positive number, got {clip_norm!r}")
    rows = np.atleast_2d(np.asarray(H, dtype=np.float64))
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    scale = np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))
    return np.asarray(rows * scale, dtype=np.float64)


def gaussian_delta(params: CuratorParams) -> float:
    """Delta of a clipped sum: clip_norm (add/remove) or 2 clip_norm (replace)."""
    return float(params.clip_norm * params.sensitivity)


def relation(params: CuratorParams) -> str:
    """The neighbouring relation every event of these releases is charged under: the run's one
    relation, which the secure sums, allocate-select and the auction are charged under too."""
    return record_relation(params.neighbouring)


def validation_frame(params: CuratorParams, H_seed: npt.ArrayLike | None) -> tuple[F64, float]:
    """Center and clip of the Gaussian validation release: (0, clip_norm), or with
    ``validation_center = "seed"`` the public seed set's mean and spread (module docstring)."""
    if params.validation_center != "seed":
        return np.zeros(params.d), float(params.clip_norm)
    S = np.asarray(H_seed if H_seed is not None else [], dtype=np.float64)
    if S.ndim != 2 or len(S) < 2 or S.shape[1] != params.d:
        raise ValueError(f"validation_center = 'seed' needs >= 2 hashed seed points of {params.d}")
    center = S.mean(axis=0)
    distances = np.linalg.norm(S - center, axis=1)
    radius = float(np.quantile(distances, VALIDATION_CLIP_QUANTILE))
    return np.asarray(center, dtype=np.float64), min(max(radius, 1e-6), float(params.clip_norm))


def release_validation(
    H_validation: npt.ArrayLike,
    params: CuratorParams,
    ledger: PrivacyLedger,
    rng: np.random.Generator,
    H_seed: npt.ArrayLike | None = None,
) -> F64:
    """Release g_tilde by ``params.validation_release`` and record it in ``ledger``.

    "mwem": Algorithm 2 at ``eps_validation`` for ``validation_iterations`` steps, each an
    exponential mechanism (charged 2 eps, pure) and a Laplace(1/eps) step (eps; the paper's
    count). "gaussian": one Gaussian mechanism of L2 sensitivity Delta (module docstring) and
    noise ``validation_sigma * Delta``; m = |D_v| is public. ``H_seed`` (the hashed public seed
    set) is needed by ``validation_center = "seed"`` only.
    """
    H = np.asarray(H_validation)
    if params.validation_release == "mwem":
        eps, rounds, s = params.eps_validation, params.validation_iterations, params.sensitivity
        release = MwemHash(params.d, params.grid_step).release(H, eps, rounds, rng)
        ledger.exponential(eps, s, count=rounds, label="h2(validation) selection",
                           neighbouring=relation(params))  # fmt: skip
        ledger.laplace(1.0 / eps, s, count=rounds, label="h2(validation) measure",
                       paper_epsilon=eps, neighbouring=relation(params))  # fmt: skip
        return np.asarray(release.mean, dtype=np.float64)
    if params.validation_release != "gaussian":
        raise ValueError(f"validation_release must be one of {VALIDATION_RELEASES}")
    center, clip = validation_frame(params, H_seed)
    delta_l2 = clip * params.sensitivity
    sigma = params.validation_sigma * delta_l2
    rows = clip_rows(np.asarray(H, dtype=np.float64) - center, clip)
    noisy = rows.sum(axis=0) + rng.normal(0.0, sigma, H.shape[1])
    label = "gaussian(validation mean)" + (" around the seed mean" if center.any() else "")
    ledger.gaussian(sigma, delta_l2, label=label, neighbouring=relation(params))
    return np.asarray(center + noisy / H.shape[0], dtype=np.float64)


def public_candidates(params: CuratorParams, n_features: int) -> F64:
    """Public random candidate points for herding, from a generator seeded by the public h1 seed.

    "gaussian": ``N(center, scale^2 I)``; "uniform": ``U[center - scale, center + scale]^n``,
    in the coordinates h1 hashes (standardised ones when the run standardises its features).
    """
    rng = np.random.default_rng([params.h1_seed, 0x4E8D])
    shape = (params.n_candidates, n_features)
    center, scale = params.candidate_center, params.candidate_scale
    if params.candidate_distribution == "gaussian":
        return np.asarray(center + scale * rng.standard_normal(shape), dtype=np.float64)
    if params.candidate_distribution == "uniform":
        return np.asarray(rng.uniform(center - scale, center + scale, shape), dtype=np.float64)
    raise ValueError(f"candidate_distribution must be one of {CANDIDATE_DISTRIBUTIONS}")


def candidate_box(params: CuratorParams) -> tuple[float, float]:
    """The public box herding's ascent stays in: the uniform domain, or center +- 3 scale."""
    width = params.candidate_scale * (1.0 if params.candidate_distribution == "uniform" else 3.0)
    return params.candidate_center - width, params.candidate_center + width

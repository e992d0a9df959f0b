"""The purchased pool and the curator's final selection (issue 6: oversample, then select).

Theory of operation
-------------------
Every verified point an owner delivers is *purchased*: the curator holds it whether or not it
won its epoch. :class:`PurchasedPool` keeps each one once (keyed by owner and token) with its
provenance. With ``CuratorParams.final_selection = "exact"`` the summary the curator returns is
not the sequence of epoch winners but the ``p`` pool points picked by exact greedy on Eq. 3
(the RBF kernel on the features h1 hashes, standardised when the run standardises) against the
*exact* validation set D_v; in the less-trusted mode, where the curator holds only hashes, the
greedy runs on h1 with the exact hashed validation mean.

Two kinds of epoch fill the pool (``explore_epochs``, :mod:`.curator`):

* *steering* epochs (the usual ones): every owner bids its best point under the broadcast
  direction (g_tilde and g_l, or herding's virtual point), the auction decides who is asked;
* *exploration* epochs, the first ``explore_epochs`` of the run: each owner bids a point drawn
  uniformly from its biddable records under its own secret key (``Owner(rng=...)``, from OS
  entropy in a deployment: actors/randomness.py), and every bidder is asked. A noisy g_tilde
  steers all owners toward the mode of the target (on the digits split: 3s, not 4s); a uniform
  share of the pool keeps every region of every owner's data within reach of the exact
  selection.

Privacy (what the ledger charges: nothing for this module):
* The final selection reads D_v exactly, but its output (which purchased points form the
  summary) goes to the consumer only; no owner ever receives it or anything computed from it
  (owners see setup, g_tilde, the epoch broadcasts and whether they were asked; FinishBody
  carries the epoch count and the reason). It is therefore not a release to any owner, and
  releases to owners are what the ledgers protect. A deployment must not pay owners by final
  inclusion (pay per delivery), or the payment becomes such a release.
* An exploration epoch's broadcast and its ask set do not depend on any private data: every
  bidder is asked, whatever its bid. No auction runs, so no auction step is charged.
* What an exploration token tells the trusted curator (never an owner: tokens are not in any
  frame an owner receives, nor in report.json). A token is a record's arrival position. Drawn
  by a publicly seeded generator (as before issue 24) it was a public function of the number of
  biddable records k: ``choice`` over k items, so anyone holding the seeds could try every k
  and read off the owner's exact count from a token or two (the consumer too, from the tokens
  and epochs in summary.csv). Drawn by the owner's secret generator it is uniform on the
  biddable records: each token is below k, so E exploration draws bound k from below and
  estimate it to within about k / E, and a repeated token hints at a small k. The curator
  learns at least as much anyway: it receives every purchased point in the clear, allocate-
  select's profile message carries the owner's record count, and each steering token is a
  position below the count too. The curator is trusted with the points, so with their number;
  the consumer's summary.csv shows the tokens of the kept points only (lower bounds).
  tests/protocol/summary/test_selection.py checks that the tokens are no longer a function of
  public values (the curator's exact-count attack of a public draw fails).
The price is parsimony: the curator accesses the whole pool (report.private.json's points
accessed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.summary.objective import greedy_exact, greedy_hashed, rbf_gram

__all__ = [
    "FINAL_SELECTIONS",
    "PoolEntry",
    "PurchasedPool",
    "prefix_gains",
]

FINAL_SELECTIONS = ("none", "exact")
F64 = npt.NDArray[np.float64]
F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class PoolEntry:
    """One purchased point: its provenance, features (None if less trusted), hash and label."""

    owner: str
    token: int
    epoch: int
    bid: float
    point: F64 | None
    hashed: F32
    label: float


class PurchasedPool:
    """Every distinct verified delivery, in arrival order (module docstring)."""

    def __init__(self) -> None:
        self.entries: list[PoolEntry] = []
        self._keys: set[tuple[str, int]] = set()

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: PoolEntry) -> bool:
        """Keep ``entry`` unless its (owner, token) is already held; True if it was added."""
        key = (entry.owner, entry.token)
        if key in self._keys:
            return False
        self._keys.add(key)
        self.entries.append(entry)
        return True

    def select(
        self,
        p: int,
        validation: npt.ArrayLike,
        H_validation: npt.ArrayLike,
        gamma: float,
        standardise: tuple[F64, F64] | None = None,
    ) -> tuple[npt.NDArray[np.int64], F64]:
        """Indices of the ``min(p, len(pool))`` entries exact greedy picks, in picking order,
        and the exact marginal gain in J (Eq. 3) each brought (they sum to J of the summary).

        Raw points (``standardise = (center, scale)`` maps them as h1 does) when every entry
        has one, else h1 hashes against the exact hashed validation set.
        """
        if p < 1:
            raise ValueError(f"p must be >= 1, got {p}")
        k = min(p, len(self.entries))
        if k == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        if all(e.point is not None for e in self.entries):
            X, V = self.features(validation, standardise)
            order = greedy_exact(X, V, k, gamma)
            return order, prefix_gains(X[order], V, gamma)
        H = np.array([e.hashed for e in self.entries], dtype=np.float32)
        HV = np.asarray(H_validation, dtype=np.float32)
        order = greedy_hashed(H, HV, k)
        return order, prefix_gains(H[order], HV, None)

    def features(
        self, validation: npt.ArrayLike, standardise: tuple[F64, F64] | None
    ) -> tuple[F64, F64]:
        """Pool points and validation points in the coordinates the kernel is defined on."""
        X = np.array([e.point for e in self.entries], dtype=np.float64)
        V = np.asarray(validation, dtype=np.float64)
        if standardise is not None:
            center, scale = standardise
            X, V = (X - center) / scale, (V - center) / scale
        return X, V


def prefix_gains(X: npt.ArrayLike, V: npt.ArrayLike, gamma: float | None) -> F64:
    """``J(S_i) - J(S_{i-1})`` along the rows of X (S_i its first i rows; J(empty) = 0), Eq. 3.

    ``gamma`` None: X and V are h1 hashes and the kernel is their inner product with the RBF
    self-kernel 1 on the diagonal (the criterion ``greedy_hashed`` picks by). A gain can be
    negative: a point far from D_v lowers J.
    """
    S = np.asarray(X, dtype=np.float64)
    T = np.asarray(V, dtype=np.float64)
    if len(S) == 0:
        return np.zeros(0)
    if gamma is None:
        K, cross = S @ S.T, S @ T.mean(axis=0)
        np.fill_diagonal(K, 1.0)
    else:
        K, cross = rbf_gram(S, S, gamma), rbf_gram(S, T, gamma).mean(axis=1)
    n = np.arange(1, len(S) + 1, dtype=np.float64)
    within = np.cumsum(2 * np.tril(K).sum(axis=1) - np.diag(K))
    J = 2 * np.cumsum(cross) / n - within / n**2
    return np.asarray(np.diff(J, prepend=0.0), dtype=np.float64)

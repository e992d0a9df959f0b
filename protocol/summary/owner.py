"""Owner and Curator state machines of private summarisation (Sarpatwar et al., Algorithm 3).

Theory of operation
-------------------
The curator holds the consumer's validation set D_v and a public seed set D_init. It sends every
owner the public parameters (``summary.setup``: h1's seed, d, gamma, tau), then g_tilde, the DP
release of mean h1 over D_v (``summary.validation``). Epoch l opens with ``summary.epoch``
carrying g_l, an estimate of the mean of h1 over the summary S collected so far (the seed's exact
hashed sum subtracted, PAPER-NOTES item 2) and q = |S|. Every owner bids its best point by the
corrected bid b(x) = h1(x) . (g_tilde - q/(q+1) g_l) (PAPER-NOTES item 1), or passes. The curator
runs the private auction over the bids, asks the chosen owners for their points, verifies each
delivered point against its bid, and adds the best verified one to S. Asked points that lose stay
with their owners and may be bid again (Algorithm 3, line 16).

Deviation from Algorithm 3: an owner is never told whether its delivered point was kept (that
outcome is a deterministic function of the other owners' bids, so telling it would not be DP).
A kept point therefore keeps its high bid and could be bid and refused (as a duplicate) forever,
stalling the run; so an owner withdraws a point after delivering it ``max_deliveries`` times.
That decision uses only what the owner already saw (being asked), so it costs no privacy.

Exploration epochs (``EpochBody.explore``, protocol/summary/selection.py): the owner bids a biddable
point drawn uniformly by its own secret generator (``rng``), scored as usual; every bidder is
asked. A draw by a publicly seeded generator would be a public function of the number of
biddable records, so its token would tell the curator the owner's count exactly. The draw is
a keyed hash of the epoch number under a key the owner takes once from ``rng``: an epoch sent
again after a curator's resume gets the same draw while the biddable records are the same.

Deadlines: a phase's deadline is armed at the first ``expire(now)`` after it opens and fires at
``now >= armed + phase_timeout``; owners that have not answered by then count as dropped for that
epoch and the phase continues without them; a dropped owner is not asked again unless the runtime
reports it reachable (``Curator.returned``: then from the next epoch on, and at most
``MAX_RETURNS`` times in a run), and T counts the
owners absent from the current epoch. An epoch that adds nothing
(nobody asked, every delivery failed verification) repeats with the *same* release (no new
privacy cost); the run stops after ``max_epochs`` steering epochs (plus any exploration epochs)
in any case.

Transition tables
-----------------
Owner:   (any, setup) -> awaiting_validation; (awaiting_validation, validation) -> idle;
         (idle | bidding, epoch) -> bidding [sends bid, pass, profile or count];
         (bidding, ask) -> bidding
         [sends deliver]; (any but new, finish) -> finished.
Curator: (bidding, bid | pass) -> bidding / asking; (asking, deliver) -> asking / bidding / done;
         late frames of an earlier epoch are counted and ignored.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.summary.allocate_mixture import ProfileFrame, owner_profile
from dpmarket.protocol.summary.allocate_rank import owner_histogram
from dpmarket.protocol.summary.h1 import RandomFourierFeatures
from dpmarket.protocol.summary.messages import (
    AskBody,
    BidBody,
    CountBody,
    DeliverBody,
    EpochBody,
    PassBody,
    ProfileBody,
    SetupBody,
    ValidationBody,
)
from dpmarket.protocol.summary.objective import bid_direction
from dpmarket.protocol.wire.codec import Message
from dpmarket.protocol.wire.errors import LocalProtocolError, RemoteProtocolError
from dpmarket.protocol.wire.parties import Handler, Outbox, body_of, dispatch

__all__ = ["Owner"]

F64 = npt.NDArray[np.float64]
_OWNER_STATES = ("new", "awaiting_validation", "idle", "bidding", "finished")


@dataclass
class _OwnerStore:
    """Records an owner holds: features, labels and their h1 hashes (hashed once).

    ``HT`` holds the hashes feature-major (d x n, C-contiguous): the per-epoch bid product
    ``direction @ HT`` then streams each hash coordinate once, about 2.5x faster than
    ``H @ direction`` on n x d rows here."""

    X: F64
    y: F64
    HT: npt.NDArray[np.float32] | None = None


class Owner:
    """A data owner (Algorithm 3, line 6): bids its best point, delivers it when asked.

    The owner sees only releases that are DP with respect to the other owners' data (g_tilde,
    g_l) and whether it was asked; it never learns whether its point was kept. New records given
    to :meth:`add_records` become biddable at the next epoch.
    """

    def __init__(
        self,
        name: str,
        run: str,
        X: npt.ArrayLike,
        y: npt.ArrayLike | None = None,
        rng: np.random.Generator | None = None,
        profile_floor: float | None = None,
        point_limit: int | None = None,
    ):
        """``rng``: the owner's secret generator, needed only for the noise of allocate-select's
        allocation profile (protocol/summary/allocate.py) and for exploration draws
        (protocol/summary/selection.py). ``profile_floor``: the operator's
        noise multiplier for that profile, given at construction (never by the curator): a
        profile asked with less noise is refused, and without a floor none is released."""
        X_arr = np.asarray(X, dtype=np.float64)
        if X_arr.ndim != 2:
            raise ValueError(f"X: expected a 2-D array of records, got shape {X_arr.shape}")
        y_arr = np.zeros(len(X_arr)) if y is None else np.asarray(y, dtype=np.float64)
        if y_arr.shape != (len(X_arr),):
            raise ValueError(f"y: expected shape ({len(X_arr)},), got {y_arr.shape}")
        if not (np.isfinite(X_arr).all() and np.isfinite(y_arr).all()):
            raise ValueError("X, y: records must be finite")
        self.name = name
        self.run = run
        self.state = "new"
        self._store = _OwnerStore(X_arr, y_arr)
        self._pending: list[tuple[F64, F64]] = []
        self._out = Outbox(run, name)
        self._h1: RandomFourierFeatures | None = None
        self._setup: SetupBody | None = None
        self._g_validation: F64 | None = None
        self._bids: dict[int, float] = {}  # token -> bid of the current epoch
        self._deliveries = np.zeros(len(X_arr), dtype=np.int64)  # per token
        self._retired = np.zeros(len(X_arr), dtype=np.bool_)  # per record, in arrival order
        self.epochs_seen = 0
        self.asks = 0
        self._rng = rng
        self._profile_floor = profile_floor
        if point_limit is not None and (isinstance(point_limit, bool) or point_limit < 0):
            raise ValueError(f"point_limit: expected an integer >= 0, got {point_limit!r}")
        self._point_limit = point_limit
        self._profile: F64 | None = None  # released once, re-sent unchanged on a resume
        self._profile_records = 0  # the live records it was computed over (n_i, public)
        self._explore_key: bytes | None = None  # secret, from rng at the first exploration
        self._table: dict[tuple[str, str], Handler] = {
            # setup is accepted in every state: a resumed run re-sends it to returning owners
            **{(state, "summary.setup"): self._on_setup for state in _OWNER_STATES},
            ("awaiting_validation", "summary.validation"): self._on_validation,
            ("idle", "summary.epoch"): self._on_epoch,
            ("bidding", "summary.epoch"): self._on_epoch,
            ("bidding", "summary.ask"): self._on_ask,
            ("awaiting_validation", "summary.finish"): self._on_finish,
            ("idle", "summary.finish"): self._on_finish,
            ("bidding", "summary.finish"): self._on_finish,
        }

    @property
    def n_records(self) -> int:
        return len(self._store.X) + sum(len(x) for x, _ in self._pending)

    def records(self) -> F64:
        """Every record held, pending ones included (for the owner's secure-sum contributions)."""
        parts = [self._store.X, *(x for x, _ in self._pending)]
        return np.concatenate(parts) if len(parts) > 1 else self._store.X

    def add_records(self, X: npt.ArrayLike, y: npt.ArrayLike | None = None) -> None:
        """Queue new records; they are hashed and biddable from the next epoch on."""
        X_arr = np.asarray(X, dtype=np.float64)
        if X_arr.ndim != 2 or X_arr.shape[1] != self._store.X.shape[1]:
            raise ValueError(f"X: expected shape (n, {self._store.X.shape[1]}), got {X_arr.shape}")
        y_arr = np.zeros(len(X_arr)) if y is None else np.asarray(y, dtype=np.float64)
        if y_arr.shape != (len(X_arr),) or not np.isfinite(X_arr).all():
            raise ValueError("records must be finite and labels must match the records")
        self._pending.append((X_arr, y_arr))

    def fork(
        self,
        run: str,
        rng: np.random.Generator | None,
        profile_floor: float | None,
        point_limit: int | None = None,
    ) -> Owner:
        """A fresh party of run ``run`` (a later purchase) holding every record this one holds,
        pending ones included, in arrival order, with the same records retired."""
        labels = [self._store.y, *(y for _, y in self._pending)]
        y = np.concatenate(labels) if len(labels) > 1 else self._store.y
        fresh = Owner(
            self.name, run, self.records(), y, rng=rng, profile_floor=profile_floor,
            point_limit=point_limit,
        )  # fmt: skip
        fresh._retired = self._retired.copy()
        return fresh

    def retire(self, mask: npt.ArrayLike) -> None:
        """Never bid or deliver the records where ``mask`` is True (arrival order, pending
        ones included): their block's privacy budget is spent. Retirement is permanent."""
        m = np.asarray(mask, dtype=np.bool_)
        if m.shape != (self.n_records,):
            raise ValueError(f"mask: expected shape ({self.n_records},), got {m.shape}")
        old = np.zeros(self.n_records, dtype=np.bool_)
        old[: len(self._retired)] = self._retired
        self._retired = old | m

    def _retired_tokens(self) -> npt.NDArray[np.bool_]:
        out = np.zeros(len(self._store.X), dtype=np.bool_)
        k = min(len(out), len(self._retired))
        out[:k] = self._retired[:k]
        return out

    def receive(self, msg: Message) -> list[Message]:
        return dispatch(self.name, self.run, self.state, self._table, msg)

    # an owner has no deadlines of its own: a transport need not tell it the time
    keeps_deadlines = False

    def expire(self, now: float) -> list[Message]:
        return []  # no deadlines (keeps_deadlines)

    # --------------------------------------------------------------------------- handlers
    def _on_setup(self, msg: Message) -> list[Message]:
        body = body_of(msg, SetupBody)
        if body.n_features != self._store.X.shape[1]:
            raise RemoteProtocolError(
                f"summary.setup.n_features: {body.n_features} != owner's {self._store.X.shape[1]}"
            )
        if body.d < 1 or body.gamma <= 0 or body.tau < 1 or body.max_deliveries < 1:
            raise RemoteProtocolError(
                "summary.setup: d, gamma, tau and max_deliveries must be positive"
            )
        try:
            h1 = RandomFourierFeatures(
                body.n_features,
                body.d,
                body.gamma,
                body.h1_seed,
                center=body.center,
                scale=body.scale,
            )
        except ValueError as exc:
            raise RemoteProtocolError(f"summary.setup: {exc}") from None
        self._h1, self._setup = h1, body
        self._store.HT = np.ascontiguousarray(h1(self._store.X).T, dtype=np.float32)
        self.state = "awaiting_validation"
        return []

    def _on_validation(self, msg: Message) -> list[Message]:
        body = body_of(msg, ValidationBody)
        g = np.asarray(body.g_validation, dtype=np.float64)
        self._check_vector("summary.validation.g_validation", g)
        self._g_validation = g
        self.state = "idle"
        return []

    def _on_epoch(self, msg: Message) -> list[Message]:
        body = body_of(msg, EpochBody)
        g = np.asarray(body.g_summary, dtype=np.float64)
        self._check_vector("summary.epoch.g_summary", g)
        if body.summary_size < 0:
            raise RemoteProtocolError("summary.epoch.summary_size: must be >= 0")
        self._ingest_pending()
        self.state = "bidding"
        self.epochs_seen += 1
        store = self._store
        assert store.HT is not None and self._g_validation is not None
        assert self._setup is not None
        if body.profile_sigma > 0:
            return [self._out.make(msg.sender, msg.round, self._release_profile(body))]
        if body.count:  # random-select (random_select.py): n_i, fixed under replace-one
            self._bids = {}
            sellable = int((~self._retired_tokens()).sum())
            left = self._points_left()  # what it may sell: its own limit caps the count
            if left is not None:
                sellable = min(sellable, left)
            return [self._out.make(msg.sender, msg.round, CountBody(sellable))]
        biddable = (self._deliveries < self._setup.max_deliveries) & ~self._retired_tokens()
        if self._at_point_limit():  # its own limit: only points already delivered stay
            biddable &= self._deliveries > 0
        if not biddable.any():
            self._bids = {}
            why = "its point limit reached" if self._at_point_limit() else "no records left to bid"
            return [self._out.make(msg.sender, msg.round, PassBody(why))]
        # one float32 matrix-vector product scores every record (the curator re-checks the
        # winner's bid in float64 within its verification tolerance)
        direction = bid_direction(self._g_validation, g, body.summary_size)
        bids = np.where(biddable, direction.astype(np.float32) @ store.HT, -np.inf)
        if body.explore:  # a uniform draw by the owner's secret generator (selection.py)
            token = self._exploration_draw(msg.round, biddable)
        else:
            token = int(np.argmax(bids))
        self._bids = {token: float(bids[token])}
        return [self._out.make(msg.sender, msg.round, BidBody(token, float(bids[token])))]

    def _exploration_draw(self, epoch: int, biddable: npt.NDArray[np.bool_]) -> int:
        """A record drawn uniformly from ``biddable``: BLAKE2b of the epoch number keyed with
        256 secret bits drawn once from the owner's generator, reduced modulo the number of
        biddable records (128 bits, so the bias is below 2^-100). A function of the epoch, so
        a resumed epoch draws the same record again; secret, so the token is not a public
        function of the count (protocol/summary/selection.py)."""
        if self._explore_key is None:
            if self._rng is None:
                raise LocalProtocolError(
                    f"{self.name}: the curator asks for an exploration draw, but this owner "
                    "was given no secret generator"
                )
            self._explore_key = self._rng.bytes(32)
        candidates = np.flatnonzero(biddable)
        digest = hashlib.blake2b(str(epoch).encode(), key=self._explore_key, digest_size=16)
        return int(candidates[int.from_bytes(digest.digest(), "little") % len(candidates)])

    def _release_profile(self, body: EpochBody) -> ProfileBody:
        """The DP mean of h1 (protocol/summary/allocate_mixture.py) or, when the epoch names bin
        edges, the DP histogram of its records' scores (allocate_rank.py), drawn once from the
        owner's own noise generator; a resumed profile epoch gets the same release again."""
        if self._profile is None:
            if self._rng is None:
                raise LocalProtocolError(
                    f"{self.name}: the curator asks for an allocation profile, but this owner "
                    "was given no noise generator"
                )
            floor = self._profile_floor
            if floor is None or not body.profile_sigma >= floor:  # also refuses a nan
                raise RemoteProtocolError(
                    f"summary.epoch.profile_sigma: {body.profile_sigma!r} is below the "
                    f"operator's floor {floor!r} (or no profile was planned): nothing released"
                )
            assert self._store.HT is not None and self._setup is not None
            d = self._setup.d
            basis = np.asarray(body.profile_basis if body.profile_basis is not None else [])
            center = np.asarray(body.profile_center if body.profile_center is not None else [])
            ok = math.isfinite(body.profile_sigma) and math.isfinite(body.profile_clip)
            if not (ok and body.profile_clip > 0 and basis.size and basis.size % d == 0):
                raise RemoteProtocolError(
                    "summary.epoch.profile_*: expected a finite sigma, a clip > 0 and k x d basis"
                )
            # only records the owner may still use: a retired record (its budget block spent,
            # actors/budgets/gate.py) is read by no release, this one included
            live = self._store.HT[:, ~self._retired_tokens()]
            self._profile_records = int(live.shape[1])
            try:
                if body.profile_edges is not None:  # score histogram (allocate_rank.py)
                    self._profile = owner_histogram(
                        live, basis, center, body.profile_edges, body.profile_sigma, self._rng
                    )
                else:
                    frame = ProfileFrame(basis.reshape(-1, d), center, float(body.profile_clip))
                    self._profile = owner_profile(live, frame, body.profile_sigma, self._rng)
            except ValueError as exc:
                raise RemoteProtocolError(f"summary.epoch.profile_basis: {exc}") from None
        self._bids = {}
        return ProfileBody(self._profile.copy(), records=self._profile_records)

    def _on_ask(self, msg: Message) -> list[Message]:
        body = body_of(msg, AskBody)
        if body.token not in self._bids:
            raise RemoteProtocolError(f"summary.ask.token: {body.token} was not bid this epoch")
        if self._retired_tokens()[body.token]:
            raise RemoteProtocolError(f"summary.ask.token: {body.token} is retired")
        if self._at_point_limit() and self._deliveries[body.token] == 0:
            raise RemoteProtocolError(
                f"summary.ask.token: {body.token} would exceed the owner's limit of "
                f"{self._point_limit} points for this purchase"
            )
        self.asks += 1
        store, token = self._store, body.token
        self._deliveries[token] += 1
        label = float(store.y[token])
        assert self._setup is not None and store.HT is not None
        if self._setup.less_trusted:
            hashed = np.ascontiguousarray(store.HT[:, token], dtype=np.float32)
            deliver = DeliverBody(token, hashed=hashed, label=label)
        else:
            deliver = DeliverBody(token, point=store.X[token].copy(), label=label)
        return [self._out.make(msg.sender, msg.round, deliver)]

    def _points_left(self) -> int | None:
        """Distinct points its own limit still lets it sell (None: no limit)."""
        limit = self._point_limit
        if limit is None:
            return None
        return max(0, limit - int(np.count_nonzero(self._deliveries)))

    def _at_point_limit(self) -> bool:
        return self._points_left() == 0

    def _on_finish(self, msg: Message) -> list[Message]:
        self.state = "finished"
        return []

    # ---------------------------------------------------------------------------- helpers
    def _check_vector(self, name: str, g: F64) -> None:
        assert self._setup is not None
        if g.shape != (self._setup.d,):
            raise RemoteProtocolError(f"{name}: shape {g.shape}, expected ({self._setup.d},)")

    def _ingest_pending(self) -> None:
        if not self._pending:
            return
        assert self._h1 is not None and self._store.HT is not None
        X_new = np.concatenate([x for x, _ in self._pending])
        y_new = np.concatenate([y for _, y in self._pending])
        self._pending.clear()
        store = self._store
        store.X = np.concatenate([store.X, X_new])
        store.y = np.concatenate([store.y, y_new])
        store.HT = np.concatenate([store.HT, self._h1(X_new).T.astype(np.float32)], axis=1)
        self._deliveries = np.concatenate([self._deliveries, np.zeros(len(X_new), np.int64)])

"""DCA secure sum (Heikkilä et al. 2017, Algorithm 1): configuration, round spec, key derivation.

The wire bodies are in :mod:`.messages`, the parties in :mod:`.client`, :mod:`.node` and
:mod:`.aggregator`.

Theory of operation
-------------------
N clients (a public roster), M >= 2 compute nodes, one aggregator, tolerance T.

Session (once): every compute node holds an X25519 key pair made or loaded by the operator; its
public half may reach clients through a relay, but each client checks it against a SHA-256
fingerprint the operator gave it directly (``Client(pinned=...)``) and refuses a mismatch. A
client party (hosting one client or a batch of them) holds one X25519 key pair per hosted client,
derives one PRK per (client, node) pair and sends ``dca.register`` (indices, public keys and a
proof per pair: an HMAC under the PRK) to every node; each node derives the same PRKs, checks
the proofs, and, given the clients' public keys pinned by the operator (``client_keys``),
refuses a key registered under another client's name. What follows from the PRK
depends on ``DcaConfig.shares``:

* ``"derived"`` (default): one HKDF-Expand per pair gives the pair's mask key; blinding shares
  and per-round frame keys are read from its AES-CTR block streams (:mod:`.masks`).
* ``"sealed-seeds"``: the pair's AES-256 round keys come from HKDF-Expand, one block of rounds
  per call (:class:`~dpmarket.protocol.securesum.sealing.RoundKeyring`, :func:`round_key_info`),
  and seeds travel sealed.

Round r (many per session):

1. The aggregator sends ``dca.open`` (the :class:`RoundSpec` and a deadline) to every node.
2. Each client encodes z_i on the fixed-point grid and adds discrete Gaussian noise of standard
   deviation sigma_std / sqrt(N - T - 1) (Theorem 1). Its *value node* is v = (i + r) mod M,
   which spreads the large frames over all nodes. With derived shares, the client sends
   ``dca.shares`` only to v: the share z_i + eta_i - sum_{k != v} mask_{i,k,r} mod 2^64, sealed
   under the round's (i, v) frame key. With sealed seeds, it draws M - 1 seeds from ``secrets``
   and sends v the sealed share z_i + eta_i - sum_k PRG(seed_k) and every other node its sealed
   seed. Either way the shares sum to z_i + eta_i, and any M - 1 of them are (computationally)
   uniform and independent of z_i.
3. A node opens and stores frames until every client it expects has arrived (all clients with
   sealed seeds; the clients whose value node it is with derived shares) or the deadline
   passes. It then sends its set to the other nodes (``dca.seen``): the clients whose frame it
   accepted and, with derived shares, every other client it holds a pair key for (it can add
   that client's mask). With all M sets it takes the intersection S. If N - |S| > T it sends
   ``dca.abort`` and releases nothing; otherwise it sends ``dca.partial``: the ring sum over S of
   its shares (value shares plus expanded seeds or derived masks) and S itself.
4. The aggregator adds the M partials modulo 2^64 when all M name the same S with N - |S| <= T,
   decodes, and records one Gaussian event in its :class:`PrivacyLedger`. Anything else ends the
   round with status ``insufficient``, ``inconsistent`` or ``failed`` and no value.

Every party refuses a message its state does not allow without changing state (one transition
table per role, :func:`dpmarket.protocol.wire.parties.dispatch`). Deadlines come in through
``expire(now)``; randomness through a ``numpy.random.Generator`` (DP noise only; keys, seeds and
nonces come from ``secrets``/``cryptography``).

Privacy (per round, neighbouring = replace one client's vector, N public): with at most T clients
dropped or colluding, the noise of the remaining honest clients other than any one curious client
has variance >= sigma_std^2 per coordinate, so the release is the Gaussian mechanism with
sigma_std at L2 sensitivity ``grid_sensitivity`` (the caller's Delta plus one grid step per
coordinate). The ledger accounts it as a continuous Gaussian: a discrete Gaussian on the grid has
the same zCDP guarantee (Canonne, Kamath & Steinke 2020), and a sum of discrete Gaussians of
per-client sigma >= 4 grid units differs from one discrete Gaussian by a term that Kairouz, Liu &
Steinke (2021) bound by 10 n exp(-pi^2 sigma^2) < 1e-60 here. Security: not all compute nodes
collude; clients are honest-but-curious (they send values within the bound); the relay sees only
ciphertext; the shares any M - 1 nodes see are computationally uniform.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpmarket.protocol.privacy.dgauss import MAX_GRID_SIGMA, client_sigma, gaussian_sigma
from dpmarket.protocol.securesum.fixedpoint import (
    FixedPoint,
    RingConfig,
    check_capacity,
    grid_sensitivity,
    noise_tail_bound,
)
from dpmarket.protocol.securesum.messages import OpenBody
from dpmarket.protocol.securesum.sealing import NONCE_BYTES, PRGS, TAG_BYTES, length_prefixed
from dpmarket.protocol.wire.codec import MAX_ARRAY_BYTES

__all__ = [
    "MAX_ROUND_D",
    "MIN_CLIENT_GRID_SIGMA",
    "REPLACE_ONE",
    "SHARE_MODES",
    "STATUSES",
    "DcaConfig",
    "RoundResult",
    "RoundSpec",
    "admitted_digest",
    "frame_aad",
    "pair_salt",
    "register_info",
    "roster_info",
    "round_key_info",
]

F64 = npt.NDArray[np.float64]
U64 = npt.NDArray[np.uint64]
BoolArray = npt.NDArray[np.bool_]

REPLACE_ONE = "replace one client's vector"
STATUSES = ("released", "insufficient", "inconsistent", "failed", "cancelled")
SHARE_MODES = ("derived", "sealed-seeds")
# values per client and round: one sealed share vector must fit one array of the codec
MAX_ROUND_D = (MAX_ARRAY_BYTES - NONCE_BYTES - TAG_BYTES) // 8
MIN_CLIENT_GRID_SIGMA = 4.0  # per-client noise, in grid units, when noise is on
_DOMAIN = "dpmarket/dca/v1"


# ------------------------------------------------------------------------------ key derivation
def round_key_info(block: int) -> bytes:
    """HKDF-Expand ``info`` of the pairs' round keys of rounds B b + 1 .. B (b + 1).

    The PRK already binds run, pair and public keys; a key is bound to its round number, and the
    frames' associated data (:func:`frame_aad`) bind the round's full digest (spec included).
    """
    return length_prefixed(_DOMAIN + "/round-keys", block)


def frame_aad(digest: bytes, node: str, kind: str) -> bytes:
    """AEAD associated data of a round's frames to ``node``: round digest (run, round, spec),
    node and kind. The client is bound by the frame's key (each pair has its own round key)."""
    return length_prefixed(_DOMAIN + "/frame", digest, node, kind)


def register_info(run: str, client: str, node: str, client_key: bytes, node_key: bytes) -> bytes:
    """What a registration proof authenticates: the client's name and key for this node."""
    return length_prefixed(_DOMAIN + "/register", run, client, node, client_key, node_key)


def roster_info(
    session: bytes, node: str, client: str, checked: bool, admitted: tuple[str, ...]
) -> bytes:
    """What a node's roster attestation to ``client`` authenticates (an HMAC under their pair
    key, :meth:`~dpmarket.protocol.securesum.node.ComputeNode.attest`): the session
    (:attr:`DcaConfig.session_digest`), both names, whether the node had every registered
    owner's key proven by that owner's signature, and the SHA-256 of the clients registered
    with it (:func:`admitted_digest`)."""
    return length_prefixed(
        _DOMAIN + "/roster", session, node, client, int(checked), admitted_digest(admitted)
    )


@functools.lru_cache(maxsize=64)
def admitted_digest(admitted: tuple[str, ...]) -> bytes:
    """SHA-256 of a list of client names (one per attestation, so K tags cost K hashes)."""
    return hashlib.sha256(length_prefixed(*admitted)).digest()


def pair_salt(run: str, client: str, node: str, client_key: bytes, node_key: bytes) -> bytes:
    """HKDF-Extract salt of a (client, node) pair: run, both names and both public keys."""
    return length_prefixed(_DOMAIN + "/pair", run, client, node, client_key, node_key)


# ------------------------------------------------------------------------------ configuration
def _check_names(name: str, values: tuple[str, ...], minimum: int) -> None:
    if not isinstance(values, tuple) or not all(isinstance(v, str) and v for v in values):
        raise ValueError(f"{name} must be a tuple of non-empty strings, got {values!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name} must be distinct, got duplicates in {values!r}")
    if len(values) < minimum:
        raise ValueError(f"{name}: need at least {minimum}, got {len(values)}")


@dataclass(frozen=True)
class DcaConfig:
    """Public parameters of a DCA session, checked at construction.

    ``clients`` is the public roster (N = len, indices are positions), ``nodes`` the compute
    nodes (M >= 2: one node alone would see every value), ``tolerance`` is T (dropped plus
    colluding clients tolerated, T <= N - 2), ``bound`` the largest |value| of one coordinate of
    one client, ``frac_bits`` the fixed-point precision. The ring capacity is checked here for
    the values alone and again per round with the noise (:meth:`check_round`).

    ``colluders`` are the clients known to collude (they may withhold their noise). They count
    against T in every round, with the clients missing from it (:meth:`shortfall`): a round with
    more than T missing-or-colluding clients is released by no node and no aggregator. More
    colluders than T is a legal configuration whose every round is refused.
    """

    run: str
    clients: tuple[str, ...]
    nodes: tuple[str, ...]
    aggregator: str = "aggregator"
    tolerance: int = 0
    bound: float = 1.0
    frac_bits: int = 32
    prg: str = "aes-ctr"
    agreement_timeout: float = 5.0
    result_timeout: float = 10.0
    shares: str = "derived"
    colluders: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.run, str) or not self.run:
            raise ValueError(f"run must be a non-empty string, got {self.run!r}")
        _check_names("clients", self.clients, 2)
        _check_names("nodes", self.nodes, 2)
        overlap = (set(self.clients) & set(self.nodes)) | ({self.aggregator} & set(self.nodes))
        if overlap or self.aggregator in self.clients:
            raise ValueError(f"clients, nodes and aggregator must not share names: {overlap}")
        t = self.tolerance
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= len(self.clients) - 2:
            raise ValueError(f"tolerance must be an integer in 0..N-2, got {t!r}")
        if self.prg not in PRGS:
            raise ValueError(f"prg must be one of {PRGS}, got {self.prg!r}")
        if self.shares not in SHARE_MODES:
            raise ValueError(f"shares must be one of {SHARE_MODES}, got {self.shares!r}")
        for name in ("agreement_timeout", "result_timeout"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite positive number, got {value!r}")
        RingConfig(len(self.clients), self.bound, self.frac_bits)
        if self.colluders:
            _check_names("colluders", self.colluders, 0)
            strangers = sorted(set(self.colluders) - set(self.clients))
            if strangers:
                raise ValueError(f"colluders: {strangers} are not clients of the roster")

    @property
    def n_clients(self) -> int:
        return len(self.clients)

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @functools.cached_property
    def colluding(self) -> BoolArray:
        """Roster mask of the known colluders (computed once per session)."""
        mask = np.zeros(self.n_clients, dtype=np.bool_)
        mask[[self.index[c] for c in self.colluders]] = True
        return mask

    def shortfall(self, included: BoolArray) -> int:
        """Clients whose noise a release over ``included`` lacks: missing or known colluders.

        Privacy (Theorem 1): each client adds sigma_std^2 / (N - T - 1), so the noise a curious
        client cannot subtract has variance (N - shortfall - 1) sigma_std^2 / (N - T - 1), which
        is >= sigma_std^2 exactly when shortfall <= T. Release only then.
        """
        return int((~np.asarray(included, dtype=np.bool_) | self.colluding).sum())

    def shortfall_reason(self, included: BoolArray) -> str:
        """Why a set falls short: the missing clients and the colluders, against T."""
        mask = np.asarray(included, dtype=np.bool_)
        missing = [c for c, keep in zip(self.clients, mask, strict=True) if not keep]
        colluding = [c for c in self.colluders if c not in missing]
        return (
            f"{len(missing)} clients missing ({', '.join(missing[:10]) or 'none'}) + "
            f"{len(colluding)} known colluders ({', '.join(colluding) or 'none'}) "
            f"> T = {self.tolerance}"
        )

    @property
    def codec(self) -> FixedPoint:
        return FixedPoint(self.frac_bits)

    def client_grid_sigma(self, spec: RoundSpec) -> float:
        """Per-client noise standard deviation in grid units (Theorem 1)."""
        sigma = client_sigma(spec.sigma_std, self.n_clients, self.tolerance)
        return sigma * self.codec.scale

    def spec(
        self,
        round_: int,
        d: int,
        epsilon: float,
        delta: float,
        sensitivity: float,
        method: str = "analytic",
        label: str = "",
        neighbouring: str = REPLACE_ONE,
    ) -> RoundSpec:
        """A round whose release is (epsilon, delta)-DP at L2 ``sensitivity`` (on the grid)."""
        on_grid = grid_sensitivity(sensitivity, d, self.frac_bits)
        sigma = gaussian_sigma(epsilon, delta, on_grid, method)
        return RoundSpec(round_, d, sigma, sensitivity, label, neighbouring)

    @functools.cached_property
    def _checked(self) -> set[RoundSpec]:
        """The specs :meth:`check_round` passed (the same for every client of a process)."""
        return set()

    @functools.cached_property
    def _digests(self) -> dict[RoundSpec, bytes]:
        """:meth:`digest` per spec, computed once per process."""
        return {}

    def check_round(self, spec: RoundSpec) -> None:
        """``ValueError`` if the round could wrap the ring or its noise does not suit the grid
        (a pure function of this configuration and ``spec``: a spec that passed is not checked
        again, so the many owners of one process pay for it once)."""
        if spec in self._checked:
            return
        self._check_round(spec)
        self._checked.add(spec)

    def _check_round(self, spec: RoundSpec) -> None:
        grid_sigma = self.client_grid_sigma(spec)
        total_sigma = grid_sigma * self.codec.resolution * math.sqrt(self.n_clients)
        check_capacity(
            self.n_clients, self.bound, self.frac_bits, noise_tail_bound(total_sigma, spec.d)
        )
        if 0.0 < grid_sigma < MIN_CLIENT_GRID_SIGMA:
            raise ValueError(
                f"sigma_std={spec.sigma_std:g} gives {grid_sigma:.3g} grid units per client "
                f"(< {MIN_CLIENT_GRID_SIGMA}); increase frac_bits above {self.frac_bits}"
            )
        if grid_sigma > MAX_GRID_SIGMA:
            raise ValueError(
                f"sigma_std={spec.sigma_std:g} gives {grid_sigma:.3g} grid units per client "
                f"(> 2^48); reduce frac_bits below {self.frac_bits}"
            )

    @functools.cached_property
    def index(self) -> dict[str, int]:
        """Roster position of every client (computed once per session)."""
        return {client: i for i, client in enumerate(self.clients)}

    @functools.cached_property
    def roster_digest(self) -> bytes:
        """SHA-256 of the roster and the compute nodes (computed once per session)."""
        roster = length_prefixed(length_prefixed(*self.clients), length_prefixed(*self.nodes))
        return hashlib.sha256(roster).digest()

    @functools.cached_property
    def session_digest(self) -> bytes:
        """SHA-256 of every public parameter of the session (roster, nodes, T, grid, colluders,
        share mode): a roster attestation binds it, so an owner and a node that sign off on
        one roster also agree on the rest."""
        parts = length_prefixed(
            _DOMAIN + "/session", self.run, self.aggregator, self.tolerance,
            float(self.bound).hex(),
            self.frac_bits, self.prg, self.shares, length_prefixed(*self.colluders),
            self.roster_digest,
        )  # fmt: skip
        return hashlib.sha256(parts).digest()

    def digest(self, spec: RoundSpec) -> bytes:
        """SHA-256 binding the session and the round's parameters (AEAD data, key info)."""
        if spec not in self._digests:
            self._digests[spec] = self._digest(spec)
        return self._digests[spec]

    def _digest(self, spec: RoundSpec) -> bytes:
        parts = length_prefixed(
            _DOMAIN,
            self.run,
            spec.round,
            spec.d,
            spec.sigma_std.hex(),
            spec.sensitivity.hex(),
            spec.label,
            spec.neighbouring,
            self.frac_bits,
            self.tolerance,
            length_prefixed(*self.colluders),
            self.prg,
            self.shares,
            self.aggregator,
            self.roster_digest,
        )
        return hashlib.sha256(parts).digest()

    def value_node(self, client_index: npt.NDArray[np.int64], round_: int) -> npt.NDArray[np.int64]:
        """Index of the node that receives each client's value share in ``round_``.

        :mod:`.masks` uses the same rule (it keeps a node's frame keys of its value clients
        at i // M), so the two change together; the exact-sum tests would catch a mismatch."""
        return (client_index + round_) % self.n_nodes


@dataclass(frozen=True)
class RoundSpec:
    """What one round computes: the sum of d-vectors with Gaussian noise sigma_std in total.

    ``sensitivity`` is the caller's L2 sensitivity of one client's vector under ``neighbouring``;
    ``sigma_std = 0`` turns noise off (not private: the ledger is not charged and the result says
    so). Use :meth:`DcaConfig.spec` to calibrate sigma_std from (epsilon, delta).
    """

    round: int
    d: int
    sigma_std: float
    sensitivity: float = 1.0
    label: str = ""
    neighbouring: str = REPLACE_ONE

    def __post_init__(self) -> None:
        for name, value, low in (("round", self.round, 1), ("d", self.d, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.d > MAX_ROUND_D:
            raise ValueError(f"d must be at most {MAX_ROUND_D} values per client, got {self.d}")
        if not (isinstance(self.sigma_std, int | float) and math.isfinite(self.sigma_std)):
            raise ValueError(f"sigma_std must be a finite number, got {self.sigma_std!r}")
        if self.sigma_std < 0:
            raise ValueError(f"sigma_std must be >= 0, got {self.sigma_std!r}")
        sens = self.sensitivity
        if not (isinstance(sens, int | float) and math.isfinite(sens) and sens > 0):
            raise ValueError(f"sensitivity must be a finite positive number, got {sens!r}")
        object.__setattr__(self, "sigma_std", float(self.sigma_std))
        object.__setattr__(self, "sensitivity", float(self.sensitivity))

    def open_body(self, deadline: float) -> OpenBody:
        return OpenBody(
            self.d, self.sigma_std, self.sensitivity, self.label, self.neighbouring, deadline
        )

    @classmethod
    def from_open(cls, round_: int, body: OpenBody) -> RoundSpec:
        return cls(round_, body.d, body.sigma_std, body.sensitivity, body.label, body.neighbouring)


@dataclass(frozen=True)
class RoundResult:
    """How a round ended. ``value`` (decoded) and ``ring_total`` are set only when released.

    ``included``/``missing`` name the clients summed and left out; ``sensitivity`` is the grid
    sensitivity the ledger was charged with; ``private`` is False when noise was off.
    """

    round: int
    status: str
    reason: str
    value: F64 | None
    ring_total: U64 | None
    included: tuple[str, ...]
    missing: tuple[str, ...]
    sigma_std: float
    sensitivity: float

    @property
    def released(self) -> bool:
        return self.status == "released"

    @property
    def private(self) -> bool:
        return self.sigma_std > 0

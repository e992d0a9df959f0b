"""DCA secure sum (Heikkilä et al. 2017, Algorithm 1): the client party.

The theory of operation, the configuration and the round spec are in :mod:`.spec`, the wire
bodies in :mod:`.messages`; the compute node is in :mod:`.node`, the aggregator in
:mod:`.aggregator`, and :mod:`.driver` runs whole rounds in-process.

Client (sender only: it accepts no message)::

    new   start()                         -> ready, dca.register to every node
    ready contribute(spec, values, rng)   round > last round: dca.shares to the value nodes
                                          (derived shares) or to every node (sealed seeds)

Privacy of a client's contribution: the value share is blinded by M - 1 PRG streams that only
the other nodes can compute (derived from their pair keys, or from seeds sealed to them), so any
M - 1 nodes hold values (computationally) independent of z_i;
the noise is drawn before any share leaves and never reused across rounds (``contribute``
refuses an old round).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from dpmarket.protocol.privacy.dgauss import sample_discrete_gaussian
from dpmarket.protocol.securesum.masks import ClientMasks, MaskCipher, mask_cipher
from dpmarket.protocol.securesum.messages import (
    RegisterBody,
    SharesBody,
)
from dpmarket.protocol.securesum.sealing import (
    NONCE_BYTES,
    PUBLIC_KEY_BYTES,
    SEED_BYTES,
    TAG_BYTES,
    PairKey,
    RoundKeyring,
    expand_rows,
    generate_keypair,
    key_fingerprint,
    pair_secret,
    random_seeds,
    seal_rows,
)
from dpmarket.protocol.securesum.spec import (
    DcaConfig,
    RoundSpec,
    frame_aad,
    pair_salt,
    register_info,
    roster_info,
    round_key_info,
)
from dpmarket.protocol.wire.codec import Message
from dpmarket.protocol.wire.errors import LocalProtocolError
from dpmarket.protocol.wire.parties import Handler, Outbox, dispatch

__all__ = ["BEHAVIOURS", "Client", "NodeKeyMismatch"]

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
BEHAVIOURS = ("honest", "reveal", "withhold")
_CHUNK_ELEMENTS = 1 << 21  # client rows x d per sealed batch (16 MiB of shares)


class Client:
    """One or many roster clients hosted by one party (one owner, or a batch in a benchmark).

    ``node_keys`` are the compute nodes' public keys, possibly relayed; ``pinned`` maps every
    node to the SHA-256 fingerprint of its key (:func:`key_fingerprint`) as the operator gave it
    to this party directly, not through the relay. A relayed key that does not match its pin
    raises :class:`NodeKeyMismatch` at construction: no registration, no share is ever sealed
    to it, so a relay that swaps keys learns nothing. ``pinned=None`` means the caller obtained
    ``node_keys`` authentically itself (in-process harnesses). ``identity`` is the members'
    X25519 private keys when the operator pinned their public halves at the nodes (one per
    member); otherwise fresh ones are drawn at :meth:`start`. ``behaviour`` (simulation only)
    marks members as colluders: ``"reveal"`` adds noise and records it in ``revealed`` for the
    adversary, ``"withhold"`` adds none; everybody else is ``"honest"``.
    """

    def __init__(
        self,
        config: DcaConfig,
        name: str,
        node_keys: Mapping[str, bytes],
        members: Sequence[str] | None = None,
        behaviour: Mapping[str, str] | None = None,
        *,
        pinned: Mapping[str, str] | None = None,
        identity: Sequence[X25519PrivateKey] | None = None,
    ) -> None:
        members = tuple(members) if members is not None else (name,)
        roster = config.index
        unknown = [m for m in members if m not in roster]
        if not members or unknown or len(set(members)) != len(members):
            raise ValueError(f"members: expected distinct roster clients, got unknown {unknown}")
        if name in config.nodes or name == config.aggregator:
            raise ValueError(f"name: {name!r} is a compute node or the aggregator")
        bad_keys = [n for n in config.nodes if len(node_keys.get(n, b"")) != PUBLIC_KEY_BYTES]
        if bad_keys:
            raise ValueError(f"node_keys: missing or malformed for {bad_keys}")
        if pinned is not None:
            check_pins(config.nodes, node_keys, pinned)
        if identity is not None and len(identity) != len(members):
            raise ValueError(f"identity: {len(identity)} keys for {len(members)} members")
        self._identity = list(identity) if identity is not None else None
        behaviour = dict(behaviour or {})
        odd = {m: b for m, b in behaviour.items() if m not in members or b not in BEHAVIOURS}
        if odd:
            raise ValueError(f"behaviour: unknown members or behaviours {odd}; use {BEHAVIOURS}")
        self.config, self.name, self.run, self.members = config, name, config.run, members
        self._node_keys = {n: bytes(node_keys[n]) for n in config.nodes}
        self._index = np.array([roster[m] for m in members], dtype=np.int64)
        self._withhold = np.array([behaviour.get(m) == "withhold" for m in members])
        self._reveal = [i for i, m in enumerate(members) if behaviour.get(m) == "reveal"]
        self._keyrings: dict[str, RoundKeyring] = {}
        self._pairs: dict[tuple[str, str], PairKey] = {}  # (member, node) -> pair key
        self._masks: ClientMasks | None = None
        self._out = Outbox(config.run, name)
        self._table: dict[tuple[str, str], Handler] = {}
        self.state = "new"
        self.last_round = 0
        self.revealed: dict[int, dict[str, I64]] = {}

    def receive(self, msg: Message) -> list[Message]:
        return dispatch(self.name, self.run, self.state, self._table, msg)

    def expire(self, now: float) -> list[Message]:
        return []

    def start(self) -> list[Message]:
        """Session set-up: one X25519 key pair per member, one PRK per (member, node), and from
        it the pair's mask key (derived shares) or the round keys of the first block of rounds
        (sealed seeds)."""
        if self.state != "new":
            raise LocalProtocolError(f"start: client party {self.name} is already {self.state}")
        if self._identity is not None:
            pairs = [(k, k.public_key().public_bytes_raw()) for k in self._identity]
        else:
            pairs = [generate_keypair() for _ in self.members]
        keyrings: dict[str, RoundKeyring] = {}
        ciphers: list[list[MaskCipher]] = []
        proofs: dict[str, bytes] = {}
        for node, node_key in self._node_keys.items():
            prks = [
                PairKey(pair_secret(key, node_key, pair_salt(self.run, m, node, public, node_key)))
                for m, (key, public) in zip(self.members, pairs, strict=True)
            ]
            self._pairs.update(((m, node), prk) for m, prk in zip(self.members, prks, strict=True))
            proofs[node] = b"".join(
                prk.mac(register_info(self.run, m, node, public, node_key))
                for prk, m, (_, public) in zip(prks, self.members, pairs, strict=True)
            )
            if self.config.shares == "derived":
                ciphers.append([mask_cipher(p, self.config.prg) for p in prks])
            else:
                keyrings[node] = RoundKeyring(len(self.members), round_key_info)
                keyrings[node].add(range(len(self.members)), prks)
        if self.config.shares == "derived":
            self._masks = ClientMasks(self._index, ciphers)
        publics = np.frombuffer(b"".join(p for _, p in pairs), dtype=np.uint8)
        publics = publics.reshape(-1, PUBLIC_KEY_BYTES).copy()
        self._keyrings, self.state = keyrings, "ready"
        index = self._index.astype(np.uint32)
        return [
            self._out.make(node, 0, RegisterBody(index, publics, _rows(proofs[node])))
            for node in self.config.nodes
        ]

    def attested(self, member: str, node: str, attestation: object) -> tuple[bool, tuple[str, ...]]:
        """``node``'s roster attestation to ``member`` (``ComputeNode.attest``): whether the
        node checked the owners' signatures, and the clients registered with it. ``ValueError``
        naming the node unless it is well formed, names only roster clients including
        ``member``, and its tag verifies under the pair key of (member, node), whose node key
        was checked against its pin at :meth:`start`: a relay cannot forge or alter it."""
        pair = self._pairs.get((member, node))
        if pair is None:
            raise ValueError(f"roster: {node} is not a node of {member}'s session set-up")
        if not isinstance(attestation, dict) or set(attestation) != {"checked", "admitted", "tag"}:
            raise ValueError(f"roster: {node}'s attestation is malformed")
        checked, admitted, tag = (attestation[k] for k in ("checked", "admitted", "tag"))
        names = tuple(admitted) if isinstance(admitted, list | tuple) else ()
        if not isinstance(checked, bool) or not isinstance(tag, bytes) or len(names) < 1:
            raise ValueError(f"roster: {node}'s attestation is malformed")
        try:  # one pass in C: this runs once per owner and node over the whole roster
            unique = set(names)
        except TypeError:
            raise ValueError(f"roster: {node}'s attestation is malformed") from None
        if len(unique) != len(names) or not unique <= self.config.index.keys():
            raise ValueError(f"roster: {node} attests names outside the session's roster")
        expected = pair.mac(roster_info(self.config.session_digest, node, member, checked, names))
        if not hmac.compare_digest(expected, tag):
            raise ValueError(f"roster: {node}'s attestation does not verify (altered or forged)")
        if member not in names:
            raise ValueError(f"roster: {node} does not attest {member} itself as registered")
        return checked, names

    def contribute(
        self, spec: RoundSpec, values: npt.ArrayLike, rng: np.random.Generator
    ) -> list[Message]:
        """Noise, split and seal every member's row of ``values`` (shape (members, d)).

        ``ValueError`` if a value is outside the configured bound or the round is unsafe;
        ``LocalProtocolError`` before ``start`` or for a round not after the last one.
        """
        if self.state != "ready":
            raise LocalProtocolError(f"contribute: client party {self.name} is {self.state}")
        if spec.round <= self.last_round:
            raise LocalProtocolError(
                f"contribute: round {spec.round} is not after {self.last_round}"
            )
        grid = self._checked_grid(spec, values)
        self.config.check_round(spec)
        everyone = np.ones(self.config.n_clients, dtype=np.bool_)
        if self.config.shortfall(everyone) > self.config.tolerance:
            reason = self.config.shortfall_reason(everyone)
            raise ValueError(f"contribute: unsafe session, {reason}")
        noise = sample_discrete_gaussian(self.config.client_grid_sigma(spec), grid.shape, rng)
        noise[self._withhold] = 0
        if self._reveal:
            self.revealed[spec.round] = {self.members[i]: noise[i].copy() for i in self._reveal}
        grid += noise  # exact: both on the grid, and the ring capacity was checked
        blinded = grid.view(np.uint64)
        digest = self.config.digest(spec)
        rows = max(1, _CHUNK_ELEMENTS // spec.d)
        out: list[Message] = []
        for start in range(0, len(grid), rows):
            stop = min(start + rows, len(grid))
            seal = self._seal_derived if self.config.shares == "derived" else self._seal_batch
            out += seal(spec, digest, blinded[start:stop], np.arange(start, stop))
        self.last_round = spec.round
        return out

    def _checked_grid(self, spec: RoundSpec, values: npt.ArrayLike) -> I64:
        x = np.asarray(values, dtype=np.float64)
        if x.shape != (len(self.members), spec.d):
            raise ValueError(
                f"values: expected shape ({len(self.members)}, {spec.d}), got {x.shape}"
            )
        if x.size:
            low, high, bound = float(x.min()), float(x.max()), self.config.bound
            if not (-bound <= low and high <= bound):  # also refuses NaN
                raise ValueError(f"values: range [{low:.6g}, {high:.6g}] exceeds bound {bound:g}")
        return self.config.codec.to_grid(x)

    def _seal_derived(
        self, spec: RoundSpec, digest: bytes, blinded: U64, positions: I64
    ) -> list[Message]:
        """Derived shares: subtract the derived masks, seal to each member's value node."""
        if self._masks is None:  # pragma: no cover - start() sets it in this mode
            raise LocalProtocolError("contribute: no derived masks")
        rows = slice(int(positions[0]), int(positions[-1]) + 1)
        masks, keys = self._masks.round(spec.round, spec.d, rows)
        shares = (blinded - masks).astype("<u8").view(np.uint8).reshape(len(positions), -1)
        idx = self._index[positions]
        value_node = self.config.value_node(idx, spec.round)
        empty_idx = np.zeros(0, np.uint32)
        empty_frames = np.zeros((0, NONCE_BYTES + SEED_BYTES + TAG_BYTES), np.uint8)
        out = []
        for j, node in enumerate(self.config.nodes):
            here = np.flatnonzero(value_node == j)
            if not here.size:
                continue
            frames = seal_rows(
                [keys[i] for i in here], shares[here], frame_aad(digest, node, "value")
            )
            body = SharesBody(idx[here].astype(np.uint32), frames, empty_idx, empty_frames)
            out.append(self._out.make(node, spec.round, body))
        return out

    def _seal_batch(
        self, spec: RoundSpec, digest: bytes, blinded: U64, positions: I64
    ) -> list[Message]:
        """Split rows into a value share and M - 1 seeds; one sealed batch per node."""
        m, d = self.config.n_nodes, spec.d
        idx = self._index[positions]
        value_node = self.config.value_node(idx, spec.round)
        seeds = random_seeds(len(idx) * (m - 1)).reshape(len(idx), m - 1, -1)
        shares = blinded - expand_rows(seeds, d, self.config.prg)
        out = []
        for j, node in enumerate(self.config.nodes):
            is_value = value_node == j
            slot = (j - (value_node < j))[~is_value]
            v_rows = shares[is_value].astype("<u8").view(np.uint8).reshape(-1, 8 * d)
            s_rows = seeds[~is_value, slot]
            keyring = self._keyrings[node]
            v_keys = keyring.keys(spec.round, positions[is_value])
            s_keys = keyring.keys(spec.round, positions[~is_value])
            body = SharesBody(
                idx[is_value].astype(np.uint32),
                seal_rows(v_keys, v_rows, frame_aad(digest, node, "value")),
                idx[~is_value].astype(np.uint32),
                seal_rows(s_keys, s_rows, frame_aad(digest, node, "seed")),
            )
            out.append(self._out.make(node, spec.round, body))
        return out


class NodeKeyMismatch(ValueError):
    """A compute node's key (as relayed) does not match the fingerprint pinned out of band."""


def check_pins(
    nodes: Sequence[str], node_keys: Mapping[str, bytes], pinned: Mapping[str, str]
) -> None:
    """``NodeKeyMismatch`` naming every node whose relayed key is not the pinned one.

    Security: the pins come from the operator, not from the relay, so a relay (curator) that
    substitutes its own key for a node's is caught before any share is sealed to that key."""
    unpinned = [n for n in nodes if n not in pinned]
    if unpinned:
        raise NodeKeyMismatch(f"pinned: no fingerprint for compute nodes {unpinned}")
    bad = [n for n in nodes if key_fingerprint(bytes(node_keys[n])) != pinned[n].lower()]
    if bad:
        raise NodeKeyMismatch(
            f"node_keys: the keys of compute nodes {bad} do not match their pinned SHA-256 "
            "fingerprints (swapped by the relay?); refusing to register"
        )


def _rows(raw: bytes) -> npt.NDArray[np.uint8]:
    return np.frombuffer(raw, dtype=np.uint8).reshape(-1, 32).copy()

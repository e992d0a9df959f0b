"""The DCA compute node (Heikkilä et al. 2017, Algorithm 1 step 3, Sec. 4.1.3) as a state machine.

Transition table (state, kind) -> handler; anything else is refused with the state untouched::

    any        dca.register  check pinned client keys and proofs; derive the new pair keys
    idle       dca.open      round r opens -> collecting (frames before this are refused;
                             so is an open the operator's plan does not admit)
    collecting dca.shares    open sealed frames, keep the valid rows; all expected in -> agreeing
    any        dca.seen      a peer's received set (for the open round, or the next one early)
    collecting expire(now >= deadline)                  -> agreeing, send own set to peers
    agreeing   all M sets in: intersect; missing + colluders > T -> dca.abort,
               else dca.partial -> idle
    agreeing   expire(now >= deadline + agreement_timeout) -> dca.abort (peer silent) -> idle

Rows of a ``dca.shares`` batch are judged one by one (unknown or duplicate client, failed
authentication) and recorded in ``rejected``; a batch none of whose rows is accepted is refused
as a whole. Frames for a round already closed are counted in ``late_frames`` and ignored.

With derived shares a node expects frames only from its value clients of the round, builds the
round's block of mask totals at the open (:class:`~dpmarket.protocol.securesum.masks.NodeMasks`) and
vouches in its set for every other client it holds a pair key for.

Privacy: a node sees, per client, either a uniform share (value node) or a seed (sealed seeds) or
nothing but its own derived mask; its partial sum is uniform unless all M nodes' partials are
added. It releases a partial only for an agreed set
with at most T clients missing or known to collude (``DcaConfig.colluders``), so no node helps
to release a sum with less than sigma_std^2 of honest noise against a curious client.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from dpmarket.protocol.securesum.fixedpoint import ring_sum
from dpmarket.protocol.securesum.masks import NodeMasks, mask_cipher
from dpmarket.protocol.securesum.messages import (
    AbortBody,
    OpenBody,
    PartialBody,
    RegisterBody,
    SeenBody,
    SharesBody,
    pack_set,
    unpack_set,
)
from dpmarket.protocol.securesum.plan import RoundAllowance, SecureSumPlan
from dpmarket.protocol.securesum.sealing import (
    NONCE_BYTES,
    PUBLIC_KEY_BYTES,
    SEED_BYTES,
    TAG_BYTES,
    PairKey,
    RoundKeyring,
    expand_sum,
    generate_keypair,
    open_rows,
    pair_secret,
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
from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.protocol.wire.parties import Handler, Outbox, body_of, dispatch

__all__ = ["ComputeNode", "owner_attestation"]


def owner_attestation(attestation: dict[str, Any], client: str) -> dict[str, Any] | None:
    """``client``'s part of a node's :meth:`ComputeNode.attest` (what the relay hands it: the
    list, the flag and its own tag), None if the node holds no tag for it."""
    tags = attestation.get("tags")
    if not isinstance(tags, dict) or client not in tags:
        return None
    return {"checked": attestation.get("checked"), "admitted": attestation.get("admitted"),
            "tag": tags[client]}  # fmt: skip


I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
BoolArray = npt.NDArray[np.bool_]
STATES = ("idle", "collecting", "agreeing")


@dataclass
class _Round:
    spec: RoundSpec
    digest: bytes
    deadline: float
    received: BoolArray
    expected: BoolArray  # clients whose frame this node waits for
    values: list[tuple[I64, U64]] = field(default_factory=list)
    seeds: list[tuple[I64, npt.NDArray[np.uint8]]] = field(default_factory=list)
    peers: dict[str, BoolArray] = field(default_factory=dict)
    own: BoolArray | None = None


class ComputeNode:
    """One compute node: holds its X25519 key, the pair keys, and at most one open round."""

    def __init__(
        self,
        config: DcaConfig,
        name: str,
        private_key: X25519PrivateKey | None = None,
        client_keys: Mapping[str, bytes] | None = None,
        *,
        plan: SecureSumPlan | None = None,
    ) -> None:
        """``private_key``: the node's X25519 key as the operator made or loaded it (whose
        fingerprint the operator pins at the clients); a fresh one if None. ``client_keys``:
        the clients' public keys pinned by the operator (name -> raw key); a registration of
        another key under a pinned name is refused. ``plan``: the operator's round plan; an
        open it does not admit (sigma below the label's floor, the label's rounds used up) is
        refused, so this node takes part in no round the plan does not allow."""
        if name not in config.nodes:
            raise ValueError(f"name: {name!r} is not one of the compute nodes {config.nodes}")
        self.config, self.name, self.run = config, name, config.run
        if private_key is None:
            self._private, self.public_key = generate_keypair()
        else:
            self._private = private_key
            self.public_key = private_key.public_key().public_bytes_raw()
        self._client_keys = {c: bytes(k) for c, k in (client_keys or {}).items()}
        self._allowance = RoundAllowance(plan) if plan is not None else None
        strangers = sorted(set(self._client_keys) - set(config.clients))
        if strangers:
            raise ValueError(f"client_keys: {strangers} are not clients of the roster")
        self._derived = config.shares == "derived"
        self._keys = RoundKeyring(0 if self._derived else config.n_clients, round_key_info)
        self._masks = NodeMasks(config.n_clients, config.n_nodes, config.nodes.index(name))
        self._registered = np.zeros(config.n_clients, dtype=np.bool_)
        self._pairs: dict[int, PairKey] = {}  # registered client -> its pair key (attestations)
        self._out = Outbox(config.run, name)
        self.state = "idle"
        self.round: _Round | None = None
        self.last_round = 0
        self._early: dict[str, BoolArray] = {}  # peers' sets for round _early_round, not open
        self._early_round = 0
        self.rejected: list[tuple[int, str, str]] = []  # (round, client, reason)
        self.late_frames = 0
        self._peers = tuple(n for n in config.nodes if n != name)
        self._position = config.nodes.index(name)
        table: dict[tuple[str, str], Handler] = {("idle", "dca.open"): self._on_open}
        table[("collecting", "dca.shares")] = self._on_shares
        for state in STATES:
            table[(state, "dca.register")] = self._on_register
            table[(state, "dca.seen")] = self._on_seen
        self._table = table

    @property
    def registered(self) -> int:
        return int(self._registered.sum())

    # ------------------------------------------------------------------------- interface
    def receive(self, msg: Message) -> list[Message]:
        if msg.kind == "dca.shares" and self._is_late(msg):
            self.late_frames += 1
            return []
        return dispatch(self.name, self.run, self.state, self._table, msg)

    def expire(self, now: float) -> list[Message]:
        rnd = self.round
        if rnd is None:
            return []
        if self.state == "collecting" and now >= rnd.deadline:
            return self._close()
        if self.state == "agreeing" and now >= rnd.deadline + self.config.agreement_timeout:
            silent = sorted(set(self._peers) - set(rnd.peers))
            return self._finish(rnd, AbortBody(f"compute nodes {silent} did not report", 0))
        return []

    def _is_late(self, msg: Message) -> bool:
        if msg.round <= self.last_round:
            return True
        rnd = self.round
        return rnd is not None and msg.round == rnd.spec.round and self.state == "agreeing"

    # ------------------------------------------------------------------------- session
    def _on_register(self, msg: Message) -> list[Message]:
        body = body_of(msg, RegisterBody)
        self._check_client_party(msg)
        idx = self._indices(body.clients, "dca.register.clients")
        keys = body.public_keys
        if keys.dtype != np.uint8 or keys.shape != (len(idx), PUBLIC_KEY_BYTES):
            raise RemoteProtocolError(f"dca.register.public_keys: shape {keys.shape} is wrong")
        if len(np.unique(idx)) != len(idx):
            raise RemoteProtocolError("dca.register.clients: a client appears twice")
        proofs = body.proofs
        if proofs is None or proofs.dtype != np.uint8 or proofs.shape != (len(idx), 32):
            raise RemoteProtocolError("dca.register.proofs: missing or malformed (n x 32 bytes)")
        again = [self.config.clients[i] for i in idx[self._registered[idx]]]
        if again:
            raise RemoteProtocolError(f"dca.register: clients {again[:3]} already registered")
        derived: dict[int, PairKey] = {}
        for i, key, proof in zip(idx, keys, proofs, strict=True):
            client, raw = self.config.clients[i], key.tobytes()
            derived[int(i)] = self._bound_pair(client, raw, proof.tobytes())
        if self._derived:
            prg = self.config.prg
            self._masks.add(list(derived), [mask_cipher(p, prg) for p in derived.values()])
        else:
            self._keys.add(list(derived), list(derived.values()))
        self._registered[list(derived)] = True
        self._pairs.update(derived)
        return []

    def attest(self, checked: bool) -> dict[str, Any]:
        """This node's roster attestation: the clients registered with it (each proved it
        holds the key pinned here), whether each of their keys was pinned only with its owner's
        signature (``checked``: the host's word, actors/remote/nodeagent.py; never true for a
        registered client whose key was not pinned at all), and per registered client a tag
        under their pair key (:func:`roster_info`), which only this node (whose key the client
        pinned) and that client can compute. A relay can withhold a tag but not forge or alter
        one; :func:`owner_attestation` is one client's part."""
        admitted = tuple(self.config.clients[i] for i in sorted(self._pairs))
        checked = checked and all(c in self._client_keys for c in admitted)
        session = self.config.session_digest
        tags = {
            self.config.clients[i]: self._pairs[i].mac(
                roster_info(session, self.name, self.config.clients[i], checked, admitted)
            )
            for i in sorted(self._pairs)
        }
        return {"checked": checked, "admitted": list(admitted), "tags": tags}

    def _bound_pair(self, client: str, raw: bytes, proof: bytes) -> PairKey:
        """The pair key of ``client``'s registration, checked against the pinned key and the
        proof. Security: the proof is an HMAC under the PRK of (client key, node key), so only
        the holder of ``raw``'s private key can make it; with the client's key pinned by the
        operator, no other party can register under ``client``'s name and index."""
        pinned = self._client_keys.get(client)
        if pinned is not None and not hmac.compare_digest(pinned, raw):
            raise RemoteProtocolError(
                f"dca.register: client {client}: the key is not its pinned key (forged?)"
            )
        salt = pair_salt(self.run, client, self.name, raw, self.public_key)
        try:
            pair = PairKey(pair_secret(self._private, raw, salt))
        except ValueError as exc:
            raise RemoteProtocolError(f"dca.register: client {client}: {exc}") from None
        expected = pair.mac(register_info(self.run, client, self.name, raw, self.public_key))
        if not hmac.compare_digest(expected, proof):
            raise RemoteProtocolError(f"dca.register: client {client}: the proof does not verify")
        return pair

    # ------------------------------------------------------------------------- collection
    def _on_open(self, msg: Message) -> list[Message]:
        body = body_of(msg, OpenBody)
        if msg.sender != self.config.aggregator:
            raise RemoteProtocolError(f"from: {msg.sender!r} may not open rounds")
        if msg.round <= self.last_round:
            raise RemoteProtocolError(f"round: {msg.round} is not after {self.last_round}")
        try:
            spec = RoundSpec.from_open(msg.round, body)
            self.config.check_round(spec)
            if self._allowance is not None:
                self._allowance.take(spec)
        except ValueError as exc:
            raise RemoteProtocolError(f"dca.open: {exc}") from None
        received = np.zeros(self.config.n_clients, dtype=np.bool_)
        if self._derived:
            expected = self._masks.value_here(spec.round)
            self._masks.prepare(spec.round, spec.d)
        else:
            expected = np.ones(self.config.n_clients, dtype=np.bool_)
        rnd = _Round(spec, self.config.digest(spec), body.deadline, received, expected)
        if msg.round == self._early_round:
            rnd.peers = self._early
        self._early, self._early_round = {}, 0
        self.round, self.state = rnd, "collecting"
        return [] if expected.any() else self._close()

    def _on_shares(self, msg: Message) -> list[Message]:
        body = body_of(msg, SharesBody)
        self._check_client_party(msg)
        rnd = self.round
        if rnd is None or msg.round != rnd.spec.round:
            raise RemoteProtocolError(f"round: {msg.round} is not open at {self.name}")
        d = rnd.spec.d
        v_idx = self._indices(body.value_clients, "dca.shares.value_clients")
        s_idx = self._indices(body.seed_clients, "dca.shares.seed_clients")
        if self._derived and len(s_idx):
            raise RemoteProtocolError("dca.shares: seed frames, but this session derives shares")
        self._check_frames(body.value_frames, len(v_idx), 8 * d, "value_frames")
        self._check_frames(body.seed_frames, len(s_idx), SEED_BYTES, "seed_frames")
        if len(np.unique(np.concatenate([v_idx, s_idx]))) != len(v_idx) + len(s_idx):
            raise RemoteProtocolError("dca.shares: a client appears twice in one batch")
        v_frames = np.asarray(body.value_frames, dtype=np.uint8)
        s_frames = np.asarray(body.seed_frames, dtype=np.uint8)
        v_ok, v_plain, v_why = self._open(rnd, "value", v_idx, v_frames)
        s_ok, s_plain, s_why = self._open(rnd, "seed", s_idx, s_frames)
        rows = len(v_idx) + len(s_idx)
        if rows and not (v_ok.any() or s_ok.any()):
            raise RemoteProtocolError(f"dca.shares: no frame accepted ({(v_why + s_why)[0][1]})")
        rnd.values.append((v_idx[v_ok], v_plain[v_ok].view("<u8").astype(np.uint64)))
        rnd.seeds.append((s_idx[s_ok], s_plain[s_ok]))
        rnd.received[v_idx[v_ok]] = True
        rnd.received[s_idx[s_ok]] = True
        self.rejected += [(msg.round, self.config.clients[i], why) for i, why in v_why + s_why]
        return self._close() if rnd.received[rnd.expected].all() else []

    def _open(
        self, rnd: _Round, kind: str, idx: I64, frames: npt.NDArray[np.uint8]
    ) -> tuple[BoolArray, npt.NDArray[np.uint8], list[tuple[int, str]]]:
        """Per-row verdicts: (accepted mask, plaintexts, [(client index, reason)])."""
        known = self._registered[idx]
        fresh = ~rnd.received[idx]
        here = self.config.value_node(idx, rnd.spec.round) == self._position
        right_kind = here if kind == "value" else ~here
        usable = known & fresh & right_kind
        why = [(int(i), "not registered") for i in idx[~known]]
        why += [(int(i), "already received this round") for i in idx[known & ~fresh]]
        why += [
            (int(i), f"{kind} frame sent to the wrong node")
            for i in idx[known & fresh & ~right_kind]
        ]
        if self._derived:
            keys = self._masks.frame_keys(rnd.spec.round, rnd.spec.d, idx[usable])
        else:
            keys = self._keys.keys(rnd.spec.round, idx[usable])
        aad = frame_aad(rnd.digest, self.name, kind)
        plain_usable, ok_usable = open_rows(keys, frames[usable], aad)
        ok = np.zeros(len(idx), dtype=np.bool_)
        ok[usable] = ok_usable
        plain = np.zeros((len(idx), plain_usable.shape[1]), dtype=np.uint8)
        plain[usable] = plain_usable
        why += [(int(i), "authentication failed") for i in idx[usable][~ok_usable]]
        return ok, plain, why

    def _close(self) -> list[Message]:
        rnd = self.round
        if rnd is None:  # pragma: no cover - callers hold an open round
            return []
        rnd.own = rnd.received.copy()
        if self._derived:  # a node vouches for the masks of every client it has a key for
            rnd.own |= self._registered & ~rnd.expected
        self.state = "agreeing"
        seen = SeenBody(pack_set(rnd.own))
        out = [self._out.make(peer, rnd.spec.round, seen) for peer in self._peers]
        return out + self._try_finish()

    # ------------------------------------------------------------------------- agreement
    def _on_seen(self, msg: Message) -> list[Message]:
        body = body_of(msg, SeenBody)
        if msg.sender not in self._peers:
            raise RemoteProtocolError(f"from: {msg.sender!r} is not a peer compute node")
        received = unpack_set(body.received, self.config.n_clients)
        if received is None:
            raise RemoteProtocolError("dca.seen.received: not a packed set of the roster")
        rnd = self.round
        if rnd is not None and msg.round == rnd.spec.round:
            store = rnd.peers
        elif rnd is None and msg.round == self.last_round + 1:
            if self._early_round != msg.round:
                self._early, self._early_round = {}, msg.round
            store = self._early
        else:
            raise RemoteProtocolError(f"round: dca.seen for round {msg.round} is unexpected")
        if msg.sender in store:
            raise RemoteProtocolError(f"dca.seen: {msg.sender} already reported this round")
        store[msg.sender] = received
        return self._try_finish()

    def _try_finish(self) -> list[Message]:
        rnd = self.round
        if self.state != "agreeing" or rnd is None or rnd.own is None:
            return []
        if len(rnd.peers) < len(self._peers):
            return []
        included = rnd.own.copy()
        for other in rnd.peers.values():
            included &= other
        short = self.config.shortfall(included)  # missing plus known colluders
        if short > self.config.tolerance:
            return self._finish(rnd, AbortBody(self.config.shortfall_reason(included), short))
        return self._finish(rnd, PartialBody(self._partial(rnd, included), pack_set(included)))

    def _partial(self, rnd: _Round, included: BoolArray) -> U64:
        """This node's ring sum over the agreed set: value shares plus expanded seeds."""
        d = rnd.spec.d
        total = np.zeros(d, dtype=np.uint64)
        for idx, rows in rnd.values:
            total += ring_sum(rows[included[idx]])
        for idx, seeds in rnd.seeds:
            total += expand_sum(seeds[included[idx]], d, self.config.prg)
        if self._derived:
            total += self._masks.partial(rnd.spec.round, d, included)
        return total

    def _finish(self, rnd: _Round, body: PartialBody | AbortBody) -> list[Message]:
        self.state, self.round, self.last_round = "idle", None, rnd.spec.round
        return [self._out.make(self.config.aggregator, rnd.spec.round, body)]

    # ------------------------------------------------------------------------- checks
    def _check_client_party(self, msg: Message) -> None:
        if msg.sender in self.config.nodes or msg.sender == self.config.aggregator:
            raise RemoteProtocolError(f"from: {msg.sender!r} is not a client party")

    def _indices(self, raw: npt.NDArray[np.generic], name: str) -> I64:
        if raw.dtype != np.uint32 or raw.ndim != 1:
            raise RemoteProtocolError(f"{name}: expected a 1-d uint32 array")
        idx = raw.astype(np.int64)
        if idx.size and int(idx.max()) >= self.config.n_clients:
            raise RemoteProtocolError(
                f"{name}: index outside the roster of {self.config.n_clients}"
            )
        return idx

    @staticmethod
    def _check_frames(frames: npt.NDArray[np.generic], rows: int, width: int, name: str) -> None:
        expected = (rows, NONCE_BYTES + width + TAG_BYTES)
        if frames.dtype != np.uint8 or frames.shape != expected:
            raise RemoteProtocolError(
                f"dca.shares.{name}: shape {frames.shape}, expected {expected}"
            )

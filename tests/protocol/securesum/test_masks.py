"""Derived DCA shares: the stream definition, blocks of rounds, late and missing registrations."""

from __future__ import annotations

import dataclasses
import secrets

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

from dpmarket.protocol.securesum.aggregator import Aggregator
from dpmarket.protocol.securesum.client import Client
from dpmarket.protocol.securesum.driver import DcaSession
from dpmarket.protocol.securesum.fixedpoint import ring_sum
from dpmarket.protocol.securesum.masks import (
    FRAME_KEY_WORDS,
    MASK_BLOCK_WORDS,
    MAX_BLOCK_ROUNDS,
    ClientMasks,
    NodeMasks,
    block_nonce,
    block_of,
    block_rounds,
    mask_cipher,
    mask_key_info,
)
from dpmarket.protocol.securesum.messages import SharesBody
from dpmarket.protocol.securesum.node import ComputeNode
from dpmarket.protocol.securesum.sealing import PairKey
from dpmarket.protocol.securesum.spec import DcaConfig, RoundSpec
from dpmarket.protocol.wire.codec import Message, decode, encode
from dpmarket.protocol.wire.errors import RemoteProtocolError


def config(n: int, m: int, t: int) -> DcaConfig:
    clients = tuple(f"c{i}" for i in range(n))
    return DcaConfig("run-m", clients, tuple(f"n{k}" for k in range(m)), tolerance=t, bound=10.0)


def wire(msg: Message) -> Message:
    return decode(encode(msg))


def reference_stream(prk: bytes, block: int, d: int) -> np.ndarray:
    """HKDF-Expand (the cryptography package), then AES-256-CTR from counter block
    block (8 bytes) || d (4 bytes) || 2 (4 bytes)."""
    key = HKDFExpand(hashes.SHA256(), 32, mask_key_info()).derive(prk)
    words = block_rounds(d) * (FRAME_KEY_WORDS + d)
    counter = block.to_bytes(8, "big") + d.to_bytes(4, "big") + (2).to_bytes(4, "big")
    enc = Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor()
    raw = enc.update(bytes(8 * words)) + enc.finalize()
    return np.frombuffer(raw, dtype="<u8").reshape(block_rounds(d), FRAME_KEY_WORDS + d)


def test_block_rounds_rule() -> None:
    assert block_rounds(1) == MAX_BLOCK_ROUNDS
    assert block_rounds(10) == MASK_BLOCK_WORDS // 14
    assert block_rounds(100) == MASK_BLOCK_WORDS // 104
    assert block_rounds(5000) == 1
    b = block_rounds(10)
    assert block_of(1, 10) == (0, 0) and block_of(b, 10) == (0, b - 1)
    assert block_of(b + 1, 10) == (1, 0)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="round"):
            block_of(bad, 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="d must be"):
        block_rounds(0)
    assert block_nonce(3, 10) == bytes(7) + b"\x03" + bytes(3) + b"\x0a"
    with pytest.raises(ValueError, match="nonce"):
        block_nonce(-1, 10)
    with pytest.raises(ValueError, match="prg"):
        mask_cipher(PairKey(bytes(32)), "rc4")


@pytest.mark.parametrize(("d", "round_"), [(3, 1), (10, 80), (300, 7)])
def test_client_masks_follow_the_stated_construction(d: int, round_: int) -> None:
    """Masks = the sum of the non-value nodes' stream rows; frame key = the value node's."""
    m, index = 3, np.array([0, 4, 5], dtype=np.int64)
    prks = [[secrets.token_bytes(32) for _ in index] for _ in range(m)]
    ciphers = [[mask_cipher(PairKey(p), "aes-ctr") for p in row] for row in prks]
    masks = ClientMasks(index, ciphers)
    got, keys = masks.round(round_, d, slice(0, 3))
    block, piece = block_of(round_, d)
    for i, client in enumerate(index.tolist()):
        value = (client + round_) % m
        rows = [reference_stream(prks[k][i], block, d)[piece] for k in range(m)]
        expected = sum((rows[k][FRAME_KEY_WORDS:] for k in range(m) if k != value), np.uint64(0))
        assert np.array_equal(got[i], np.asarray(expected, dtype=np.uint64))
        assert keys[i] == rows[value][:FRAME_KEY_WORDS].astype("<u8").tobytes()


def test_node_totals_match_the_client_side() -> None:
    """For every round of a block, the node's mask total plus the clients' subtracted masks
    cancel: sum over clients (client mask sum) == sum over nodes (node partial)."""
    n, m, d = 7, 3, 5
    prks = [
        [mask_cipher(PairKey(secrets.token_bytes(32)), "chacha20") for _ in range(n)]
        for _ in range(m)
    ]
    client = ClientMasks(np.arange(n), prks)
    nodes = [NodeMasks(n, m, k) for k in range(m)]
    for k, node in enumerate(nodes):
        node.add(range(n), prks[k])
    everyone = np.ones(n, dtype=np.bool_)
    for round_ in (1, 2, block_rounds(d), block_rounds(d) + 1):
        subtracted, _ = client.round(round_, d, slice(0, n))
        added = ring_sum(np.stack([node.partial(round_, d, everyone) for node in nodes]))
        assert np.array_equal(added, ring_sum(subtracted))


def test_mixed_dimensions_and_block_boundaries_stay_exact() -> None:
    cfg = config(6, 3, 1)
    session = DcaSession(cfg, batch=4)
    rng = np.random.default_rng(11)
    b4, b300 = block_rounds(4), block_rounds(300)
    assert b300 == 3 and b4 > 10
    schedule = [(1, 4), (2, 300), (3, 300), (4, 300), (5, 4), (7, 300), (b4 - 1, 4), (b4, 300)]
    schedule += [(b4 + 1, 4), (b4 + 2, 4), (2 * b4 + 1, 300)]
    for round_, d in schedule:
        x = rng.uniform(-10.0, 10.0, (6, d))
        out = session.run_round(RoundSpec(round_, d, 0.0), x, rng)
        assert out.result.ring_total is not None, (round_, d, out.result.reason)
        assert np.array_equal(out.result.ring_total, ring_sum(cfg.codec.encode(x)))


def test_an_old_frame_in_the_next_block_fails_authentication() -> None:
    """Round 1 and round 1 + M B(d) have the same value node and piece, in different blocks."""
    cfg = config(4, 3, 1)
    session = DcaSession(cfg, batch=1)
    d, rng = 5, np.random.default_rng(0)
    spec = RoundSpec(1, d, 0.0)
    session.deliver(session.aggregator.open_round(spec, 1.0))
    (msg,) = session.clients[0].contribute(spec, np.ones((1, d)), rng)
    session.deliver([msg])
    for client in session.clients[1:]:
        session.deliver(client.contribute(spec, np.ones((1, d)), rng))
    result = session.aggregator.result(1)
    assert result is not None and result.released
    later = RoundSpec(1 + 3 * block_rounds(d), d, 0.0)
    session.deliver(session.aggregator.open_round(later, 2.0))
    old = dataclasses.replace(msg, round=later.round, seq=msg.seq + 100)
    with pytest.raises(RemoteProtocolError, match="authentication failed"):
        session.nodes[msg.recipient].receive(wire(old))


def test_seed_frames_are_refused_when_shares_are_derived() -> None:
    cfg = config(4, 2, 1)
    sealed = dataclasses.replace(cfg, shares="sealed-seeds")
    session = DcaSession(cfg, batch=4)
    node = session.nodes["n0"]
    session.deliver(session.aggregator.open_round(RoundSpec(1, 2, 0.0), 1.0))
    other = DcaSession(sealed, batch=4)
    other.deliver(other.aggregator.open_round(RoundSpec(1, 2, 0.0), 1.0))
    msgs = other.clients[0].contribute(
        RoundSpec(1, 2, 0.0), np.zeros((4, 2)), np.random.default_rng(0)
    )
    to_n0 = next(m for m in msgs if m.recipient == "n0")
    body = to_n0.body
    assert isinstance(body, SharesBody) and len(body.seed_clients)
    with pytest.raises(RemoteProtocolError, match="seed frames, but this session derives"):
        node.receive(wire(dataclasses.replace(to_n0, run=cfg.run)))


def _manual_session(cfg: DcaConfig) -> tuple[dict[str, ComputeNode], Aggregator, dict[str, bytes]]:
    nodes = {name: ComputeNode(cfg, name) for name in cfg.nodes}
    return nodes, Aggregator(cfg), {name: node.public_key for name, node in nodes.items()}


def _route(nodes: dict[str, ComputeNode], agg: Aggregator, msgs: list[Message]) -> None:
    queue = list(msgs)
    while queue:
        msg = wire(queue.pop(0))
        party = agg if msg.recipient == agg.name else nodes[msg.recipient]
        queue += party.receive(msg)


def test_a_client_registered_after_the_block_was_built_is_summed() -> None:
    cfg = config(5, 3, 1)
    nodes, agg, keys = _manual_session(cfg)
    early = Client(cfg, "early", keys, ["c0", "c1", "c2", "c3"])
    late = Client(cfg, "late", keys, ["c4"])
    _route(nodes, agg, early.start())
    spec = RoundSpec(1, 3, 0.0)
    _route(nodes, agg, agg.open_round(spec, 1.0))  # the nodes build the block without c4
    _route(nodes, agg, late.start())
    x = np.random.default_rng(2).uniform(-10, 10, (5, 3))
    rng = np.random.default_rng(3)
    _route(nodes, agg, early.contribute(spec, x[:4], rng) + late.contribute(spec, x[4:], rng))
    result = agg.result(1)
    assert result is not None and result.released and result.missing == ()
    assert np.array_equal(result.ring_total, ring_sum(cfg.codec.encode(x)))


def test_a_client_one_node_has_no_key_for_is_left_out() -> None:
    """c4's registration never reaches n0, so n0 cannot vouch for c4's mask: c4 is left out
    (T = 1) even though its value share reached n2, and the sum stays exact over the others."""
    cfg = config(5, 3, 1)
    nodes, agg, keys = _manual_session(cfg)
    early = Client(cfg, "early", keys, ["c0", "c1", "c2", "c3"])
    late = Client(cfg, "late", keys, ["c4"])
    _route(nodes, agg, early.start())
    _route(nodes, agg, [m for m in late.start() if m.recipient != "n0"])
    spec = RoundSpec(1, 3, 0.0)
    _route(nodes, agg, agg.open_round(spec, 1.0))
    x = np.random.default_rng(4).uniform(-10, 10, (5, 3))
    rng = np.random.default_rng(5)
    msgs = early.contribute(spec, x[:4], rng) + late.contribute(spec, x[4:], rng)
    _route(nodes, agg, msgs)
    for node in nodes.values():
        _route(nodes, agg, node.expire(1.0))
    result = agg.result(1)
    assert result is not None and result.released and result.missing == ("c4",)
    assert np.array_equal(result.ring_total, ring_sum(cfg.codec.encode(x[:4])))

"""DCA secure sum parties: exact sums, uniform shares, sealed frames, refusals, faults."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from dpmarket.protocol.securesum.aggregator import Aggregator
from dpmarket.protocol.securesum.client import Client
from dpmarket.protocol.securesum.driver import DcaSession, secure_sum
from dpmarket.protocol.securesum.fixedpoint import ring_sum, to_signed
from dpmarket.protocol.securesum.messages import (
    OpenBody,
    PartialBody,
    RegisterBody,
    SeenBody,
    SharesBody,
    pack_set,
)
from dpmarket.protocol.securesum.node import ComputeNode
from dpmarket.protocol.securesum.sealing import ROUND_KEY_BLOCK
from dpmarket.protocol.securesum.spec import MAX_ROUND_D, SHARE_MODES, DcaConfig, RoundSpec
from dpmarket.protocol.wire.codec import Message, ReplayGuard, decode, encode
from dpmarket.protocol.wire.errors import LocalProtocolError, RemoteProtocolError

CHI2_255_LIMIT = 350.0  # chi-square(255) exceeds this with probability about 1e-4


def config(
    n: int = 6,
    m: int = 3,
    t: int = 1,
    bound: float = 10.0,
    f: int = 24,
    shares: str = "derived",
) -> DcaConfig:
    clients = tuple(f"c{i}" for i in range(n))
    nodes = tuple(f"n{k}" for k in range(m))
    return DcaConfig("run-1", clients, nodes, tolerance=t, bound=bound, frac_bits=f, shares=shares)


def wire(msg: Message) -> Message:
    """What the recipient sees after the codec."""
    return decode(encode(msg))


def pump(session: DcaSession, messages: list[Message]) -> None:
    """Deliver strictly (a refusal raises), through the codec, until quiet."""
    queue = list(messages)
    while queue:
        msg = queue.pop(0)
        queue += session.parties[msg.recipient].receive(wire(msg))


def node_state(node: ComputeNode) -> tuple[object, ...]:
    rnd = node.round
    received = None if rnd is None else rnd.received.copy().tolist()
    return (node.state, node.last_round, received, len(node.rejected), node.registered)


# ----------------------------------------------------------------------------- exact sums
@pytest.mark.parametrize("shares", SHARE_MODES)
@pytest.mark.parametrize(
    ("n", "m", "d", "t", "batch"),
    [
        (2, 2, 1, 0, 1),
        (5, 3, 4, 1, 2),
        (17, 4, 9, 3, 5),
        (40, 2, 3, 0, 40),
        (9, 7, 130, 2, 4),
        (2, 5, 3, 0, 1),
    ],
)
def test_sums_are_exact_with_noise_off(
    n: int, m: int, d: int, t: int, batch: int, shares: str
) -> None:
    cfg = config(n, m, t, bound=1000.0, f=20, shares=shares)
    session = DcaSession(cfg, batch=batch)
    rng = np.random.default_rng(n * 100 + d)
    for round_ in (1, 2):
        x = rng.uniform(-1000.0, 1000.0, (n, d))
        x[0, 0], x[-1, -1] = 1000.0, -1000.0  # the bound itself is allowed
        out = session.run_round(RoundSpec(round_, d, 0.0), x, rng)
        assert out.result.released and not out.result.private
        assert out.result.ring_total is not None and out.result.value is not None
        assert np.array_equal(out.result.ring_total, ring_sum(cfg.codec.encode(x)))
        assert np.allclose(out.result.value, x.sum(axis=0), atol=n * cfg.codec.resolution)
        assert out.refused == [] and out.rejected == []
        assert out.kinds["dca.partial"] == m and out.kinds["dca.seen"] == m * (m - 1)


@pytest.mark.parametrize("shares", SHARE_MODES)
@pytest.mark.parametrize("sign", [1, -1])
def test_sums_at_the_ring_boundary(sign: int, shares: str) -> None:
    cfg = config(4, 3, 0, bound=2.0**60, f=0, shares=shares)  # 4 (2^60 + 1/2) < 2^63
    x = sign * np.array([[2.0**60, -(2.0**60)], [2.0**60, 1.0], [2.0**60, 3.0], [2.0**60, 0.0]])
    out = DcaSession(cfg).run_round(RoundSpec(1, 2, 0.0), x, np.random.default_rng(0))
    assert out.result.ring_total is not None
    assert to_signed(out.result.ring_total).tolist() == [sign * 2**62, sign * (4 - 2**60)]


def test_same_seed_same_release_despite_fresh_shares() -> None:
    cfg = config(8, 3, 2, bound=5.0, f=24)
    x = np.random.default_rng(1).uniform(-5, 5, (8, 6))
    spec = RoundSpec(1, 6, 2.5)
    runs = [
        DcaSession(cfg, batch=3).run_round(spec, x, np.random.default_rng(s)) for s in (4, 4, 5)
    ]
    values = [r.result.value for r in runs]
    assert values[0] is not None and values[1] is not None and values[2] is not None
    assert np.array_equal(values[0], values[1])
    assert not np.array_equal(values[0], values[2])


# ----------------------------------------------------------------------------- shares
@pytest.mark.parametrize("shares", SHARE_MODES)
def test_shares_seen_by_any_node_are_uniform(shares: str) -> None:
    """All inputs zero and noise off: every value share and seed a node holds is uniform bytes.

    Client c0 stays silent, so the nodes keep collecting and their stored shares can be read."""
    cfg = config(600, 2, 5, bound=1.0, f=24, shares=shares)
    session = DcaSession(cfg, batch=100)
    spec = RoundSpec(1, 16, 0.0)
    pump(session, session.aggregator.open_round(spec, deadline=10.0))
    for client in session.clients[1:]:
        pump(session, client.contribute(spec, np.zeros((100, 16)), np.random.default_rng(0)))
    shares, seeds = b"", b""
    for node in session.nodes.values():
        assert node.state == "collecting" and node.round is not None
        shares += b"".join(rows.tobytes() for _, rows in node.round.values)
        seeds += b"".join(s.tobytes() for _, s in node.round.seeds)
    assert len(shares) == 500 * 16 * 8
    assert len(seeds) == (500 * 32 if cfg.shares == "sealed-seeds" else 0)
    for data in (shares, seeds) if seeds else (shares,):
        counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256)
        expected = len(data) / 256
        assert float(((counts - expected) ** 2 / expected).sum()) < CHI2_255_LIMIT
    bits = np.unpackbits(np.frombuffer(shares, dtype=np.uint8)).reshape(-1, 64).mean(axis=0)
    assert np.abs(bits - 0.5).max() < 5 * np.sqrt(0.25 / (500 * 16))  # every bit position


# ----------------------------------------------------------------------------- sealed frames
def single_client_round(
    n: int = 4, shares: str = "derived"
) -> tuple[DcaSession, RoundSpec, list[Message]]:
    """A session of one-client parties with round 1 open; c0's (undelivered) share messages."""
    session = DcaSession(config(n, 3, 1, shares=shares), batch=1)
    spec = RoundSpec(1, 5, 0.0)
    pump(session, session.aggregator.open_round(spec, deadline=10.0))
    x = np.ones((1, 5))
    return session, spec, session.clients[0].contribute(spec, x, np.random.default_rng(0))


def with_body(msg: Message, **changes: object) -> Message:
    body: Any = msg.body  # a registered frozen dataclass
    return dataclasses.replace(msg, body=dataclasses.replace(body, **changes))


@pytest.mark.parametrize("shares", SHARE_MODES)
def test_tampered_frames_are_refused_and_leave_the_node_untouched(shares: str) -> None:
    session, _, msgs = single_client_round(shares=shares)
    for msg in msgs:
        body = msg.body
        assert isinstance(body, SharesBody)
        node = session.nodes[msg.recipient]
        for field in ("value_frames", "seed_frames"):
            frames = getattr(body, field)
            if not len(frames):
                continue
            for column in (0, 20, frames.shape[1] - 1):  # nonce, ciphertext, tag
                bad = frames.copy()
                bad[0, column] ^= 1
                before = node_state(node)
                with pytest.raises(RemoteProtocolError, match="authentication failed"):
                    node.receive(wire(with_body(msg, **{field: bad})))
                assert node_state(node) == before
        node.receive(wire(msg))  # the genuine frame is still accepted
        assert node.round is not None and node.round.received[0]


@pytest.mark.parametrize("shares", SHARE_MODES)
def test_relabelled_or_misdirected_frames_are_refused(shares: str) -> None:
    """c0 and c3 share a value node (index + round mod 3), so only the keys and the associated
    data can tell c0's frames from c3's; n0 and n2 both hold seeds of c0 in round 1."""
    session, _, msgs = single_client_round(shares=shares)
    for msg in msgs:
        body = msg.body
        assert isinstance(body, SharesBody)
        relabel = {
            "value_clients": np.full_like(body.value_clients, 3),
            "seed_clients": np.full_like(body.seed_clients, 3),
        }
        with pytest.raises(RemoteProtocolError, match="authentication failed"):
            session.nodes[msg.recipient].receive(wire(with_body(msg, **relabel)))
    if shares == "derived":  # c0 sends only its value share, to n1
        (to_n1,) = msgs
        for other in ("n0", "n2"):
            with pytest.raises(RemoteProtocolError, match="wrong node"):
                session.nodes[other].receive(wire(dataclasses.replace(to_n1, recipient=other)))
        return
    to_n0 = next(m for m in msgs if m.recipient == "n0")
    with pytest.raises(RemoteProtocolError, match="authentication failed"):
        session.nodes["n2"].receive(wire(dataclasses.replace(to_n0, recipient="n2")))
    with pytest.raises(RemoteProtocolError, match="wrong node"):
        session.nodes["n1"].receive(wire(dataclasses.replace(to_n0, recipient="n1")))


@pytest.mark.parametrize("shares", SHARE_MODES)
def test_replayed_frames_are_refused(shares: str) -> None:
    session, spec, msgs = single_client_round(shares=shares)
    msg = msgs[0]
    node = session.nodes[msg.recipient]
    guard = ReplayGuard()
    frame = encode(msg)
    node.receive(decode(frame, guard))
    with pytest.raises(RemoteProtocolError, match="replayed"):  # verbatim: the codec's guard
        decode(frame, guard)
    resent = dataclasses.replace(msg, seq=msg.seq + 100)  # new envelope, same sealed rows
    before = node_state(node)
    with pytest.raises(RemoteProtocolError, match="already received"):
        node.receive(wire(resent))
    assert node_state(node) == before
    # round 4 (M + 1: every client has the same value node as in round 1): round-1 rows in a
    # round-4 envelope fail (the key and the AAD name the round)
    for m in msgs[1:]:
        session.nodes[m.recipient].receive(wire(m))
    session.deliver(session.clients[1].contribute(spec, np.ones((1, 5)), np.random.default_rng(1)))
    for party in session.parties.values():
        session.deliver(party.expire(10.0))
    assert session.aggregator.result(1) is not None
    spec2 = RoundSpec(4, 5, 0.0)
    pump(session, session.aggregator.open_round(spec2, deadline=20.0))
    old = dataclasses.replace(msg, round=4, seq=msg.seq + 200)
    with pytest.raises(RemoteProtocolError, match="authentication failed"):
        node.receive(wire(old))
    fresh = session.clients[0].contribute(spec2, np.ones((1, 5)), np.random.default_rng(2))
    node.receive(wire(next(m for m in fresh if m.recipient == msg.recipient)))


def test_rounds_across_key_blocks_stay_exact_and_refuse_old_frames() -> None:
    """Rounds 1, 2, B + 1 and 2 B + 1 use keys from three HKDF blocks, derived on first use;
    a round-1 frame resent in round B + 1 (same piece of the next block) fails authentication."""
    cfg = config(5, 3, 1, bound=10.0, f=20, shares="sealed-seeds")
    session = DcaSession(cfg, batch=2)
    rng = np.random.default_rng(3)
    for round_ in (1, 2, ROUND_KEY_BLOCK + 1, 2 * ROUND_KEY_BLOCK + 1):
        x = rng.uniform(-10.0, 10.0, (5, 4))
        out = session.run_round(RoundSpec(round_, 4, 0.0), x, rng)
        assert out.result.ring_total is not None
        assert np.array_equal(out.result.ring_total, ring_sum(cfg.codec.encode(x)))
    session, _, msgs = single_client_round(shares="sealed-seeds")
    for m in msgs[1:]:
        session.nodes[m.recipient].receive(wire(m))
    session.deliver(session.clients[1].contribute(RoundSpec(1, 5, 0.0), np.ones((1, 5)), rng))
    for party in session.parties.values():
        session.deliver(party.expire(10.0))
    later = RoundSpec(ROUND_KEY_BLOCK + 1, 5, 0.0)
    pump(session, session.aggregator.open_round(later, deadline=20.0))
    old = dataclasses.replace(msgs[0], round=later.round, seq=msgs[0].seq + 200)
    with pytest.raises(RemoteProtocolError, match="authentication failed"):
        session.nodes[old.recipient].receive(wire(old))


@pytest.mark.parametrize("shares", SHARE_MODES)
def test_batch_with_one_bad_row_keeps_the_good_rows(shares: str) -> None:
    session = DcaSession(config(4, 2, 1, shares=shares), batch=4)
    spec = RoundSpec(1, 3, 0.0)
    pump(session, session.aggregator.open_round(spec, deadline=10.0))
    msgs = session.clients[0].contribute(spec, np.zeros((4, 3)), np.random.default_rng(0))
    msg = msgs[0]
    body = msg.body
    kind = "seed" if shares == "sealed-seeds" else "value"
    clients = getattr(body, f"{kind}_clients")
    assert isinstance(body, SharesBody) and len(clients) == 2
    bad = getattr(body, f"{kind}_frames").copy()
    bad[1, -1] ^= 0x80
    node = session.nodes[msg.recipient]
    node.receive(wire(with_body(msg, **{f"{kind}_frames": bad})))
    assert node.round is not None
    assert int(node.round.received.sum()) == (3 if shares == "sealed-seeds" else 1)
    assert node.rejected == [(1, f"c{clients[1]}", "authentication failed")]


# ----------------------------------------------------------------------------- dropouts
@pytest.mark.parametrize("shares", SHARE_MODES)
def test_dropouts_up_to_t_are_left_out_and_above_t_abort(shares: str) -> None:
    """c5's frame to its value node of round 1 (n0) is lost, c7's of round 2 (n0) too."""
    cfg = config(8, 3, 2, bound=10.0, shares=shares)
    session = DcaSession(cfg, batch=3)
    rng = np.random.default_rng(7)
    x = rng.uniform(-10, 10, (8, 4))
    out = session.run_round(RoundSpec(1, 4, 0.0), x, rng, absent=["c2"], lost={"c5": ["n0"]})
    assert out.result.released and out.result.ring_total is not None
    assert out.result.missing == ("c2", "c5")  # c5 did not reach every node
    keep = [i for i in range(8) if i not in (2, 5)]
    assert np.array_equal(out.result.ring_total, ring_sum(cfg.codec.encode(x[keep])))
    out = session.run_round(RoundSpec(2, 4, 1.0), x, rng, absent=["c0", "c1"], lost={"c7": ["n0"]})
    assert out.result.status == "insufficient"
    assert out.result.value is None and out.result.ring_total is None
    assert out.kinds["dca.partial"] == 0 and out.kinds["dca.abort"] == 3
    assert "3 clients missing (c0, c1, c7) + 0 known colluders (none) > T = 2" in out.result.reason
    assert session.aggregator.ledger.events == ()  # nothing released, nothing charged


def test_a_silent_compute_node_fails_the_round() -> None:
    cfg = config(5, 3, 1)
    session = DcaSession(cfg, batch=5)
    spec = RoundSpec(1, 2, 1.0)
    opens = session.aggregator.open_round(spec, deadline=1.0)
    session.deliver([m for m in opens if m.recipient != "n2"])  # n2 never hears of the round
    shares = session.clients[0].contribute(spec, np.zeros((5, 2)), np.random.default_rng(0))
    session.deliver(shares)
    assert any("not expected by n2 in idle" in why for _, why in session.refused)
    for now in (1.0, 1.0 + cfg.agreement_timeout):
        for party in session.parties.values():
            session.deliver(party.expire(now))
    result = session.aggregator.result(1)
    assert result is not None and result.status == "failed" and result.value is None
    assert "['n2'] did not report" in result.reason


def test_a_peer_set_arriving_before_the_open_is_kept() -> None:
    cfg = config(4, 3, 1)
    session = DcaSession(cfg, batch=4)
    spec = RoundSpec(1, 2, 0.0)
    opens = session.aggregator.open_round(spec, deadline=1.0)
    late = [m for m in opens if m.recipient == "n2"]
    pump(session, [m for m in opens if m.recipient != "n2"])
    shares = session.clients[0].contribute(spec, np.ones((4, 2)), np.random.default_rng(0))
    held = [m for m in shares if m.recipient == "n2"]
    pump(session, [m for m in shares if m.recipient != "n2"])  # n0, n1 close: all 4 arrived
    assert session.nodes["n2"].state == "idle"
    pump(session, late + held)
    result = session.aggregator.result(1)
    assert result is not None and result.released
    assert result.value is not None and np.allclose(result.value, [4.0, 4.0])


def test_inconsistent_sets_release_nothing() -> None:
    cfg = config(4, 2, 1)
    session = DcaSession(cfg, batch=4)
    spec = RoundSpec(1, 2, 0.0)
    pump(session, session.aggregator.open_round(spec, deadline=1.0))
    queue = session.clients[0].contribute(spec, np.ones((4, 2)), np.random.default_rng(0))
    while queue:
        msg = queue.pop(0)
        body = msg.body
        if isinstance(body, PartialBody) and msg.sender == "n0":  # n0 claims a smaller set
            msg = with_body(msg, included=pack_set(np.array([True, True, True, False])))
        queue += session.parties[msg.recipient].receive(wire(msg))
    result = session.aggregator.result(1)
    assert result is not None and result.status == "inconsistent" and result.value is None


# ----------------------------------------------------------------------------- refusals
def test_client_refusals_leave_it_untouched() -> None:
    cfg = config(3, 2, 0)
    nodes = [ComputeNode(cfg, n) for n in cfg.nodes]
    keys = {n.name: n.public_key for n in nodes}
    client = Client(cfg, "party", keys, ["c0", "c1"])
    spec = RoundSpec(1, 2, 0.0)
    rng = np.random.default_rng(0)
    with pytest.raises(LocalProtocolError, match="new"):
        client.contribute(spec, np.zeros((2, 2)), rng)
    client.start()
    with pytest.raises(LocalProtocolError, match="already"):
        client.start()
    with pytest.raises(ValueError, match="exceeds bound"):
        client.contribute(spec, np.array([[0.0, 10.5], [0.0, 0.0]]), rng)
    with pytest.raises(ValueError, match="exceeds bound"):
        client.contribute(spec, np.array([[0.0, np.nan], [0.0, 0.0]]), rng)
    with pytest.raises(ValueError, match="shape"):
        client.contribute(spec, np.zeros((3, 2)), rng)
    assert client.last_round == 0
    client.contribute(spec, np.zeros((2, 2)), rng)
    with pytest.raises(LocalProtocolError, match="not after"):
        client.contribute(spec, np.zeros((2, 2)), rng)
    stray = Message("run-1", 1, "n0", "party", 1, SeenBody(pack_set(np.ones(3, dtype=bool))))
    with pytest.raises(RemoteProtocolError, match="not expected"):
        client.receive(stray)
    with pytest.raises(ValueError, match="members"):
        Client(cfg, "p2", keys, ["c9"])
    with pytest.raises(ValueError, match="node_keys"):
        Client(cfg, "p2", {"n0": keys["n0"]}, ["c0"])


def test_node_refusals_leave_it_untouched() -> None:
    session = DcaSession(config(4, 3, 1), batch=4)
    node = session.nodes["n0"]
    spec = RoundSpec(1, 2, 0.0)
    shares = session.clients[0].contribute(spec, np.zeros((4, 2)), np.random.default_rng(0))
    mine = next(m for m in shares if m.recipient == "n0")
    seen = Message("run-1", 1, "n1", "n0", 1, SeenBody(pack_set(np.ones(4, dtype=bool))))
    open_body = OpenBody(2, 0.0, 1.0, "", "x", 1.0)
    cases = [
        (mine, "not expected by n0 in idle"),  # shares before the round opened
        (Message("run-1", 1, "party", "n0", 1, open_body), "may not open"),
        (
            Message(
                "run-1", 1, "aggregator", "n0", 2, dataclasses.replace(open_body, sigma_std=1e-9)
            ),
            "frac_bits",
        ),
        (
            Message(
                "run-1", 1, "aggregator", "n0", 3, dataclasses.replace(open_body, d=MAX_ROUND_D + 1)
            ),
            "at most",
        ),
        (dataclasses.replace(seen, sender="c0"), "not a peer"),
        (dataclasses.replace(seen, round=5), "unexpected"),
        (with_body(seen, received=np.zeros(2, dtype=np.uint8)), "packed set"),
        (Message("run-2", 1, "aggregator", "n0", 1, open_body), "run"),
    ]
    for msg, why in cases:
        before = node_state(node)
        with pytest.raises(RemoteProtocolError, match=why):
            node.receive(wire(msg))
        assert node_state(node) == before
    register = session.clients[0].start  # already started: rebuild a registration by hand
    with pytest.raises(LocalProtocolError):
        register()


def test_register_twice_is_refused() -> None:
    cfg = config(2, 2, 0)
    node = ComputeNode(cfg, "n0")
    other = ComputeNode(cfg, "n1")
    keys = {"n0": node.public_key, "n1": other.public_key}
    first = Client(cfg, "a", keys, ["c0"]).start()[0]
    node.receive(wire(first))
    again = Client(cfg, "b", keys, ["c0"]).start()[0]  # a relay re-registering c0's slot
    with pytest.raises(RemoteProtocolError, match="already registered"):
        node.receive(wire(again))
    body = again.body
    assert isinstance(body, RegisterBody)
    twice = RegisterBody(np.array([1, 1], dtype=np.uint32), np.repeat(body.public_keys, 2, axis=0))
    with pytest.raises(RemoteProtocolError, match="appears twice"):
        node.receive(wire(dataclasses.replace(again, body=twice, seq=again.seq + 1)))
    assert node.registered == 1


def test_aggregator_refusals_leave_it_untouched() -> None:
    cfg = config(3, 2, 0)
    agg = Aggregator(cfg)
    spec = RoundSpec(1, 2, 0.0)
    agg.open_round(spec, deadline=1.0)
    with pytest.raises(LocalProtocolError, match="still open"):
        agg.open_round(RoundSpec(2, 2, 0.0), deadline=2.0)
    good = PartialBody(np.zeros(2, dtype=np.uint64), pack_set(np.ones(3, dtype=bool)))
    cases = [
        (Message("run-1", 1, "c0", "aggregator", 1, good), "not a compute node"),
        (
            Message(
                "run-1",
                1,
                "n0",
                "aggregator",
                1,
                dataclasses.replace(good, total=np.zeros(3, dtype=np.uint64)),
            ),
            "shape",
        ),
        (
            Message(
                "run-1", 1, "n0", "aggregator", 2, dataclasses.replace(good, total=np.zeros(2))
            ),
            "dtype",
        ),
        (Message("run-1", 4, "n0", "aggregator", 3, good), "not the open round"),
    ]
    for msg, why in cases:
        with pytest.raises(RemoteProtocolError, match=why):
            agg.receive(wire(msg))
        assert agg.state == "waiting" and agg.result(1) is None
    agg.receive(wire(Message("run-1", 1, "n0", "aggregator", 9, good)))
    with pytest.raises(RemoteProtocolError, match="already answered"):
        agg.receive(wire(Message("run-1", 1, "n0", "aggregator", 10, good)))
    assert agg.expire(1.0 + cfg.result_timeout - 0.01) == [] and agg.state == "waiting"
    agg.expire(1.0 + cfg.result_timeout)
    result = agg.result(1)
    assert result is not None and result.status == "failed" and "n1" in result.reason


def test_config_refuses_unsafe_sessions() -> None:
    clients = tuple(f"c{i}" for i in range(5))
    with pytest.raises(ValueError, match="nodes"):
        DcaConfig("r", clients, ("n0",))
    with pytest.raises(ValueError, match="tolerance"):
        DcaConfig("r", clients, ("n0", "n1"), tolerance=4)
    with pytest.raises(ValueError, match=r"could wrap.*reduce frac_bits to <= 40"):
        DcaConfig("r", clients, ("n0", "n1"), bound=1e6, frac_bits=50)
    with pytest.raises(ValueError, match="share names"):
        DcaConfig("r", clients, ("n0", "c1"))
    cfg = DcaConfig("r", clients, ("n0", "n1"), tolerance=1, frac_bits=10)
    with pytest.raises(ValueError, match="increase frac_bits"):
        cfg.check_round(RoundSpec(1, 3, 1e-3))  # 1e-3 / sqrt(3) * 2^10 < 4 grid units
    with pytest.raises(ValueError, match="could wrap"):
        cfg.check_round(RoundSpec(1, 3, 2.0**55))
    with pytest.raises(ValueError, match="d must be at most"):
        RoundSpec(1, MAX_ROUND_D + 1, 1.0)
    pair = DcaConfig("r", clients[:2], ("n0", "n1"), frac_bits=0)
    with pytest.raises(ValueError, match="reduce frac_bits"):
        pair.check_round(RoundSpec(1, 3, 2.0**50))  # fits the ring, too coarse for the sampler
    # a refused spec is refused every time (nothing remembered of it); a passed one is
    # remembered per configuration and spec, and its digest computed once, the same bytes
    for _ in range(2):
        with pytest.raises(ValueError, match="increase frac_bits"):
            cfg.check_round(RoundSpec(1, 3, 1e-3))
    fine = RoundSpec(2, 3, 1.0)
    cfg.check_round(fine)
    assert fine in cfg._checked and RoundSpec(1, 3, 1e-3) not in cfg._checked
    first = cfg.digest(fine)
    assert cfg.digest(fine) is first and first == cfg._digest(fine)
    assert cfg.digest(RoundSpec(3, 3, 1.0)) != first


def test_secure_sum_one_call() -> None:
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (50, 5))
    out = secure_sum(x, epsilon=1.0, delta=1e-5, sensitivity=2.0, bound=1.0, rng=rng, tolerance=2)
    assert out.result.released and out.result.private and out.value is not None
    sigma_total = out.result.sigma_std * np.sqrt(50 / 47)
    assert np.abs(out.value - x.sum(axis=0)).max() < 6 * sigma_total
    assert out.result.sigma_std > 2.0 * 3.7  # analytic sigma at eps 1, delta 1e-5 is 3.73 Delta


def test_frames_of_the_wrong_kind_for_a_node_are_refused() -> None:
    """A (buggy) client that sends its value share to a seed node is not counted there."""
    cfg = config(3, 2, 1)
    session = DcaSession(cfg, batch=3)
    spec = RoundSpec(1, 2, 0.0)
    pump(session, session.aggregator.open_round(spec, deadline=1.0))
    client = session.clients[0]
    skewed = dataclasses.replace(cfg)
    object.__setattr__(skewed, "value_node", lambda idx, r: (idx + r + 1) % 2)
    client.config = skewed
    msgs = client.contribute(spec, np.zeros((3, 2)), np.random.default_rng(0))
    node = session.nodes[msgs[0].recipient]
    with pytest.raises(RemoteProtocolError, match="sent to the wrong node"):
        node.receive(wire(msgs[0]))


@pytest.mark.parametrize("shares", SHARE_MODES)
def test_chacha20_seed_expansion_end_to_end(shares: str) -> None:
    cfg = dataclasses.replace(config(7, 3, 1, bound=4.0, shares=shares), prg="chacha20")
    x = np.random.default_rng(8).uniform(-4, 4, (7, 11))
    out = DcaSession(cfg, batch=3).run_round(RoundSpec(1, 11, 0.0), x, np.random.default_rng(0))
    assert out.result.ring_total is not None
    assert np.array_equal(out.result.ring_total, ring_sum(cfg.codec.encode(x)))

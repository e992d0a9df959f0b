"""Node keys pinned out of band, registrations bound to their client (issue 12, part 4).

Adversaries, each with only what it really holds: the curator relays the compute nodes' public
keys to owners and may swap one for a key of its own (then it could open every share sealed to
it); an owner may send a registration naming another owner's roster index.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dpmarket.protocol.securesum.aggregator import Aggregator
from dpmarket.protocol.securesum.client import Client, NodeKeyMismatch
from dpmarket.protocol.securesum.messages import RegisterBody
from dpmarket.protocol.securesum.node import ComputeNode
from dpmarket.protocol.securesum.sealing import generate_keypair, key_fingerprint
from dpmarket.protocol.securesum.spec import DcaConfig, RoundSpec
from dpmarket.protocol.wire.codec import Message, decode, encode
from dpmarket.protocol.wire.errors import RemoteProtocolError

OWNERS = ("owner-1", "owner-2", "owner-3", "owner-4")


def config() -> DcaConfig:
    return DcaConfig("keys", OWNERS, ("compute-1", "compute-2"), tolerance=1, frac_bits=24)


def operator_nodes(cfg: DcaConfig) -> tuple[dict[str, ComputeNode], dict[str, str]]:
    """The operator makes each node's key and the fingerprints it hands to owners directly."""
    nodes = {}
    for name in cfg.nodes:
        private, _ = generate_keypair()
        nodes[name] = ComputeNode(cfg, name, private)
    return nodes, {n: key_fingerprint(node.public_key) for n, node in nodes.items()}


def wire(msg: Message) -> Message:
    return decode(encode(msg))


def test_a_relay_that_swaps_a_node_key_is_refused() -> None:
    cfg = config()
    nodes, pins = operator_nodes(cfg)
    honest = {n: node.public_key for n, node in nodes.items()}
    _, curators_key = generate_keypair()  # the relay's own key pair; it keeps the private half
    relayed = honest | {"compute-2": curators_key}
    with pytest.raises(NodeKeyMismatch, match=r"compute nodes \['compute-2'\] do not match"):
        Client(cfg, "client:owner-1", relayed, ["owner-1"], pinned=pins)
    # a pin missing for a node is refused too; the honest keys pass and the owner registers
    with pytest.raises(NodeKeyMismatch, match="no fingerprint"):
        Client(cfg, "client:owner-1", honest, ["owner-1"], pinned={"compute-1": pins["compute-1"]})
    frames = Client(cfg, "client:owner-1", honest, ["owner-1"], pinned=pins).start()
    assert sorted(m.recipient for m in frames) == ["compute-1", "compute-2"]


def test_a_registration_under_another_owners_index_is_refused() -> None:
    """owner-1 registers owner-2's index with a key of its own: the node holds owner-2's key,
    pinned by the operator, and refuses. Nothing is registered for owner-2."""
    cfg = config()
    identities = {o: generate_keypair()[0] for o in OWNERS}
    pinned_clients = {o: k.public_key().public_bytes_raw() for o, k in identities.items()}
    private, _ = generate_keypair()
    node = ComputeNode(cfg, "compute-1", private, pinned_clients)
    keys = {"compute-1": node.public_key, "compute-2": generate_keypair()[1]}
    own_key = generate_keypair()[0]  # all an honest-but-curious owner-1 can hold
    forged = Client(cfg, "client:owner-1", keys, ["owner-2"], identity=[own_key]).start()[0]
    with pytest.raises(RemoteProtocolError, match="owner-2: the key is not its pinned key"):
        node.receive(wire(forged))
    assert node.registered == 0
    # owner-2's public key is public, its private key is not: a proof made without it fails
    body = forged.body
    assert isinstance(body, RegisterBody)
    replayed = RegisterBody(
        body.clients,
        np.frombuffer(pinned_clients["owner-2"], np.uint8).reshape(1, 32).copy(),
        body.proofs,
    )
    with pytest.raises(RemoteProtocolError, match="owner-2: the proof does not verify"):
        node.receive(wire(replace(forged, body=replayed)))
    no_proof = RegisterBody(replayed.clients, replayed.public_keys)
    with pytest.raises(RemoteProtocolError, match="proofs: missing"):
        node.receive(wire(replace(forged, body=no_proof)))
    assert node.registered == 0
    genuine = Client(
        cfg, "client:owner-2", keys, ["owner-2"], identity=[identities["owner-2"]]
    ).start()[0]
    assert node.receive(wire(genuine)) == [] and node.registered == 1


def test_operator_keys_and_pins_still_sum_exactly() -> None:
    """The pinned path end to end: operator-made node keys, pinned owners, an exact sum."""
    cfg = config()
    nodes, pins = operator_nodes(cfg)
    keys = {n: node.public_key for n, node in nodes.items()}
    clients = [Client(cfg, f"client:{o}", keys, [o], pinned=pins) for o in OWNERS]
    aggregator = Aggregator(cfg)
    parties = {**nodes, aggregator.name: aggregator, **{c.name: c for c in clients}}
    queue = [m for c in clients for m in c.start()]
    spec = RoundSpec(1, 3, 0.0)
    queue += aggregator.open_round(spec, deadline=1.0)
    x = np.arange(12, dtype=np.float64).reshape(4, 3) / 12
    rng = np.random.default_rng(0)
    queue += [
        m for c, row in zip(clients, x, strict=True) for m in c.contribute(spec, row[None], rng)
    ]
    while queue:
        msg = queue.pop(0)
        queue += parties[msg.recipient].receive(wire(msg))
    result = aggregator.result(1)
    assert result is not None and result.value is not None
    assert np.allclose(result.value, x.sum(axis=0), atol=1e-6)


def test_a_relayed_roster_attestation_that_is_malformed_or_altered_is_refused_by_name() -> None:
    """What the relay hands an owner as a node's roster attestation (``ComputeNode.attest``,
    its part for that owner): the honest one verifies; a name list with a duplicate, a name
    outside the roster, an unhashable entry or one owner left out is refused, naming the node,
    before or at the tag, whatever the relay rewrites."""
    cfg = config()
    nodes, pins = operator_nodes(cfg)
    keys = {n: node.public_key for n, node in nodes.items()}
    clients = {o: Client(cfg, f"client:{o}", keys, [o], pinned=pins) for o in OWNERS}
    for client in clients.values():
        for msg in client.start():
            nodes[msg.recipient].receive(wire(msg))
    honest = nodes["compute-1"].attest(True)
    part = {"checked": honest["checked"], "admitted": honest["admitted"]}
    part["tag"] = honest["tags"]["owner-1"]
    assert clients["owner-1"].attested("owner-1", "compute-1", part) == (False, OWNERS)
    for admitted, match in [
        ([*OWNERS, "owner-1"], "compute-1 attests names outside the session's roster"),
        ([*OWNERS, "owner-9"], "compute-1 attests names outside the session's roster"),
        ([*OWNERS[:3], ["owner-4"]], "compute-1's attestation is malformed"),
        (list(OWNERS[1:]), "compute-1's attestation does not verify"),
    ]:
        with pytest.raises(ValueError, match=match):
            clients["owner-1"].attested("owner-1", "compute-1", part | {"admitted": admitted})

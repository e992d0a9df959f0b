"""A compute node with ``[node].owners_ca`` admits an owner's secure-sum key only with that
owner's signature: from the view of a market that relays the roster, every way of putting a key
of its own choosing in an owner's name is refused, and that owner is then absent (its key
replaced by one nobody holds), never impersonated."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from dpmarket.actors.remote import tls
from dpmarket.actors.remote.agent import Link
from dpmarket.actors.remote.agentconfig import NodeAgentConfig
from dpmarket.actors.remote.nodeagent import NodeAgent
from dpmarket.protocol.securesum.client import Client
from dpmarket.protocol.securesum.node import ComputeNode
from dpmarket.protocol.securesum.sealing import generate_keypair
from dpmarket.protocol.securesum.spec import DcaConfig

SESSION = "market-dca"
ROSTER = ("owner-1", "owner-2")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    main, other = tmp_path_factory.mktemp("pki"), tmp_path_factory.mktemp("other")
    tls.write_party_certs(main, ["owner-1", "owner-2"], ["node-1"])
    tls.write_party_certs(other, ["owner-1"], ["node-1"])
    return main, other


def _node(tmp_path: Path, pki: Path, owners_ca: bool = True) -> NodeAgent:
    link = Link("127.0.0.1:1", "m", "node-1", "node", b"", b"", b"")
    ca = (pki / "ca.crt").read_bytes() if owners_ca else None
    return NodeAgent(NodeAgentConfig("node.toml", "node-1", str(tmp_path / "n.x25519"), link, ca))


def _proof(pki: Path, owner: str, key: bytes, signer: str | None = None) -> dict[str, bytes]:
    signer = signer or owner
    pem = (pki / f"{signer}.key").read_bytes()
    return {
        "key": key,
        "certificate": (pki / f"{signer}.crt").read_bytes(),
        "signature": tls.sign_identity(pem, SESSION, owner, key),
    }


def test_proven_keys_are_admitted_and_every_substitution_is_refused(
    tmp_path: Path, pki: tuple[Path, Path]
) -> None:
    main, other = pki
    honest = {o: generate_keypair()[1] for o in ("owner-1", "owner-2")}
    forged = generate_keypair()[1]  # the market's own key
    node = _node(tmp_path, main)
    proofs = {o: _proof(main, o, k) for o, k in honest.items()}
    assert node.checked_keys(SESSION, ROSTER, honest, proofs) == honest
    assert node.refused == {}

    cases = {
        # the owner's real proof, a key of the market's choosing
        "swapped": ({"owner-1": forged}, {"owner-1": proofs["owner-1"]}, "no proof"),
        # the market's key with a proof by another owner's certificate
        "other owner": ({"owner-1": forged},
                        {"owner-1": _proof(main, "owner-1", forged, "owner-2")}, "not 'owner-1'"),
        # a certificate the owners' CA never issued
        "other CA": ({"owner-1": forged}, {"owner-1": _proof(other, "owner-1", forged)},
                     "not issued by the owners' CA"),
        # signed for another session: replayed
        "replayed": ({"owner-1": honest["owner-1"]}, {"owner-1": proofs["owner-1"]},
                     "not the one it signed"),
        "no proof": ({"owner-1": forged}, {}, "no proof"),
    }  # fmt: skip
    for name, (keys, given, reason) in cases.items():
        node = _node(tmp_path, main)
        session = "another-session" if name == "replayed" else SESSION
        checked = node.checked_keys(session, ("owner-1",), keys, given)
        assert checked["owner-1"] not in (forged, honest["owner-1"]), name  # nobody holds it
        assert reason in node.refused["owner-1"], (name, node.refused)


def test_without_an_owners_ca_the_node_takes_the_market_word(
    tmp_path: Path, pki: tuple[Path, Path]
) -> None:
    forged = {"owner-1": generate_keypair()[1]}
    node = _node(tmp_path, pki[0], owners_ca=False)
    assert node.checked_keys(SESSION, ROSTER, forged, {}) == forged


def test_a_roster_name_the_market_leaves_out_is_pinned_to_nobody_and_never_attested_checked(
    tmp_path: Path, pki: tuple[Path, Path]
) -> None:
    """The market relays owner-1's proven key only, leaving owner-2 unpinned, and registers a
    key of its own under owner-2's name: the node pins owner-2 to a key nobody holds, so the
    market's registration is refused, and what the node attests to owner-1 never counts a key
    it did not check."""
    main, _ = pki
    honest = generate_keypair()[1]
    node = _node(tmp_path, main)
    checked = node.checked_keys(SESSION, ROSTER, {"owner-1": honest}, {
        "owner-1": _proof(main, "owner-1", honest)})  # fmt: skip
    assert checked["owner-1"] == honest and set(checked) == set(ROSTER)
    assert "no proof" in node.refused["owner-2"]
    # the protocol node alone (no host check): an unpinned name a market registers is admitted,
    # and then the attestation says the roster was not checked
    config = DcaConfig(SESSION, ("owner-1", "owner-2", "owner-3"), ("node-1", "node-2"))
    private = X25519PrivateKey.generate()
    owner, market = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    publics = {"node-1": private.public_key().public_bytes_raw(),
               "node-2": generate_keypair()[1]}  # fmt: skip
    pinned = {"owner-1": owner.public_key().public_bytes_raw()}
    proto = ComputeNode(config, "node-1", private, pinned)
    registrations = [
        *Client(config, "client:owner-1", publics, ("owner-1",), identity=[owner]).start(),
        *Client(config, "client:owner-2", publics, ("owner-2",), identity=[market]).start(),
    ]
    for msg in registrations:
        if msg.recipient == "node-1":
            proto.receive(msg)
    attestation = proto.attest(True)
    assert attestation["admitted"] == ["owner-1", "owner-2"]
    assert attestation["checked"] is False

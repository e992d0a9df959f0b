"""The curator's attacks on an owner's secure-sum trust anchors (actors/dcaowner.py).

The curator relays every secure-sum frame and holds every owner actor's handle, so it can call
``dca_setup`` with keys of its choosing, as often as it likes. These tests play that curator
with what it has (the session's public config, keys it makes, the methods of the handle) and
check that no share is ever sealed to a key it chose.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpmarket.actors.dcaowner import OperatorTrust, OwnerSecureSum
from dpmarket.actors.owner import OwnerActor
from dpmarket.protocol.securesum.parties import ComputeNode, DcaConfig, NodeKeyMismatch
from dpmarket.protocol.securesum.sealing import generate_keypair, key_fingerprint

OWNERS = ("owner-0", "owner-1", "owner-2")
NODES = ("compute-1", "compute-2")


def _session() -> tuple[DcaConfig, dict[str, ComputeNode], dict[str, OwnerSecureSum]]:
    """The operator's set-up: node keys made first, owners constructed with their pins."""
    config = DcaConfig("run-dca", OWNERS, NODES, tolerance=0, bound=100.0, frac_bits=24)
    keys = {n: generate_keypair() for n in NODES}
    trust = OperatorTrust(config, {n: key_fingerprint(pub) for n, (_, pub) in keys.items()})
    owners = {o: OwnerSecureSum(o, trust, np.random.default_rng(i)) for i, o in enumerate(OWNERS)}
    client_keys = {o: s.public_key() for o, s in owners.items()}
    nodes = {n: ComputeNode(config, n, keys[n][0], client_keys) for n in NODES}
    return config, nodes, owners


def _curator_keys() -> dict[str, bytes]:
    return {n: generate_keypair()[1] for n in NODES}


def test_setup_under_curator_keys_is_refused_and_seals_nothing() -> None:
    config, nodes, owners = _session()
    owner = owners["owner-0"]
    with pytest.raises(NodeKeyMismatch):
        owner.setup(config, _curator_keys())
    assert owner.client is None  # no registration was made, nothing can be sealed
    real = {n: node.public_key for n, node in nodes.items()}
    frames = owner.setup(config, real)  # the relay forwards the real keys: the session works
    assert {m.recipient for m in frames} == set(NODES)
    for m in frames:
        assert nodes[m.recipient].receive(m) == []
    assert all(node.registered == 1 for node in nodes.values())


def test_second_setup_is_refused_whatever_the_keys() -> None:
    config, nodes, owners = _session()
    owner = owners["owner-1"]
    real = {n: node.public_key for n, node in nodes.items()}
    owner.setup(config, real)
    first = owner.client
    for keys in (_curator_keys(), real):
        with pytest.raises(RuntimeError, match="already set up"):
            owner.setup(config, keys)
    assert owner.client is first  # the operator's session is still the one in use


def test_setup_under_another_session_config_is_refused() -> None:
    config, nodes, owners = _session()
    real = {n: node.public_key for n, node in nodes.items()}
    forged = DcaConfig(config.run, OWNERS, NODES, tolerance=1, bound=100.0, frac_bits=24)
    with pytest.raises(ValueError, match="operator's session configuration"):
        owners["owner-2"].setup(forged, real)
    assert owners["owner-2"].client is None


def test_owner_actor_has_no_method_that_repins() -> None:
    """The pins come only with the actor's construction: its handle offers no way to set them
    (the old ``dca_pin`` replaced them on every call)."""
    methods = set(OwnerActor.__ray_metadata__.method_meta.methods)  # type: ignore[attr-defined]
    assert {"dca_setup", "dca_contribute", "dca_identity"} <= methods
    assert not {m for m in methods if "pin" in m}

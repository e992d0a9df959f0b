"""The curator's attacks on an owner's secure-sum trust anchors (actors/parties/dcaowner.py).

The curator relays every secure-sum frame and holds every owner actor's handle, so it can call
``dca_setup`` with keys of its choosing, as often as it likes. These tests play that curator
with what it has (the session's public config, keys it makes, the methods of the handle) and
check that no share is ever sealed to a key it chose.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import numpy as np
import pytest

from dpmarket.actors.parties.dcaowner import OperatorTrust, OwnerSecureSum
from dpmarket.actors.parties.ray_actors import OwnerActor
from dpmarket.protocol.privacy.ledger import ADD_REMOVE
from dpmarket.protocol.securesum.aggregator import Aggregator
from dpmarket.protocol.securesum.client import NodeKeyMismatch
from dpmarket.protocol.securesum.node import ComputeNode
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.securesum.sealing import generate_keypair, key_fingerprint
from dpmarket.protocol.securesum.spec import DcaConfig, RoundSpec
from dpmarket.protocol.wire.codec import Message

OWNERS = ("owner-0", "owner-1", "owner-2", "owner-3")
NODES = ("compute-1", "compute-2")
BOUND = 3.0
SKETCH = {"family": "l2", "rows": 4, "width": 8, "seed": 7, "bandwidth": 1.5}


def _session(
    behaviours: dict[str, str] | None = None,
) -> tuple[DcaConfig, dict[str, ComputeNode], dict[str, OwnerSecureSum]]:
    """The operator's set-up: node keys and the round plan made first, owners constructed with
    their pins, the plan and (simulation only) colluders' behaviour; nodes with the plan."""
    config = DcaConfig("run-dca", OWNERS, NODES, tolerance=1, bound=1e4, frac_bits=24)
    plan = SecureSumPlan.calibrated(
        config,
        1e-5,
        {
            "normalise": ("moments", 5, 1.0, 3.0, 1, {"bound": BOUND}),
            "scan": ("sketch", 32, 1.0, 2.0, 1, SKETCH),
        },
        neighbouring=ADD_REMOVE,
    )
    keys = {n: generate_keypair() for n in NODES}
    pins = {n: key_fingerprint(pub) for n, (_, pub) in keys.items()}
    trust = OperatorTrust(config, pins, plan, behaviours or {})
    owners = {o: OwnerSecureSum(o, trust, np.random.default_rng(i)) for i, o in enumerate(OWNERS)}
    client_keys = {o: s.public_key() for o, s in owners.items()}
    nodes = {n: ComputeNode(config, n, keys[n][0], client_keys, plan=plan) for n in NODES}
    return config, nodes, owners


def _set_up(
    config: DcaConfig, nodes: dict[str, ComputeNode], owners: dict[str, OwnerSecureSum]
) -> None:
    real = {n: node.public_key for n, node in nodes.items()}
    for owner in owners.values():
        for m in owner.setup(config, real):
            nodes[m.recipient].receive(m)


def _records(i: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    return np.random.default_rng(10 + i).uniform(-BOUND, BOUND, (20, 2))


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
    forged = DcaConfig(config.run, OWNERS, NODES, tolerance=2, bound=1e4, frac_bits=24)
    with pytest.raises(ValueError, match="operator's session configuration"):
        owners["owner-2"].setup(forged, real)
    assert owners["owner-2"].client is None


def test_owner_actor_has_no_method_that_repins() -> None:
    """The pins come only with the actor's construction: its handle offers no way to set them
    (the old ``dca_pin`` replaced them on every call)."""
    methods = set(OwnerActor.__ray_metadata__.method_meta.methods)  # type: ignore[attr-defined]
    assert {"dca_setup", "dca_contribute", "dca_identity"} <= methods
    assert not {m for m in methods if "pin" in m}


# ---------------------------------------------------------------- the round plan (finding 2)
def test_owner_refuses_rounds_the_plan_does_not_admit() -> None:
    """The curator asks for a sigma-0 round (the review's differencing attack starts so), one
    below the floor, a wider clip, another kind, and a second normalise: each is refused by
    every owner, naming the label and the bound, and nothing is sealed."""
    config, nodes, owners = _session()
    _set_up(config, nodes, owners)
    plan = owners["owner-0"].trust.plan
    honest = plan.spec("normalise", 1)
    attacks: list[tuple[RoundSpec, str, dict[str, Any], str]] = [
        (dataclasses.replace(honest, sigma_std=0.0), "moments", {"bound": BOUND}, "floor"),
        (
            dataclasses.replace(honest, sigma_std=honest.sigma_std / 2),
            "moments",
            {"bound": BOUND},
            "floor",
        ),
        (honest, "moments", {"bound": 1e3}, r"options \['bound'\]"),
        (dataclasses.replace(honest, d=32), "sketch", SKETCH, "d = 32"),
    ]
    for i, owner in enumerate(owners.values()):
        for spec, what, options, why in attacks:
            with pytest.raises(ValueError, match=f"'normalise'.*{why}"):
                owner.contribute(_records(i), spec, what, options)
        assert owner.client is not None and owner.client.last_round == 0  # nothing sealed
    first = owners["owner-0"].contribute(_records(0), honest, "moments", {"bound": BOUND})
    assert first  # the planned round goes through
    again = dataclasses.replace(honest, round=2)
    with pytest.raises(ValueError, match="'normalise': the plan allows 1 such rounds"):
        owners["owner-0"].contribute(_records(0), again, "moments", {"bound": BOUND})


def test_planned_round_releases_through_nodes_holding_the_plan() -> None:
    """The honest path: owners, nodes and the aggregator all use the operator's plan."""
    config, nodes, owners = _session()
    _set_up(config, nodes, owners)
    spec = owners["owner-0"].trust.plan.spec("normalise", 1)
    aggregator = Aggregator(config)
    queue: list[Message] = list(aggregator.open_round(spec, deadline=1.0))
    for i, owner in enumerate(owners.values()):
        queue += owner.contribute(_records(i), spec, "moments", {"bound": BOUND})
    while queue:
        m = queue.pop(0)
        party = aggregator if m.recipient == config.aggregator else nodes[m.recipient]
        queue += party.receive(m)
    result = aggregator.result(1)
    assert result is not None and result.released and result.sigma_std == spec.sigma_std


def test_the_curator_cannot_choose_an_owners_noise_behaviour() -> None:
    """Behaviour ("withhold"/"reveal") is a simulation fault the driver sets at construction;
    ``dca_setup`` takes none from its caller (the old one let the curator make an honest owner
    withhold its noise)."""
    actor = OwnerActor.__ray_metadata__.modified_class  # type: ignore[attr-defined]
    parameters = set(inspect.signature(actor.dca_setup).parameters)
    assert {"owner", "config", "node_keys"} <= parameters
    assert not {p for p in parameters if "behaviour" in p}
    config, nodes, owners = _session({"owner-3": "withhold"})
    _set_up(config, nodes, owners)
    assert owners["owner-3"].client is not None and owners["owner-0"].client is not None
    assert owners["owner-3"].client._withhold.all()  # the operator's simulated colluder
    assert not owners["owner-0"].client._withhold.any()

"""The owner decides, from the market's side as an adversary: an owner agent driven directly by
the control calls a market can make (no network: the same dispatcher the stream feeds), with a
market that asks for more than the owner's policy. Each such request gets nothing: no frame, no
charge in the owner's store, or a declined purchase."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from dpmarket.actors.parties.transport import LoopbackTransport
from dpmarket.actors.randomness import NoiseSource
from dpmarket.actors.remote import tls
from dpmarket.actors.remote.agent import Declined, Link
from dpmarket.actors.remote.agentconfig import OwnerAgentConfig
from dpmarket.actors.remote.owneragent import OwnerAgent
from dpmarket.protocol.agents.policy import OwnerPolicy
from dpmarket.protocol.agents.records import record
from dpmarket.protocol.privacy.ledger import record_relation
from dpmarket.protocol.securesum.client import Client, NodeKeyMismatch
from dpmarket.protocol.securesum.node import ComputeNode, owner_attestation
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.securesum.sealing import generate_keypair, key_fingerprint
from dpmarket.protocol.securesum.spec import DcaConfig, RoundSpec
from dpmarket.protocol.summary.curator import CuratorParams
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.summary.snr import moments_sensitivity, sketch_sensitivity
from dpmarket.protocol.wire.codec import decode
from tests.small import small_curator, small_params, small_scenario

NAME, MARKET, K = "owner-1", "adversary", 4
NODES = ("node-1", "node-2", "node-3")
RELATION = record_relation("replace")
SKETCH = {"family": "l2", "rows": 4, "width": 16, "seed": 0, "bandwidth": 1.0}


PRIVATE: dict[str, X25519PrivateKey] = {}  # the honest nodes' keys (the test plays them)


def _session(
    tolerance: int = 1, relation: str = "replace", lie: float = 1.0
) -> tuple[DcaConfig, SecureSumPlan, dict[str, bytes], dict[str, str]]:
    """A market's session: the plan declares each sensitivity divided by ``lie`` (sigma
    calibrated to what it declares), under ``relation``, with T = ``tolerance``."""
    config = DcaConfig(
        f"{MARKET}-dca", tuple(f"owner-{i + 1}" for i in range(4)), NODES, tolerance=tolerance,
        bound=1e6, frac_bits=24,
    )  # fmt: skip
    moments = moments_sensitivity(K, 3.0, neighbouring=relation) / lie
    sketch = sketch_sensitivity(4, neighbouring=relation) / lie
    planned = {
        "normalise": ("moments", 2 * K + 1, 0.5, moments, 1, {"bound": 3.0}),
        "scan": ("sketch", 64, 0.5, sketch, 1, SKETCH),
    }  # fmt: skip
    plan = SecureSumPlan.calibrated(config, 1e-5, planned, neighbouring=record_relation(relation))
    keys, pins = {}, {}
    for node in NODES:
        private = PRIVATE.setdefault(node, X25519PrivateKey.generate())
        public = private.public_key().public_bytes_raw()
        keys[node], pins[node] = public, key_fingerprint(public)
    return config, plan, keys, pins


def _attestations(
    config: DcaConfig,
    keys: dict[str, bytes],
    frames: list[bytes],
    own_key: bytes,
    others: int = 3,
) -> dict[str, Any]:
    """The honest compute nodes' roster attestations to owner-1, after its registration
    ``frames`` (under ``own_key``, pinned at the nodes) and those of ``others`` more owners."""
    members = config.clients[1 : 1 + others]
    identities = {o: X25519PrivateKey.generate() for o in members}
    pinned = {o: k.public_key().public_bytes_raw() for o, k in identities.items()}
    pinned[NAME] = own_key
    nodes = {n: ComputeNode(config, n, PRIVATE[n], pinned) for n in NODES}
    clients = [Client(config, f"client:{o}", keys, (o,), identity=[identities[o]]) for o in members]
    for msg in [*(decode(f) for f in frames), *(m for c in clients for m in c.start())]:
        nodes[msg.recipient].receive(msg)
    return {n: owner_attestation(node.attest(True), NAME) for n, node in nodes.items()}


def _params() -> CuratorParams:
    return CuratorParams(p=10, d=32, auction_variant="pure", eps_auction=1e-6, tau=1)


def _policy(**kw: Any) -> OwnerPolicy:
    base: dict[str, Any] = {
        "epsilon": 8.0,
        "delta": 1e-5,
        "max_points": 3,
        "rounds": {"normalise": 1, "scan": 1},
        "min_noise": {"normalise": 1.0, "scan": 1.0},
    }
    return OwnerPolicy(**(base | kw))


def _agent(tmp_path: Path, pins: dict[str, str], **policy: Any) -> OwnerAgent:
    data = tmp_path / "owner-1.csv"
    rows = np.random.default_rng(0).uniform(-1, 1, size=(40, K + 1)).round(4)
    data.write_text("\n".join(",".join(str(v) for v in r) for r in rows) + "\n")
    pki = tmp_path / "pki"
    if not pki.exists():
        tls.write_party_certs(pki, [NAME], ["node-1"])
    link = Link(
        "127.0.0.1:1", MARKET, NAME, "owner", (pki / "ca.crt").read_bytes(),
        (pki / f"{NAME}.crt").read_bytes(), (pki / f"{NAME}.key").read_bytes(),
    )  # fmt: skip
    config = OwnerAgentConfig(
        str(tmp_path / "owner.toml"), NAME, str(tmp_path / "state"), link, (str(data),), False,
        {}, pins, _policy(**policy), 0, NoiseSource.reproducible(1),
    )  # fmt: skip
    return OwnerAgent(config)


def _offer(
    config: DcaConfig, plan: SecureSumPlan, params: CuratorParams, run: str = "L1"
) -> dict[str, Any]:
    return {
        "market": MARKET,
        "run": MARKET,
        "params": record(params),
        "dca": record(config),
        "plan": record(plan),
        "ledger_run": run,
        "schema": {
            "n_features": K, "lower": [-1.0] * K, "upper": [1.0] * K, "label_column": K,
            "policy": "clip",
        },
    }  # fmt: skip


def _charged(agent: OwnerAgent) -> list[str]:
    path = Path(agent.ledger)
    if not path.exists():
        return []
    with sqlite3.connect(path) as db:
        tables = {r[0] for r in db.execute("select name from sqlite_master where type='table'")}
        if "charges" not in tables:
            return [r[0] for r in db.execute("select release from releases")]
        return [r[0] for r in db.execute("select release from charges")]


async def _ingested(agent: OwnerAgent) -> None:
    for _ in range(400):
        status = await agent.dispatch("ingest_status", {})
        if status["caught_up"] and status["records"] == 40:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"ingest did not catch up: {status}")


def _spec(plan: SecureSumPlan, label: str, round_: int, sigma: float | None = None) -> RoundSpec:
    spec = plan.spec(label, round_)
    return (
        spec
        if sigma is None
        else RoundSpec(round_, spec.d, sigma, spec.sensitivity, label, spec.neighbouring)
    )


def test_an_honest_offer_is_served_and_a_second_normalise_gets_nothing(tmp_path: Path) -> None:
    config, plan, keys, pins = _session()
    agent = _agent(tmp_path, pins)

    async def go() -> None:
        assert (await agent.dispatch("begin", {"offer": _offer(config, plan, _params())}))[
            "accepted"
        ]
        await _ingested(agent)
        identity = await agent.dispatch("dca_identity", {})  # its key, signed for the session
        assert len(identity["key"]) == 32
        ca = (tmp_path / "pki" / "ca.crt").read_bytes()
        tls.verify_identity(
            ca, identity["certificate"], identity["signature"], config.run, NAME, identity["key"]
        )
        frames = await agent.dispatch("dca_setup", {"config": config, "node_keys": keys})
        assert frames  # its registrations at the nodes it pinned
        args = {"spec": _spec(plan, "normalise", 1), "what": "moments", "options": {"bound": 3.0}}
        with pytest.raises(ValueError, match="no round before the pinned compute nodes attest"):
            await agent.dispatch("dca_contribute", args)
        roster = {"attestations": _attestations(config, keys, frames, identity["key"])}
        assert await agent.dispatch("dca_roster", roster) == 4
        args = {"spec": _spec(plan, "normalise", 1), "what": "moments", "options": {"bound": 3.0}}
        assert await agent.dispatch("dca_contribute", args)
        charged = agent_rows(agent)
        assert len(charged) == 1
        with pytest.raises(ValueError, match="all used"):  # the market asks for it again
            await agent.dispatch("dca_contribute", args | {"spec": _spec(plan, "normalise", 2)})
        low = {"spec": _spec(plan, "scan", 3, sigma=plan.rounds["scan"].sigma_floor / 2),
               "what": "sketch", "options": dict(SKETCH)}  # fmt: skip
        with pytest.raises(ValueError, match="below the plan's floor"):
            await agent.dispatch("dca_contribute", low)
        assert agent_rows(agent) == charged  # neither was charged

    asyncio.run(go())
    assert agent.host is not None
    assert agent.host._hosted[NAME].party._point_limit == 3  # its policy, not the market's


def agent_rows(agent: OwnerAgent) -> list[dict[str, Any]]:
    from dpmarket.actors.budgets.reading import read_store

    return [r for r in read_store(Path(agent.ledger))["rows"] if r["state"] == "charged"]


def test_a_relayed_node_key_that_does_not_match_the_owner_pin_gets_no_registration(
    tmp_path: Path,
) -> None:
    config, plan, keys, pins = _session()
    agent = _agent(tmp_path, pins)
    forged = dict(keys) | {"node-2": generate_keypair()[1]}  # the market's own key for node-2

    async def go() -> None:
        await agent.dispatch("begin", {"offer": _offer(config, plan, _params())})
        with pytest.raises(NodeKeyMismatch):
            await agent.dispatch("dca_setup", {"config": config, "node_keys": forged})
        with pytest.raises(RuntimeError, match="before dca_setup"):  # no session: no shares
            await agent.dispatch(
                "dca_contribute",
                {"spec": _spec(plan, "normalise", 1), "what": "moments", "options": {"bound": 3.0}},
            )

    asyncio.run(go())
    assert _no_charges(agent)


def _no_charges(agent: OwnerAgent) -> bool:
    return not Path(agent.ledger).exists() or agent_rows(agent) == []


@pytest.mark.parametrize(
    ("policy", "reason"),
    [
        ({"min_noise": {"normalise": 50.0, "scan": 1.0}}, "'normalise': noise multiplier"),
        ({"rounds": {"normalise": 1}}, "'scan': the market plans 1 round(s), the policy admits 0"),
        ({"epsilon": 0.05}, "cap: the purchase's planned charge does not fit"),
    ],
)
def test_an_offer_beyond_the_policy_is_declined_whole_and_charged_nothing(
    tmp_path: Path, policy: dict[str, Any], reason: str
) -> None:
    config, plan, keys, pins = _session()
    agent = _agent(tmp_path, pins, **policy)

    async def go() -> None:
        with pytest.raises(Declined, match=reason.replace("(", r"\(").replace(")", r"\)")):
            await agent.dispatch("begin", {"offer": _offer(config, plan, _params())})
        for method, args in (
            ("dca_identity", {}),
            ("dca_setup", {"config": config, "node_keys": keys}),
            ("handle", {"frames": []}),
        ):
            with pytest.raises(Declined):
                await agent.dispatch(method, args)
        view = await agent.dispatch("budget_view", {})
        assert reason.split(":")[0] in view["declined"]

    asyncio.run(go())
    assert _no_charges(agent)


def test_unpinned_nodes_a_reused_finished_purchase_and_an_empty_ledger_run_are_declined(
    tmp_path: Path,
) -> None:
    config, plan, _, pins = _session()
    partial = {n: pins[n] for n in ("node-1", "node-2")}
    agent = _agent(tmp_path, partial)
    with pytest.raises(Declined, match=r"no pinned key fingerprint for compute nodes \['node-3'\]"):
        asyncio.run(agent.dispatch("begin", {"offer": _offer(config, plan, _params())}))
    (tmp_path / "b").mkdir()
    agent = _agent(tmp_path / "b", pins)
    asyncio.run(agent.dispatch("begin", {"offer": _offer(config, plan, _params(), run="L1")}))
    agent.record_finished()  # the market ended purchase L1
    with pytest.raises(Declined, match="a purchase this owner already finished"):
        asyncio.run(agent.dispatch("begin", {"offer": _offer(config, plan, _params(), run="L1")}))
    with pytest.raises(Declined, match="ledger run: the offer names none"):
        asyncio.run(agent.dispatch("begin", {"offer": _offer(config, plan, _params(), run="")}))


def test_a_resumed_purchase_cannot_have_a_paid_round_again(tmp_path: Path) -> None:
    """The market restarts (a resume, or a replay under the same ledger run): the rounds the
    owner's store shows it paid count against the plan again, so normalise is refused."""
    config, plan, keys, pins = _session()
    agent = _agent(tmp_path, pins)
    args = {"spec": _spec(plan, "normalise", 1), "what": "moments", "options": {"bound": 3.0}}

    async def first() -> None:
        await agent.dispatch("begin", {"offer": _offer(config, plan, _params())})
        await _ingested(agent)
        own = (await agent.dispatch("dca_identity", {}))["key"]
        frames = await agent.dispatch("dca_setup", {"config": config, "node_keys": keys})
        roster = _attestations(config, keys, frames, own)
        await agent.dispatch("dca_roster", {"attestations": roster})
        assert await agent.dispatch("dca_contribute", args)

    asyncio.run(first())
    again = _agent(tmp_path, pins)  # the agent restarted: only its store remembers

    async def second() -> None:
        await again.dispatch("begin", {"offer": _offer(config, plan, _params())})
        await _ingested(again)
        own = (await again.dispatch("dca_identity", {}))["key"]
        frames = await again.dispatch("dca_setup", {"config": config, "node_keys": keys})
        roster = _attestations(config, keys, frames, own)
        await again.dispatch("dca_roster", {"attestations": roster})
        with pytest.raises(ValueError, match="all used"):
            await again.dispatch("dca_contribute", args | {"spec": _spec(plan, "normalise", 2)})
        scan = {"spec": _spec(plan, "scan", 3), "what": "sketch", "options": dict(SKETCH)}
        assert await again.dispatch("dca_contribute", scan)  # a round it has not paid: served

    asyncio.run(second())
    labels = sorted(e["label"] for r in agent_rows(again) for e in r["events"])
    assert labels == ["normalise (secure sum)", "scan (secure sum)"]


def _owner_1_limited(run: str, params: Any, seed: int) -> tuple[Any, Any, dict[str, int]]:
    """small_scenario(3)'s market with owner-1 limited to 3 distinct points, run in-process:
    the curator, the transport and each owner's distinct points delivered."""
    scenario = small_scenario(3)
    curator = small_curator(run, scenario, small_params(scenario, **params), 0)
    owners = [
        Owner(n, run, X, y, rng=np.random.default_rng([seed, i]),
              point_limit=3 if n == "owner-1" else None)
        for i, (n, (X, y)) in enumerate(zip(scenario.owner_names, scenario.owners, strict=True))
    ]  # fmt: skip
    transport = LoopbackTransport([curator, *owners])
    transport.send(curator.start())
    transport.run_until(lambda: curator.state in ("done", "refused"))
    assert all(o._point_limit is None for o in owners[1:])
    return curator, transport, {o.name: int(np.count_nonzero(o._deliveries)) for o in owners}


def test_an_owner_never_delivers_more_points_than_its_limit() -> None:
    """The curator keeps asking for points (p = 10 from 4 owners); owner-1's own limit of 3
    distinct points holds whatever it is asked."""
    herding = {
        "summary_release": "herding", "validation_release": "gaussian",
        "auction_variant": "pure", "tau": 1, "eps_auction": 1e-6, "max_deliveries": 1,
        "final_selection": "exact", "explore_share": 1.0,
    }  # fmt: skip
    _, _, delivered = _owner_1_limited("limit-run", herding, 5)
    assert delivered["owner-1"] <= 3
    assert sum(delivered.values()) > 3  # the others kept selling: the limit is owner-1's


def test_random_select_quotas_respect_an_owners_point_limit() -> None:
    """The default mechanism (random-select) splits its budget by the counts the owners send;
    an owner with its own point limit counts only what it may sell, so the quotas never ask it
    beyond its limit and the rest of the budget goes to the others: the whole budget is bought."""
    from dpmarket.protocol.summary.random_select import plan_random_select

    curator, transport, delivered = _owner_1_limited("limit-random", plan_random_select(10, 40), 6)
    assert curator.state == "done" and not transport.errors
    assert delivered["owner-1"] <= 3
    assert sum(delivered.values()) == 40  # owner-1's share went to the others

"""A dishonest market against a real owner agent process (issue 36): one lie per test.

The owner is ``dpmarket owner serve`` in its own OS process, with its own configuration,
certificates, pins and ledger store (tests/integration/remote_setup.py ``build``); the market
is a :class:`~dpmarket.actors.remote.gateway.Gateway` in this process, which makes whatever
calls a market can make, with whatever values it likes. The compute nodes are honest: the test
plays them with the protocol's own :class:`ComputeNode` and the node keys the build made (the
owner pinned their fingerprints). Each lie is declined (the offer) or refused (a call) with its
reason named, and the owner's store holds no charge for the lying purchase. The market uses
only what a market has: the owners' public schema, the public configuration, and the frames
and answers that reach it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from dpmarket.actors.remote import tls
from dpmarket.actors.remote.control import AgentUnavailable
from dpmarket.actors.remote.gateway import Gateway
from dpmarket.actors.remote.nodeagent import node_key
from dpmarket.protocol.agents.records import record
from dpmarket.protocol.privacy.ledger import record_relation
from dpmarket.protocol.securesum.client import Client
from dpmarket.protocol.securesum.fixedpoint import grid_sensitivity
from dpmarket.protocol.securesum.node import ComputeNode, owner_attestation
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.securesum.spec import DcaConfig, RoundSpec
from dpmarket.protocol.summary.params import CuratorParams
from dpmarket.protocol.summary.snr import contribution_sensitivity
from dpmarket.protocol.wire.codec import decode
from tests.integration.remote_setup import RemoteMarket, build, charged_rows

OWNER = "owner-1"
K = 13  # the wine data's features (configs/remote/data)
LOWER = [10.0, 0.0, 1.0, 5.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0]
UPPER = [16.0, 6.0, 4.0, 32.0, 18.0, 4.0, 6.0, 1.0, 4.0, 14.0, 2.0, 4.5, 18.0]
BOUND = 18.0
SKETCH = {"family": "l2", "rows": 8, "width": 32, "seed": 0, "bandwidth": 1.0}
T = TypeVar("T")


@dataclasses.dataclass
class Market:
    """The lying market's side: its gateway (on its own event loop thread), the built
    directory, and the honest nodes' keys the test plays them with."""

    built: RemoteMarket
    gateway: Gateway
    loop: asyncio.AbstractEventLoop
    nodes: dict[str, X25519PrivateKey]
    purchases: int = 0

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def invoke(self, method: str, *args: Any) -> Any:
        return self.call(self.gateway.invoke(OWNER, method, args))

    def store_rows(self, ledger_run: str) -> list[dict[str, Any]]:
        store = self.built.store(OWNER)  # release ids are LEDGER_RUN:...
        return [r for r in charged_rows(store) if str(r["release"]).startswith(f"{ledger_run}:")]

    def log(self) -> str:
        return self.built.log(OWNER).read_text(errors="replace")


@pytest.fixture(scope="module", name="m")
def _market(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Market]:
    built = build(tmp_path_factory.mktemp("hostile"), owners=4)
    built.set_policy(
        OWNER, min_tolerance=1, hide_count=True, rounds="{ normalise = 1, scan = 1, refresh = 0 }"
    )
    pki = built.root / "pki"
    declared = {OWNER: ("owner", tls.fingerprint((pki / f"{OWNER}.crt").read_bytes()))}
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    gateway = Gateway(
        built.name, f"127.0.0.1:{built.port}", (pki / "market.crt").read_bytes(),
        (pki / "market.key").read_bytes(), (pki / "ca.crt").read_bytes(), declared,
        call_timeout=60.0,
    )  # fmt: skip
    nodes = {n: node_key(str(built.root / n / "certs" / f"{n}.x25519")) for n in built.nodes}
    m = Market(built, gateway, loop, nodes)
    try:
        m.call(gateway.start())
        built.start_agent(OWNER, give_up=120.0)
        assert m.call(gateway.joined(120.0, [OWNER])) == {OWNER: True}, m.log()
        yield m
        m.call(gateway.finish("complete", finished=True, grace=2.0))
        assert built.wait_agents([OWNER], timeout=60) == {OWNER: 0}
    finally:
        built.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


# ---------------------------------------------------------------------- the market's offers
def _session(m: Market, clients: int = 4, tolerance: int = 1) -> DcaConfig:
    roster = tuple(f"owner-{i}" for i in range(1, clients + 1))
    return DcaConfig(f"{m.built.name}-dca", roster, tuple(m.nodes), tolerance=tolerance,
                     bound=1e6, frac_bits=24)  # fmt: skip


def _plan(
    config: DcaConfig,
    lie: float = 1.0,
    relation: str = "replace",
    bound: float = BOUND,
    declared_bound: float = BOUND,
    d_scan: int | None = None,
    refresh: int = 0,
    eps: float = 0.5,
) -> SecureSumPlan:
    """The rounds a market plans: each sensitivity declared as the honest figure (for
    ``declared_bound``) over ``lie``, sigma calibrated to what it declares."""
    moments = (
        contribution_sensitivity(
            "moments", 2 * K + 1, {"bound": declared_bound}, K, neighbouring=relation
        )
        / lie
    )
    d_sketch = SKETCH["rows"] * SKETCH["width"]  # type: ignore[operator]
    sketch = contribution_sensitivity("sketch", d_sketch, SKETCH, K, neighbouring=relation) / lie
    rounds: dict[str, tuple[str, int, float, float, int, dict[str, Any]]] = {
        "normalise": ("moments", 2 * K + 1, eps, moments, 1, {"bound": bound}),
        "scan": ("sketch", d_scan or d_sketch, eps, sketch, 1, SKETCH),
    }
    if refresh:
        rounds["refresh"] = ("sketch_delta", d_sketch, 0.5, sketch, refresh, SKETCH)
    return SecureSumPlan.calibrated(
        config, 1e-5, rounds, neighbouring=record_relation(relation),
        per_round={"refresh": ("base_rounds",)},
    )  # fmt: skip


def _params(**kw: Any) -> CuratorParams:
    """Herding-select's public parameters (the market's steering mechanism), changed by ``kw``."""
    herding = {"p": 10, "auction_variant": "pure", "eps_auction": 1e-6,
               "summary_release": "herding", "final_selection": "exact"}  # fmt: skip
    return CuratorParams(**(herding | kw))


def _offer(
    m: Market, params: CuratorParams, config: DcaConfig | None, plan: SecureSumPlan | None
) -> tuple[dict[str, Any], str]:
    m.purchases += 1
    ledger_run = f"lie-{m.purchases}"
    offer = {
        "market": m.built.name, "run": f"{m.built.name}-{m.purchases}", "params": record(params),
        "dca": None if config is None else record(config),
        "plan": None if plan is None else record(plan), "ledger_run": ledger_run,
        "schema": {"n_features": K, "lower": LOWER, "upper": UPPER, "label_column": K,
                   "policy": "clip"},
    }  # fmt: skip
    return offer, ledger_run


def _declined(m: Market, params: CuratorParams, config: Any, plan: Any) -> tuple[str, str]:
    offer, ledger_run = _offer(m, params, config, plan)
    answer = m.invoke("begin", offer)
    assert answer["accepted"] is False, answer
    return " ".join(answer["reasons"]), ledger_run


def _accepted(m: Market, config: DcaConfig, plan: SecureSumPlan) -> tuple[str, list[bytes], bytes]:
    """An offer the owner accepts, its registrations (the session set up) and its key."""
    offer, ledger_run = _offer(m, _params(), config, plan)
    assert m.invoke("begin", offer)["accepted"] is True
    own = m.invoke("dca_identity", OWNER)["key"]
    publics = {n: k.public_key().public_bytes_raw() for n, k in m.nodes.items()}
    frames = m.invoke("dca_setup", OWNER, config, publics)
    assert frames, m.log()
    return ledger_run, frames, own


def _attest(
    m: Market,
    config: DcaConfig,
    frames: list[bytes],
    own: bytes,
    others: tuple[str, ...],
    checked: bool = True,
) -> dict[str, Any]:
    """The honest nodes' attestations to owner-1 after its registration (its key ``own``
    pinned, as its signature proves it) and ``others``' (theirs pinned too)."""
    publics = {n: k.public_key().public_bytes_raw() for n, k in m.nodes.items()}
    identities = {o: X25519PrivateKey.generate() for o in others}
    pinned = {o: k.public_key().public_bytes_raw() for o, k in identities.items()} | {OWNER: own}
    nodes = {n: ComputeNode(config, n, k, pinned) for n, k in m.nodes.items()}
    clients = [Client(config, f"client:{o}", publics, (o,), identity=[identities[o]])
               for o in others]  # fmt: skip
    for msg in [*(decode(f) for f in frames), *(x for c in clients for x in c.start())]:
        nodes[msg.recipient].receive(msg)
    return {n: owner_attestation(node.attest(checked), OWNER) for n, node in nodes.items()}


# ---------------------------------------------------------------------- lies in the offer
def test_understated_sensitivities_with_sigma_calibrated_to_them_are_declined(m: Market) -> None:
    config = _session(m)
    reasons, run = _declined(m, _params(), config, _plan(config, lie=20.0))
    own = contribution_sensitivity(
        "moments", 2 * K + 1, {"bound": BOUND}, K, neighbouring="replace"
    )
    assert f"this owner's own figure for what it sends is {own:.6g}" in reasons
    assert "secure sum 'normalise': the market declares L2 sensitivity" in reasons
    assert "secure sum 'scan': the market declares L2 sensitivity" in reasons
    assert m.store_rows(run) == []


def test_another_relation_is_declined_naming_both(m: Market) -> None:
    config = _session(m)
    reasons, run = _declined(m, _params(), config, _plan(config, relation="add_remove"))
    assert f"relation {record_relation('add_remove')!r}, this owner's is " in reasons
    assert m.store_rows(run) == []


def test_a_clip_bound_wider_than_the_declared_sensitivity_is_declined(m: Market) -> None:
    config = _session(m)
    plan = _plan(config, bound=4 * BOUND)  # declares the sensitivity of BOUND, clips at 4 BOUND
    reasons, run = _declined(m, _params(), config, plan)
    assert "secure sum 'normalise': the market declares L2 sensitivity" in reasons
    assert m.store_rows(run) == []


def test_a_sketch_shape_other_than_what_is_sent_is_declined(m: Market) -> None:
    config = _session(m)
    reasons, run = _declined(m, _params(), config, _plan(config, d_scan=512))
    assert "sketch: d = 512, but the sketch has rows x width = 256" in reasons
    assert m.store_rows(run) == []


def test_a_tolerance_below_the_owners_is_declined(m: Market) -> None:
    config = _session(m, tolerance=0)
    reasons, run = _declined(m, _params(), config, _plan(config))
    assert "tolerance: the session tolerates T = 0 dropped or colluding owners, the policy " in (
        reasons
    )
    assert m.store_rows(run) == []


def test_an_extra_round_in_the_offer_is_declined(m: Market) -> None:
    config = _session(m)
    reasons, run = _declined(m, _params(), config, _plan(config, refresh=3))
    assert "secure sum 'refresh': the market plans 3 round(s), the policy admits 0" in reasons
    assert m.store_rows(run) == []


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"allocate": True, "allocation_sigma": 0.5, "max_points": 20, "final_selection": "exact",
          "max_deliveries": 1}, "profile: noise multiplier 0.5 is below the policy's 1"),
        ({"summary_release": "gaussian", "summary_sigma": 0.5},
         "summary: noise multiplier 0.5 is below the policy's 1"),
    ],
)  # fmt: skip
def test_a_profile_or_summary_sigma_below_the_floor_is_declined(
    m: Market, params: dict[str, Any], reason: str
) -> None:
    config = _session(m)
    reasons, run = _declined(m, _params(**params), config, _plan(config))
    assert reason in reasons
    assert m.store_rows(run) == []


def test_a_schedule_that_shows_the_owners_count_is_declined_by_an_owner_hiding_it(
    m: Market,
) -> None:
    """The market offers random-select (the default), under which every owner sees the epochs
    (the largest quota + 1) and its own quota, both functions of every owner's count."""
    config = _session(m)
    random = _params(random_purchase=True, max_points=30, explore_share=0.0)
    reasons, run = _declined(m, random, config, _plan(config))
    assert reasons.startswith("hide_count: random-select: every owner sees the epochs")
    assert m.store_rows(run) == []


# ---------------------------------------------------------------------- lies after the offer
def test_phantom_owners_in_the_roster_are_declined_at_the_attested_roster(m: Market) -> None:
    """The market names 12 owners (8 phantoms), so each share is sigma / sqrt(10); the nodes
    attest the 4 that registered. No round could be released (an honest node needs K - T = 11
    of them), so the owner declines before paying for one; nothing charged."""
    config = _session(m, clients=12)
    plan = _plan(config)
    ledger_run, frames, own = _accepted(m, config, plan)
    attestations = _attest(m, config, frames, own, ("owner-2", "owner-3", "owner-4"))
    with pytest.raises(AgentUnavailable, match=r"declined: roster: .* attest 4 registered owner"):
        m.invoke("dca_roster", OWNER, attestations)
    spec = plan.spec("normalise", 1)
    with pytest.raises(AgentUnavailable, match="declined"):
        m.invoke("dca_contribute", OWNER, spec, "moments", {"bound": BOUND})
    assert m.store_rows(ledger_run) == []


def test_no_round_without_the_nodes_attestation_and_a_forged_one_is_refused(m: Market) -> None:
    config = _session(m)
    plan = _plan(config)
    ledger_run, frames, own = _accepted(m, config, plan)
    spec = plan.spec("normalise", 1)
    with pytest.raises(AgentUnavailable, match="no round before the pinned compute nodes attest"):
        m.invoke("dca_contribute", OWNER, spec, "moments", {"bound": BOUND})
    attestations = _attest(m, config, frames, own, ("owner-2", "owner-3", "owner-4"))
    forged = {n: dict(a) for n, a in attestations.items()}
    forged["node-2"]["admitted"] = [*forged["node-2"]["admitted"], "owner-5"]  # a phantom
    with pytest.raises(AgentUnavailable, match=r"node-2 attests names outside|does not verify"):
        m.invoke("dca_roster", OWNER, forged)
    del attestations["node-3"]  # withheld
    with pytest.raises(AgentUnavailable, match=r"no attestation from compute nodes \['node-3'\]"):
        m.invoke("dca_roster", OWNER, attestations)
    with pytest.raises(AgentUnavailable, match="no round before the pinned compute nodes attest"):
        m.invoke("dca_contribute", OWNER, spec, "moments", {"bound": BOUND})
    assert m.store_rows(ledger_run) == []


def test_nodes_that_did_not_check_the_owners_signatures_are_declined(m: Market) -> None:
    config = _session(m)
    ledger_run, frames, own = _accepted(m, config, _plan(config))
    others = ("owner-2", "owner-3", "owner-4")
    attestations = _attest(m, config, frames, own, others, checked=False)
    with pytest.raises(AgentUnavailable, match="did not check every owner's signature"):
        m.invoke("dca_roster", OWNER, attestations)
    assert m.store_rows(ledger_run) == []


def test_a_call_below_the_floor_or_beyond_the_plan_gets_nothing_and_an_honest_round_is_charged_once(
    m: Market,
) -> None:
    config = _session(m)
    plan = _plan(config)
    ledger_run, frames, own = _accepted(m, config, plan)
    attestations = _attest(m, config, frames, own, ("owner-2", "owner-3", "owner-4"))
    assert m.invoke("dca_roster", OWNER, attestations) == 4
    scan = plan.spec("scan", 1)
    low = RoundSpec(1, scan.d, scan.sigma_std / 2, scan.sensitivity, "scan", scan.neighbouring)
    with pytest.raises(AgentUnavailable, match="below the plan's floor"):
        m.invoke("dca_contribute", OWNER, low, "sketch", dict(SKETCH))
    assert m.store_rows(ledger_run) == []
    moments = {"bound": BOUND}
    assert m.invoke("dca_contribute", OWNER, plan.spec("normalise", 2), "moments", moments)
    with pytest.raises(AgentUnavailable, match="all used"):  # the same round asked again
        m.invoke("dca_contribute", OWNER, plan.spec("normalise", 3), "moments", moments)
    rows = m.store_rows(ledger_run)
    assert len(rows) == 1  # the honest round, at the owner's own price and nothing else
    (event,) = rows[0]["events"]
    own = contribution_sensitivity("moments", 2 * K + 1, moments, K, neighbouring="replace")
    assert event["sensitivity"] == grid_sensitivity(own, 2 * K + 1, config.frac_bits)
    assert event["parameters"]["sigma"] == plan.rounds["normalise"].sigma_floor


def test_a_warm_up_call_carrying_the_markets_own_work_figure_is_refused(
    m: Market, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner's warm-up takes nothing from the market (it hashes its own records for its
    own accepted plan's sketches); a market that sends a figure of its own with the call (a
    work estimate, to steer what the owner does before the rounds) gets the call refused
    naming the argument (the gateway's default, 0.0, and the owner's error), nothing is
    charged, and the owner's own warm-up still answers."""
    from dpmarket.actors.remote import control

    config = _session(m)
    ledger_run, _, _ = _accepted(m, config, _plan(config))
    honest = control.METHODS[("owner", "warm_up")]
    lying = (lambda args: {"work_per_record": 10**12}, *honest[1:])
    monkeypatch.setitem(control.METHODS, ("owner", "warm_up"), lying)
    m.gateway.errors.pop(OWNER, None)
    assert m.invoke("warm_up") == 0.0  # no answer: the absent value
    [refused] = m.gateway.errors[OWNER]
    assert "warm_up failed" in refused and "work_per_record" in refused
    monkeypatch.setitem(control.METHODS, ("owner", "warm_up"), honest)
    assert m.invoke("warm_up") >= 0.0
    assert m.gateway.errors[OWNER] == [refused]  # the honest call: no further error
    assert m.store_rows(ledger_run) == []

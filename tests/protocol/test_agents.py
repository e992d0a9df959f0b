"""protocol/agents: control values cross the wire only as checked values, and an owner's policy
names every way an offer exceeds it."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from dpmarket.protocol.agents.messages import CallBody, EndBody, HelloBody, ReplyBody
from dpmarket.protocol.agents.policy import OwnerPolicy, planned_purchase, review
from dpmarket.protocol.agents.records import from_record, pack, record, unpack
from dpmarket.protocol.privacy.ledger import PrivacyLedger, record_relation
from dpmarket.protocol.securesum.plan import PlannedRound, SecureSumPlan
from dpmarket.protocol.securesum.spec import DcaConfig, RoundSpec
from dpmarket.protocol.summary.params import CuratorParams
from dpmarket.protocol.summary.snr import planned_owner_ledger
from dpmarket.protocol.wire.codec import Message, ReplayGuard, decode, encode
from dpmarket.protocol.wire.errors import RemoteProtocolError

RELATION = record_relation("replace")  # the market's one relation (actors/run/phases.py)


def _plan(sigma: float = 4.0, sens: float = 2.0, rounds: int = 1) -> SecureSumPlan:
    return SecureSumPlan(
        {
            "normalise": PlannedRound(
                "moments", 7, sigma, sens, rounds, {"bound": 3.0}, neighbouring=RELATION
            ),
            "scan": PlannedRound(
                "sketch", 64, sigma, sens, 1, {"rows": 4, "family": "l2"}, neighbouring=RELATION
            ),
        }
    )


def _policy(**kw: object) -> OwnerPolicy:
    base: dict[str, object] = {
        "epsilon": 5.0,
        "delta": 1e-5,
        "max_points": 10,
        "rounds": {"normalise": 1, "scan": 1},
        "min_noise": {"normalise": 1.5, "scan": 1.5},
    }
    return OwnerPolicy(**(base | kw))  # type: ignore[arg-type]


def test_protocol_values_round_trip_exactly() -> None:
    params = CuratorParams(p=10, center=(0.5, -1.0), scale=(1.0, 2.0), max_points=30)
    config = DcaConfig(
        "m-dca", ("owner-1", "owner-2", "owner-3"), ("node-1", "node-2"), tolerance=1
    )
    spec = RoundSpec(3, 64, 2.5, 1.0, "scan")
    for value in (params, config, spec, _plan()):
        back = from_record(type(value), unpack(pack(record(value)), "value"), "value")
        assert back == value


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"p": 10, "surprise": 1}, "unknown fields ['surprise']"),
        ({"p": "10"}, "params.p: expected an integer"),
        ({"p": True}, "params.p: expected an integer"),
        ({"p": 10, "gamma": float("nan")}, "params.gamma: nan is not finite"),
        ({"p": 10, "center": [1.0, "x"]}, "params.center[1]: expected a number"),
        ({"p": 0}, "params: "),  # the dataclass's own check runs after the types
        ([1, 2], "params: expected a map"),
    ],
)
def test_a_record_is_refused_field_by_field(raw: object, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match=message.replace("[", r"\[").replace("]", r"\]")):
        from_record(CuratorParams, raw, "params")


def test_unpack_refuses_what_the_frame_limits_refuse() -> None:
    with pytest.raises(RemoteProtocolError, match="not part of the protocol"):
        unpack(msgpack.packb(msgpack.ExtType(1, b"x")), "args")
    with pytest.raises(RemoteProtocolError, match="args"):
        unpack(b"\xc1", "args")  # never a msgpack byte
    deep: object = 1
    for _ in range(40):
        deep = [deep]
    with pytest.raises(RemoteProtocolError, match="args"):
        unpack(pack(deep), "args")
    with pytest.raises(RemoteProtocolError, match="expected bytes"):
        unpack("text", "args")


def test_agent_frames_cross_the_codec_with_the_replay_guard() -> None:
    guard = ReplayGuard()
    bodies = [
        HelloBody("owner", "dpmarket 1"),
        CallBody(1, "status", pack({})),
        ReplyBody(1, pack({"state": "idle"})),
        ReplyBody(2, declined=True, error="cap"),
        EndBody("complete"),
    ]
    for seq, body in enumerate(bodies, 1):
        msg = decode(encode(Message("m", 0, "owner-1", "market", seq, body)), guard)
        assert msg.body == body
    with pytest.raises(RemoteProtocolError, match="seq"):  # a replayed frame
        decode(encode(Message("m", 0, "owner-1", "market", 2, bodies[0])), guard)


def test_review_accepts_an_offer_within_the_policy() -> None:
    assert review(_policy(), _plan(), CuratorParams(p=10)) == []


def test_review_names_every_excess() -> None:
    params = CuratorParams(
        p=10,
        allocate=True,
        allocation_sigma=0.5,
        max_points=20,
        final_selection="exact",
        max_deliveries=1,
    )
    reasons = review(_policy(min_noise={"normalise": 3.0, "profile": 1.0}), _plan(rounds=2), params)
    assert any("'normalise'" in r and "plans 2 round(s)" in r and "admits 1" in r for r in reasons)
    assert any("'normalise'" in r and "multiplier 2 is below the policy's 3" in r for r in reasons)
    assert any(r.startswith("profile: noise multiplier 0.5") for r in reasons)
    # a round the policy does not list is admitted zero times
    no_scan = review(_policy(rounds={"normalise": 1}), _plan(), CuratorParams(p=10))
    assert no_scan == ["secure sum 'scan': the market plans 1 round(s), the policy admits 0"]
    gaussian = CuratorParams(p=10, summary_release="gaussian", summary_sigma=0.8)
    assert review(_policy(min_noise={"summary": 1.0}), None, gaussian) == [
        "summary: noise multiplier 0.8 is below the policy's 1"
    ]


def test_a_policy_refuses_nonsense_by_key() -> None:
    with pytest.raises(ValueError, match=r"policy\.rounds\.sketch"):
        _policy(rounds={"sketch": 1})
    with pytest.raises(ValueError, match=r"policy\.min_noise\.scan"):
        _policy(min_noise={"scan": -1.0})
    with pytest.raises(ValueError, match=r"policy\.epsilon"):
        _policy(epsilon=0.0)
    with pytest.raises(ValueError, match=r"policy\.max_points"):
        _policy(max_points=-1)


def test_the_planned_purchase_counts_every_round_at_its_floor_and_the_summary_plan() -> None:
    params = CuratorParams(p=10, auction_variant="pure", eps_auction=0.01)
    events = planned_purchase(_plan(sigma=4.0, sens=2.0, rounds=2), params)
    ledger = PrivacyLedger("owner", events)
    expected = PrivacyLedger("owner")
    expected.gaussian(4.0, 2.0, count=2, label="normalise", neighbouring=RELATION)
    expected.gaussian(4.0, 2.0, count=1, label="scan", neighbouring=RELATION)
    for e in planned_owner_ledger(params).events:
        expected.record(e)
    assert ledger.epsilon(1e-5) == pytest.approx(expected.epsilon(1e-5))
    assert sum(e.count for e in events if e.label == "normalise") == 2
    # a wider plan costs more: the review's cap check sees it
    wider = PrivacyLedger("owner", planned_purchase(_plan(sigma=2.0, sens=2.0, rounds=2), params))
    assert wider.epsilon(1e-5) > ledger.epsilon(1e-5)


def test_records_skip_derived_fields() -> None:
    @dataclasses.dataclass(frozen=True)
    class WithDerived:
        a: int
        b: int = dataclasses.field(init=False, default=0)

    assert record(WithDerived(3)) == {"a": 3}

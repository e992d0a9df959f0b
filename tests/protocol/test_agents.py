"""protocol/agents: control values cross the wire only as checked values, and an owner's policy
names every way an offer exceeds it."""

from __future__ import annotations

import dataclasses
import math

import msgpack
import numpy as np
import pytest

from dpmarket.protocol.agents.messages import CallBody, EndBody, HelloBody, ReplyBody
from dpmarket.protocol.agents.policy import OwnerPolicy, planned_purchase, price_rounds, review
from dpmarket.protocol.agents.records import from_record, pack, record, unpack
from dpmarket.protocol.privacy.dgauss import sample_discrete_gaussian
from dpmarket.protocol.privacy.ledger import PrivacyLedger, record_relation
from dpmarket.protocol.securesum.fixedpoint import grid_sensitivity
from dpmarket.protocol.securesum.plan import PlannedRound, SecureSumPlan
from dpmarket.protocol.securesum.spec import DcaConfig, RoundSpec
from dpmarket.protocol.summary.params import CuratorParams
from dpmarket.protocol.summary.snr import (
    moments_sensitivity,
    planned_owner_ledger,
    sketch_sensitivity,
)
from dpmarket.protocol.wire.codec import Message, ReplayGuard, decode, encode
from dpmarket.protocol.wire.errors import RemoteProtocolError

RELATION = record_relation("replace")  # the market's one relation (actors/run/phases.py)
K_FEATURES = 3
SKETCH = {"family": "l2", "rows": 4, "width": 16, "seed": 0, "bandwidth": 1.0}
SESSION = DcaConfig(
    "m-dca", tuple(f"owner-{i}" for i in range(1, 5)), ("node-1", "node-2"), tolerance=1,
    bound=1e4, frac_bits=24,
)  # fmt: skip
# the owner's own figures for what it sends: k = 3 features clipped to 3, a 4 x 16 sketch
MOMENTS_SENS = moments_sensitivity(K_FEATURES, 3.0, neighbouring="replace")  # about 16.5
SKETCH_SENS = sketch_sensitivity(4, neighbouring="replace")  # sqrt(8)


def _plan(
    mult: float = 2.0, rounds: int = 1, *, lie: float = 1.0, relation: str = RELATION
) -> SecureSumPlan:
    """An offer's plan at noise multiplier ``mult`` of the sensitivity it declares, which is
    the true one divided by ``lie`` (sigma calibrated to the lie)."""
    moments, sketch = MOMENTS_SENS / lie, SKETCH_SENS / lie
    return SecureSumPlan(
        {
            "normalise": PlannedRound(
                "moments", 2 * K_FEATURES + 1, mult * moments, moments, rounds, {"bound": 3.0},
                neighbouring=relation,
            ),
            "scan": PlannedRound(
                "sketch", 64, mult * sketch, sketch, 1, SKETCH, neighbouring=relation
            ),
        }
    )  # fmt: skip


def _review(policy: OwnerPolicy, plan: SecureSumPlan | None, params: CuratorParams) -> list[str]:
    return review(policy, plan, params, SESSION if plan is not None else None, K_FEATURES)


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
    assert _review(_policy(), _plan(), CuratorParams(p=10)) == []


def test_review_names_every_excess() -> None:
    params = CuratorParams(
        p=10,
        allocate=True,
        allocation_sigma=0.5,
        max_points=20,
        final_selection="exact",
        max_deliveries=1,
    )
    policy = _policy(min_noise={"normalise": 3.0, "profile": 1.0})
    reasons = _review(policy, _plan(rounds=2), params)
    assert any("'normalise'" in r and "plans 2 round(s)" in r and "admits 1" in r for r in reasons)
    assert any(
        "'normalise'" in r and "multiplier 2 (sigma" in r and "policy's 3" in r for r in reasons
    )
    assert any(r.startswith("profile: noise multiplier 0.5") for r in reasons)
    # a round the policy does not list is admitted zero times
    no_scan = _review(_policy(rounds={"normalise": 1}), _plan(), CuratorParams(p=10))
    assert no_scan == ["secure sum 'scan': the market plans 1 round(s), the policy admits 0"]
    gaussian = CuratorParams(p=10, summary_release="gaussian", summary_sigma=0.8)
    assert _review(_policy(min_noise={"summary": 1.0}), None, gaussian) == [
        "summary: noise multiplier 0.8 is below the policy's 1"
    ]


def test_a_sensitivity_understated_with_sigma_calibrated_to_it_is_declined_by_name() -> None:
    """The dishonest market of issue 36: every declared multiplier looks honest (2.0), but the
    sensitivities are 20x too small; the owner's own figure names the lie."""
    reasons = _review(_policy(), _plan(lie=20.0), CuratorParams(p=10))
    assert len(reasons) == 2
    assert "secure sum 'normalise': the market declares L2 sensitivity 0.8" in reasons[0]
    assert f"own figure for what it sends is {MOMENTS_SENS:.6g}" in reasons[0]
    assert "secure sum 'scan'" in reasons[1] and f"{SKETCH_SENS:.6g}" in reasons[1]
    # the old test's offer: sensitivity 2.0 declared for bound 3 and k = 3 (really about 16.5)
    lie = MOMENTS_SENS / 2.0
    assert any(
        "declares L2 sensitivity 2," in r
        for r in _review(_policy(), _plan(lie=lie), CuratorParams(p=10))
    )
    # a sensitivity overstated is declined too: what is declared must be what is sent
    assert _review(_policy(), _plan(lie=0.5), CuratorParams(p=10)) != []


@pytest.mark.parametrize(
    ("round_", "message"),
    [
        (PlannedRound("moments", 9, 40.0, MOMENTS_SENS, 1, {"bound": 3.0}, RELATION),
         "moments: d = 9, but 3 features give 2k + 1 = 7"),
        (PlannedRound("moments", 7, 40.0, MOMENTS_SENS, 1, {"bound": 3.0, "rows": 1}, RELATION),
         "moments: options ['bound', 'rows'], expected ['bound']"),
        (PlannedRound("sketch", 128, 6.0, SKETCH_SENS, 1, SKETCH, RELATION),
         "sketch: d = 128, but the sketch has rows x width = 64"),
        (PlannedRound("sketch", 64, 6.0, SKETCH_SENS, 1, {"rows": 4, "width": 16}, RELATION),
         "sketch: options ['rows', 'width'], expected"),
        (PlannedRound("histogram", 64, 6.0, SKETCH_SENS, 1, {}, RELATION),
         "contribution 'histogram' is not one of"),
    ],
)  # fmt: skip
def test_a_shape_or_options_other_than_what_the_owner_sends_is_declined(
    round_: PlannedRound, message: str
) -> None:
    plan = SecureSumPlan({"normalise": round_})
    reasons = _review(_policy(rounds={"normalise": 1}), plan, CuratorParams(p=10))
    assert any(message in r for r in reasons), reasons


def test_the_relation_is_the_owners_own() -> None:
    add_remove = record_relation("add_remove")
    reasons = _review(_policy(), _plan(relation=add_remove), CuratorParams(p=10))
    assert f"relation {add_remove!r}, this owner's is {RELATION!r}" in reasons[0]
    params = CuratorParams(p=10, neighbouring="add_remove")
    assert _review(_policy(), _plan(), params) == [
        "relation: the curator's parameters say 'add_remove', this owner's is 'replace'"
    ]
    with pytest.raises(ValueError, match=r"policy\.neighbouring"):
        _policy(neighbouring="replace-one")


def test_t_colluders_and_the_attested_roster_are_priced_by_the_owner() -> None:
    reasons = _review(_policy(min_tolerance=2), _plan(mult=4.0), CuratorParams(p=10))
    assert reasons[0] == (
        "tolerance: the session tolerates T = 1 dropped or colluding owners, the policy needs "
        "at least 2"
    )
    # K = 4, T = 1: each share is sigma / sqrt(2). With 2 owners on the market's side, one
    # share of the K - T = 3 released is unknown to it: sigma / sqrt(2)
    two = _policy(max_colluders=2)
    prices, reasons = price_rounds(two, _plan(mult=4.0), SESSION, K_FEATURES)
    assert prices["scan"].ratio == pytest.approx(math.sqrt(1 / 2))
    assert prices["scan"].sigma == pytest.approx(4.0 * SKETCH_SENS / math.sqrt(2))
    assert reasons == []
    _, reasons = price_rounds(two, _plan(mult=2.0), SESSION, K_FEATURES)
    assert any("noise multiplier 1.414 (sigma" in r and "from 1 unknown share(s)" in r
               for r in reasons)  # fmt: skip
    _, reasons = price_rounds(_policy(max_colluders=3), _plan(), SESSION, K_FEATURES)
    assert reasons[-1].startswith("roster: K = 4 owners, T = 1 absent and 3 colluding")
    # the nodes attest fewer registered owners than a round needs (K - T = 3): declined
    _, reasons = price_rounds(_policy(), _plan(), SESSION, K_FEATURES, roster=2)
    assert reasons == [
        "roster: the pinned compute nodes attest 2 registered owner(s) of the 4 the offer "
        "names; a round needs K - T = 3, so none could be released"
    ]
    # the Theorem's one curious owner: exactly the plan's floor
    prices, _ = price_rounds(_policy(), _plan(), SESSION, K_FEATURES, roster=4)
    assert prices["normalise"].ratio == 1.0
    assert prices["normalise"].sigma == _plan().rounds["normalise"].sigma_floor


def test_the_guaranteed_sigma_is_the_noise_the_market_does_not_know() -> None:
    """Noise scale: with T absent and C colluding owners, the K - T - C shares the market does
    not know (each drawn as every client draws it, discrete Gaussian on the grid) have the
    standard deviation the owner prices and charges; a price off by a factor of two fails."""
    plan = _plan(mult=4.0)
    prices, _ = price_rounds(_policy(max_colluders=2), plan, SESSION, K_FEATURES)
    spec = plan.spec("scan", 1)
    rng = np.random.default_rng(7)
    unknown = len(SESSION.clients) - SESSION.tolerance - 2
    shares = sample_discrete_gaussian(SESSION.client_grid_sigma(spec), (unknown, 200_000), rng)
    measured = float(shares.sum(axis=0).std()) * SESSION.codec.resolution
    assert measured == pytest.approx(prices["scan"].sigma, rel=0.02)
    for wrong in (2 * prices["scan"].sigma, prices["scan"].sigma / 2):  # a scale off by two
        assert measured != pytest.approx(wrong, rel=0.2)
    assert measured < spec.sigma_std * 0.8  # the declared sigma is not what the market leaves


def test_an_owner_hiding_its_count_declines_the_mechanisms_that_show_it() -> None:
    policy = _policy(hide_count=True)
    herding = CuratorParams(p=10, summary_release="herding", final_selection="exact")
    assert herding.mechanism == "herding-select"
    assert _review(policy, _plan(), herding) == []
    random = CuratorParams(p=10, random_purchase=True, max_points=30, final_selection="exact",
                           explore_share=0.0)  # fmt: skip
    assert _review(_policy(), _plan(), random) == []
    for params in (
        random,
        CuratorParams(p=10, allocate=True, allocation_sigma=2.0, max_points=20,
                      final_selection="exact", max_deliveries=1),
        CuratorParams(p=10, summary_release="herding", final_selection="exact", max_points=20,
                      max_deliveries=3),
        CuratorParams(p=10),  # mwem: a mechanism no market config selects, so not vouched for
    ):  # fmt: skip
        reasons = _review(policy, _plan(), params)
        assert len(reasons) == 1 and reasons[0].startswith(f"hide_count: {params.mechanism}: ")


def test_a_coarse_grid_is_charged_at_its_sensitivity() -> None:
    coarse = dataclasses.replace(SESSION, frac_bits=2)
    prices, _ = price_rounds(_policy(), _plan(), coarse, K_FEATURES)
    assert prices["scan"].charged == pytest.approx(SKETCH_SENS + math.sqrt(64) / 4)
    assert prices["scan"].multiplier < 2.0 / 1.5  # the grid's rounding is in the price


def test_a_policy_refuses_nonsense_by_key() -> None:
    with pytest.raises(ValueError, match=r"policy\.rounds\.sketch"):
        _policy(rounds={"sketch": 1})
    with pytest.raises(ValueError, match=r"policy\.min_noise\.scan"):
        _policy(min_noise={"scan": -1.0})
    with pytest.raises(ValueError, match=r"policy\.epsilon"):
        _policy(epsilon=0.0)
    with pytest.raises(ValueError, match=r"policy\.max_points"):
        _policy(max_points=-1)
    with pytest.raises(ValueError, match=r"policy\.min_tolerance"):
        _policy(min_tolerance=-1)


def test_the_planned_purchase_counts_every_round_at_the_owners_price_and_the_summary_plan() -> None:
    params = CuratorParams(p=10, auction_variant="pure", eps_auction=0.01)
    plan = _plan(mult=4.0, rounds=2)
    policy = _policy(rounds={"normalise": 2, "scan": 1})
    prices, _ = price_rounds(policy, plan, SESSION, 3)
    events = planned_purchase(prices, plan, params)
    ledger = PrivacyLedger("owner", events)
    expected = PrivacyLedger("owner")
    moments = grid_sensitivity(MOMENTS_SENS, 7, SESSION.frac_bits)  # on the grid
    sketch = grid_sensitivity(SKETCH_SENS, 64, SESSION.frac_bits)
    expected.gaussian(4.0 * MOMENTS_SENS, moments, count=2, label="normalise",
                      neighbouring=RELATION)  # fmt: skip
    expected.gaussian(4.0 * SKETCH_SENS, sketch, count=1, label="scan", neighbouring=RELATION)
    for e in planned_owner_ledger(params).events:
        expected.record(e)
    assert ledger.epsilon(1e-5) == pytest.approx(expected.epsilon(1e-5))
    assert sum(e.count for e in events if e.label == "normalise") == 2
    # a wider plan costs more: the review's cap check sees it
    wide = _plan(mult=2.0, rounds=2)
    wider = planned_purchase(price_rounds(policy, wide, SESSION, 3)[0], wide, params)
    assert PrivacyLedger("owner", wider).epsilon(1e-5) > ledger.epsilon(1e-5)
    # an owner that assumes more colluders charges more than the plan's floor says
    two = dataclasses.replace(policy, max_colluders=2)
    more = planned_purchase(price_rounds(two, plan, SESSION, 3)[0], plan, params)
    assert PrivacyLedger("owner", more).epsilon(1e-5) > ledger.epsilon(1e-5)


def test_records_skip_derived_fields() -> None:
    @dataclasses.dataclass(frozen=True)
    class WithDerived:
        a: int
        b: int = dataclasses.field(init=False, default=0)

    assert record(WithDerived(3)) == {"a": 3}

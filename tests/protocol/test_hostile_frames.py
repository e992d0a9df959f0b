"""Hostile frames against every party state (issue 14, item 2): a frame whose body holds
arbitrary values (negative, huge and non-finite numbers, 1e39 coordinates, arrays of wrong
shapes and dtypes, missing and extra keys) or arbitrary bytes is either handled or refused with
RemoteProtocolError, never anything else; a refused frame leaves the party exactly as it was."""

from __future__ import annotations

import copy
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpmarket.protocol.securesum.driver import DcaSession
from dpmarket.protocol.securesum.spec import DcaConfig, RoundSpec
from dpmarket.protocol.summary.curator import Curator
from dpmarket.protocol.summary.messages import BidBody, DeliverBody, EpochBody
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.wire.checks import ALLOWED_DTYPES
from dpmarket.protocol.wire.codec import Message, decode, encode
from dpmarket.protocol.wire.errors import RemoteProtocolError
from dpmarket.protocol.wire.parties import Party
from tests.small import small_curator, small_params, small_scenario

EDGE_INTS = [-1, 0, 1, 2, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]
EDGE_FLOATS = [0.0, -0.0, 1e39, -3.5e38, 3.4e38, 1e308, float("inf"), float("nan"), 5e-324]


# ----------------------------------------------------------------------------- the state
def state_of(obj: object, seen: dict[int, object] | None = None) -> object:
    """Everything a party holds, as comparable plain values (arrays by bytes, sets sorted).
    ``seen`` keeps every visited object alive, so that no id is reused during one walk."""
    seen = {} if seen is None else seen
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    if isinstance(obj, np.ndarray):
        return ("array", obj.dtype.str, obj.shape, obj.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.random.Generator):
        return ("rng", repr(obj.bit_generator.state))
    if id(obj) in seen:
        return ("seen", type(obj).__name__)
    seen[id(obj)] = obj
    if isinstance(obj, dict):
        return ("dict", [(state_of(k, seen), state_of(v, seen)) for k, v in obj.items()])
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [state_of(v, seen) for v in obj])
    if isinstance(obj, (set, frozenset)):
        return ("set", sorted(repr(state_of(v, seen)) for v in obj))
    fields = dict(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if isinstance(slot, str) and hasattr(obj, slot):
                fields[slot] = getattr(obj, slot)
    if fields:
        return (type(obj).__name__, state_of(fields, seen))
    return (type(obj).__name__, id(obj))  # immutable leaves: keys, ciphers, bound methods


# ------------------------------------------------------------------------- the frames
def wire_array(dtype: str, shape: list[int], fill: float) -> dict[str, object]:
    arr = np.full(shape, fill if np.dtype(dtype).kind == "f" else 1, dtype=np.dtype(dtype))
    return {"dtype": dtype, "shape": shape, "data": arr.tobytes()}


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(EDGE_INTS),
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from(EDGE_FLOATS),
    st.floats(),
    st.text(max_size=4),
    st.binary(max_size=8),
)
arrays = st.builds(
    wire_array,
    st.sampled_from(sorted(ALLOWED_DTYPES)),
    st.lists(st.integers(0, 5), max_size=3),
    st.sampled_from(EDGE_FLOATS),
)
values = st.one_of(scalars, arrays, st.lists(scalars, max_size=3))


def body_map(body: object) -> dict[str, Any]:
    """The wire map of a valid body (the encoder's own output)."""
    msg = Message("r", 1, "a", "b", 1, body)  # type: ignore[arg-type]
    raw: dict[str, Any] = msgpack.unpackb(encode(msg), raw=False)["body"]
    return raw


def near(shape: list[int]) -> st.SearchStrategy[object]:
    """Values close to valid ones: edge numbers, arrays of the expected shape with hostile
    contents or dtypes, and anything at all."""
    dtypes = st.sampled_from(sorted(ALLOWED_DTYPES))
    fills = st.sampled_from(EDGE_FLOATS)
    shaped = st.builds(wire_array, dtypes, st.just(shape), fills)
    reals = st.builds(wire_array, st.sampled_from(["<f8", "<f4"]), st.just(shape), fills)
    hostile_ints = st.sampled_from([-1, -(2**63), 2**63, 2**64 - 1, 2**53 + 1])
    edges = st.sampled_from(EDGE_INTS) | st.sampled_from(EDGE_FLOATS)
    return st.one_of(hostile_ints, reals, edges, shaped, values)


@st.composite
def hostile_bodies(
    draw: st.DrawFn, valid: dict[str, Any], keys: list[str], shape: list[int] | None = None
) -> dict[str, Any]:
    """A valid body with some fields set to arbitrary values, some removed, some added."""
    body = dict(valid)
    for key in [k for k in keys if draw(st.booleans())] or keys[:1]:
        if draw(st.integers(0, 5)) == 0:
            body.pop(key, None)
        else:
            body[key] = draw(near(shape or [2]))
    if draw(st.integers(0, 9)) == 0:
        body[draw(st.text(min_size=1, max_size=3))] = draw(values)
    return body


def frame(kind: str, sender: str, recipient: str, round_: int, body: object) -> bytes:
    envelope = {"v": 1, "kind": kind, "run": RUN, "round": round_}
    envelope |= {"from": sender, "to": recipient, "seq": 10**6, "body": body}
    return bytes(msgpack.packb(envelope, use_bin_type=True))


def feed(party: Party, data: bytes) -> None:
    """The invariant: handled, or refused by RemoteProtocolError with the state untouched."""
    before = state_of(party)
    try:
        msg = decode(data)
    except RemoteProtocolError:
        return
    try:
        party.receive(msg)
    except RemoteProtocolError:
        assert state_of(party) == before, f"refused {msg.kind} changed {party.name}"


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
RUN = "run-h"


# ----------------------------------------------------------------- summarisation parties
def _summary_parties() -> dict[str, Party]:
    """Curator in bidding and asking, owners in every state (built once, copied per example)."""
    scenario = small_scenario(7)
    params = small_params(scenario, explore_share=0.0)
    curator = small_curator(RUN, scenario, params, seed=3)
    owners = {
        n: Owner(n, RUN, X, y)
        for n, (X, y) in zip(scenario.owner_names, scenario.owners, strict=True)
    }
    states: dict[str, Party] = {"owner:new": copy.deepcopy(next(iter(owners.values())))}
    queue = list(curator.start())
    parties: dict[str, Party] = {"curator:bidding": copy.deepcopy(curator)}
    while queue and curator.state != "asking":
        msg = queue.pop(0)
        target = curator if msg.recipient == "curator" else owners[msg.recipient]
        before = getattr(target, "state", "")
        queue += target.receive(decode(encode(msg)))
        if target is curator and len(curator._waiting()) == 1 and curator.state == "bidding":
            parties["curator:last-bid"] = copy.deepcopy(curator)  # the next bid closes bidding
        if target is not curator and target.state != before:
            states.setdefault(f"owner:{target.state}", copy.deepcopy(target))
    parties["curator:asking"] = copy.deepcopy(curator)
    finished = copy.deepcopy(next(iter(owners.values())))
    finished.state = "finished"
    states["owner:finished"] = finished
    return parties | states


SUMMARY = _summary_parties()
VALID = {
    "summary.bid": body_map(BidBody(token=1, bid=0.25)),
    "summary.pass": {},
    "summary.deliver": body_map(DeliverBody(token=1, point=np.zeros(4), label=1.0)),
    "summary.epoch": body_map(EpochBody(g_summary=np.zeros(8), summary_size=1)),
}
OWNER_KINDS = ["summary.setup", "summary.validation", "summary.epoch", "summary.ask"]
OWNER_KINDS += ["summary.finish"]


def test_every_party_state_is_covered() -> None:
    assert set(SUMMARY) == {
        "curator:bidding",
        "curator:asking",
        "curator:last-bid",
        "owner:new",
        "owner:awaiting_validation",
        "owner:idle",
        "owner:bidding",
        "owner:finished",
    }


@pytest.mark.parametrize("kind", sorted(VALID))
@pytest.mark.parametrize("state", ["curator:bidding", "curator:last-bid", "curator:asking"])
@given(data=st.data())
@settings(SETTINGS, max_examples=200)
def test_curator_survives_hostile_owner_frames(state: str, kind: str, data: st.DataObject) -> None:
    curator = copy.deepcopy(SUMMARY[state])
    assert isinstance(curator, Curator)
    valid = dict(VALID[kind])
    if kind == "summary.deliver" and curator.epoch.bids:  # the asked token, so checks run deep
        owner = data.draw(st.sampled_from(sorted(curator.epoch.asked or curator.epoch.bids)))
        valid["token"] = curator.epoch.bids[owner].token
    else:  # the owner the phase waits for, so that a bid can close it
        owner = data.draw(st.sampled_from(sorted(curator._waiting()) or sorted(curator.owners)))
    keep_token = kind == "summary.deliver" and data.draw(st.booleans())  # reach the point checks
    keys = sorted(set(valid) - {"token"}) if keep_token else sorted(valid)
    body = data.draw(hostile_bodies(valid, keys or ["reason"], [curator.h1.n_features]))
    feed(curator, frame(kind, owner, "curator", curator.epoch.number, body))
    feed(curator, data.draw(st.binary(max_size=64)))


@pytest.mark.parametrize(
    ("state", "kind", "body", "match"),
    [
        ("curator:last-bid", "summary.bid", {"token": -1, "bid": 0.5}, r"token: -1 outside"),
        ("curator:last-bid", "summary.bid", {"token": -(2**63), "bid": 0.5}, r"token: -9223"),
        ("curator:last-bid", "summary.bid", {"token": 2**63, "bid": 0.5}, r"token: 9223"),
        ("curator:asking", "summary.deliver", {"point": 1e39}, r"point: a value beyond"),
        ("curator:asking", "summary.deliver", {"point": -3.5e38}, r"point: a value beyond"),
    ],
)
def test_the_issue_frames_are_refused_and_change_nothing(
    state: str, kind: str, body: dict[str, Any], match: str
) -> None:
    """The frames that crashed the curator (issue 14): refused, attributed, state untouched."""
    curator = copy.deepcopy(SUMMARY[state])
    assert isinstance(curator, Curator)
    owner = sorted(curator._waiting())[0]
    if "point" in body:
        fill = body["point"]
        body = {"token": curator.epoch.bids[owner].token, "label": 1.0}
        body["point"] = wire_array("<f8", [curator.h1.n_features], fill)
    before = state_of(curator)
    with pytest.raises(RemoteProtocolError, match=match):
        curator.receive(decode(frame(kind, owner, "curator", curator.epoch.number, body)))
    assert state_of(curator) == before


def test_an_owner_refuses_a_summary_size_beyond_its_range() -> None:
    owner = copy.deepcopy(SUMMARY["owner:idle"])
    body = body_map(EpochBody(np.zeros(32), 1)) | {"summary_size": 2**64 - 1}
    before = state_of(owner)
    with pytest.raises(RemoteProtocolError, match=r"summary_size: 18446744073709551615 outside"):
        owner.receive(decode(frame("summary.epoch", "curator", owner.name, 1, body)))
    assert state_of(owner) == before


@pytest.mark.parametrize("state", sorted(s for s in SUMMARY if s.startswith("owner:")))
@given(data=st.data())
@SETTINGS
def test_owner_survives_hostile_curator_frames(state: str, data: st.DataObject) -> None:
    owner = copy.deepcopy(SUMMARY[state])
    curator = SUMMARY["curator:bidding"]
    assert isinstance(owner, Owner) and isinstance(curator, Curator)
    kind = data.draw(st.sampled_from(OWNER_KINDS))
    valid = {
        "summary.setup": body_map(curator._setup_body()),
        "summary.validation": {"g_validation": wire_array("<f8", [curator.params.d], 0.1)},
        "summary.epoch": body_map(EpochBody(np.zeros(curator.params.d), 1)),
        "summary.ask": {"token": data.draw(st.sampled_from([0, 1, *owner._bids]))},
        "summary.finish": {"epochs": 1},
    }[kind]
    keys = sorted(set(valid) | {"center", "scale", "summary_size", "explore", "token"})
    body = data.draw(hostile_bodies(valid, keys, [curator.params.d]))
    feed(owner, frame(kind, "curator", owner.name, 1, body))


# --------------------------------------------------------------------- secure-sum parties
def _session() -> tuple[DcaSession, RoundSpec]:
    cfg = DcaConfig(RUN, ("c0", "c1", "c2"), ("n0", "n1"), tolerance=0, bound=10.0)
    session = DcaSession(cfg, batch=3)
    spec = RoundSpec(1, 2, 0.0)
    return session, spec


@st.composite
def securesum_frames(draw: st.DrawFn, recipient: str, senders: list[str]) -> bytes:
    kind = draw(
        st.sampled_from(
            ["dca.register", "dca.open", "dca.shares", "dca.seen", "dca.partial", "dca.abort"]
        )
    )
    fields = {
        "dca.register": ["clients", "public_keys", "proofs"],
        "dca.open": ["d", "sigma_std", "sensitivity", "label", "neighbouring", "deadline"],
        "dca.shares": ["value_clients", "value_frames", "seed_clients", "seed_frames"],
        "dca.seen": ["received"],
        "dca.partial": ["total", "included"],
        "dca.abort": ["reason", "missing"],
    }[kind]
    valid = {
        "dca.open": {"d": 2, "sigma_std": 0.0, "sensitivity": 1.0, "label": "x",
                     "neighbouring": "add_remove", "deadline": 1.0},
        "dca.partial": {"total": wire_array("<u8", [2], 0), "included": wire_array("|u1", [1], 0)},
        "dca.seen": {"received": wire_array("|u1", [1], 0)},
        "dca.abort": {"reason": "x", "missing": 0},
    }.get(kind, {f: wire_array("|u1", [1, 32], 0) for f in fields})  # fmt: skip
    body = draw(hostile_bodies(valid, fields))
    return frame(kind, draw(st.sampled_from(senders)), recipient, 1, body)


@given(data=st.data())
@SETTINGS
def test_secure_sum_parties_in_open_rounds_survive_hostile_frames(data: st.DataObject) -> None:
    session, spec = _session()
    opens = session.aggregator.open_round(spec, deadline=1.0)
    for msg in opens:  # the nodes open the round: they are collecting
        session.parties[msg.recipient].receive(decode(encode(msg)))
    senders = ["aggregator", "n0", "n1", "c0", "client-0", "x"]
    for name in ["aggregator", "n0", session.clients[0].name]:
        party = session.parties[name]
        feed(party, data.draw(securesum_frames(name, senders)))
        feed(party, data.draw(st.binary(max_size=64)))


def test_a_point_h1_cannot_hash_is_rejected_not_bought() -> None:
    """A coordinate inside float32's range (so the codec accepts it) can still overflow h1's
    projection: the curator rejects the delivery instead of buying a point whose hashed vector
    is nan (a nan bid difference compares as False, which used to pass verification)."""
    import numpy as np

    from dpmarket.protocol.summary.curator import Curator
    from dpmarket.protocol.summary.messages import DeliverBody
    from tests.small import small_params, small_scenario

    scenario = small_scenario(5)
    owners, params = list(scenario.owner_names), small_params(scenario)
    rng = np.random.default_rng(0)
    curator = Curator("run", owners, scenario.validation, scenario.seed_set, params, rng)
    curator.start()
    point = np.full(scenario.validation.shape[1], 3.0e38)
    why = curator._verify("owner-1", DeliverBody(0, point, None, 1.0))
    assert why == "point outside the range h1 can hash"

"""The control calls a stand-in forwards to its agent: arguments and results, both directions.

Every call the driver or the curator makes on an owner actor or a compute-node actor has a
remote form here, one entry per (role, method): how the market packs the call's arguments
(:func:`pack_call`), how the agent checks and unpacks them (:func:`read_args`), how the agent
packs its result (:func:`pack_result`) and how the market checks it (:func:`read_result`). Both
sides treat the other as a stranger: every value is unpacked within the frame limits
(protocol/agents/records.py) and checked for its type before use. A method not in the table is
refused by both.

What a stand-in answers when its agent is not connected, declined the purchase or failed the
call (:data:`ABSENT`): the value a lost party's absence already means to the caller (no frames,
no key, an empty status), or an exception where the local actor raises one too (a secure-sum
set-up or contribution: the hub counts the owner absent from the round).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dpmarket.protocol.agents.records import from_record, pack, plain_value, record, unpack
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.securesum.sealing import PUBLIC_KEY_BYTES
from dpmarket.protocol.securesum.spec import DcaConfig, RoundSpec
from dpmarket.protocol.wire.errors import RemoteProtocolError

__all__ = [
    "ABSENT",
    "METHODS",
    "RAISE",
    "AgentUnavailable",
    "pack_call",
    "pack_result",
    "read_args",
    "read_result",
]

MAX_FRAMES = 100_000  # frames in one call or reply (the frame limits bound their bytes)


class AgentUnavailable(RuntimeError):
    """A remote party did not answer a call that has no absent value (not connected,
    declined the purchase, or failed the call)."""


RAISE = object()  # ABSENT marker: the stand-in raises AgentUnavailable


def _frames(value: object, what: str) -> list[bytes]:
    if not isinstance(value, list) or len(value) > MAX_FRAMES:
        raise RemoteProtocolError(f"{what}: expected a list of at most {MAX_FRAMES} frames")
    if not all(isinstance(f, bytes) for f in value):
        raise RemoteProtocolError(f"{what}: every frame must be bytes")
    return value


def _keys(value: object, what: str) -> dict[str, bytes]:
    if not isinstance(value, dict):
        raise RemoteProtocolError(f"{what}: expected a map of party -> public key")
    for name, key in value.items():
        if not isinstance(key, bytes) or len(key) != PUBLIC_KEY_BYTES:
            raise RemoteProtocolError(f"{what}.{name}: expected {PUBLIC_KEY_BYTES} raw bytes")
    return value


def _map(value: object, what: str) -> dict[str, Any]:
    checked = plain_value(value, what)
    if not isinstance(checked, dict):
        raise RemoteProtocolError(f"{what}: expected a map")
    return checked


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RemoteProtocolError(f"{what}: expected a number")
    return float(value)


def _key(value: object, what: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != PUBLIC_KEY_BYTES:
        raise RemoteProtocolError(f"{what}: expected {PUBLIC_KEY_BYTES} raw bytes")
    return value


MAX_PROOF_BYTES = 16 * 1024  # a certificate and a signature


def _identity(value: object, what: str) -> dict[str, bytes]:
    """An owner agent's secure-sum key with its proof: the key signed by its TLS key for the
    session, and the certificate to check it by (actors/remote/tls.py ``sign_identity``)."""
    if not isinstance(value, dict) or set(value) != {"key", "certificate", "signature"}:
        raise RemoteProtocolError(f"{what}: expected key, certificate and signature")
    _key(value["key"], f"{what}.key")
    for name in ("certificate", "signature"):
        item = value[name]
        if not isinstance(item, bytes) or not 0 < len(item) <= MAX_PROOF_BYTES:
            raise RemoteProtocolError(f"{what}.{name}: expected at most {MAX_PROOF_BYTES} bytes")
    return value


def _proofs(value: object, what: str) -> dict[str, dict[str, bytes]]:
    if not isinstance(value, dict):
        raise RemoteProtocolError(f"{what}: expected a map of owner -> proof")
    return {str(o): _identity(p, f"{what}.{o}") for o, p in value.items()}


def _status(value: object, what: str) -> dict[str, Any]:
    status = _map(value, what)
    for key in ("records", "epochs_seen", "asks"):
        if key in status and (isinstance(status[key], bool) or not isinstance(status[key], int)):
            raise RemoteProtocolError(f"{what}.{key}: expected an integer")
    return status


def _ingest(value: object, what: str) -> dict[str, Any]:
    status = _map(value, what)
    for key, kind in (("records", int), ("rejected", int), ("caught_up", bool)):
        if not isinstance(status.get(key), kind):
            raise RemoteProtocolError(f"{what}.{key}: missing or not a {kind.__name__}")
    for key in ("failed", "missing"):
        if not isinstance(status.get(key, []), list):
            raise RemoteProtocolError(f"{what}.{key}: expected a list")
    return status


def _view(value: object, what: str) -> dict[str, Any] | None:
    return None if value is None else _map(value, what)


# (role, method) -> (market side: the call's positional arguments -> a packable map;
#                    agent side: the unpacked map -> checked arguments as a dict)
Packer = Callable[[tuple[Any, ...]], dict[str, Any]]
Reader = Callable[[dict[str, Any]], dict[str, Any]]
Checker = Callable[[object, str], Any]


def _no_args(args: tuple[Any, ...]) -> dict[str, Any]:
    return {}


def _read_none(raw: dict[str, Any]) -> dict[str, Any]:
    if raw:
        raise RemoteProtocolError(f"arguments: unexpected {sorted(raw)}")
    return {}


def _fields(raw: dict[str, Any], names: set[str]) -> None:
    if set(raw) != names:
        raise RemoteProtocolError(f"arguments: expected {sorted(names)}, got {sorted(raw)}")


def _read_begin_owner(raw: dict[str, Any]) -> dict[str, Any]:
    _fields(raw, {"offer"})
    return {"offer": _map(raw["offer"], "offer")}  # checked field by field by the agent


def _read_setup(raw: dict[str, Any]) -> dict[str, Any]:
    _fields(raw, {"config", "node_keys"})
    return {
        "config": from_record(DcaConfig, raw["config"], "config"),
        "node_keys": _keys(raw["node_keys"], "node_keys"),
    }


def _read_contribute(raw: dict[str, Any]) -> dict[str, Any]:
    _fields(raw, {"spec", "what", "options"})
    if not isinstance(raw["what"], str):
        raise RemoteProtocolError("what: expected a string")
    return {
        "spec": from_record(RoundSpec, raw["spec"], "spec"),
        "what": raw["what"],
        "options": _map(raw["options"], "options"),
    }


def _read_roster(raw: dict[str, Any]) -> dict[str, Any]:
    _fields(raw, {"attestations"})  # each checked by the owner's client (its tag, its names)
    return {"attestations": _map(raw["attestations"], "attestations")}


def _read_frames(raw: dict[str, Any]) -> dict[str, Any]:
    _fields(raw, {"frames"})
    return {"frames": _frames(raw["frames"], "frames")}


def _read_begin_node(raw: dict[str, Any]) -> dict[str, Any]:
    _fields(raw, {"config", "client_keys", "plan", "proofs"})
    return {
        "config": from_record(DcaConfig, raw["config"], "config"),
        "client_keys": _keys(raw["client_keys"], "client_keys"),
        "plan": from_record(SecureSumPlan, raw["plan"], "plan"),
        "proofs": _proofs(raw["proofs"], "proofs"),
    }


def _read_tick(raw: dict[str, Any]) -> dict[str, Any]:
    _fields(raw, {"now"})
    return {"now": _number(raw["now"], "now")}


def _owner_frames(args: tuple[Any, ...]) -> dict[str, Any]:
    (batches,) = args  # {owner: frames}: a stand-in stands in for one owner
    (frames,) = batches.values()
    return {"frames": list(frames)}


METHODS: dict[tuple[str, str], tuple[Packer, Reader, Checker, object]] = {
    # owner: the driver's and the curator's calls on an owner actor (actors/parties/owner.py)
    ("owner", "begin"): (
        lambda a: {"offer": a[0]},
        _read_begin_owner,
        _map,
        {"accepted": False, "reasons": ["not connected"]},
    ),
    ("owner", "warm_up"): (_no_args, _read_none, _number, 0.0),
    ("owner", "ingest_status"): (
        _no_args,
        _read_none,
        _ingest,
        {
            "records": 0,
            "rejected": 0,
            "caught_up": True,
            "failed": [],
            "missing": [],
            "gaps": 0,
            "gap_bytes": 0,
        },
    ),
    ("owner", "dca_identity"): (_no_args, _read_none, _identity, None),
    ("owner", "dca_setup"): (
        lambda a: {"config": record(a[1]), "node_keys": dict(a[2])},
        _read_setup,
        _frames,
        RAISE,
    ),
    ("owner", "dca_contribute"): (
        lambda a: {"spec": record(a[1]), "what": a[2], "options": record(a[3])},
        _read_contribute,
        _frames,
        RAISE,
    ),
    ("owner", "dca_roster"): (
        lambda a: {"attestations": dict(a[1])},
        _read_roster,
        _number,
        RAISE,
    ),
    ("owner", "handle"): (_owner_frames, _read_frames, _frames, []),
    ("owner", "budget_view"): (_no_args, _read_none, _view, {"unreachable": "not connected"}),
    ("owner", "status"): (
        _no_args,
        _read_none,
        _status,
        {"state": "absent", "records": 0, "epochs_seen": 0, "asks": 0, "errors": []},
    ),
    # compute node (actors/parties/compute.py)
    ("node", "begin"): (
        lambda a: {
            "config": record(a[0]),
            "client_keys": dict(a[1]),
            "plan": record(a[2]),
            "proofs": dict(a[3]),
        },
        _read_begin_node,
        _map,
        RAISE,
    ),
    ("node", "public_key"): (_no_args, _read_none, _key, RAISE),
    ("node", "handle"): (lambda a: {"frames": list(a[0])}, _read_frames, _frames, RAISE),
    ("node", "tick"): (lambda a: {"now": float(a[0])}, _read_tick, _frames, []),
    ("node", "status"): (_no_args, _read_none, _status, {"registered": 0, "errors": []}),
    ("node", "attest"): (_no_args, _read_none, _map, RAISE),
}

ABSENT = {key: entry[3] for key, entry in METHODS.items()}


def _entry(role: str, method: str) -> tuple[Packer, Reader, Checker, object]:
    entry = METHODS.get((role, method))
    if entry is None:
        raise RemoteProtocolError(f"method: {role} agents have no method {method!r}")
    return entry


def pack_call(role: str, method: str, args: tuple[Any, ...]) -> bytes:
    """Market side: a stand-in's call (the local actor method's positional arguments) packed."""
    return pack(_entry(role, method)[0](args))


def read_args(role: str, method: str, data: bytes) -> dict[str, Any]:
    """Agent side: a call's arguments, unpacked within the limits and checked, by name."""
    reader = _entry(role, method)[1]
    raw = unpack(data, f"{method} arguments")
    if not isinstance(raw, dict):
        raise RemoteProtocolError(f"{method} arguments: expected a map")
    return reader(raw)


def pack_result(value: object) -> bytes:
    """Agent side: a method's result packed (frames, keys, maps, numbers)."""
    return pack(record(value))


def read_result(role: str, method: str, data: bytes) -> Any:
    """Market side: an agent's result, unpacked within the limits and checked for its method."""
    return _entry(role, method)[2](unpack(data, f"{method} result"), f"{method} result")

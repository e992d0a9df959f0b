"""An agent's own configuration: ``OWNER.toml`` (``dpmarket owner serve``) and ``NODE.toml``.

Everything here belongs to the party that runs the agent; the market never sees or sets it.
Relative paths are taken from the file's folder. An owner::

    [owner]
    name = "owner-1"
    state = "owner-1-state"          # its ledger store, tailer offsets and rejects

    [market]
    address = "127.0.0.1:50551"      # where the market listens (the agent dials out)
    name = "remote-demo"             # the market's [run].name: another market is refused
    ca = "certs/ca.crt"              # the trust anchor for the market's certificate
    server_name = "market"           # optional: the name the market's certificate carries

    [tls]
    certificate = "certs/owner-1.crt"
    key = "certs/owner-1.key"

    [data]
    files = ["data/owner-1.csv"]     # read by the agent's own tailers, never sent anywhere
    header = false
    # optional: the schema the owner expects (features, label_column, lower, upper, policy);
    # an offer with another schema is declined. Without it the market's public schema is used.

    [nodes]                          # compute nodes' X25519 key fingerprints, out of band
    pins = "certs/node-keys.toml"    # a file of node = "HEX" (or the entries inline)

    [policy]                         # protocol/agents/policy.py
    epsilon = 4.0                    # its persistent cap, over every purchase
    delta = 1e-6
    max_points = 60                  # the most records it delivers to one purchase
    purchases = 1                    # purchases it joins while serving (default: any)
    block_records = 0                # > 0: blocks of records with their own budgets
    rounds = { normalise = 1, scan = 1, refresh = 0 }
    min_noise = { normalise = 1.0, scan = 1.0, refresh = 1.0, profile = 1.0, summary = 1.0 }
    neighbouring = "replace"         # its relation ("replace": counts public; "add_remove")
    min_tolerance = 1                # the fewest dropped-or-colluding owners T must cover
    max_colluders = 1                # owners it assumes side with the market (1: Theorem 1)
    attested_roster = true           # K only from its pinned nodes' attestations
    hide_count = false               # true: decline mechanisms that show others its count

    [simulation]                     # tests only: noise from a public seed is not private
    reproducible_noise = true
    noise_seed = 0

A compute node has ``[node]`` (``name``, ``key``: its X25519 private key file, made by the
node itself on first use, 0600; ``owners_ca``: the CA that signs the owners' certificates, so
that the node accepts an owner's secure-sum key only with that owner's signature, never on the
market's word), ``[market]`` and ``[tls]``.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpmarket.actors.config.checks import ConfigError
from dpmarket.actors.randomness import NoiseSource
from dpmarket.actors.remote.agent import Link
from dpmarket.actors.remote.tls import load_pem
from dpmarket.protocol.agents.policy import OwnerPolicy

__all__ = ["NodeAgentConfig", "OwnerAgentConfig", "load_node_config", "load_owner_config"]

SECTIONS_OWNER: dict[str, set[str] | None] = {
    "owner": {"name", "state"},
    "market": {"address", "name", "ca", "server_name"},
    "tls": {"certificate", "key"},
    "data": {"files", "header", "features", "label_column", "lower", "upper", "policy"},
    "nodes": None,  # node names or "pins"
    "policy": {"epsilon", "delta", "max_points", "purchases", "block_records", "rounds"}
    | {"min_noise", "neighbouring", "min_tolerance", "max_colluders", "attested_roster"}
    | {"hide_count"},
    "simulation": {"reproducible_noise", "noise_seed"},
}
SECTIONS_NODE: dict[str, set[str] | None] = {
    "node": {"name", "key", "owners_ca"},
    "market": {"address", "name", "ca", "server_name"},
    "tls": {"certificate", "key"},
}


@dataclass(frozen=True)
class OwnerAgentConfig:
    """An owner agent's configuration (module docstring)."""

    path: str
    name: str
    state: str
    link: Link
    files: tuple[str, ...]
    header: bool
    schema: dict[str, Any]  # the owner's own expectation of the schema (may be empty)
    pins: dict[str, str]
    policy: OwnerPolicy
    block_records: int = 0
    noise: NoiseSource = field(default_factory=NoiseSource.secure)


@dataclass(frozen=True)
class NodeAgentConfig:
    """A compute-node agent's configuration (module docstring)."""

    path: str
    name: str
    key: str
    link: Link
    owners_ca: bytes | None = None  # the CA of owners' certificates: their keys are checked


def _read(path: str | Path, sections: dict[str, set[str] | None]) -> dict[str, Any]:
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read configuration ({exc})") from None
    unknown = sorted(set(data) - set(sections))
    if unknown:
        raise ConfigError(f"{path}: unknown sections {unknown}; allowed {sorted(sections)}")
    for name, allowed in sections.items():
        table = data.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [{name}]: expected a table")
        if allowed is not None and (extra := sorted(set(table) - allowed)):
            raise ConfigError(f"{path}: [{name}]: unknown keys {extra}; allowed {sorted(allowed)}")
    return data


def _need(path: str, data: dict[str, Any], section: str, key: str) -> Any:
    value = data.get(section, {}).get(key)
    if value is None:
        raise ConfigError(f"{path}: [{section}].{key}: required")
    return value


def _file(path: str, base: Path, key: str, value: object, must_exist: bool = True) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{path}: {key}: expected a path, got {value!r}")
    p = Path(value) if Path(value).is_absolute() else base / value
    if must_exist and not p.is_file():
        raise ConfigError(f"{path}: {key}: {p} does not exist or is not a file")
    return str(p.resolve())


def _link(path: str, data: dict[str, Any], base: Path, party: str, role: str) -> Link:
    address = _need(path, data, "market", "address")
    host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not host or not port.isdigit():
        raise ConfigError(f"{path}: [market].address: expected HOST:PORT, got {address!r}")
    market = _need(path, data, "market", "name")
    server_name = data["market"].get("server_name")
    if not isinstance(market, str) or not market:
        raise ConfigError(f"{path}: [market].name: expected the market's name")
    if server_name is not None and not isinstance(server_name, str):
        raise ConfigError(f"{path}: [market].server_name: expected a name")
    pem = {
        key: load_pem(_file(path, base, f"[{sec}].{name}", _need(path, data, sec, name)), what)
        for key, sec, name, what in (
            ("ca", "market", "ca", "the CA certificate the market's certificate is signed by"),
            ("certificate", "tls", "certificate", f"{party}'s certificate"),
            ("key", "tls", "key", f"{party}'s private key"),
        )
    }
    return Link(
        address, market, party, role, pem["ca"], pem["certificate"], pem["key"], server_name
    )


def _name(path: str, section: str, value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > 64:
        raise ConfigError(f"{path}: [{section}].name: expected a party name")
    return value


def _pins(path: str, base: Path, table: dict[str, Any]) -> dict[str, str]:
    entries = dict(table)
    source = f"{path}: [nodes]"
    if "pins" in entries:
        pins_file = _file(path, base, "[nodes].pins", entries.pop("pins"))
        try:
            entries |= tomllib.loads(Path(pins_file).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{source}.pins: cannot read {pins_file} ({exc})") from None
    for node, fp in entries.items():
        ok = isinstance(fp, str) and len(fp) == 64 and all(c in "0123456789abcdef" for c in fp)
        if not ok:
            raise ConfigError(f"{source}: {node}: expected the node key's SHA-256 (64 hex digits)")
    if not entries:
        raise ConfigError(f"{source}: no compute-node key fingerprints (the owner pins them)")
    return entries


def _policy(path: str, table: dict[str, Any]) -> tuple[OwnerPolicy, int]:
    for key in ("epsilon", "delta", "max_points"):
        if key not in table:
            raise ConfigError(f"{path}: [policy].{key}: required (the owner's own limit)")
    rounds, noise = table.get("rounds", {}), table.get("min_noise", {})
    if not isinstance(rounds, dict) or not isinstance(noise, dict):
        raise ConfigError(f"{path}: [policy].rounds and min_noise: expected tables")
    blocks = table.get("block_records", 0)
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 0:
        raise ConfigError(f"{path}: [policy].block_records: expected an integer >= 0")
    try:
        policy = OwnerPolicy(
            epsilon=float(table["epsilon"]),
            delta=float(table["delta"]),
            max_points=table["max_points"],
            purchases=table.get("purchases"),
            rounds=dict(rounds),
            min_noise={k: float(v) for k, v in noise.items()},
            neighbouring=table.get("neighbouring", "replace"),
            min_tolerance=table.get("min_tolerance", 0),
            max_colluders=table.get("max_colluders", 1),
            attested_roster=table.get("attested_roster", True),
            hide_count=table.get("hide_count", False),
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: [policy]: {exc}") from None
    return policy, blocks


def _noise(path: str, table: dict[str, Any]) -> NoiseSource:
    if not table.get("reproducible_noise", False):
        if "noise_seed" in table:
            raise ConfigError(f"{path}: [simulation].noise_seed: only with reproducible_noise")
        return NoiseSource.secure()
    seed = table.get("noise_seed", 0)
    try:
        return NoiseSource.reproducible(seed)
    except ValueError as exc:
        raise ConfigError(f"{path}: [simulation].noise_seed: {exc}") from None


def load_owner_config(path: str | Path) -> OwnerAgentConfig:
    where, base = str(path), Path(path).resolve().parent
    data = _read(path, SECTIONS_OWNER)
    name = _name(where, "owner", _need(where, data, "owner", "name"))
    files = data.get("data", {}).get("files")
    if not isinstance(files, list) or not files:
        raise ConfigError(f"{where}: [data].files: expected a non-empty list of the owner's files")
    paths = tuple(_file(where, base, "[data].files", f) for f in files)
    for p in paths:
        if not os.path.isfile(p):
            raise ConfigError(f"{where}: [data].files: {p} is not a regular file")
        if p.endswith(".npy"):
            raise ConfigError(
                f"{where}: [data].files: {p} is .npy, read whole and never followed as it grows; "
                "an owner's files are CSV, JSONL or msgpack streams"
            )
    header = data["data"].get("header", False)
    if not isinstance(header, bool):
        raise ConfigError(f"{where}: [data].header: expected true or false")
    schema = {k: v for k, v in data["data"].items() if k not in ("files", "header")}
    policy, blocks = _policy(where, data.get("policy", {}))
    state = data.get("owner", {}).get("state", f"{name}-state")
    return OwnerAgentConfig(
        path=where,
        name=name,
        state=str(Path(state) if Path(state).is_absolute() else base / state),
        link=_link(where, data, base, name, "owner"),
        files=paths,
        header=header,
        schema=schema,
        pins=_pins(where, base, data.get("nodes", {})),
        policy=policy,
        block_records=blocks,
        noise=_noise(where, data.get("simulation", {})),
    )


def load_node_config(path: str | Path) -> NodeAgentConfig:
    where, base = str(path), Path(path).resolve().parent
    data = _read(path, SECTIONS_NODE)
    name = _name(where, "node", _need(where, data, "node", "name"))
    key = _file(where, base, "[node].key", _need(where, data, "node", "key"), must_exist=False)
    owners_ca = data["node"].get("owners_ca")
    ca = None
    if owners_ca is not None:
        ca = load_pem(_file(where, base, "[node].owners_ca", owners_ca), "the owners' CA")
    return NodeAgentConfig(where, name, key, _link(where, data, base, name, "node"), ca)

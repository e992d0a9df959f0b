"""``[remote]``: owners and compute nodes that run as agents in other organisations.

The market config names each remote party and the fingerprint of the one client certificate
allowed to act as it, and nothing else about it: a remote owner's files, cap, ledger and noise
floors live in its own agent's configuration (actors/remote/agentconfig.py)::

    [remote]
    listen = "127.0.0.1:50551"          # the market's address (agents dial in; TLS only)
    certificate = "certs/market.crt"    # the market's certificate and key
    key = "certs/market.key"
    client_ca = "certs/ca.crt"          # the CA whose certificates agents present
    fingerprints = "certs/fingerprints.toml"  # party = "sha256:..." (or a table inline)
    owners = ["owner-1", "owner-2"]     # owners of [market].owners that are remote
    nodes = ["node-1", "node-2", "node-3"]    # compute nodes that are remote (of compute_nodes)
    join_deadline = 120                 # seconds to wait for every declared party
    call_timeout = 120                  # seconds a control call waits for an agent's answer

Paths are relative to the config file. A remote owner has no ``[data.files]`` entry,
no ``[owners.NAME]`` table (placement, budget, ledger: its own), and no simulated fault. With
``[[requests]]`` every request is offered to every remote owner in turn; each takes part in as
many as its own policy admits.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpmarket.actors.config.checks import ConfigError, number

__all__ = ["REMOTE_KEYS", "RemoteConfig", "parse_remote"]

REMOTE_KEYS = frozenset(
    {"listen", "certificate", "key", "client_ca", "fingerprints", "owners", "nodes"}
    | {"join_deadline", "call_timeout"}
)
FINGERPRINT_PREFIX = "sha256:"


@dataclass(frozen=True)
class RemoteConfig:
    """The remote parties of a market and how the market meets them (module docstring)."""

    listen: str
    certificate: str
    key: str
    client_ca: str
    fingerprints: dict[str, str]  # party -> "sha256:HEX" of its certificate
    owners: tuple[str, ...]
    nodes: tuple[str, ...]
    join_deadline: float = 120.0
    call_timeout: float = 120.0

    def parties(self) -> dict[str, tuple[str, str]]:
        """name -> (role, fingerprint), what the gateway admits."""
        return {o: ("owner", self.fingerprints[o]) for o in self.owners} | {
            n: ("node", self.fingerprints[n]) for n in self.nodes
        }


def _path(base: Path, where: str, key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: [remote].{key}: expected a path, got {value!r}")
    p = Path(value) if Path(value).is_absolute() else base / value
    if not p.is_file():
        raise ConfigError(f"{where}: [remote].{key}: {p} does not exist or is not a file")
    return str(p.resolve())


def _names(where: str, key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: [remote].{key}: expected a list of party names")
    if len(set(value)) != len(value):
        raise ConfigError(f"{where}: [remote].{key}: a party is named twice")
    return tuple(value)


def _fingerprints(base: Path, where: str, value: object) -> dict[str, str]:
    source = f"{where}: [remote].fingerprints"
    if isinstance(value, str):
        path = Path(_path(base, where, "fingerprints", value))
        try:
            value = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{source}: cannot read {path} ({exc})") from None
        source = f"{path}"
    if not isinstance(value, dict):
        raise ConfigError(f'{source}: expected a table of party = "sha256:..."')
    out: dict[str, str] = {}
    for party, fp in value.items():
        hexpart = fp[len(FINGERPRINT_PREFIX) :] if isinstance(fp, str) else ""
        ok = isinstance(fp, str) and fp.startswith(FINGERPRINT_PREFIX) and len(hexpart) == 64
        if not ok or any(c not in "0123456789abcdef" for c in hexpart):
            raise ConfigError(f'{source}: {party}: expected "sha256:" and 64 hex digits')
        out[party] = fp
    return out


def parse_remote(
    where: str, table: object, base: Path, owners: tuple[str, ...], compute_nodes: int
) -> RemoteConfig | None:
    """The ``[remote]`` table checked (module docstring), or None without one."""
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [remote]: expected a table")
    unknown = sorted(set(table) - REMOTE_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: [remote]: unknown keys {unknown}; allowed {sorted(REMOTE_KEYS)}"
        )
    missing = sorted({"listen", "certificate", "key", "client_ca", "fingerprints"} - set(table))
    if missing:
        raise ConfigError(f"{where}: [remote]: missing {missing}")
    listen = table["listen"]
    host, _, port = listen.rpartition(":") if isinstance(listen, str) else ("", "", "")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{where}: [remote].listen: expected HOST:PORT, got {listen!r}")
    remote_owners = _names(where, "owners", table.get("owners", []))
    nodes = _names(where, "nodes", table.get("nodes", []))
    strangers = sorted(set(remote_owners) - set(owners))
    if strangers:
        raise ConfigError(
            f"{where}: [remote].owners: {strangers} are not owners of this market {list(owners)}"
        )
    if len(nodes) > compute_nodes:
        raise ConfigError(
            f"{where}: [remote].nodes: {len(nodes)} remote nodes but [market].compute_nodes = "
            f"{compute_nodes}"
        )
    clash = sorted(set(nodes) & (set(owners) | {"aggregator", "market", "curator"}))
    if clash or any(n.startswith("compute-") for n in nodes):
        raise ConfigError(
            f"{where}: [remote].nodes: {clash or nodes} clash with other parties' names "
            "(owner-N, compute-N, aggregator, market, curator)"
        )
    if remote_owners and len(nodes) < compute_nodes:
        raise ConfigError(
            f"{where}: [remote]: remote owners pin every compute node's key out of band, and a "
            f"local node's key is made anew for each run: declare all {compute_nodes} compute "
            f"nodes in [remote].nodes (it names {len(nodes)})"
        )
    if not remote_owners and not nodes:
        raise ConfigError(f"{where}: [remote]: declares no remote owner or node")
    fingerprints = _fingerprints(base, where, table["fingerprints"])
    unpinned = sorted(set(remote_owners + nodes) - set(fingerprints))
    if unpinned:
        raise ConfigError(
            f"{where}: [remote].fingerprints: no certificate fingerprint for {unpinned}"
        )
    twice = sorted(
        fp for fp in {fingerprints[p] for p in remote_owners + nodes}
        if sum(fingerprints[p] == fp for p in remote_owners + nodes) > 1
    )  # fmt: skip
    if twice:
        raise ConfigError(f"{where}: [remote].fingerprints: one certificate for several parties")
    return RemoteConfig(
        listen=listen,
        certificate=_path(base, where, "certificate", table["certificate"]),
        key=_path(base, where, "key", table["key"]),
        client_ca=_path(base, where, "client_ca", table["client_ca"]),
        fingerprints={p: fingerprints[p] for p in remote_owners + nodes},
        owners=remote_owners,
        nodes=nodes,
        join_deadline=number(
            where, "[remote].join_deadline", table.get("join_deadline", 120.0), 0.0, 86400.0
        ),
        call_timeout=number(
            where, "[remote].call_timeout", table.get("call_timeout", 120.0), 1.0, 86400.0
        ),
    )


def check_remote_market(where: str, config: Any) -> None:
    """What a market with remote parties may not also say (module docstring)."""
    remote = config.remote
    if remote is None:
        return
    if remote.owners and config.source != "files":
        raise ConfigError(
            f"{where}: [remote].owners: remote owners hold their own files; use "
            "[data].source = 'files' (the consumer's validation and seed set)"
        )
    for owner in remote.owners:
        if owner in config.placement or owner in config.budgets:
            raise ConfigError(
                f"{where}: [owners.{owner}]: {owner} is remote; its placement, budget and ledger "
                "are its own (in its agent's configuration)"
            )
    f = config.faults
    simulated = set(f.kill) | set(f.slow) | set(f.colluders) | set(f.kill_actor)
    clash = (simulated & set(remote.owners)) | (set(f.kill_compute) & set(remote.nodes))
    if clash:
        raise ConfigError(
            f"{where}: [faults]: simulated faults apply to local actors only; "
            f"{sorted(clash)} are remote"
        )

"""``dpmarket node serve NODE.toml``: a compute node run by a party that is not the curator.

The node makes its own X25519 key on first use (``[node].key``, created 0600 and never
overwritten; ``dpmarket node fingerprint NODE.toml`` prints the SHA-256 fingerprint the owners
pin), dials out to the market like an owner agent (actors/remote/agent.py) and hosts the same
:class:`~dpmarket.actors.parties.compute.ComputeNodeHost` a local node actor runs: the session's
configuration, the owners' public keys and the round plan arrive in the market's ``begin``; the
node opens no round below the plan's sigma floor or beyond its count, and its private key never
leaves this process. With ``[node].owners_ca`` it admits an owner's key only with that owner's
signature by a certificate of that CA (:meth:`NodeAgent.checked_keys`), so a market cannot
register a key of its own in an owner's name; its roster attestations (``attest``: the owners
registered with it, MACed for each owner under their pair key) say whether it checked them, so
each owner counts the roster it contributes among from its pinned nodes, not the market.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from dpmarket.actors.config.checks import ConfigError
from dpmarket.actors.parties.compute import ComputeNodeHost
from dpmarket.actors.remote.agent import serve
from dpmarket.actors.remote.agentconfig import NodeAgentConfig
from dpmarket.actors.remote.owneragent import software
from dpmarket.actors.remote.tls import verify_identity
from dpmarket.protocol.securesum.sealing import generate_keypair, key_fingerprint
from dpmarket.protocol.wire.errors import RemoteProtocolError

__all__ = ["NodeAgent", "node_key", "serve_node"]


def node_key(path: str) -> X25519PrivateKey:
    """The node's X25519 key from ``path`` (32 raw bytes), made there first if absent."""
    p = Path(path)
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        key = X25519PrivateKey.generate()
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(key.private_bytes_raw())
        return key
    raw = p.read_bytes()
    if len(raw) != 32:
        raise ConfigError(f"{p}: expected a 32-byte X25519 private key, got {len(raw)} bytes")
    return X25519PrivateKey.from_private_bytes(raw)


def fingerprint_of(config: NodeAgentConfig) -> str:
    return key_fingerprint(node_key(config.key).public_key().public_bytes_raw())


class NodeAgent:
    """The node's side of every control call."""

    def __init__(self, config: NodeAgentConfig) -> None:
        self.config = config
        self.key = node_key(config.key)
        self.host: ComputeNodeHost | None = None
        self.refused: dict[str, str] = {}  # owner -> why its relayed key was refused

    def checked_keys(
        self,
        session: str,
        roster: tuple[str, ...],
        keys: dict[str, bytes],
        proofs: dict[str, dict[str, bytes]],
    ) -> dict[str, bytes]:
        """The owners' keys the market relayed, each kept only with its owner's signature by a
        certificate of ``[node].owners_ca`` (with one); a roster owner whose key is not relayed
        or not proven is pinned to a key nobody holds: its registration is refused, so it is
        absent from every round (counted against T), and no key of the market's choosing is
        admitted in its name. Without ``owners_ca`` the node takes the market's word (a trial)."""
        ca = self.config.owners_ca
        if ca is None:
            return dict(keys)
        checked: dict[str, bytes] = {}
        for owner in roster:  # every roster name is pinned: none left for the market to fill
            key, proof = keys.get(owner), proofs.get(owner)
            try:
                if key is None or proof is None or proof["key"] != key:
                    raise ValueError(f"{owner}: no proof that the relayed key is its own")
                verify_identity(ca, proof["certificate"], proof["signature"], session, owner, key)
                checked[owner] = key
            except ValueError as exc:
                self.refused[owner] = str(exc)
                print(f"dpmarket {self.config.name}: refused a key: {exc}", file=sys.stderr)
                checked[owner] = generate_keypair()[1]
        return checked

    async def dispatch(self, method: str, args: dict[str, Any]) -> Any:
        if method == "public_key":
            return self.key.public_key().public_bytes_raw()
        if method == "begin":
            config = args["config"]
            if self.config.name not in config.nodes:
                raise RemoteProtocolError(f"begin: {self.config.name} is not a node of the session")
            keys = self.checked_keys(
                config.run, config.clients, args["client_keys"], args["proofs"]
            )
            self.host = ComputeNodeHost(
                config, self.config.name, self.key.private_bytes_raw(), keys, args["plan"]
            )
            self.host.checked = self.config.owners_ca is not None  # what its attestations say
            print(
                f"dpmarket {self.config.name}: session {config.run} with "
                f"{len(config.clients)} owners",
                file=sys.stderr,
                flush=True,
            )
            return {"ready": True}
        if method == "status":
            return (
                {"registered": 0, "errors": []} if self.host is None else await self.host.status()
            )
        if self.host is None:
            raise RuntimeError(f"{method}: no secure-sum session has begun")
        if method == "handle":
            return await self.host.handle(args["frames"])
        if method == "tick":
            return await self.host.tick(args["now"])
        if method == "attest":
            return await self.host.attest()
        raise RemoteProtocolError(f"method: no node method {method!r}")


def serve_node(config: NodeAgentConfig, give_up: float = 600.0) -> int:
    agent = NodeAgent(config)
    if config.owners_ca is not None and config.owners_ca.strip() == config.link.ca.strip():
        print(
            f"dpmarket {config.name}: WARNING: [node].owners_ca is the CA this node trusts the "
            "market by: whoever holds it can issue an owner's certificate, so the roster this "
            "node attests as checked is only as good as that CA's holder (a trial on one "
            "machine; docs/guide/remote.md)",
            file=sys.stderr,
            flush=True,
        )
    print(
        f"dpmarket {config.name}: key fingerprint {fingerprint_of(config)}; serving market "
        f"{config.link.market!r} at {config.link.address}",
        file=sys.stderr,
        flush=True,
    )
    try:
        return asyncio.run(serve(config.link, agent.dispatch, software(), give_up=give_up))
    except KeyboardInterrupt:
        print(f"dpmarket {config.name}: stopped (interrupted)", file=sys.stderr, flush=True)
        return 130

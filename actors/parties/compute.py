"""The compute-node actor: hosts one DCA ComputeNode; only decodes, calls, encodes.

:class:`ComputeNodeHost` imports no Ray (a node's agent hosts it without Ray installed); the
Ray actor is actors/parties/ray_actors.py ``ComputeNodeActor``."""

from __future__ import annotations

import os
from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from dpmarket.protocol.securesum.node import ComputeNode
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.securesum.spec import DcaConfig
from dpmarket.protocol.wire.codec import ReplayGuard, decode, encode
from dpmarket.protocol.wire.errors import RemoteProtocolError

__all__ = ["ComputeNodeHost"]


class ComputeNodeHost:
    """One compute node of the secure sum, as a Ray actor (ray_actors.py ``ComputeNodeActor``)
    or in a node's own agent (actors/remote/nodeagent.py). ``private_key`` (raw X25519 bytes)
    comes from the operator, who pins its fingerprint at the owners; ``client_keys`` are the
    owners' public keys the operator collected from them directly (registrations under another
    key are refused); ``plan`` the operator's round plan (protocol/securesum/plan.py: an open
    below its sigma floor or beyond its count is refused). The private key goes nowhere but
    here."""

    def __init__(
        self,
        config: DcaConfig,
        name: str,
        private_key: bytes | None = None,
        client_keys: dict[str, bytes] | None = None,
        plan: SecureSumPlan | None = None,
    ) -> None:
        key = X25519PrivateKey.from_private_bytes(private_key) if private_key else None
        self._node = ComputeNode(config, name, key, client_keys, plan=plan)
        self._guard = ReplayGuard()
        self.errors: list[str] = []
        # the owners' keys were pinned only with their own signatures (a node agent with
        # [node].owners_ca) or by the operator itself (a local node): what attest() says
        self.checked = True

    async def public_key(self) -> bytes:
        return bytes(self._node.public_key)

    async def handle(self, frames: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        for frame in frames:
            try:
                out.extend(encode(m) for m in self._node.receive(decode(frame, self._guard)))
            except RemoteProtocolError as exc:
                self.errors.append(str(exc))
        return out

    async def tick(self, now: float) -> list[bytes]:
        return [encode(m) for m in self._node.expire(now)]

    async def pid(self) -> int:
        """The worker's process id (benchmarks read its CPU time)."""
        return os.getpid()

    async def where(self, paths: list[str]) -> dict[str, Any]:
        """This node (Ray id, IP) and the dpmarket running here (actors/config/placement.py);
        only a Ray actor is asked (imported here: a node's agent holds no Ray)."""
        from dpmarket.actors.cluster.placement import node_report

        return node_report(paths)

    async def status(self) -> dict[str, Any]:
        return {"registered": self._node.registered, "errors": list(self.errors)}

    async def attest(self) -> dict[str, dict[str, Any]]:
        """This node's roster attestation to each registered owner (protocol/securesum/node.py
        ``ComputeNode.attest``), for the relay to hand on; it cannot alter them."""
        return self._node.attest(self.checked)

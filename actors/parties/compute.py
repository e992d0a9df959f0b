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
        *,
        await_session: bool = False,
    ) -> None:
        self._config, self._name = config, name
        self._key = X25519PrivateKey.from_private_bytes(private_key) if private_key else None
        # await_session: spawned with the owners, before their keys exist (actors/run/phases.py
        # ``spawn_local_nodes``); the operator hands them over once, in :meth:`begin`
        self._node: ComputeNode | None = None
        if await_session and self._key is None:
            raise ValueError(f"{name}: a node awaiting its session needs the operator's key")
        if not await_session:
            self._start(client_keys, plan)
        if self._key is not None:
            self._public = self._key.public_key().public_bytes_raw()
        else:  # the node made a fresh key (benchmarks; an unpinned trial)
            self._public = self._session.public_key
        self._guard = ReplayGuard()
        self.errors: list[str] = []
        # the owners' keys were pinned only with their own signatures (a node agent with
        # [node].owners_ca) or by the operator itself (a local node): what attest() says
        self.checked = True

    def _start(self, client_keys: dict[str, bytes] | None, plan: SecureSumPlan | None) -> None:
        self._node = ComputeNode(self._config, self._name, self._key, client_keys, plan=plan)

    async def begin(self, client_keys: dict[str, bytes], plan: SecureSumPlan) -> dict[str, Any]:
        """The session's owners' public keys and round plan, from the operator (the driver,
        never the curator): once. A node spawned with ``await_session`` takes part in nothing
        before it; a second call is refused, so whoever else holds this handle later (the
        curator relays through it) cannot swap the owners' keys for its own."""
        if self._node is not None:
            raise RuntimeError(
                f"begin: {self._name} holds its session's owners' keys already; they are fixed"
            )
        self._start(client_keys, plan)
        return {"ready": True}

    @property
    def _session(self) -> ComputeNode:
        if self._node is None:
            raise RuntimeError(f"{self._name}: no secure-sum session has begun (begin first)")
        return self._node

    async def public_key(self) -> bytes:
        return bytes(self._public)

    async def handle(self, frames: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        for frame in frames:
            try:
                out.extend(encode(m) for m in self._session.receive(decode(frame, self._guard)))
            except RemoteProtocolError as exc:
                self.errors.append(str(exc))
        return out

    async def tick(self, now: float) -> list[bytes]:
        return [encode(m) for m in self._session.expire(now)]

    async def pid(self) -> int:
        """The worker's process id (benchmarks read its CPU time)."""
        return os.getpid()

    async def where(self, paths: list[str]) -> dict[str, Any]:
        """This node (Ray id, IP) and the dpmarket running here (actors/config/placement.py);
        only a Ray actor is asked (imported here: a node's agent holds no Ray)."""
        from dpmarket.actors.cluster.placement import node_report

        return node_report(paths)

    async def status(self) -> dict[str, Any]:
        registered = self._node.registered if self._node is not None else 0
        return {"registered": registered, "errors": list(self.errors)}

    async def attest(self) -> dict[str, dict[str, Any]]:
        """This node's roster attestation to each registered owner (protocol/securesum/node.py
        ``ComputeNode.attest``), for the relay to hand on; it cannot alter them."""
        return self._session.attest(self.checked)

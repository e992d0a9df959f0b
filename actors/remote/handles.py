"""Stand-ins: what the market's actors hold for a remote party, used like its actor's handle.

A :class:`RemoteHandle` names one remote party (an owner or a compute node) and the gateway
actor that holds its agent's stream (actors/remote/gateway.py). ``handle.METHOD.remote(*args)``
returns the Ray object reference of the gateway's ``invoke(party, METHOD, args)``, so the
curator, the secure-sum hub, the phases, the journal and resume call a remote party exactly as
they call a local actor (``await``, ``ray.get``, ``asyncio.wait``), and a lost gateway is a
``RayActorError`` for every party behind it. Stand-ins compare and hash by party, so the
curator's transport sends one call per remote party (actors/parties/transport.py groups calls
by handle). A stand-in is never killed with ``ray.kill``: :func:`is_remote` tells them apart.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RemoteHandle", "is_remote"]


class _Method:
    def __init__(self, handle: RemoteHandle, method: str) -> None:
        self._handle, self._method = handle, method

    def remote(self, *args: Any) -> Any:
        h = self._handle
        return h.gateway.invoke.remote(h.party, self._method, args)


class RemoteHandle:
    """The stand-in of remote party ``party`` (role ``owner`` or ``node``) behind ``gateway``."""

    def __init__(self, gateway: Any, party: str, role: str) -> None:
        self.gateway, self.party, self.role = gateway, party, role

    def __getattr__(self, method: str) -> _Method:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Method(self, method)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemoteHandle) and (other.party, other.role) == (
            self.party,
            self.role,
        )

    def __hash__(self) -> int:
        return hash(("remote", self.role, self.party))

    def __repr__(self) -> str:
        return f"RemoteHandle({self.role} {self.party!r})"

    def __reduce__(self) -> tuple[Any, ...]:  # pickled into the curator's process by Ray
        return (RemoteHandle, (self.gateway, self.party, self.role))


def is_remote(handle: object) -> bool:
    return isinstance(handle, RemoteHandle)

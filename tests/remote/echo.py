"""An echo market over the real channel helpers, and the certificates the remote tests use
(made in a temporary directory, never checked in)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dpmarket.actors.remote import channel, tls


@dataclass
class Certs:
    """One trial CA's directory, and a second, unrelated CA's."""

    directory: Path
    other: Path

    def read(self, name: str, other: bool = False) -> bytes:
        return ((self.other if other else self.directory) / name).read_bytes()

    def client(self, party: str, ca_from_other: bool = False, other: bool = False) -> Any:
        """Credentials of ``party`` (its cert from the main or the other CA), trusting the main
        CA or the other one."""
        return tls.channel_credentials(
            self.read("ca.crt", other=ca_from_other),
            self.read(f"{party}.crt", other=other),
            self.read(f"{party}.key", other=other),
        )


@dataclass
class Echo:
    """What the echo market saw: (fingerprint, common name) of each stream's client."""

    seen: list[tuple[str, str]] = field(default_factory=list)
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    async def handler(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        pem = channel.peer_certificate(context)
        assert pem is not None, "mutual TLS let a client without a certificate through"
        self.seen.append((tls.fingerprint(pem), tls.common_name(pem)))
        try:
            yield tls.fingerprint(pem).encode()
            async for frame in requests:
                yield frame
        finally:
            self.ended.set()


async def start_echo(certs: Certs, echo: Echo) -> tuple[Any, int]:
    credentials = tls.server_credentials(
        certs.read("market.crt"), certs.read("market.key"), certs.read("ca.crt")
    )
    return await channel.start_server("127.0.0.1:0", credentials, echo.handler)


async def exchange(chan: Any, frames: list[bytes], timeout: float = 20.0) -> list[bytes]:
    """Send ``frames`` on one Connect stream and collect every reply until the server ends."""
    call = channel.stream(chan)(iter(frames), timeout=timeout)
    return [bytes(reply) async for reply in call]


def code_of(exc: BaseException) -> Any:
    assert isinstance(exc, grpc.aio.AioRpcError), exc
    return exc.code()

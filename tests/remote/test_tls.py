"""Certificates (``dpmarket certs init``) and mutual TLS on the market's gRPC stream: the right
client gets through and is seen by its fingerprint; every other kind of client is refused
before the market's handler runs."""

from __future__ import annotations

import asyncio
import stat
import tomllib
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from dpmarket.actors.commands.main import main
from dpmarket.actors.config.market import ConfigError
from dpmarket.actors.remote import channel, tls
from tests.remote.echo import Certs, Echo, code_of, exchange, start_echo

OWNERS, NODES = ["owner-1", "owner-2"], ["node-1", "node-2", "node-3"]


def _init(directory: Path, *extra: str) -> int:
    owners, nodes = ",".join(OWNERS), ",".join(NODES)
    return main(["certs", "init", str(directory), "--owners", owners, "--nodes", nodes, *extra])


def test_certs_init_writes_every_party_with_private_keys(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    assert _init(out) == 0
    parties = ["market", *OWNERS, *NODES]
    for name in ["ca", *parties]:
        assert stat.S_IMODE((out / f"{name}.key").stat().st_mode) == 0o600
        assert (out / f"{name}.crt").read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
    listed = tomllib.loads((out / "fingerprints.toml").read_text())
    assert set(listed) == set(parties)
    for name in parties:
        pem = (out / f"{name}.crt").read_bytes()
        assert listed[name] == tls.fingerprint(pem)
        assert tls.common_name(pem) == name
        der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
        assert tls.fingerprint(der) == listed[name]


def test_certificates_carry_names_hosts_and_usages(tmp_path: Path) -> None:
    assert _init(tmp_path, "--market-host", "127.0.0.1", "--market-host", "market.example") == 0
    market = x509.load_pem_x509_certificate((tmp_path / "market.crt").read_bytes())
    alt = market.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert alt.get_values_for_type(x509.DNSName) == ["market", "market.example"]
    assert [str(ip) for ip in alt.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    usage = market.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage
    owner = x509.load_pem_x509_certificate((tmp_path / "owner-2.crt").read_bytes())
    usage = owner.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert not owner.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    alt = owner.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert alt.get_values_for_type(x509.DNSName) == ["owner-2"]


def test_certs_init_never_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _init(tmp_path) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    capsys.readouterr()
    assert _init(tmp_path) == 2
    assert str(tmp_path / "ca.crt") in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "node-3.key").write_text("mine")
    assert _init(fresh) == 2
    assert str(fresh / "node-3.key") in capsys.readouterr().err
    assert [p.name for p in fresh.iterdir()] == ["node-3.key"]  # nothing written beside it


@pytest.mark.parametrize(
    ("owners", "says"),
    [
        ("owner 1", "bad party name 'owner 1'"),
        ("owner-1,owner-1", "given twice"),
        ("market", "reserved"),
        ("ca", "reserved"),
        ("../up", "bad party name '../up'"),
        ("x" * 65, "1 to 64 characters"),
        ("", "at least one"),
    ],
)
def test_certs_init_refuses_bad_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], owners: str, says: str
) -> None:
    assert main(["certs", "init", str(tmp_path / "c"), "--owners", owners]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_load_pem_names_the_file_and_what_it_should_be(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.crt: no such file \(expected the CA\)"):
        tls.load_pem(tmp_path / "missing.crt", "the CA")
    (tmp_path / "garbage.crt").write_bytes(b"\x00\x01")
    with pytest.raises(ConfigError, match=r"garbage\.crt: not a PEM file \(expected the CA\)"):
        tls.load_pem(tmp_path / "garbage.crt", "the CA")
    assert _init(tmp_path / "c") == 0
    assert tls.load_pem(tmp_path / "c" / "ca.crt", "the CA").startswith(b"-----BEGIN")


# -- mutual TLS on the market's stream ---------------------------------------------------


async def _through(certs: Certs, credentials: Any, server_name: str | None = None) -> Any:
    """Run one exchange against a fresh echo market: (replies or the error, what it saw)."""
    echo = Echo()
    server, port = await start_echo(certs, echo)
    try:
        async with channel.open_channel(f"127.0.0.1:{port}", credentials, server_name) as chan:
            try:
                return await exchange(chan, [b"hello", b"again"]), echo.seen
            except grpc.aio.AioRpcError as exc:
                return exc, echo.seen
    finally:
        await server.stop(None)


def test_a_client_of_the_ca_gets_through_and_is_seen_by_fingerprint(certs: Certs) -> None:
    replies, seen = asyncio.run(_through(certs, certs.client("owner-2")))
    expected = tls.fingerprint(certs.read("owner-2.crt"))
    assert replies == [expected.encode(), b"hello", b"again"]
    assert seen == [(expected, "owner-2")]


def test_the_market_certificate_is_checked_by_name(certs: Certs) -> None:
    replies, _ = asyncio.run(_through(certs, certs.client("node-1"), server_name="market"))
    assert replies[1:] == [b"hello", b"again"]
    error, seen = asyncio.run(_through(certs, certs.client("node-1"), server_name="owner-1"))
    assert code_of(error) == grpc.StatusCode.UNAVAILABLE
    assert seen == []


@pytest.mark.parametrize(
    "client",
    ["cert from another CA", "does not trust the market's CA", "no certificate"],
)
def test_other_clients_are_refused_before_the_handler_runs(certs: Certs, client: str) -> None:
    credentials = {
        "cert from another CA": lambda: certs.client("owner-1", other=True),
        "does not trust the market's CA": lambda: certs.client(
            "owner-1", ca_from_other=True, other=True
        ),
        "no certificate": lambda: grpc.ssl_channel_credentials(certs.read("ca.crt")),
    }[client]()
    error, seen = asyncio.run(_through(certs, credentials))
    assert code_of(error) == grpc.StatusCode.UNAVAILABLE
    assert seen == []


def test_plain_tcp_is_refused(certs: Certs) -> None:
    async def go() -> Any:
        echo = Echo()
        server, port = await start_echo(certs, echo)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as chan:
                try:
                    return await exchange(chan, [b"hello"]), echo.seen
                except grpc.aio.AioRpcError as exc:
                    return exc, echo.seen
        finally:
            await server.stop(None)

    error, seen = asyncio.run(go())
    assert code_of(error) == grpc.StatusCode.UNAVAILABLE
    assert seen == []


def test_a_port_in_use_is_a_config_error(certs: Certs) -> None:
    async def go() -> None:
        server, port = await start_echo(certs, Echo())
        try:
            with pytest.raises(ConfigError, match=f"127.0.0.1:{port}: cannot listen"):
                await channel.start_server(
                    f"127.0.0.1:{port}",
                    tls.server_credentials(
                        certs.read("market.crt"), certs.read("market.key"), certs.read("ca.crt")
                    ),
                    Echo().handler,
                )
        finally:
            await server.stop(None)

    asyncio.run(go())


def test_certs_init_makes_node_keys_that_owners_pin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trial's compute nodes get their X25519 keys (0600) and node-keys.toml the pins an
    owner's [nodes] reads; `dpmarket node fingerprint` of a node config prints the same line."""

    certs = tmp_path / "certs"
    assert (
        main(["certs", "init", str(certs), "--owners", "owner-1", "--nodes", "node-1,node-2"]) == 0
    )
    pins = tomllib.loads((certs / "node-keys.toml").read_text())
    assert sorted(pins) == ["node-1", "node-2"]
    for node in pins:
        assert (certs / f"{node}.x25519").stat().st_mode & 0o777 == 0o600
    config = tmp_path / "node-1.toml"
    config.write_text(
        '[node]\nname = "node-1"\nkey = "certs/node-1.x25519"\n'
        '[market]\naddress = "127.0.0.1:1"\nname = "m"\nca = "certs/ca.crt"\n'
        '[tls]\ncertificate = "certs/node-1.crt"\nkey = "certs/node-1.key"\n'
    )
    capsys.readouterr()
    assert main(["node", "fingerprint", str(config)]) == 0
    assert capsys.readouterr().out.strip() == f'node-1 = "{pins["node-1"]}"'

"""Certificates and keys of the parties; mutual TLS credentials.

Every party that crosses an organisation's boundary (the market, each remote owner, each remote
compute node) holds an ECDSA P-256 key and a certificate whose subject common name is its party
name (``market``, ``owner-1``, ``node-2``). The market's certificate carries serverAuth and the
hosts agents dial (IP addresses and DNS names in its SubjectAlternativeName); an agent's carries
clientAuth. Both sides of a connection present a certificate and check the other's against
their own trust anchor (mutual TLS, ``server_credentials`` / ``channel_credentials``); on top of
the CA, the market pins each declared party's certificate by its SHA-256 fingerprint
(``fingerprint``), so a certificate the CA issued to another name, or a second certificate for
the same name, is refused by whoever checks the pin.

``write_party_certs`` (``dpmarket certs init``) makes a throwaway CA and one key and certificate
per party for local trials and tests. Its CA key sits beside the certificates it signed, which is
fine for a trial and wrong for production: operators bring their own PKI (their CA signs each
party's certificate; each party keeps its own key) and only exchange certificates and
fingerprints.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dpmarket.actors.config.market import ConfigError

__all__ = [
    "AGENT_ROLES",
    "MARKET",
    "channel_credentials",
    "check_party_name",
    "common_name",
    "fingerprint",
    "issue",
    "load_pem",
    "make_ca",
    "server_credentials",
    "sign_identity",
    "verify_identity",
    "write_party_certs",
]

MARKET = "market"
AGENT_ROLES = ("owner", "node")
ROLES = (*AGENT_ROLES, MARKET)
RESERVED_NAMES = ("ca", MARKET, "fingerprints")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_CLOCK_SKEW = datetime.timedelta(minutes=5)


def check_party_name(name: str) -> str:
    """``name`` if it can name a party and its files, else a ValueError saying what is allowed:
    1 to 64 characters of ``A-Z a-z 0-9 . _ -``, not starting with ``.``, ``_`` or ``-``, and
    none of the reserved names (``ca``, ``market``, ``fingerprints``)."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"bad party name {name!r}: use 1 to 64 characters of A-Z a-z 0-9 . _ - "
            "starting with a letter or digit"
        )
    if name.lower() in RESERVED_NAMES:
        raise ValueError(f"bad party name {name!r}: {', '.join(RESERVED_NAMES)} are reserved")
    return name


def _validity(days: int) -> tuple[datetime.datetime, datetime.datetime]:
    if days < 1:
        raise ValueError(f"a certificate must be valid for at least 1 day, not {days}")
    now = datetime.datetime.now(datetime.UTC)
    return now - _CLOCK_SKEW, now + datetime.timedelta(days=days)


def make_ca(name: str, days: int = 365) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new self-signed certificate authority (ECDSA P-256, SHA-256) named ``name``, valid for
    ``days``; it may sign leaf certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    start, end = _validity(days)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _alt_names(name: str, hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.DNSName(name)]
    for host in hosts:
        try:
            entry: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            entry = x509.DNSName(host)
        if entry not in names:
            names.append(entry)
    return names


def issue(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    name: str,
    role: str,
    hosts: Sequence[str] = (),
    days: int = 365,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new key and a leaf certificate for party ``name`` signed by the CA: subject CN ``name``
    and OU ``role`` (``owner``, ``node`` or ``market``), SubjectAlternativeName DNS:``name``
    plus each of ``hosts`` (IP addresses as IPAddress entries, others as DNSName), not a CA.
    Extended key usage: clientAuth for an agent; serverAuth and clientAuth for the market."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    key = ec.generate_private_key(ec.SECP256R1())
    start, end = _validity(days)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role == MARKET:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
            x509.NameAttribute(NameOID.COMMON_NAME, name),
        ]
    )
    ca_public = ca_cert.public_key()
    if not isinstance(ca_public, ec.EllipticCurvePublicKey):
        raise ValueError("the CA certificate must carry an EC public key")
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(min(end, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(_alt_names(name, hosts)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_public), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _certificate(cert_pem_or_der: bytes) -> x509.Certificate:
    try:
        if cert_pem_or_der.lstrip().startswith(b"-----BEGIN"):
            return x509.load_pem_x509_certificate(cert_pem_or_der)
        return x509.load_der_x509_certificate(cert_pem_or_der)
    except ValueError as exc:
        raise ValueError(f"not an X.509 certificate (PEM or DER): {exc}") from None


def fingerprint(cert_pem_or_der: bytes) -> str:
    """``"sha256:" + hex`` of SHA-256 over the certificate's DER encoding (the same value for
    its PEM and DER forms; ``openssl x509 -fingerprint -sha256`` prints it with colons)."""
    der = _certificate(cert_pem_or_der).public_bytes(serialization.Encoding.DER)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def common_name(cert_pem: bytes) -> str:
    """The subject common name of a certificate (PEM or DER): the party it was issued to."""
    names = _certificate(cert_pem).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        raise ValueError(f"a party's certificate has one subject common name, not {len(names)}")
    value = names[0].value
    return value if isinstance(value, str) else value.decode("utf-8")


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Write a file that must not exist yet (O_EXCL), created with ``mode``."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise ConfigError(f"{path}: already exists; refusing to overwrite it") from None
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _party_names(owners: Sequence[str], nodes: Sequence[str]) -> list[str]:
    names = [*owners, *nodes]
    if not names:
        raise ConfigError("certs: name at least one owner or compute node")
    seen: set[str] = set()
    for name in names:
        try:
            check_party_name(name)
        except ValueError as exc:
            raise ConfigError(f"certs: {exc}") from None
        if name.lower() in seen:
            raise ConfigError(f"certs: party name {name!r} given twice (names ignore case)")
        seen.add(name.lower())
    return names


def write_party_certs(
    directory: str | os.PathLike[str],
    owners: Sequence[str],
    nodes: Sequence[str],
    market_hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    days: int = 365,
) -> dict[str, str]:
    """A throwaway CA and a key and certificate for the market and every owner and node, in
    ``directory``: ``ca.crt``, ``ca.key``, ``market.crt``, ``market.key``, ``NAME.crt``,
    ``NAME.key``, and ``fingerprints.toml`` (party = "sha256:..."). Keys are unencrypted PKCS8
    PEM, created with mode 0600. Refuses (ConfigError) bad or repeated party names and any file
    that already exists, before writing anything. Returns party -> certificate fingerprint
    (the market included)."""
    names = _party_names(owners, nodes)
    if days < 1:
        raise ConfigError(f"certs: --days must be at least 1, not {days}")
    target = Path(directory)
    files = ["ca", MARKET, *names]
    paths = [target / f"{n}{ext}" for n in files for ext in (".crt", ".key")]
    paths.append(target / "fingerprints.toml")
    for path in paths:
        if path.exists():
            raise ConfigError(f"{path}: already exists; refusing to overwrite it")
    target.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = make_ca("dpmarket trial CA", days)
    _write_new(target / "ca.key", _key_pem(ca_key), 0o600)
    _write_new(target / "ca.crt", _cert_pem(ca_cert), 0o644)
    roles = [(MARKET, MARKET)] + [(o, "owner") for o in owners] + [(n, "node") for n in nodes]
    found: dict[str, str] = {}  # names hold no quote or backslash: safe as TOML keys
    for name, role in roles:
        hosts = market_hosts if role == MARKET else ()
        key, cert = issue(ca_key, ca_cert, name, role, hosts, days)
        _write_new(target / f"{name}.key", _key_pem(key), 0o600)
        _write_new(target / f"{name}.crt", _cert_pem(cert), 0o644)
        found[name] = fingerprint(_cert_pem(cert))
    lines = ["# SHA-256 fingerprints of the parties' certificates (dpmarket certs init)"]
    lines += [f'"{name}" = "{value}"' for name, value in found.items()]
    _write_new(target / "fingerprints.toml", ("\n".join(lines) + "\n").encode(), 0o644)
    return found


def load_pem(path: str | os.PathLike[str], what: str) -> bytes:
    """The bytes of a PEM file, or a ConfigError naming the file and ``what`` it should hold
    (e.g. "the market's CA certificate") when it is missing, unreadable or not PEM."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file (expected {what})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{path}: not a PEM file (expected {what})")
    return data


def server_credentials(cert: bytes, key: bytes, ca: bytes) -> grpc.ServerCredentials:
    """The market's TLS credentials: its certificate chain and key (PEM), and the CA (PEM) that
    every client certificate must chain to; a client without one is refused."""
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )


def channel_credentials(ca: bytes, cert: bytes, key: bytes) -> grpc.ChannelCredentials:
    """An agent's TLS credentials: the CA (PEM) the market's certificate must chain to, and the
    agent's own certificate and key (PEM) that it presents to the market."""
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


# ---------------------------------------------------------------- an owner's secure-sum key
IDENTITY_CONTEXT = b"dpmarket secure-sum identity v1"


def _identity_message(session: str, party: str, public_key: bytes) -> bytes:
    parts = [IDENTITY_CONTEXT, session.encode(), party.encode(), public_key]
    return b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def sign_identity(key_pem: bytes, session: str, party: str, public_key: bytes) -> bytes:
    """``party``'s signature, with its TLS key, binding its X25519 ``public_key`` to the
    secure-sum ``session``: a compute node that trusts the party's CA can check that the key the
    market relays is the party's own (:func:`verify_identity`)."""
    key = serialization.load_pem_private_key(key_pem, password=None)
    message = _identity_message(session, party, public_key)
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(message, ec.ECDSA(hashes.SHA256()))
    if isinstance(key, rsa.RSAPrivateKey):
        return key.sign(message, padding.PSS(padding.MGF1(hashes.SHA256()), 32), hashes.SHA256())
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(message)
    raise ValueError(f"{party}: a {type(key).__name__} key cannot sign its identity")


def verify_identity(
    ca_pem: bytes, certificate_pem: bytes, signature: bytes, session: str, party: str,
    public_key: bytes, now: datetime.datetime | None = None,
) -> None:  # fmt: skip
    """``ValueError`` naming the reason unless ``certificate_pem`` was issued by the CA in
    ``ca_pem`` to ``party`` (its common name), is valid ``now``, and its key signed
    ``public_key`` for ``session`` (:func:`sign_identity`)."""
    try:
        ca = x509.load_pem_x509_certificate(ca_pem)
        cert = x509.load_pem_x509_certificate(certificate_pem)
    except ValueError as exc:
        raise ValueError(f"{party}: not a PEM certificate ({exc})") from None
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise ValueError(
            f"{party}: its certificate is not issued by the owners' CA ({exc!r})"
        ) from None
    names = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if names != [party]:
        raise ValueError(f"{party}: the certificate is {names}'s, not {party!r}'s")
    now = now or datetime.datetime.now(datetime.UTC)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise ValueError(f"{party}: its certificate is not valid now")
    message = _identity_message(session, party, public_key)
    key = cert.public_key()
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        elif isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, message, padding.PSS(padding.MGF1(hashes.SHA256()), 32),
                       hashes.SHA256())  # fmt: skip
        elif isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, message)
        else:
            raise ValueError(f"{party}: a {type(key).__name__} certificate key is not supported")
    except InvalidSignature:
        raise ValueError(f"{party}: the key relayed for it is not the one it signed") from None

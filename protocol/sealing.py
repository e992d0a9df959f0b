"""Sealed client-to-compute frames and seed expansion for the DCA secure sum.

Heikkilä et al. (2017, Sec. 4.1.4) ask for fast symmetric encryption between each client and each
compute node, with public-key cryptography only to agree on keys. Here:

* **Session keys.** Once per (client, compute node) pair and session: X25519 key agreement, then
  HKDF-Extract (RFC 5869, SHA-256) with a salt that binds the run, both names and both public
  keys, giving a 32-byte pseudorandom key (PRK) per pair (:func:`pair_secret`).
* **Round keys.** Once per pair and round: HKDF-Expand(PRK, info) with ``info`` naming the round
  (:func:`round_keys`); one HMAC-SHA256 each (key blocks absorbed once per session,
  :class:`PairKey`), so it is cheap enough to do per round.
* **Frames.** AES-256-GCM with a fresh random 96-bit nonce from ``secrets`` and associated data
  naming run, round, client, node and payload kind (:func:`seal_rows`, :func:`open_rows`). A
  frame opened under another round's key, another pair's key, or with any bit changed fails
  authentication; a relaying process sees only ciphertext.
* **Seeds.** Blinding shares r_{i,2..M} travel as 32-byte seeds drawn from ``secrets``; the
  compute node expands them with AES-256-CTR or ChaCha20 (:func:`expand_rows`). The keystream is
  taken from the AEAD primitives of ``cryptography`` encrypting zeros with a zero nonce (GCM's
  encryption is AES-CTR from counter block nonce || 2; ChaCha20-Poly1305's is ChaCha20 from block
  counter 1), which avoids a cipher-context set-up per seed; the tag is discarded. Each seed is a
  fresh key used for exactly one expansion, so the fixed nonce is safe. Tests check both streams
  against the raw ``Cipher`` objects.

Security assumptions: compute nodes' public keys reach clients authentically (configuration, not
the relay); X25519 private keys never leave the party that made them.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

__all__ = [
    "KEY_BYTES",
    "NONCE_BYTES",
    "PRGS",
    "PUBLIC_KEY_BYTES",
    "SEED_BYTES",
    "TAG_BYTES",
    "PairKey",
    "expand_rows",
    "expand_sum",
    "generate_keypair",
    "hkdf_expand",
    "hkdf_extract",
    "length_prefixed",
    "open_rows",
    "pair_secret",
    "random_seeds",
    "round_keys",
    "seal_rows",
]

KEY_BYTES = 32
SEED_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
PUBLIC_KEY_BYTES = 32
PRGS = ("aes-ctr", "chacha20")
_ZERO_NONCE = bytes(NONCE_BYTES)
_CHUNK_BYTES = 1 << 25  # keystream bytes joined per vectorised block

U8 = npt.NDArray[np.uint8]
U64 = npt.NDArray[np.uint64]


def length_prefixed(*parts: bytes | str | int) -> bytes:
    """Unambiguous concatenation: each part as 4-byte big-endian length + bytes (ints: 8 bytes)."""
    out = bytearray()
    for part in parts:
        if isinstance(part, int):
            data = part.to_bytes(8, "big", signed=False)
        elif isinstance(part, str):
            data = part.encode("utf-8")
        else:
            data = bytes(part)
        out += len(data).to_bytes(4, "big") + data
    return bytes(out)


# ------------------------------------------------------------------------------ HKDF, X25519
def hkdf_extract(salt: bytes, ikm: bytes) -> bytes:
    """RFC 5869 HKDF-Extract with SHA-256: PRK = HMAC(salt, IKM)."""
    return hmac.digest(salt or bytes(32), ikm, "sha256")


def hkdf_expand(prk: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    """RFC 5869 HKDF-Expand with SHA-256 (``length`` <= 255 * 32)."""
    if not 1 <= length <= 255 * 32:
        raise ValueError(f"length must be in 1..{255 * 32}, got {length}")
    if len(prk) < 32:
        raise ValueError(f"prk must be at least 32 bytes, got {len(prk)}")
    block, out = b"", bytearray()
    counter = 1
    while len(out) < length:
        block = hmac.digest(prk, block + info + bytes([counter]), "sha256")
        out += block
        counter += 1
    return bytes(out[:length])


def generate_keypair() -> tuple[X25519PrivateKey, bytes]:
    """A fresh X25519 key pair from the OS CSPRNG: (private key, raw 32-byte public key)."""
    private = X25519PrivateKey.generate()
    return private, private.public_key().public_bytes_raw()


def pair_secret(private: X25519PrivateKey, peer_public: bytes, salt: bytes) -> bytes:
    """X25519 with the peer's raw public key, then HKDF-Extract with ``salt``: the pair's PRK.

    ``ValueError`` for a malformed or low-order peer key (the shared secret would be zero).
    """
    if not isinstance(peer_public, bytes) or len(peer_public) != PUBLIC_KEY_BYTES:
        raise ValueError(f"peer_public must be {PUBLIC_KEY_BYTES} bytes")
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError:
        raise ValueError("peer_public: not a usable X25519 public key") from None
    return hkdf_extract(hashlib.sha256(salt).digest(), shared)


class PairKey:
    """A pair's PRK ready for HKDF-Expand: the HMAC-SHA256 key blocks (RFC 2104, K xor ipad and
    K xor opad) are absorbed once, so each round key costs two short SHA-256 computations.

    ``expand(info)`` equals :func:`hkdf_expand` (PRK, info, 32) (a test checks it against the
    ``cryptography`` package). The PRK itself is not kept.
    """

    __slots__ = ("_inner", "_outer")

    def __init__(self, prk: bytes) -> None:
        if len(prk) != 32:
            raise ValueError(f"prk must be 32 bytes, got {len(prk)}")
        block = prk.ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))

    def expand(self, info: bytes) -> bytes:
        """HKDF-Expand(PRK, info) to 32 bytes: HMAC(PRK, info || 0x01)."""
        return self.mac(info + b"\x01")

    def mac(self, message: bytes) -> bytes:
        """HMAC-SHA256(PRK, message)."""
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


def round_keys(pairs: Sequence[PairKey], info: bytes) -> list[bytes]:
    """HKDF-Expand of every pair's PRK with the round's ``info``: one AES-256 key per pair."""
    tail = info + b"\x01"
    return [pair.mac(tail) for pair in pairs]


# ------------------------------------------------------------------------------ AES-GCM frames
def seal_rows(keys: Sequence[bytes], rows: U8, aads: Sequence[bytes]) -> U8:
    """Seal row i of ``rows`` (uint8, shape (n, L)) with ``keys[i]`` and ``aads[i]``.

    Returns uint8 of shape (n, 12 + L + 16): random nonce || ciphertext || tag.
    """
    data = np.ascontiguousarray(rows, dtype=np.uint8)
    if data.ndim != 2 or len(keys) != len(data) or len(aads) != len(data):
        raise ValueError(
            f"rows: expected shape (n, L) with n = len(keys) = len(aads), got {data.shape}, "
            f"{len(keys)} keys, {len(aads)} aads"
        )
    n, width = data.shape
    out = np.empty((n, NONCE_BYTES + width + TAG_BYTES), dtype=np.uint8)
    nonces = secrets.token_bytes(NONCE_BYTES * n)
    out[:, :NONCE_BYTES] = np.frombuffer(nonces, dtype=np.uint8).reshape(n, NONCE_BYTES)
    src, dst = data.reshape(-1).data, out.reshape(-1).data
    step = out.shape[1]
    for i in range(n):
        nonce = nonces[NONCE_BYTES * i : NONCE_BYTES * (i + 1)]
        sealed = dst[step * i + NONCE_BYTES : step * (i + 1)]
        AESGCM(keys[i]).encrypt_into(nonce, src[width * i : width * (i + 1)], aads[i], sealed)
    return out


def open_rows(
    keys: Sequence[bytes], frames: U8, aads: Sequence[bytes]
) -> tuple[U8, npt.NDArray[np.bool_]]:
    """Open frames sealed by :func:`seal_rows`; returns (plaintexts, ok).

    Rows that fail authentication come back as zeros with ``ok`` False; nothing raises for them.
    """
    data = np.ascontiguousarray(frames, dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] < NONCE_BYTES + TAG_BYTES:
        raise ValueError(f"frames: expected shape (n, >= 28), got {data.shape}")
    if len(keys) != len(data) or len(aads) != len(data):
        raise ValueError(f"frames: {len(data)} rows for {len(keys)} keys and {len(aads)} aads")
    step = data.shape[1]
    width = step - NONCE_BYTES - TAG_BYTES
    plain = np.zeros((len(data), width), dtype=np.uint8)
    ok = np.zeros(len(data), dtype=np.bool_)
    src, dst = data.reshape(-1).data, plain.reshape(-1).data
    for i in range(len(data)):
        frame = src[step * i : step * (i + 1)]
        target = dst[width * i : width * (i + 1)]
        try:
            AESGCM(keys[i]).decrypt_into(frame[:NONCE_BYTES], frame[NONCE_BYTES:], aads[i], target)
        except InvalidTag:
            plain[i] = 0  # never hand out unauthenticated plaintext
            continue
        ok[i] = True
    return plain, ok


# ------------------------------------------------------------------------------ seeds, PRG
def random_seeds(count: int) -> U8:
    """``count`` independent 32-byte seeds from the OS CSPRNG, shape (count, 32)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    raw = secrets.token_bytes(SEED_BYTES * count)
    return np.frombuffer(raw, dtype=np.uint8).reshape(count, SEED_BYTES).copy()


def _prg_cipher(prg: str) -> type[AESGCM] | type[ChaCha20Poly1305]:
    if prg == "aes-ctr":
        return AESGCM
    if prg == "chacha20":
        return ChaCha20Poly1305
    raise ValueError(f"prg must be one of {PRGS}, got {prg!r}")


def _expanded_blocks(seeds: U8, d: int, prg: str) -> Iterator[tuple[int, U64]]:
    """(start row, words of shape (rows, k, d)) over blocks of about 32 MiB of keystream.

    The words are a view of one reused buffer: consume each block before asking for the next.
    """
    arr = np.asarray(seeds, dtype=np.uint8)
    if arr.ndim == 2:
        arr = arr[:, None, :]
    if arr.ndim != 3 or arr.shape[2] != SEED_BYTES:
        raise ValueError(f"seeds: expected shape (n, k, {SEED_BYTES}), got {arr.shape}")
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"d must be an integer >= 1, got {d!r}")
    cipher, zeros = _prg_cipher(prg), bytes(8 * d)
    n, k, _ = arr.shape
    step = 8 * d + TAG_BYTES  # keystream words then the discarded tag (two words)
    chunk = max(1, min(n, _CHUNK_BYTES // (k * step)))
    buffer = np.empty((chunk, k, d + 2), dtype="<u8")
    dst = buffer.data.cast("B")
    for start in range(0, n, chunk):
        flat = np.ascontiguousarray(arr[start : start + chunk]).tobytes()
        count = len(flat) // SEED_BYTES
        for j in range(count):
            key = flat[SEED_BYTES * j : SEED_BYTES * (j + 1)]
            cipher(key).encrypt_into(_ZERO_NONCE, zeros, None, dst[step * j : step * (j + 1)])
        yield start, buffer[: count // k, :, :d]


def expand_rows(seeds: U8, d: int, prg: str = "aes-ctr") -> U64:
    """Expand seeds of shape (n, k, 32) and sum over k: uint64 array (n, d) whose row i is
    sum_j PRG(seeds[i, j]) mod 2^64 (little-endian 64-bit words of the keystream).

    A (n, 32) input is treated as k = 1. For a uniform seed the output is computationally
    uniform on Z_2^64 (AES-256 and ChaCha20 as pseudorandom functions).
    """
    n = int(np.shape(seeds)[0])
    out = np.zeros((n, d), dtype=np.uint64)
    for start, words in _expanded_blocks(seeds, d, prg):
        out[start : start + len(words)] = words.sum(axis=1, dtype=np.uint64)
    return out


def expand_sum(seeds: U8, d: int, prg: str = "aes-ctr") -> U64:
    """sum_i PRG(seeds[i]) mod 2^64 over seeds of shape (n, 32), without an (n, d) buffer."""
    total = np.zeros(d, dtype=np.uint64)
    for _, words in _expanded_blocks(seeds, d, prg):
        total += words.sum(axis=(0, 1), dtype=np.uint64)
    return total

"""Sealed client-to-compute frames and seed expansion for the DCA secure sum.

Heikkilä et al. (2017, Sec. 4.1.4) ask for fast symmetric encryption between each client and each
compute node, with public-key cryptography only to agree on keys. Here:

* **Session keys.** Once per (client, compute node) pair and session: X25519 key agreement, then
  HKDF-Extract (RFC 5869, SHA-256) with a salt that binds the run, both names and both public
  keys, giving a 32-byte pseudorandom key (PRK) per pair (:func:`pair_secret`).
* **Round keys.** Per pair, HKDF-Expand(PRK, info(b), 32 B) (RFC 5869) gives the AES-256 keys
  of B = :data:`ROUND_KEY_BLOCK` consecutive rounds at once: round r >= 1 uses the 32-byte piece
  (r - 1) mod B of block b = (r - 1) // B (:class:`RoundKeyring`). Distinct pieces of one HKDF
  output are independent pseudorandom keys, so every (pair, round) has its own key, as with one
  HKDF-Expand per round; deriving a block costs B HMAC-SHA256s per pair (the first block during
  session set-up, later ones when a round first needs them), so a round itself hashes nothing.
* **Frames.** AES-256-GCM with a fresh random 96-bit nonce from ``secrets`` and associated data
  naming run, round (with its parameters), node and payload kind (:func:`seal_rows`,
  :func:`open_rows`); the client is named by the key, which only that (client, node) pair holds.
  A frame opened under another round's key, another pair's key, for another node or kind, or
  with any bit changed fails authentication; a relaying process sees only ciphertext.
* **Seeds** (``shares = "sealed-seeds"``; the default derives them instead, :mod:`.masks`).
  Blinding shares r_{i,2..M} travel as 32-byte seeds drawn from ``secrets``; the
  compute node expands them with AES-256-CTR or ChaCha20 (:func:`expand_rows`). The keystream is
  taken from the AEAD primitives of ``cryptography`` encrypting zeros with a zero nonce (GCM's
  encryption is AES-CTR from counter block nonce || 2, CCM's, used for streams of at most 256
  bytes because its set-up costs less, AES-CTR from counter block 0x01 || 0^13 || 1;
  ChaCha20-Poly1305's is ChaCha20 from block counter 1), which avoids a cipher-context set-up
  per seed; the tag is discarded. Each seed is a fresh key used for exactly one expansion, so
  the fixed nonce is safe. Tests check the streams against the raw ``Cipher`` objects.

Security assumptions: compute nodes' public keys reach clients authentically: a client checks
each against a SHA-256 fingerprint (:func:`key_fingerprint`) pinned out of band, never through
the relay that carries the keys; X25519 private keys never leave the party that holds them.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import numpy.typing as npt
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESCCM, AESGCM, ChaCha20Poly1305

__all__ = [
    "KEY_BYTES",
    "NONCE_BYTES",
    "PRGS",
    "PUBLIC_KEY_BYTES",
    "ROUND_KEY_BLOCK",
    "SEED_BYTES",
    "TAG_BYTES",
    "PairKey",
    "RoundKeyring",
    "expand_rows",
    "expand_sum",
    "generate_keypair",
    "hkdf_expand",
    "hkdf_extract",
    "key_fingerprint",
    "length_prefixed",
    "open_rows",
    "pair_secret",
    "random_seeds",
    "seal_rows",
]

KEY_BYTES = 32
SEED_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
PUBLIC_KEY_BYTES = 32
PRGS = ("aes-ctr", "chacha20")
ROUND_KEY_BLOCK = 16  # rounds whose keys one HKDF-Expand call per pair derives
_ZERO_NONCE = bytes(NONCE_BYTES)
_ZERO_NONCE_13 = bytes(13)
_CCM_STREAM_BYTES = 256  # AES streams this short come from AESCCM (its set-up is cheaper)
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
    """RFC 5869 HKDF-Expand with SHA-256 of a 32-byte PRK (``length`` <= 255 * 32)."""
    return PairKey(prk).expand(info, length)


def generate_keypair() -> tuple[X25519PrivateKey, bytes]:
    """A fresh X25519 key pair from the OS CSPRNG: (private key, raw 32-byte public key)."""
    private = X25519PrivateKey.generate()
    return private, private.public_key().public_bytes_raw()


def key_fingerprint(public: bytes) -> str:
    """SHA-256 of a raw public key, hex: what an operator pins out of band (never via a relay)."""
    if not isinstance(public, bytes) or len(public) != PUBLIC_KEY_BYTES:
        raise ValueError(f"public key must be {PUBLIC_KEY_BYTES} raw bytes")
    return hashlib.sha256(public).hexdigest()


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


_IPAD = bytes(b ^ 0x36 for b in range(256))  # byte translation tables: x -> x xor pad
_OPAD = bytes(b ^ 0x5C for b in range(256))


class PairKey:
    """A pair's PRK ready for HKDF-Expand: the HMAC-SHA256 key blocks (RFC 2104, K xor ipad and
    K xor opad) are absorbed once, so each 32-byte output block costs two short SHA-256 runs.

    ``expand(info, length)`` equals :func:`hkdf_expand` (PRK, info, length) (a test checks it
    against the ``cryptography`` package). The PRK itself is not kept.
    """

    __slots__ = ("_inner", "_outer")

    def __init__(self, prk: bytes) -> None:
        if len(prk) != 32:
            raise ValueError(f"prk must be 32 bytes, got {len(prk)}")
        block = prk.ljust(64, b"\0")
        self._inner = hashlib.sha256(block.translate(_IPAD))
        self._outer = hashlib.sha256(block.translate(_OPAD))

    def expand(self, info: bytes, length: int = KEY_BYTES) -> bytes:
        """HKDF-Expand(PRK, info, length): T(i) = HMAC(PRK, T(i-1) || info || i), concatenated."""
        if not 1 <= length <= 255 * 32:
            raise ValueError(f"length must be in 1..{255 * 32}, got {length}")
        block, out = b"", []
        for counter in range(1, -(-length // 32) + 1):
            block = self.mac(block + info + bytes([counter]))
            out.append(block)
        return b"".join(out)[:length]

    def mac(self, message: bytes) -> bytes:
        """HMAC-SHA256(PRK, message)."""
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


class RoundKeyring:
    """The AES-256 round keys of up to ``size`` pairs (slots), derived B rounds at a time.

    Round r >= 1 lies in block b = (r - 1) // B; a slot's keys for block b are one
    HKDF-Expand(PRK, ``info(b)``, 32 B) call, cut into B keys, and round r takes piece
    (r - 1) mod B. ``add`` derives the current block for new pairs (session set-up); ``keys``
    derives a later block for every pair the first time a round of it is asked for. Rounds only
    move forward: asking for a round of an earlier block raises ``ValueError`` (its keys are
    gone). Memory: 32 B bytes per slot.
    """

    def __init__(
        self, size: int, info: Callable[[int], bytes], block: int = ROUND_KEY_BLOCK
    ) -> None:
        if size < 0 or not 1 <= block <= 255:
            raise ValueError(f"size must be >= 0 and block in 1..255, got {size}, {block}")
        self._info, self._width = info, block
        self._pairs: list[PairKey | None] = [None] * size
        self._known = np.zeros(size, dtype=np.bool_)
        self._keys = np.zeros((size, block * KEY_BYTES), dtype=np.uint8)
        self._block = 0

    def add(self, slots: Sequence[int], pairs: Sequence[PairKey]) -> None:
        """Install the pairs of new ``slots`` and derive their keys of the current block."""
        index = self._slots(slots)
        if len(index) != len(pairs):
            raise ValueError(f"slots: {len(index)} slots for {len(pairs)} pairs")
        if len(np.unique(index)) != len(index) or self._known[index].any():
            raise ValueError("slots: repeated or already installed")
        for slot, pair in zip(index.tolist(), pairs, strict=True):
            self._pairs[slot] = pair
        self._known[index] = True
        self._derive(index)

    def keys(self, round_: int, slots: Sequence[int] | npt.NDArray[np.int64]) -> list[bytes]:
        """Round ``round_``'s 32-byte key of every slot in ``slots`` (installed ones only)."""
        if isinstance(round_, bool) or not isinstance(round_, int) or round_ < 1:
            raise ValueError(f"round must be an integer >= 1, got {round_!r}")
        block, piece = divmod(round_ - 1, self._width)
        if block < self._block:
            raise ValueError(f"round {round_}: its key block {block} was already discarded")
        index = self._slots(slots)
        if not self._known[index].all():
            raise ValueError("slots: some have no pair key installed")
        if block > self._block:
            self._block = block
            self._derive(np.flatnonzero(self._known))
        raw = self._keys[index, KEY_BYTES * piece : KEY_BYTES * (piece + 1)].tobytes()
        return [raw[i : i + KEY_BYTES] for i in range(0, len(raw), KEY_BYTES)]

    def _slots(self, slots: Sequence[int] | npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        index = np.asarray(slots, dtype=np.int64).reshape(-1)
        if index.size and (index.min() < 0 or index.max() >= len(self._pairs)):
            raise ValueError(f"slots: outside 0..{len(self._pairs) - 1}")
        return index

    def _derive(self, index: npt.NDArray[np.int64]) -> None:
        info, length = self._info(self._block), KEY_BYTES * self._width
        pairs = [self._pairs[i] for i in index.tolist()]
        raw = b"".join(p.expand(info, length) for p in pairs if p is not None)
        self._keys[index] = np.frombuffer(raw, dtype=np.uint8).reshape(len(index), length)


# ------------------------------------------------------------------------------ AES-GCM frames
def seal_rows(keys: Sequence[bytes], rows: U8, aad: bytes) -> U8:
    """Seal row i of ``rows`` (uint8, shape (n, L)) with ``keys[i]``, all with associated data
    ``aad``.

    Returns uint8 of shape (n, 12 + L + 16): random nonce || ciphertext || tag, with 96 random
    bits from ``secrets`` per frame. Each key must seal one frame only (here: one round key per
    pair and round); what tells the rows apart is their keys.
    """
    data = np.ascontiguousarray(rows, dtype=np.uint8)
    if data.ndim != 2 or len(keys) != len(data):
        raise ValueError(
            f"rows: expected shape (n, L) with n = len(keys), got {data.shape}, {len(keys)} keys"
        )
    n, width = data.shape
    out = np.empty((n, NONCE_BYTES + width + TAG_BYTES), dtype=np.uint8)
    nonces = secrets.token_bytes(NONCE_BYTES * n)
    out[:, :NONCE_BYTES] = np.frombuffer(nonces, dtype=np.uint8).reshape(n, NONCE_BYTES)
    src, dst, step = memoryview(data.tobytes()), out.reshape(-1).data, out.shape[1]
    for i, key in enumerate(keys):
        at = step * i + NONCE_BYTES
        AESGCM(key).encrypt_into(
            nonces[NONCE_BYTES * i : NONCE_BYTES * (i + 1)],
            src[width * i : width * (i + 1)],
            aad,
            dst[at : at + width + TAG_BYTES],
        )
    return out


def open_rows(keys: Sequence[bytes], frames: U8, aad: bytes) -> tuple[U8, npt.NDArray[np.bool_]]:
    """Open frames sealed by :func:`seal_rows`; returns (plaintexts, ok).

    Rows that fail authentication come back as zeros with ``ok`` False; nothing raises for them.
    """
    data = np.ascontiguousarray(frames, dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] < NONCE_BYTES + TAG_BYTES:
        raise ValueError(f"frames: expected shape (n, >= 28), got {data.shape}")
    if len(keys) != len(data):
        raise ValueError(f"frames: {len(data)} rows for {len(keys)} keys")
    step = data.shape[1]
    width = step - NONCE_BYTES - TAG_BYTES
    plain = np.zeros((len(data), width), dtype=np.uint8)
    ok = np.ones(len(data), dtype=np.bool_)
    src, dst = memoryview(data.tobytes()), plain.reshape(-1).data
    for i, key in enumerate(keys):
        at = step * i
        try:
            AESGCM(key).decrypt_into(
                src[at : at + NONCE_BYTES],
                src[at + NONCE_BYTES : at + step],
                aad,
                dst[width * i : width * (i + 1)],
            )
        except InvalidTag:
            ok[i] = False
    plain[~ok] = 0  # never hand out unauthenticated plaintext
    return plain, ok


# ------------------------------------------------------------------------------ seeds, PRG
def random_seeds(count: int) -> U8:
    """``count`` independent 32-byte seeds from the OS CSPRNG, shape (count, 32)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    raw = secrets.token_bytes(SEED_BYTES * count)
    return np.frombuffer(raw, dtype=np.uint8).reshape(count, SEED_BYTES).copy()


def _prg_cipher(prg: str, d: int) -> tuple[type[AESGCM | AESCCM | ChaCha20Poly1305], bytes]:
    """The AEAD whose encryption of zeros is the seed's keystream for d words, and its nonce."""
    if prg == "aes-ctr":
        if 8 * d <= _CCM_STREAM_BYTES:
            return AESCCM, _ZERO_NONCE_13
        return AESGCM, _ZERO_NONCE
    if prg == "chacha20":
        return ChaCha20Poly1305, _ZERO_NONCE
    raise ValueError(f"prg must be one of {PRGS}, got {prg!r}")


def _expanded_blocks(seeds: U8, d: int, prg: str) -> Iterator[tuple[int, U64]]:
    """(start row, words of shape (rows, k, d + 2)) over blocks of about 32 MiB of keystream.

    The last two words of each stream are the discarded tag: callers slice them off (after
    reducing, which is faster on contiguous rows). The words are a view of one reused buffer:
    consume each block before asking for the next.
    """
    arr = np.asarray(seeds, dtype=np.uint8)
    if arr.ndim == 2:
        arr = arr[:, None, :]
    if arr.ndim != 3 or arr.shape[2] != SEED_BYTES:
        raise ValueError(f"seeds: expected shape (n, k, {SEED_BYTES}), got {arr.shape}")
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"d must be an integer >= 1, got {d!r}")
    (cipher, nonce), zeros = _prg_cipher(prg, d), bytes(8 * d)
    n, k, _ = arr.shape
    step = 8 * d + TAG_BYTES  # keystream words then the discarded tag (two words)
    chunk = max(1, min(n, _CHUNK_BYTES // (k * step)))
    buffer = np.empty((chunk, k, d + 2), dtype="<u8")
    dst = buffer.data.cast("B")
    for start in range(0, n, chunk):
        flat = np.ascontiguousarray(arr[start : start + chunk]).tobytes()
        for j, at in enumerate(range(0, len(flat), SEED_BYTES)):
            key = flat[at : at + SEED_BYTES]
            cipher(key).encrypt_into(nonce, zeros, None, dst[step * j : step * (j + 1)])
        yield start, buffer[: len(flat) // (SEED_BYTES * k)]


def expand_rows(seeds: U8, d: int, prg: str = "aes-ctr") -> U64:
    """Expand seeds of shape (n, k, 32) and sum over k: uint64 array (n, d) whose row i is
    sum_j PRG(seeds[i, j]) mod 2^64 (little-endian 64-bit words of the keystream).

    A (n, 32) input is treated as k = 1. For a uniform seed the output is computationally
    uniform on Z_2^64 (AES-256 and ChaCha20 as pseudorandom functions).
    """
    n = int(np.shape(seeds)[0])
    out = np.zeros((n, d), dtype=np.uint64)
    for start, words in _expanded_blocks(seeds, d, prg):
        out[start : start + len(words)] = words.sum(axis=1, dtype=np.uint64)[:, :d]
    return out


def expand_sum(seeds: U8, d: int, prg: str = "aes-ctr") -> U64:
    """sum_i PRG(seeds[i]) mod 2^64 over seeds of shape (n, 32), without an (n, d) buffer."""
    total = np.zeros(d, dtype=np.uint64)
    for _, words in _expanded_blocks(seeds, d, prg):
        total += words.reshape(-1, d + 2).sum(axis=0, dtype=np.uint64)[:d]
    return total

"""Derived blinding shares for the DCA secure sum (``DcaConfig.shares == "derived"``).

In the ``"sealed-seeds"`` mode a client draws a fresh seed for every node but its value node,
seals it and sends it; the node opens and expands it. That costs four ``cryptography`` calls per
(client, node) pair and round. In the ``"derived"`` mode (the default) the blinding share of a
pair is never sent: client i and node k compute it from their pair's PRK (X25519 + HKDF-Extract,
:func:`~dpmarket.protocol.securesum.sealing.pair_secret`), and only the value share crosses the
network,
sealed as before. The construction, for a round r of dimension d:

* **Mask key.** Once per pair and session, K = HKDF-Expand(PRK, info, 32) (RFC 5869,
  SHA-256; :func:`mask_key_info`), kept as a ready cipher object (:func:`mask_cipher`).
* **Blocks of rounds.** B(d) = clamp(``MASK_BLOCK_WORDS`` // (d + 4), 1, ``MAX_BLOCK_ROUNDS``)
  rounds of dimension d form a block: round r lies in block b = (r - 1) // B(d) at piece
  p = (r - 1) mod B(d). B depends only on d, so both sides agree on it.
* **Block stream.** B(d) (4 + d) 64-bit words of the AES-256-CTR keystream under K from counter
  block nonce(b, d) || 2 (or ChaCha20 with that nonce from block 1), nonce(b, d) = b as 8 bytes
  || d as 4 bytes (big-endian): distinct (b, d) give distinct nonces, so no two streams of a key
  overlap. The stream is the encryption of zeros by AES-GCM (ChaCha20-Poly1305) with that nonce,
  tag discarded, as for the seeds (:mod:`.sealing`). It is read as B(d) rows of 4 + d words: row
  p's first 4 words (32 bytes) are the pair's AES-256-GCM key for its frame of round
  b B + p + 1, the other d words the pair's blinding share for that round.

Client i's value share in round r is z_i + eta_i - sum over k != v(i, r) of mask_{i,k,r}, sealed
under the (i, v(i, r)) frame key of round r; node k adds mask_{i,k,r} for every agreed client
whose value node is not k. The sums are the sealed-seeds sums, exactly.

Security, against the sealed-seeds mode: a mask or frame key is a pseudorandom function of a key
only that pair holds (AES as a PRF over distinct counter blocks: no counter block repeats across
(b, d) or within a stream), so it is as unpredictable to every other party as a fresh seed;
pieces are disjoint, so no mask or frame key serves two rounds. A relay now sees one sealed
frame per client and round instead of M. What changes is when a node learns that a client took
part: a node k that is not client i's value node hears nothing from i and vouches only for
having i's pair key (registration); the value node vouches for the frame (agreement in
:mod:`.node`).
Cost: per pair and block one keystream call on each side (about 1.8 us for 8 KiB), amortised
over B(d) rounds; per client and round one seal and one open.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

from dpmarket.protocol.securesum.sealing import KEY_BYTES, PRGS, TAG_BYTES, PairKey, length_prefixed

__all__ = [
    "FRAME_KEY_WORDS",
    "MASK_BLOCK_WORDS",
    "MAX_BLOCK_ROUNDS",
    "ClientMasks",
    "NodeMasks",
    "block_of",
    "block_rounds",
    "block_streams",
    "mask_cipher",
    "mask_key_info",
]

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
BoolArray = npt.NDArray[np.bool_]
MaskCipher = AESGCM | ChaCha20Poly1305

MASK_BLOCK_WORDS = 1024  # keystream words per pair and block (8 KiB)
MAX_BLOCK_ROUNDS = 128
FRAME_KEY_WORDS = KEY_BYTES // 8
_KEEP_DIMS = 4  # blocks of this many distinct d are kept at once (older ones are rebuilt)
_CHUNK_BYTES = 1 << 25  # keystream bytes per chunk
_CACHE_WORDS = 1 << 18  # stream words per member chunk when a client party builds a block
_DOMAIN = "dpmarket/dca/v1/mask-block"


def block_rounds(d: int) -> int:
    """B(d): how many rounds of dimension ``d`` one block stream covers."""
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"d must be an integer >= 1, got {d!r}")
    return max(1, min(MAX_BLOCK_ROUNDS, MASK_BLOCK_WORDS // (d + FRAME_KEY_WORDS)))


def block_of(round_: int, d: int) -> tuple[int, int]:
    """(block, piece) of round ``round_`` >= 1 at dimension ``d``."""
    if isinstance(round_, bool) or not isinstance(round_, int) or round_ < 1:
        raise ValueError(f"round must be an integer >= 1, got {round_!r}")
    return divmod(round_ - 1, block_rounds(d))


def mask_key_info() -> bytes:
    """HKDF-Expand ``info`` of a pair's mask key (the PRK binds run, pair and public keys)."""
    return length_prefixed(_DOMAIN)


def mask_cipher(pair: PairKey, prg: str) -> MaskCipher:
    """The pair's mask key K as a ready AEAD object whose encryption of zeros is the stream."""
    key = pair.expand(mask_key_info())
    if prg == "aes-ctr":
        return AESGCM(key)
    if prg == "chacha20":
        return ChaCha20Poly1305(key)
    raise ValueError(f"prg must be one of {PRGS}, got {prg!r}")


def block_nonce(block: int, d: int) -> bytes:
    """nonce(b, d): b as 8 bytes || d as 4 bytes, big-endian."""
    if not (0 <= block < 1 << 64 and 1 <= d < 1 << 32):
        raise ValueError(f"block {block} or d {d} outside the nonce's range")
    return block.to_bytes(8, "big") + d.to_bytes(4, "big")


def block_streams(ciphers: Sequence[MaskCipher], block: int, d: int) -> Iterator[tuple[int, U64]]:
    """(start, words of shape (rows, B(d), 4 + d)) for the pairs, in chunks of about 32 MiB.

    Row p of a pair is [frame key (4 words) | mask (d words)] of round block B + p + 1. The words
    are a view of a reused buffer: consume each chunk before asking for the next.
    """
    rounds, width = block_rounds(d), _stream_words(d)
    chunk = max(1, min(len(ciphers), _CHUNK_BYTES // (8 * width + TAG_BYTES)))
    buffer = np.empty((chunk, width + TAG_BYTES // 8), dtype="<u8")
    for start in range(0, len(ciphers), chunk):
        part = ciphers[start : start + chunk]
        _fill(part, block, d, buffer[: len(part)])
        words = buffer[: len(part), :width]
        yield start, words.reshape(len(part), rounds, FRAME_KEY_WORDS + d).view(np.uint64)


def _stream_words(d: int) -> int:
    return block_rounds(d) * (FRAME_KEY_WORDS + d)


def _fill(ciphers: Sequence[MaskCipher], block: int, d: int, out: npt.NDArray[np.generic]) -> None:
    """Write each pair's block stream and discarded tag into a row of ``out`` (contiguous,
    shape (len(ciphers), words + 2), 8-byte items)."""
    width = _stream_words(d)
    if out.shape != (len(ciphers), width + TAG_BYTES // 8) or not out.flags.c_contiguous:
        raise ValueError(f"out: expected a contiguous ({len(ciphers)}, {width + 2}) buffer")
    nonce, zeros, step = block_nonce(block, d), bytes(8 * width), 8 * width + TAG_BYTES
    dst = out.data.cast("B")
    for j, cipher in enumerate(ciphers):
        cipher.encrypt_into(nonce, zeros, None, dst[step * j : step * (j + 1)])


def _key_bytes(words: U64) -> list[bytes]:
    raw = np.ascontiguousarray(words, dtype="<u8").tobytes()
    return [raw[i : i + KEY_BYTES] for i in range(0, len(raw), KEY_BYTES)]


def _value_nodes(index: I64, block: int, rounds: int, n_nodes: int) -> I64:
    """v(i, r) = (i + r) mod M for every client in ``index`` and round of the block: (n, B)."""
    first = block * rounds + 1
    return (index[:, None] + np.arange(first, first + rounds)[None, :]) % n_nodes


@dataclass
class _ClientBlock:
    block: int
    masks: U64  # (n, B, d): sum of the masks of every node but the value node
    keys: U64  # (n, B, 4): the frame key with the value node


class ClientMasks:
    """A client party's side: per member, the masks to subtract and the frame keys.

    ``ciphers[k][i]`` is member i's :func:`mask_cipher` with node k (configuration order).
    Memory: up to ``MASK_BLOCK_WORDS`` words (8 KiB) per member and cached d, whatever d is.

    Masks and frame keys are fixed per (pair, round): a client must never contribute twice to
    one round with the same pair keys, or the value node learns the difference of the two
    values. :class:`~dpmarket.protocol.securesum.client.Client` refuses any round not after its
    last
    one; a restarted client makes new key pairs, and nodes refuse a second registration, so it
    stays out of the session. Anything that would persist pair keys across a restart must
    persist the last round before the first frame of a round leaves.
    """

    def __init__(self, index: I64, ciphers: Sequence[Sequence[MaskCipher]]) -> None:
        if any(len(row) != len(index) for row in ciphers) or len(ciphers) < 2:
            raise ValueError("ciphers: one per member for each of at least 2 nodes")
        self._index, self._ciphers = np.asarray(index, np.int64), ciphers
        self._blocks: dict[int, _ClientBlock] = {}

    def round(self, round_: int, d: int, rows: slice) -> tuple[U64, list[bytes]]:
        """For members ``rows``: (sum of their non-value nodes' masks (rows, d), frame keys)."""
        block, piece = block_of(round_, d)
        cached = self._blocks.get(d)
        if cached is None or cached.block != block:
            cached = self._build(block, d)
        return cached.masks[rows, piece], _key_bytes(cached.keys[rows, piece])

    def _build(self, block: int, d: int) -> _ClientBlock:
        self._blocks.pop(d, None)
        if len(self._blocks) >= _KEEP_DIMS:
            self._blocks.pop(next(iter(self._blocks)))
        n, rounds, m = len(self._index), block_rounds(d), len(self._ciphers)
        value = _value_nodes(self._index, block, rounds, m)
        masks = np.empty((n, rounds, d), dtype=np.uint64)
        keys = np.empty((n, rounds, FRAME_KEY_WORDS), dtype=np.uint64)
        width = _stream_words(d)
        rows = max(1, _CACHE_WORDS // (m * width))  # member chunks that stay in cache
        streams = np.empty((m, rows, width + TAG_BYTES // 8), dtype="<u8")
        for start in range(0, n, rows):
            stop = min(n, start + rows)
            count = stop - start
            for k, ciphers in enumerate(self._ciphers):
                _fill(ciphers[start:stop], block, d, streams[k, :count])
            words = streams[:, :count, :width].reshape(m, count, rounds, -1).view(np.uint64)
            total = words[..., FRAME_KEY_WORDS:].sum(axis=0, dtype=np.uint64)
            pick = words[value[start:stop], np.arange(count)[:, None], np.arange(rounds)]
            np.subtract(total, pick[..., FRAME_KEY_WORDS:], out=masks[start:stop])
            keys[start:stop] = pick[..., :FRAME_KEY_WORDS]
        self._blocks[d] = _ClientBlock(block, masks, keys)
        return self._blocks[d]


@dataclass
class _NodeBlock:
    block: int
    covered: BoolArray  # the clients registered when the block was built
    totals: U64  # (B, d): masks summed over covered clients whose value node is elsewhere
    keys: U64  # (B, ceil(N / M), 4): frame keys of value clients i, at i // M


class NodeMasks:
    """A compute node's side: mask totals over all registered clients per block, corrected at
    partial time for clients outside the agreed set, and the value clients' frame keys.

    The totals cost one keystream per registered client and block (the mask keys were derived
    at registration); a correction re-derives the stream of each client left out (at most T of
    them) or registered later. Memory per cached d: B(d) x d totals and B(d) x ceil(N / M)
    frame keys.
    """

    def __init__(self, n_clients: int, n_nodes: int, position: int) -> None:
        self._n, self._m, self._position = n_clients, n_nodes, position
        self._ciphers: list[MaskCipher | None] = [None] * n_clients
        self._blocks: dict[int, _NodeBlock] = {}

    def add(self, index: Sequence[int], ciphers: Sequence[MaskCipher]) -> None:
        for i, cipher in zip(index, ciphers, strict=True):
            self._ciphers[i] = cipher

    def value_here(self, round_: int) -> BoolArray:
        """Which roster clients send this node their value share in ``round_``."""
        here: BoolArray = (np.arange(self._n) + round_) % self._m == self._position
        return here

    def frame_keys(self, round_: int, d: int, index: I64) -> list[bytes]:
        """The round's frame keys of registered value clients ``index`` of this node."""
        cached = self._block(round_, d)
        _, piece = block_of(round_, d)
        idx = np.asarray(index, dtype=np.int64)
        words = cached.keys[piece, idx // self._m].copy()
        late = ~cached.covered[idx]
        if late.any():
            words[late] = self._rows(idx[late], cached.block, d, piece)[:, :FRAME_KEY_WORDS]
        return _key_bytes(words)

    def partial(self, round_: int, d: int, included: BoolArray) -> U64:
        """Ring sum of this node's masks over the agreed clients whose value node is elsewhere."""
        cached = self._block(round_, d)
        _, piece = block_of(round_, d)
        elsewhere = ~self.value_here(round_)
        covered, needed = cached.covered & elsewhere, included & elsewhere
        total: U64 = cached.totals[piece].copy()
        for sign, chosen in ((-1, covered & ~needed), (1, needed & ~covered)):
            idx = np.flatnonzero(chosen)
            if idx.size:
                rows = self._rows(idx, cached.block, d, piece)[:, FRAME_KEY_WORDS:]
                part = rows.sum(axis=0, dtype=np.uint64)
                total = np.subtract(total, part) if sign < 0 else np.add(total, part)
        return total

    def prepare(self, round_: int, d: int) -> None:
        """Build the block of ``round_`` now (at the open) if it is not built yet."""
        self._block(round_, d)

    def _rows(self, index: I64, block: int, d: int, piece: int) -> U64:
        ciphers = [self._cipher(int(i)) for i in index]
        out = np.zeros((len(index), FRAME_KEY_WORDS + d), dtype=np.uint64)
        for start, words in block_streams(ciphers, block, d):
            out[start : start + len(words)] = words[:, piece]
        return out

    def _cipher(self, i: int) -> MaskCipher:
        cipher = self._ciphers[i]
        if cipher is None:
            raise ValueError(f"client {i} has no pair key at this node")
        return cipher

    def _block(self, round_: int, d: int) -> _NodeBlock:
        block, _ = block_of(round_, d)
        cached = self._blocks.get(d)
        if cached is not None and cached.block == block:
            return cached
        self._blocks.pop(d, None)
        if len(self._blocks) >= _KEEP_DIMS:
            self._blocks.pop(next(iter(self._blocks)))
        rounds = block_rounds(d)
        covered = np.array([c is not None for c in self._ciphers], dtype=np.bool_)
        index = np.flatnonzero(covered)
        value = _value_nodes(index, block, rounds, self._m) == self._position
        totals = np.zeros((rounds, d), dtype=np.uint64)
        keys = np.zeros((rounds, -(-self._n // self._m), FRAME_KEY_WORDS), dtype=np.uint64)
        ciphers = [self._cipher(int(i)) for i in index]
        for start, words in block_streams(ciphers, block, d):
            totals += words[..., FRAME_KEY_WORDS:].sum(axis=0, dtype=np.uint64)
            # take the value clients' rows back out, grouped by piece (nonzero of the transpose)
            pieces, rows = np.nonzero(value[start : start + len(words)].T)
            if not len(rows):
                continue
            picked = words[rows, pieces]
            keys[pieces, index[start + rows] // self._m] = picked[:, :FRAME_KEY_WORDS]
            counts = np.bincount(pieces, minlength=rounds)
            filled = np.flatnonzero(counts)
            starts = (np.cumsum(counts) - counts)[filled]
            sums = np.add.reduceat(picked[:, FRAME_KEY_WORDS:], starts, axis=0, dtype=np.uint64)
            totals[filled] -= sums
        self._blocks[d] = _NodeBlock(block, covered, totals, keys)
        return self._blocks[d]

"""Uniform 64-bit words for one sampler call: OpenSSL's ChaCha20 under keys from the caller's
numpy generator (the discrete Gaussian sampler's only source of randomness, :mod:`dgauss`)."""

from __future__ import annotations

import struct

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms

__all__ = ["WORDS_PER_KEY", "Keystream"]

WORDS_PER_KEY = 1 << 22  # ChaCha20 words under one key: 2^19 blocks, far below the 2^32 counter
_BATCH = 3 << 14  # words per cipher update at most: one full pass of the sampler
_ZEROS = memoryview(bytes(8 * _BATCH))  # ChaCha20 encrypts zeros to its keystream
_MASK64 = (1 << 64) - 1
_U64 = npt.NDArray[np.uint64]


class Keystream:
    """Uniform 64-bit words for one call: OpenSSL's ChaCha20 (through ``cryptography``) under
    keys drawn from the caller's generator, a fresh key every ``words_per_key`` words.

    A key is 4 raw words of ``rng``'s bit generator, each XOR-ed with another raw word shifted
    left by 32, so it is uniform also when raw words carry only 32 bits (numpy's MT19937). The
    nonce is zero and no key serves twice; a key lives only in this call's cipher object and is
    never stored, returned or logged.
    """

    def __init__(self, rng: np.random.Generator, words_per_key: int = WORDS_PER_KEY) -> None:
        if (
            isinstance(words_per_key, bool)
            or not isinstance(words_per_key, int)
            or words_per_key < 1
        ):
            raise ValueError(f"words_per_key must be an integer >= 1, got {words_per_key!r}")
        self._rng = rng
        self._per_key = words_per_key
        self._left = 0
        self._cipher: CipherContext | None = None
        self.keys = 0  # keys drawn so far

    def _rekey(self) -> CipherContext:
        raw = self._rng.bit_generator.random_raw(8).tolist()
        key = struct.pack("<4Q", *(((raw[i] ^ (raw[i + 4] << 32)) & _MASK64) for i in range(4)))
        self.keys += 1
        self._left = self._per_key
        return Cipher(algorithms.ChaCha20(key, bytes(16)), None).encryptor()

    def fill(self, out: _U64) -> None:
        """Overwrite ``out``, a writable C-contiguous uint64 array, with the next ``out.size``
        words (in C order); ``ValueError`` for any other ``out``."""
        if not (
            isinstance(out, np.ndarray)
            and out.dtype == np.uint64
            and out.flags.c_contiguous
            and out.flags.writeable
        ):
            got = (
                f"a {out.dtype} array (C-contiguous: {out.flags.c_contiguous}, writable: "
                f"{out.flags.writeable})"
                if isinstance(out, np.ndarray)
                else type(out).__name__
            )
            raise ValueError(f"out must be a writable C-contiguous uint64 array, got {got}")
        out = out.reshape(-1)  # a view: C-contiguous
        done = 0
        while done < out.size:
            if self._cipher is None or self._left == 0:
                self._cipher = self._rekey()
            n = min(out.size - done, self._left, len(_ZEROS) // 8)
            target = out[done : done + n].view(np.uint8).data  # a writable memoryview
            self._cipher.update_into(_ZEROS[: 8 * n], target)
            self._left -= n
            done += n

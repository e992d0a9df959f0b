"""Frame sealing: HKDF, X25519 pair keys, AES-GCM rows, and the seed PRG streams."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand

from dpmarket.protocol.securesum.sealing import (
    ROUND_KEY_BLOCK,
    PairKey,
    RoundKeyring,
    expand_rows,
    expand_sum,
    generate_keypair,
    hkdf_expand,
    hkdf_extract,
    length_prefixed,
    open_rows,
    pair_secret,
    random_seeds,
    seal_rows,
)
from dpmarket.protocol.securesum.spec import round_key_info


def byte_chi_square(data: bytes) -> float:
    counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256)
    expected = len(data) / 256
    return float(((counts - expected) ** 2 / expected).sum())


CHI2_255_LIMIT = 350.0  # chi-square(255) exceeds this with probability about 1e-4


def test_hkdf_matches_rfc_5869_test_case_1() -> None:
    ikm = bytes.fromhex("0b" * 22)
    salt = bytes.fromhex("000102030405060708090a0b0c")
    info = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9")
    prk = hkdf_extract(salt, ikm)
    assert prk.hex() == "077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844ad7c2b3e5"
    okm = hkdf_expand(prk, info, 42)
    assert okm.hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )


def test_hkdf_matches_the_cryptography_package() -> None:
    salt, ikm, info = b"salt" * 5, b"key material" * 3, b"round 7"
    prk = hkdf_extract(salt, ikm)
    want = HKDF(hashes.SHA256(), 32, salt, info).derive(ikm)
    assert hkdf_expand(prk, info) == want
    assert PairKey(prk).expand(info) == want
    for seed in range(20):  # random keys and info lengths across SHA-256 block boundaries
        prk = bytes((seed * 37 + i) % 256 for i in range(32))
        info = bytes(range(seed * 7))
        assert PairKey(prk).expand(info) == HKDFExpand(hashes.SHA256(), 32, info).derive(prk)
    assert HKDFExpand(hashes.SHA256(), 80, info).derive(prk) == hkdf_expand(prk, info, 80)


def _keyring(pairs: int = 3, block: int = 4) -> tuple[RoundKeyring, list[bytes]]:
    prks = [bytes([7 * i + 1]) * 32 for i in range(pairs)]
    ring = RoundKeyring(pairs + 2, round_key_info, block)  # two slots stay empty
    ring.add([0, 2, 4][:pairs], [PairKey(p) for p in prks])
    return ring, prks


def test_round_keys_are_hkdf_expand_pieces_of_their_block() -> None:
    ring, prks = _keyring(block=4)
    for round_ in range(1, 13):  # three blocks, derived as the rounds reach them
        block, piece = divmod(round_ - 1, 4)
        keys = ring.keys(round_, [4, 0, 2])
        for key, prk in zip(keys, [prks[2], prks[0], prks[1]], strict=True):
            okm = HKDFExpand(hashes.SHA256(), 4 * 32, round_key_info(block)).derive(prk)
            assert key == okm[32 * piece : 32 * (piece + 1)]
    assert ROUND_KEY_BLOCK * 32 <= 255 * 32  # one HKDF-Expand call per block and pair


def test_round_keys_differ_per_round_and_pair() -> None:
    ring, _ = _keyring(pairs=3, block=4)
    seen = [k for r in range(1, 10) for k in ring.keys(r, [0, 2, 4])]
    assert len(set(seen)) == len(seen) == 27  # also the same piece of different blocks


def test_round_keys_refuse_bad_slots_and_past_blocks() -> None:
    ring, _ = _keyring(block=4)
    assert ring.keys(5, [0]) != ring.keys(6, [0])  # block 1 is now current
    with pytest.raises(ValueError, match="discarded"):
        ring.keys(4, [0])
    with pytest.raises(ValueError, match="no pair key"):
        ring.keys(6, [1])
    with pytest.raises(ValueError, match="outside"):
        ring.keys(6, [5])
    with pytest.raises(ValueError, match="round"):
        ring.keys(0, [0])
    with pytest.raises(ValueError, match="already installed"):
        ring.add([0], [PairKey(bytes(32))])
    with pytest.raises(ValueError, match="slots"):
        ring.add([1, 3], [PairKey(bytes(32))])


def test_a_pair_added_late_gets_the_current_block() -> None:
    ring, _ = _keyring(block=4)
    ring.keys(9, [0])  # block 2
    prk = bytes(range(32))
    ring.add([1], [PairKey(prk)])
    okm = HKDFExpand(hashes.SHA256(), 4 * 32, round_key_info(2)).derive(prk)
    assert ring.keys(10, [1]) == [okm[32:64]]


def test_pair_secret_agrees_and_binds_the_salt() -> None:
    client, client_pub = generate_keypair()
    node, node_pub = generate_keypair()
    assert pair_secret(client, node_pub, b"s") == pair_secret(node, client_pub, b"s")
    assert pair_secret(client, node_pub, b"s") != pair_secret(client, node_pub, b"t")
    with pytest.raises(ValueError, match="X25519"):
        pair_secret(client, bytes(32), b"s")  # low-order point: all-zero shared secret
    with pytest.raises(ValueError, match="32 bytes"):
        pair_secret(client, b"short", b"s")


def test_length_prefixed_is_unambiguous() -> None:
    assert length_prefixed("ab", "c") != length_prefixed("a", "bc")
    assert length_prefixed(1) != length_prefixed(b"\x01")


def _sealed(n: int = 4, width: int = 40) -> tuple[list[bytes], np.ndarray, bytes, np.ndarray]:
    keys = [bytes([i]) * 32 for i in range(n)]
    rows = np.arange(n * width, dtype=np.uint64).astype(np.uint8).reshape(n, width)
    aad = b"round 1 to node n0"
    return keys, rows, aad, seal_rows(keys, rows, aad)


def test_seal_and_open_round_trip() -> None:
    keys, rows, aad, frames = _sealed()
    assert frames.shape == (4, 12 + 40 + 16)
    plain, ok = open_rows(keys, frames, aad)
    assert ok.all()
    assert np.array_equal(plain, rows)
    again = seal_rows(keys, rows, aad)
    assert not np.array_equal(again[:, :12], frames[:, :12])  # fresh random nonces


@pytest.mark.parametrize("column", [0, 11, 12, 30, 51, 67])  # nonce, ciphertext, tag
def test_any_flipped_bit_is_rejected_alone(column: int) -> None:
    keys, rows, aad, frames = _sealed()
    tampered = frames.copy()
    tampered[2, column] ^= 0x10
    plain, ok = open_rows(keys, tampered, aad)
    assert ok.tolist() == [True, True, False, True]
    assert not plain[2].any()  # no unauthenticated plaintext is handed out
    assert np.array_equal(plain[[0, 1, 3]], rows[[0, 1, 3]])


def test_wrong_key_or_associated_data_is_rejected() -> None:
    keys, _, aad, frames = _sealed()
    _, ok = open_rows(keys[1:] + keys[:1], frames, aad)
    assert not ok.any()
    _, ok = open_rows(keys, frames, aad + b"!")
    assert not ok.any()
    with pytest.raises(ValueError, match="rows"):
        seal_rows(keys[:2], np.zeros((3, 5), dtype=np.uint8), aad)
    with pytest.raises(ValueError, match="frames"):
        open_rows(keys[:2], frames, aad)


def test_aes_stream_is_aes_256_ctr_from_counter_2() -> None:
    seeds = random_seeds(3)
    d = 37
    words = expand_rows(seeds, d, "aes-ctr")
    for seed, row in zip(seeds, words, strict=True):
        iv = bytes(12) + (2).to_bytes(4, "big")
        stream = (
            Cipher(algorithms.AES(seed.tobytes()), modes.CTR(iv)).encryptor().update(bytes(8 * d))
        )
        assert np.array_equal(row, np.frombuffer(stream, dtype="<u8"))


def test_short_aes_streams_are_aes_256_ctr_from_the_ccm_counter_block() -> None:
    seeds = random_seeds(3)
    for d in (1, 10, 32):  # up to 256 bytes: the keystream of AESCCM's encryption
        words = expand_rows(seeds, d, "aes-ctr")
        for seed, row in zip(seeds, words, strict=True):
            iv = b"\x01" + bytes(13) + (1).to_bytes(2, "big")
            cipher = Cipher(algorithms.AES(seed.tobytes()), modes.CTR(iv))
            stream = cipher.encryptor().update(bytes(8 * d))
            assert np.array_equal(row, np.frombuffer(stream, dtype="<u8"))


def test_chacha_stream_is_chacha20_from_block_1() -> None:
    seeds = random_seeds(2)
    d = 20
    words = expand_rows(seeds, d, "chacha20")
    for seed, row in zip(seeds, words, strict=True):
        nonce = (1).to_bytes(4, "little") + bytes(12)
        algo = algorithms.ChaCha20(seed.tobytes(), nonce)
        stream = Cipher(algo, mode=None).encryptor().update(bytes(8 * d))
        assert np.array_equal(row, np.frombuffer(stream, dtype="<u8"))


def test_expansions_sum_in_the_ring_over_blocks() -> None:
    seeds = random_seeds(12).reshape(4, 3, 32)
    d = 9
    single = expand_rows(seeds.reshape(12, 32), d).reshape(4, 3, d)
    assert np.array_equal(expand_rows(seeds, d), single.sum(axis=1, dtype=np.uint64))
    assert np.array_equal(
        expand_sum(seeds.reshape(12, 32), d), single.sum(axis=(0, 1), dtype=np.uint64)
    )
    big = random_seeds(600)  # several 32 MiB blocks at d = 20000
    assert np.array_equal(
        expand_sum(big, 20_000), expand_rows(big, 20_000).sum(axis=0, dtype=np.uint64)
    )
    with pytest.raises(ValueError, match="prg"):
        expand_rows(seeds, d, "rc4")


def test_seeds_and_streams_look_uniform() -> None:
    assert byte_chi_square(random_seeds(4096).tobytes()) < CHI2_255_LIMIT
    stream = expand_rows(random_seeds(64), 2048).tobytes()
    assert byte_chi_square(stream) < CHI2_255_LIMIT
    # the test has power: bytes that are uniform on only 200 of 256 values fail it
    skewed = np.random.default_rng(0).integers(0, 200, len(stream), dtype=np.uint8).tobytes()
    assert byte_chi_square(skewed) > CHI2_255_LIMIT

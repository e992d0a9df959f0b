"""Per-client costs of one DCA round with derived shares, measured on this machine (issue 3).

What bounds dca_scaling at many clients and small d: each client seals one AES-GCM frame per
round under that round's fresh key, and its value node opens it; each pair's block stream is
computed once per B(d) rounds on each side. This script times those pieces with the real code
(``protocol/securesum/sealing.py``, ``protocol/securesum/masks.py``) on n frames of 8 d bytes:

* seal / open with per-round keys (what runs: ``seal_rows`` / ``open_rows``, one AES-GCM
  context per frame);
* the bare AEAD call on a context built beforehand (what a key living across rounds would cost;
  shown for comparison, not used);
* one pair's block stream (B(d) rounds) and its share per round;
* the discrete Gaussian noise per client and round.

    python benchmarks/dca_frame_costs.py [--n 50000] [--d 10]

Last line: ``{"benchmark": "dca_frame_costs", "d", "n", "seal_us", "open_us",
"reused_context_seal_us", "block_stream_us", "block_stream_per_round_us", "noise_us"}``.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from dpmarket.protocol.privacy.dgauss import sample_discrete_gaussian
from dpmarket.protocol.securesum.masks import block_rounds, block_streams, mask_cipher
from dpmarket.protocol.securesum.sealing import PairKey, open_rows, seal_rows


def best_of(repeats: int, run: object) -> float:
    """Fastest of ``repeats`` timings of ``run()`` in seconds."""
    assert callable(run)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50_000, help="frames (clients) per timing")
    parser.add_argument("--d", type=int, default=10, help="values per client")
    args = parser.parse_args()
    n, d = args.n, args.d
    keys = [secrets.token_bytes(32) for _ in range(n)]
    rows = np.random.default_rng(0).integers(0, 256, (n, 8 * d), dtype=np.uint8)
    aad = bytes(60)
    frames = seal_rows(keys, rows, aad)
    seal = best_of(3, lambda: seal_rows(keys, rows, aad)) / n
    opened = best_of(3, lambda: open_rows(keys, frames, aad)) / n
    contexts = [AESGCM(k) for k in keys]
    nonce, plain, out = bytes(12), rows[0].tobytes(), bytearray(8 * d + 16)

    def reused() -> None:
        for context in contexts:
            context.encrypt_into(nonce, plain, aad, out)

    reused_seal = best_of(3, reused) / n
    pairs = [mask_cipher(PairKey(k), "aes-ctr") for k in keys]

    def streams() -> None:
        rows = sum(len(words) for _, words in block_streams(pairs, 0, d))
        if rows != n:
            raise RuntimeError(f"block_streams gave {rows} rows for {n} pairs")

    stream = best_of(3, streams) / n
    rng = np.random.default_rng(1)
    noise = best_of(3, lambda: sample_discrete_gaussian(1e6, (n, d), rng)) / n
    rounds = block_rounds(d)
    table = [
        ("seal, per-round key (seal_rows)", seal),
        ("open, per-round key (open_rows)", opened),
        ("seal on a context built beforehand", reused_seal),
        (f"block stream of one pair ({rounds} rounds)", stream),
        ("  the same per round", stream / rounds),
        ("discrete Gaussian noise, d values", noise),
    ]
    print(f"n = {n} frames, d = {d}, B(d) = {rounds}; microseconds per client (best of 3)")
    for label, seconds in table:
        print(f"  {label:<44} {seconds * 1e6:8.2f} us")
    print(
        f"per client and round with derived shares: seal + open = {(seal + opened) * 1e6:.2f} us, "
        f"streams on both sides = {2 * stream / rounds * 1e6 * 10:.2f} us at M = 10 nodes"
    )
    result = {
        "benchmark": "dca_frame_costs",
        "d": d,
        "n": n,
        "seal_us": round(seal * 1e6, 3),
        "open_us": round(opened * 1e6, 3),
        "reused_context_seal_us": round(reused_seal * 1e6, 3),
        "block_stream_us": round(stream * 1e6, 3),
        "block_stream_per_round_us": round(stream / rounds * 1e6, 4),
        "noise_us": round(noise * 1e6, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

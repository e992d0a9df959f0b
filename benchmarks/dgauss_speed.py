"""Speed of the discrete Gaussian sampler against the previous one, in the same run (issue 39).

The secure sums draw each owner's noise share with ``sample_discrete_gaussian`` once per owner
and round: a scan round at K = 1024 owners makes 1024 calls of d = 12,800 draws, a normalise
round 1024 calls of d = 41. Each case below times the calls a round makes, on the generator a
deployment uses (randomgen's ChaCha20 from OS entropy, ``NoiseSource.secure``), for

* **new** -- ``dpmarket.protocol.privacy.dgauss.sample_discrete_gaussian``: ChaCha20 keystream
  from ``cryptography`` under keys drawn from the generator, exact base-2 discrete Laplace
  proposal, passes sized by the exact emission rate;
* **baseline** -- the previous sampler, copied below unchanged (:func:`baseline_sample`):
  exponentials and sign bits straight from the numpy generator, passes of 1.6x the remainder;
* **--against REV** (optional) -- ``protocol/privacy/dgauss.py`` as it was at git revision REV
  (``git show``, loaded as a module), timed in the same rounds: what a change to the sampler
  costs.

It also times the exact acceptance path alone: every candidate of a call of 2,000 draws forced
through it (the float margin widened), its cost per candidate, and that cost times the
probability that the float path leaves a candidate to it (at most 130 * 2^-52).

    python benchmarks/dgauss_speed.py [--repeats 3] [--against REV]

Prints a table (best of ``--repeats``) and, as its last line, ``{"benchmark": "dgauss_speed",
"rows": [...], "speedup_512x12800": ratio, "exact_path": {...}}``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from dpmarket.actors.randomness import NoiseSource
from dpmarket.protocol.privacy import dgauss
from dpmarket.protocol.privacy.dgauss import Proposal, sample_discrete_gaussian

Sampler = Callable[[float, int, np.random.Generator], npt.NDArray[np.int64]]

# (label, sigma in grid units, calls, draws per call)
CASES = [
    ("scan round, 512 owners", 1e6, 512, 12_800),
    ("normalise round, 1024 owners", 1e6, 1024, 41),
    ("small sigma, 512 owners", 2.0, 512, 12_800),
    ("grid-scale sigma (frac_bits 32), 512 owners", 3e9, 512, 12_800),
]


# --- baseline: the previous sampler, unchanged (exponentials from the numpy generator) --------

_BASELINE_CHUNK = 1 << 16


def _baseline_pass(sigma: float, count: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    t = math.floor(sigma) + 1.0
    magnitude = rng.standard_exponential(count)
    magnitude *= t
    np.floor(magnitude, out=magnitude)
    bits = rng.bit_generator.random_raw((count + 63) // 64).view(np.uint8)
    negative = np.unpackbits(bits, count=count).view(np.bool_)
    threshold = rng.standard_exponential(count)
    threshold *= 2.0 * sigma * sigma
    centred = magnitude - sigma * sigma / t
    centred *= centred
    keep = threshold >= centred
    keep &= ~(negative & (magnitude == 0.0))
    np.negative(magnitude, out=magnitude, where=negative)
    return np.asarray(magnitude[keep], dtype=np.int64)


def baseline_sample(sigma: float, total: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """The previous ``sample_discrete_gaussian`` (argument checks left out)."""
    out = np.zeros(total, dtype=np.int64)
    filled = 0
    while filled < total:
        want = min(total - filled, _BASELINE_CHUNK)
        accepted = _baseline_pass(sigma, int(want * 1.6) + 32, rng)[:want]
        out[filled : filled + accepted.size] = accepted
        filled += accepted.size
    return out


# --- timing ----------------------------------------------------------------------------------


def best_round(sampler: Sampler, sigma: float, calls: int, d: int, repeats: int) -> float:
    """Fastest of ``repeats`` rounds of ``calls`` calls of ``d`` draws, in seconds."""
    rng = NoiseSource.secure().generator("bench:dgauss")
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            sampler(sigma, d, rng)
        best = min(best, time.perf_counter() - start)
    return best


def sampler_at(revision: str) -> Sampler:
    """``sample_discrete_gaussian`` of ``protocol/privacy/dgauss.py`` at git ``revision``."""
    root = Path(__file__).resolve().parents[1]
    source = subprocess.run(
        ["git", "show", f"{revision}:protocol/privacy/dgauss.py"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "dgauss_at_revision.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("dgauss_at_revision", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["dgauss_at_revision"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    sampler: Sampler = module.sample_discrete_gaussian
    return sampler


def exact_path_cost(sigma: float, draws: int) -> dict[str, float]:
    """Seconds per candidate with every candidate decided by the exact path (the float margin
    widened past any D), and that cost per draw at the float path's hand-over probability."""
    candidates = draws / Proposal.of(sigma).rate
    saved = dgauss._MARGIN
    dgauss._MARGIN = 2.0**60
    try:
        start = time.perf_counter()
        sample_discrete_gaussian(sigma, draws, NoiseSource.secure().generator("bench:exact"))
        seconds = time.perf_counter() - start
    finally:
        dgauss._MARGIN = saved
    per_candidate = seconds / candidates
    handed_over = 130 * 2.0**-52 / Proposal.of(sigma).rate  # at most, per draw
    return {"sigma": sigma, "draws": draws, "us_per_candidate": round(per_candidate * 1e6, 1),
            "expected_ns_per_draw": per_candidate * handed_over * 1e9}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds per case (best is kept)")
    parser.add_argument("--against", default=None, help="git revision to time as well")
    args = parser.parse_args()
    other = sampler_at(args.against) if args.against else None
    rows = []
    for label, sigma, calls, d in CASES:
        baseline = best_round(baseline_sample, sigma, calls, d, args.repeats)
        new = best_round(sample_discrete_gaussian, sigma, calls, d, args.repeats)
        row = {"case": label, "sigma": sigma, "calls": calls, "d": d,
               "baseline_s": round(baseline, 4), "new_s": round(new, 4),
               "new_ns_per_draw": round(new / (calls * d) * 1e9, 1),
               "speedup": round(baseline / new, 2)}  # fmt: skip
        if other is not None:
            at_revision = best_round(other, sigma, calls, d, args.repeats)
            row["against_s"] = round(at_revision, 4)
            row["new_over_against"] = round(new / at_revision, 3)
        rows.append(row)
    print(f"discrete Gaussian sampler, best of {args.repeats} rounds (seconds per round)")
    against = f" {args.against[:10]:>10} {'new/it':>7}" if other is not None else ""
    print(f"{'case':<46} {'sigma':>8} {'calls x d':>13} {'baseline':>9} {'new':>8} "
          f"{'ns/draw':>8} {'speedup':>8}{against}")  # fmt: skip
    for row in rows:
        shape = f"{row['calls']} x {row['d']}"
        timing = f"{row['baseline_s']:>9.4f} {row['new_s']:>8.4f} {row['new_ns_per_draw']:>8.1f}"
        case = f"{row['case']:<46} {row['sigma']:>8.3g} {shape:>13}"
        line = f"{case} {timing} {row['speedup']:>7.2f}x"
        if other is not None:
            line += f" {row['against_s']:>10.4f} {row['new_over_against']:>7.3f}"
        print(line)
    exact = exact_path_cost(6.0, 2000)
    print(f"exact path alone (sigma {exact['sigma']:g}): {exact['us_per_candidate']} us per "
          f"candidate; at <= 130 * 2^-52 of candidates: {exact['expected_ns_per_draw']:.1e} ns "
          "per draw")  # fmt: skip
    result = {"benchmark": "dgauss_speed", "rows": rows, "speedup_512x12800": rows[0]["speedup"],
              "exact_path": exact}  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()

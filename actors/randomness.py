"""Where every generator of the deployed paths comes from: secret noise or public randomness.

Two kinds of randomness run through a market, and they never share a seed:

- **Noise** (every draw a privacy guarantee rests on: the Gaussian, Laplace and tree noise of the
  summary channels, MWEM's selection and measurements, the validation release, the auction's
  coins, each owner's share of the secure-sum noise, RACE releases, the regression's noise,
  each owner's exploration draws: a public draw's token would give away its record count).
  A DP guarantee assumes the adversary cannot predict the noise; a generator seeded from any
  value a party can learn (the config, report.json, the h1 seed sent in ``summary.setup``) gives
  epsilon = infinity, because the noise can be regenerated and subtracted. :class:`NoiseSource`
  is the only constructor of such generators: by default each generator is randomgen's ChaCha
  (20 rounds, a cryptographically secure stream cipher generator, maintained upstream) behind
  ``numpy.random.Generator``, keyed with 256 bits from the operating system (``secrets``), and
  its key is never written anywhere. numpy's PCG64 is not used for noise even from OS entropy:
  its state can be recovered from enough outputs, and many releases of one generator are public.
- **Public randomness** (h1's random Fourier features, LSH functions, herding candidates,
  simulated data, the harness's baselines): :func:`public_generator`, from
  a configuration seed.

Reproducible noise exists for simulations and tests only: :meth:`NoiseSource.reproducible`
(``[run].reproducible_noise = true`` with ``[run].noise_seed``, refused for ``source = "files"``,
recorded in report.json and printed as a warning). Its generators are the same ChaCha, keyed
from the noise seed and the generator's label through a SeedSequence, so the stream is fixed
by public values: such a run has no privacy at all, whatever its ledger says.

The sans-I/O parties (protocol/, streams/) take a ``numpy.random.Generator`` argument and never
build one for noise; the actors, the CLI commands and the benchmarks build them here. The
secure-sum noise shares are drawn by ``protocol/privacy/dgauss.py``, which takes fresh 256-bit
keys from the generator it is given and expands them with ChaCha20 from ``cryptography``: the
generator built here stays the only source of that noise (secret in the secure mode, public in
the reproducible one).
``tests/test_randomness.py`` checks statically that no module under actors/ constructs a
generator anywhere else.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import numpy as np
from randomgen import ChaCha

__all__ = ["NOISE_WARNING", "NoiseSource", "public_generator"]

NOISE_WARNING = (
    "reproducible_noise is on: every noise draw follows from a public seed, so nothing this run "
    "releases is private (simulation and tests only)"
)

_CHACHA_ROUNDS = 20
_NOISE_DOMAIN = 0x6E6F697365  # "noise": reproducible noise never shares a stream with data


def _label_words(label: str) -> list[int]:
    """A label as 32-bit words for a SeedSequence (stable across processes, unlike hash())."""
    digest = hashlib.blake2b(label.encode("utf-8"), digest_size=16).digest()
    return [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]


@dataclass(frozen=True)
class NoiseSource:
    """How the generators for noise are keyed: OS entropy (``seed is None``, the default and the
    only mode a deployment uses) or, in a simulation, a public noise seed.

    Picklable and small, so it can be handed to Ray actors: each actor builds its generators in
    its own process, and in the secure mode every :meth:`generator` call draws a fresh key.
    """

    seed: int | None = None

    @classmethod
    def secure(cls) -> NoiseSource:
        return cls(None)

    @classmethod
    def reproducible(cls, seed: int) -> NoiseSource:
        """Simulation and tests only: noise fixed by ``seed`` (public), so not private."""
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"noise seed: expected an integer >= 0, got {seed!r}")
        return cls(seed)

    @property
    def is_reproducible(self) -> bool:
        return self.seed is not None

    def generator(self, label: str) -> np.random.Generator:
        """A noise generator for the party or use named by ``label`` (e.g. ``"curator"``,
        ``"dca:owner-3"``). Secure mode: ChaCha20 keyed with 256 fresh bits from ``secrets``
        (the label is ignored: every call is independent). Reproducible mode: ChaCha20 keyed
        from (noise domain, seed, label), so distinct labels give independent streams."""
        if self.seed is None:
            return np.random.Generator(ChaCha(key=secrets.randbits(256), rounds=_CHACHA_ROUNDS))
        sequence = np.random.SeedSequence([_NOISE_DOMAIN, self.seed, *_label_words(label)])
        return np.random.Generator(ChaCha(sequence, rounds=_CHACHA_ROUNDS))

    def describe(self) -> dict[str, object]:
        """What report.json records about the noise (never a key)."""
        if self.seed is None:
            return {"mode": "secure", "generator": "randomgen ChaCha20, 256-bit key from os"}
        return {
            "mode": "reproducible",
            "seed": self.seed,
            "generator": "randomgen ChaCha20 keyed from the public noise seed",
            "warning": NOISE_WARNING,
        }


def public_generator(seed: int | list[int] | tuple[int, ...]) -> np.random.Generator:
    """A generator for public randomness only (simulated data, baselines, the harness's public
    draws), seeded by configuration values: numpy's default generator, as before, so simulated
    data sets are unchanged. It must never draw noise (noise comes from :class:`NoiseSource`,
    whose reproducible streams live in their own domain)."""
    return np.random.default_rng(list(seed) if not isinstance(seed, int) else seed)

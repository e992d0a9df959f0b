"""Noise is unpredictable from public values (issue 12, part 1).

The attack of the review: an owner rebuilds the curator's generator from the public seed (it is
in the config, in report.json and, as ``h1_seed``, in the ``summary.setup`` frame every owner
receives), draws the validation release's noise and subtracts it from the g_tilde it received,
recovering the consumer's exact validation mean. These tests play that owner with the bytes it
really receives, against the generator the deployed path builds (``MarketConfig.noise``), and
check statically that no module of the runtime builds a generator anywhere else.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from dpmarket.actors.config.market import ConfigError, MarketConfig, load_market_config
from dpmarket.actors.randomness import NoiseSource, public_generator
from dpmarket.protocol.summary.curator import Curator
from dpmarket.protocol.summary.h1 import RandomFourierFeatures
from dpmarket.protocol.summary.messages import SetupBody, ValidationBody
from dpmarket.protocol.summary.releases import clip_rows
from dpmarket.protocol.wire.codec import decode, encode
from tests.small import small_params, small_scenario

ROOT = Path(__file__).resolve().parents[2]
SEED = 7  # the public [run].seed: h1's seed, sent to every owner


def _owner_view(rng: np.random.Generator) -> tuple[SetupBody, ValidationBody, object]:
    """Start a curator with ``rng`` and return what owner-1 receives (decoded from bytes)."""
    scenario = small_scenario(3)
    params = small_params(
        scenario, h1_seed=SEED, validation_release="gaussian", validation_sigma=2.0, d=64
    )
    curator = Curator("run", list(scenario.owner_names), scenario.validation,
                      scenario.seed_set, params, rng)  # fmt: skip
    frames = [encode(m) for m in curator.start() if m.recipient == "owner-1"]
    bodies = [decode(f).body for f in frames]
    setup = next(b for b in bodies if isinstance(b, SetupBody))
    release = next(b for b in bodies if isinstance(b, ValidationBody))
    return setup, release, (scenario, params)


def _attack(setup: SetupBody, release: ValidationBody, guess: np.random.Generator,
            context: object) -> tuple[float, float]:  # fmt: skip
    """The owner's attack: subtract the regenerated noise; return (error of the recovered
    mean, the release's own noise norm) against the exact mean of the clipped h1 rows."""
    scenario, params = context  # type: ignore[misc]
    H = RandomFourierFeatures(scenario.validation.shape[1], params.d, params.gamma,
                              setup.h1_seed)(scenario.validation)  # fmt: skip
    m = len(H)
    exact = clip_rows(H, params.clip_norm).sum(axis=0) / m
    sigma = params.validation_sigma * params.clip_norm * params.sensitivity
    recovered = np.asarray(release.g_validation) - guess.normal(0.0, sigma, params.d) / m
    return float(np.linalg.norm(recovered - exact)), sigma * math.sqrt(params.d) / m


def test_the_attack_recovers_the_validation_mean_from_a_seeded_generator() -> None:
    """Control: against the old construction (noise from the public seed) the attack works,
    so the tests below can fail."""
    setup, release, context = _owner_view(np.random.default_rng(SEED))
    assert setup.h1_seed == SEED  # the owner learns the seed from the setup frame
    error, noise = _attack(setup, release, np.random.default_rng(setup.h1_seed), context)
    assert error < 1e-6 * noise


@pytest.mark.parametrize("guess_kind", ["default_rng", "reproducible"])
def test_the_attack_fails_against_the_deployed_generator(guess_kind: str) -> None:
    config = MarketConfig(source="synthetic", seed=SEED)
    setup, release, context = _owner_view(config.noise.generator("curator"))
    guesses = {
        "default_rng": np.random.default_rng(setup.h1_seed),
        "reproducible": NoiseSource.reproducible(setup.h1_seed).generator("curator"),
    }
    error, noise = _attack(setup, release, guesses[guess_kind], context)
    # subtracting an independent draw adds noise instead of removing it: error ~ sqrt(2) noise
    assert error > 0.8 * noise


def test_two_deployed_generators_never_repeat_and_reproducible_ones_do() -> None:
    secure = MarketConfig(source="synthetic", seed=SEED).noise
    assert not secure.is_reproducible
    a, b = (secure.generator("curator").normal(size=64) for _ in range(2))
    assert not np.allclose(a, b)
    simulated = NoiseSource.reproducible(3)
    np.testing.assert_array_equal(
        simulated.generator("curator").normal(size=8), simulated.generator("curator").normal(size=8)
    )
    assert not np.allclose(
        simulated.generator("curator").normal(size=8),
        simulated.generator("dca:owner-1").normal(size=8),
    )
    # the reproducible noise never shares a stream with public randomness of the same seed
    assert not np.allclose(simulated.generator("curator").random(8), public_generator(3).random(8))


def test_noise_scale_of_the_secure_generator() -> None:
    """The CSPRNG behind numpy's Generator draws N(0, 1) (a scale off by two fails)."""
    draws = NoiseSource.secure().generator("x").normal(0.0, 3.0, 200_000)
    assert abs(float(np.std(draws)) - 3.0) < 0.05 and abs(float(np.mean(draws))) < 0.05


def test_reproducible_noise_is_an_explicit_switch(tmp_path: Path) -> None:
    base = (ROOT / "configs" / "demo.toml").read_text()
    path = tmp_path / "c.toml"
    path.write_text(base)
    config = load_market_config(path)
    assert not config.reproducible_noise and config.noise.describe()["mode"] == "secure"
    config = load_market_config(path, ["run.reproducible_noise=true", "run.noise_seed=4"])
    assert config.noise == NoiseSource.reproducible(4)
    assert config.public_record()["reproducible_noise"] is True
    with pytest.raises(ConfigError, match="noise_seed"):
        load_market_config(path, ["run.noise_seed=4"])
    with pytest.raises(ValueError, match="noise seed"):
        NoiseSource.reproducible(-1)


def test_reproducible_noise_is_refused_with_files(tmp_path: Path) -> None:
    (tmp_path / "v.csv").write_text("0.5,0.5\n")
    config = tmp_path / "files.toml"
    config.write_text(
        "[market]\nowners = 2\ntolerance = 0\n[data]\nsource = 'files'\nfeatures = 2\n"
        "lower = 0.0\nupper = 1.0\nvalidation = 'v.csv'\nseed_set = 'v.csv'\n"
        "[data.files]\n'owner-1' = ['a.csv']\n'owner-2' = ['b.csv']\n"
    )
    assert not load_market_config(config).reproducible_noise
    with pytest.raises(ConfigError, match="reproducible_noise: refused"):
        load_market_config(config, ["run.reproducible_noise=true"])


# ---------------------------------------------------------------------- static checks
_CONSTRUCTORS = {
    "default_rng", "Generator", "RandomState", "SeedSequence", "PCG64", "PCG64DXSM", "MT19937",
    "Philox", "SFC64", "ChaCha", "AESCounter", "ThreeFry", "seed",
}  # fmt: skip
_GLOBAL_STATE = {
    "random", "normal", "uniform", "laplace", "choice", "permutation", "shuffle", "integers",
    "randint", "rand", "randn", "standard_normal", "exponential",
}  # fmt: skip

# public randomness in the sans-I/O layers: (module, enclosing function) that may seed a
# generator from a public value. Everything else takes its generator as an argument.
_PUBLIC_DRAWS = {
    ("protocol/summary/h1.py", "__init__"),  # RandomFourierFeatures: h1's public features
    ("protocol/summary/allocate_mixture.py", "smoothing_generator"),  # re-noising released profiles
    ("protocol/summary/releases.py", "public_candidates"),
    ("protocol/summary/audit.py", "_hashed_pair"),  # the audit's fixed public data set
    ("streams/race/lsh.py", "__init__"),  # the LSH functions of a sketch
}


def _constructions(path: Path) -> list[tuple[int, str, str]]:
    """(line, enclosing function, call) for every generator construction or use of global
    random state in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            scope = child.name if isinstance(child, ast.FunctionDef) else function
            if isinstance(child, ast.Call):
                name = ast.unparse(child.func)
                last = name.rsplit(".", 1)[-1]
                on_module = name.rsplit(".", 1)[0] in ("np.random", "numpy.random", "random")
                if last in _CONSTRUCTORS or (on_module and last in _GLOBAL_STATE):
                    found.append((child.lineno, scope, name))
            if isinstance(child, ast.Import | ast.ImportFrom):
                names = [a.name for a in child.names]
                if "random" in names or getattr(child, "module", None) == "random":
                    found.append((child.lineno, scope, "import random"))
            visit(child, scope)

    visit(tree, "<module>")
    return found


def test_no_runtime_module_builds_a_generator_outside_randomness() -> None:
    """actors/: every generator comes from actors/randomness.py (NoiseSource for noise,
    public_generator for public draws); nothing reads global random state."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line} {call} (in {function})"
        for path in sorted((ROOT / "actors").rglob("*.py"))
        if path.name != "randomness.py"
        for line, function, call in _constructions(path)
    ]
    assert offenders == []


def test_the_only_seeded_noise_is_behind_the_switch() -> None:
    """In randomness.py the one construction from a seed is NoiseSource.generator's
    reproducible branch (taken only when a simulation asked for it) and public_generator."""
    found = _constructions(ROOT / "actors" / "randomness.py")
    assert {(function, call) for _, function, call in found} == {
        ("generator", "np.random.Generator"),
        ("generator", "ChaCha"),
        ("generator", "np.random.SeedSequence"),
        ("public_generator", "np.random.default_rng"),
    }


def test_sans_io_layers_seed_only_public_randomness() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line} {call} (in {function})"
        for folder in ("protocol", "streams")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, function, call in _constructions(path)
        if (str(path.relative_to(ROOT)), function) not in _PUBLIC_DRAWS
    ]
    assert offenders == []

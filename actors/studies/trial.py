"""One trial of a study: the market's real parties in one process, on simulated time.

A trial draws its faults from its cell (which owners drop and when, which are slow, which
collude), then runs what ``dpmarket run`` runs, minus the processes: the secure-sum phases
(normalise, standardisation, scan) through the real client, compute-node and aggregator parties
(``DcaSession``: every frame encoded and decoded, deadlines by a simulated clock), then the
summary (the real Owner and Curator parties on a :class:`LoopbackTransport`, whose clock jumps
to the next frame or deadline: a slow owner misses its deadline without anyone sleeping).
Owners dropped before a secure sum are absent from it and from every later phase; colluders
withhold their secure-sum noise and count against T everywhere (``DcaConfig.colluders``,
``CuratorParams.known_colluders``), as in the market.

The noise is a simulation's (``NoiseSource.reproducible`` keyed by the trial's public seed;
the data is simulated too): a trial is reproducible, and nothing it computes is private.

What a trial returns (plain data, one line of the study's results file):
``verdict`` (completed / refused), ``refused_phase`` and ``refused_epoch``, ``epochs``, the
summary's MMD^2 on the harness's test set with the ``gap_closed`` between uniform (0) and exact
greedy (1) at the same size, ``points_accessed`` (distinct points the curator saw),
``t_used`` (lost + colluding owners), and the honest owners' epsilons: from their ledgers
(``eps_*``: PLD at the config's delta) and against the coalition (``eps_coalition_*``: the
coalition pools its members' auction bits, c per epoch, and knows its own secure-sum noise,
so each secure sum protects an honest owner only with the noise of the honest owners whose
contribution was included, less one curious owner, Theorem 1's count: sigma_client *
sqrt(honest included - 1), which is at least the plan's sigma while lost + colluding <= T),
and the trial's ``seconds`` (wall) and ``cpu_seconds`` (this process's CPU time).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpmarket.actors.config.market import FaultConfig, MarketConfig
from dpmarket.actors.config.scenarios import make_market_scenario
from dpmarket.actors.parties.dca import record_for_owners
from dpmarket.actors.parties.dcaowner import contribution
from dpmarket.actors.parties.faults import FaultPlan
from dpmarket.actors.parties.securephase_journal import LABELS, moments_summary
from dpmarket.actors.parties.transport import LoopbackTransport
from dpmarket.actors.randomness import NoiseSource, public_generator
from dpmarket.actors.run.phases import prepare_secure, standardisation_of
from dpmarket.actors.run.preflight import discarded_normalise
from dpmarket.actors.run.spawn import OwnerInputs
from dpmarket.actors.studies.config import PHASES, Cell
from dpmarket.protocol.privacy.dgauss import client_sigma
from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.securesum.driver import DcaSession
from dpmarket.protocol.securesum.spec import RoundResult
from dpmarket.protocol.summary.curator import Curator
from dpmarket.protocol.summary.objective import greedy_exact, mmd2, uniform_sample
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.summary.snr import standardisation_verdict
from dpmarket.streams.synthetic import Scenario

__all__ = [
    "FaultDraw",
    "draw_faults",
    "owner_values",
    "run_trial",
    "trial_secure_phases",
    "trial_seed",
]

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class FaultDraw:
    """A trial's faults: owner -> (phase, epoch) for drops (epoch 0 in a secure phase),
    owner -> seconds of delay for slow owners, and the colluders."""

    drops: dict[str, tuple[str, int]]
    slow: dict[str, float]
    colluders: tuple[str, ...]

    def record(self) -> dict[str, Any]:
        return {
            "drops": {o: list(v) for o, v in sorted(self.drops.items())},
            "slow": dict(sorted(self.slow.items())),
            "colluders": list(self.colluders),
        }


def trial_seed(study_seed: int, cell_key: str, trial: int) -> int:
    """The trial's public seed: a hash of the study's seed, the cell's key and the trial index
    (stable across runs and resumes, independent of the order trials run in)."""
    digest = hashlib.sha256(f"{study_seed}/{cell_key}/{trial}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def owner_values(scenario: Scenario, gamma: float, sample: int = 200) -> dict[str, float]:
    """Harness-side value of each owner for the consumer: the mean RBF kernel between (up to
    ``sample`` of) its points and the validation set, times its size (mass near D_v)."""
    V = scenario.validation[:sample]
    out = {}
    for name, (X, _) in zip(scenario.owner_names, scenario.owners, strict=True):
        Xs = X[:sample]
        sq = ((Xs[:, None, :] - V[None, :, :]) ** 2).sum(axis=2)
        out[name] = float(np.exp(-gamma * sq).mean() * len(X))
    return out


def draw_faults(
    cell: Cell,
    owners: list[str],
    values: dict[str, float],
    timing: dict[str, float],
    epoch_range: tuple[int, int],
    rng: np.random.Generator,
) -> FaultDraw:
    """Each owner drops with probability ``cell.dropout`` (independently; the count is what
    varies); ``who_fails = "highest-value"`` gives those drops to the owners of highest
    :func:`owner_values` first. A drop's phase follows ``timing``, its epoch uniform over
    ``epoch_range``. Colluders are drawn at random among the others, then slow owners (each
    with probability ``cell.slow_fraction``) among the rest."""
    n_drop = int(rng.binomial(len(owners), cell.dropout))
    if cell.who_fails == "highest-value":
        ranked = sorted(owners, key=lambda o: (-values[o], o))
        dropping = ranked[:n_drop]
    else:
        dropping = [owners[i] for i in sorted(rng.choice(len(owners), n_drop, replace=False))]
    phases = list(PHASES)
    probs = np.array([timing[p] for p in phases])
    drops: dict[str, tuple[str, int]] = {}
    for owner in dropping:
        phase = phases[int(rng.choice(len(phases), p=probs))]
        epoch = int(rng.integers(epoch_range[0], epoch_range[1] + 1)) if phase == "epochs" else 0
        drops[owner] = (phase, epoch)
    rest = [o for o in owners if o not in drops]
    c = min(cell.colluders, len(rest))
    colluders = tuple(rest[i] for i in sorted(rng.choice(len(rest), c, replace=False)))
    rest = [o for o in rest if o not in colluders]
    slow = {o: cell.slow_delay for o in rest if rng.random() < cell.slow_fraction}
    return FaultDraw(drops, slow, colluders)


@dataclass
class TrialSecure:
    """The secure phases' outcome in a trial."""

    refused: tuple[str, str] | None = None  # (phase, reason)
    missing: list[str] = dataclasses.field(default_factory=list)
    rounds: dict[str, RoundResult] = dataclasses.field(default_factory=dict)


def trial_secure_phases(
    config: MarketConfig,
    scenario: Scenario,
    curator: Curator,
    draw: FaultDraw,
    noise: NoiseSource,
) -> TrialSecure:
    """Normalise, standardisation and scan as actors/run/phases.py runs them, in-process."""
    inputs = OwnerInputs.of(scenario)
    records = float(sum(len(X) for X, _ in scenario.owners))  # the config's n_points: public
    k = int(scenario.validation.shape[1])
    discard = discarded_normalise(config, k, records, curator.params)
    skipped = discard[1] if discard is not None and discard[0] else None
    prep = prepare_secure(config, inputs, scenario.gamma, curator.params, None, None, skipped)
    out = TrialSecure()
    if prep is None:
        return out
    rounds, timeout = prep.plan["rounds"], float(prep.plan["timeout"])
    behaviour = dict.fromkeys(draw.colluders, "withhold")
    session = DcaSession(prep.config, batch=1, behaviour=behaviour, plan=rounds)
    rng = noise.generator("study:dca")
    data = dict(zip(scenario.owner_names, scenario.owners, strict=True))
    absent: list[str] = []
    for number, (label, what) in enumerate((("normalise", "moments"), ("scan", "sketch")), 1):
        absent += [o for o, (phase, _) in draw.drops.items() if phase == label]
        if label not in rounds.rounds:  # a normalise round the plan skipped (as a run does)
            continue
        spec = rounds.spec(label, number)
        options = rounds.options(label) if what == "moments" else prep.plan["sketch"]
        values = np.stack(
            [contribution(data[o][0], spec, what, options, o, {}) for o in prep.config.clients]
        )
        result = session.run_round(spec, values, rng, absent=sorted(absent), timeout=timeout).result
        out.rounds[label] = result
        if result.status == "insufficient":
            curator.refuse_round(f"secure sum: {label}", result.reason, list(result.missing))
            out.refused, out.missing = (label, result.reason), sorted(absent)
            return out
        record_for_owners(curator.ledgers, result, LABELS[label], spec.neighbouring)
        if label == "normalise":
            _standardize(config, scenario, curator, result)
    out.missing = sorted(absent)
    return out


def _standardize(
    config: MarketConfig, scenario: Scenario, curator: Curator, result: RoundResult
) -> None:
    """actors/run/phases.py ``standardize`` without Ray (post-processing of the normalise
    release)."""
    summary = moments_summary(result, scenario.validation.shape[1])
    if not config.secure["standardize"] or summary["status"] != "released":
        return
    useful, _ = standardisation_verdict(float(summary["count"]), float(summary["sigma"]))
    if not useful:
        return
    bound = float(config.data.get("bound", 10.0))
    records = float(sum(len(X) for X, _ in scenario.owners))  # n_points: public
    standard = standardisation_of(
        summary, bound, scenario.seed_set, config.data.get("gamma"), records
    )
    curator.standardize(list(standard.center), list(standard.scale), standard.gamma)


def coalition_ledger(
    ledger: PrivacyLedger, config: MarketConfig, draw: FaultDraw, secure: TrialSecure
) -> PrivacyLedger | None:
    """An honest owner's ledger as the coalition sees it (module docstring); None when a
    secure sum kept no noise the coalition does not know (its epsilon is infinite)."""
    c, K, T = len(draw.colluders), config.owners, config.tolerance
    remaining: dict[str, float] = {}
    for label, result in secure.rounds.items():
        honest = len(set(result.included) - set(draw.colluders))
        per_client = client_sigma(result.sigma_std, K, T)
        remaining[LABELS[label]] = per_client * float(np.sqrt(max(honest - 1, 0)))
    pooled = PrivacyLedger(ledger.party)
    for event in ledger.events:
        if event.mechanism == "auction":
            for _ in range(max(c, 1)):
                pooled.record(event)
        elif event.label in remaining and event.mechanism == "gaussian":
            sigma = remaining[event.label]
            if sigma <= 0:  # nobody's noise is left: the coalition sees the exact sum
                return None
            pooled.record(dataclasses.replace(event, parameters=(("sigma", sigma),)))
        else:
            pooled.record(event)
    return pooled


_EPSILONS: dict[tuple[Any, ...], float] = {}  # events -> epsilon, shared by a worker's trials


def _pld_epsilon(ledger: PrivacyLedger, delta: float) -> float:
    """PLD epsilon of ``ledger`` at ``delta``, memoised by its events (trials of a cell mostly
    end with the same few ledgers, and a PLD costs tens of milliseconds)."""
    if not ledger.events:
        return 0.0
    key = (delta, *ledger.events)
    if key not in _EPSILONS:
        if len(_EPSILONS) > 10_000:
            _EPSILONS.clear()
        _EPSILONS[key] = float(ledger.epsilon(delta, "pld"))
    return _EPSILONS[key]


def _epsilons(
    curator: Curator, config: MarketConfig, draw: FaultDraw, secure: TrialSecure
) -> dict[str, float]:
    """Max and median over honest owners of epsilon (ledger) and against the coalition."""
    cache: dict[tuple[Any, ...], tuple[float, float]] = {}
    own, vs = [], []
    for owner in config.owner_names:
        if owner in draw.colluders:
            continue
        ledger = curator.ledgers[owner]
        key = tuple(ledger.events)
        if key not in cache:
            eps = _pld_epsilon(ledger, config.delta)
            pooled = coalition_ledger(ledger, config, draw, secure)
            coal = float("inf") if pooled is None else _pld_epsilon(pooled, config.delta)
            cache[key] = (eps, coal)
        own.append(cache[key][0])
        vs.append(cache[key][1])
    return {
        "eps_max": max(own, default=0.0),
        "eps_median": float(np.median(own)) if own else 0.0,
        "eps_coalition_max": max(vs, default=0.0),
        "eps_coalition_median": float(np.median(vs)) if vs else 0.0,
    }


def _utility(scenario: Scenario, points: F64 | None, seed: int) -> dict[str, float | None]:
    """MMD^2 on the test set of the summary, of uniform and of exact greedy at its size."""
    if points is None or len(points) == 0:
        return {"mmd2": None, "mmd2_uniform": None, "mmd2_greedy": None, "gap_closed": None}
    p, gamma, test = len(points), scenario.gamma, scenario.test_X
    X = np.concatenate([X for X, _ in scenario.owners])
    owner_of = np.concatenate([np.full(len(Xk), k) for k, (Xk, _) in enumerate(scenario.owners)])
    greedy = X[greedy_exact(X, scenario.validation, p, gamma)]
    uniform = X[uniform_sample(owner_of, p, public_generator(seed))]
    m_priv, m_uni, m_gr = (
        mmd2(points, test, gamma),
        mmd2(uniform, test, gamma),
        mmd2(greedy, test, gamma),
    )
    gap = (m_uni - m_priv) / (m_uni - m_gr) if m_uni - m_gr > 1e-12 else None
    return {"mmd2": m_priv, "mmd2_uniform": m_uni, "mmd2_greedy": m_gr, "gap_closed": gap}


def run_trial(
    config: MarketConfig,
    cell: Cell,
    seed: int,
    timing: dict[str, float],
    epoch_range: tuple[int, int],
    vary_data: bool = True,
    draw: FaultDraw | None = None,
    scenario: Scenario | None = None,
) -> dict[str, Any]:
    """Run one trial (module docstring); ``draw`` replays given faults instead of drawing;
    ``scenario`` replaces the config's simulated data (a benchmark's own split)."""
    started, cpu = time.perf_counter(), time.process_time()
    if vary_data:
        config = dataclasses.replace(config, seed=seed % (2**31))
    if scenario is None:
        scenario = make_market_scenario(config)
    if draw is None:
        values = {}  # only drawn upon when the highest-value owners fail first
        if cell.who_fails == "highest-value":
            values = owner_values(scenario, scenario.gamma)
        rng = public_generator([seed, 1])
        draw = draw_faults(cell, list(scenario.owner_names), values, timing, epoch_range, rng)
    config = dataclasses.replace(config, faults=FaultConfig(colluders=draw.colluders))
    noise = NoiseSource.reproducible(seed)
    params = config.curator_params(scenario.gamma, len(scenario.validation))
    run_id = f"study-{seed}"
    owners = {
        name: Owner(name, run_id, X, y, rng=noise.generator(f"summary:{name}"))
        for name, (X, y) in zip(scenario.owner_names, scenario.owners, strict=True)
    }
    curator = Curator(
        run_id, list(owners), scenario.validation, scenario.seed_set, params,
        noise.generator("curator"),
    )  # fmt: skip
    secure = trial_secure_phases(config, scenario, curator, draw, noise)
    transport: LoopbackTransport | None = None
    if secure.refused is None:
        kill = {o: (0 if phase != "epochs" else epoch) for o, (phase, epoch) in draw.drops.items()}
        plan = FaultPlan(kill, draw.slow)
        transport = LoopbackTransport([curator, *owners.values()], plan)  # ticks the curator only
        transport.send(curator.start())
        transport.run_until(lambda: curator.state in ("done", "refused"))
    done = curator.state == "done"
    result = curator.result()
    lost = set(curator.lost) | set(secure.missing)
    phase = None
    if not done:
        phase = secure.refused[0] if secure.refused else "epochs"
    out: dict[str, Any] = {
        "verdict": "completed" if done else "refused",
        "refused_phase": phase,
        "refused_epoch": None if done else curator.epoch.number,
        "reason": curator.reason,
        "epochs": result.epochs,
        "summary_size": len(result.provenance),
        "points_accessed": result.transfers.distinct_points,
        "t_used": len(lost | set(draw.colluders)),
        "tolerance": config.tolerance,
        "lost": sorted(lost),
        "faults": draw.record(),
        "simulated_seconds": transport.now if transport is not None else 0.0,
    }
    out |= _epsilons(curator, config, draw, secure)
    out |= _utility(scenario, result.points if done else None, seed)
    out["seconds"] = time.perf_counter() - started
    out["cpu_seconds"] = time.process_time() - cpu  # this process's CPU: noisy less than wall
    return out

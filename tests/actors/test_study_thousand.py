"""A thousand owners in a study (issue 29 part 4): cells of K = 1024 load and run, and a cell's
completion frequency agrees with its closed form (actors/studies/closedform.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from scipy.stats import binom

from dpmarket.actors.config.checks import MAX_OWNER_ACTORS, MAX_OWNERS
from dpmarket.actors.studies.closedform import completion_form, completion_probability
from dpmarket.actors.studies.config import Cell, load_study
from dpmarket.actors.studies.report import summarise
from dpmarket.actors.studies.run import run_study

ROOT = Path(__file__).resolve().parents[2]
TINY = (
    '["data.n_points=4096", "market.summary_size=2", "data.n_test=100", "data.dim=2", '
    '"data.n_validation=20", "privacy.secure_phases=false"]'
)


def _cell(K: int, T: int, q: float, c: int = 0, s: float = 0.0, delay: float = 4.0) -> Cell:
    return Cell(0, K, T, 3, q, s, delay, c, "random")


def test_closed_form_is_the_binomial_count_of_lost_owners() -> None:
    """Without slow owners: P(Binomial(K, q) <= T - c). With slow owners past the deadline and
    no colluders each owner is lost independently with probability q + (1 - q) s, so the sum
    over the drop count must equal one binomial CDF."""
    for K, T, q, c in ((1024, 4, 0.005, 0), (1024, 10, 0.01, 3), (20, 2, 0.1, 1), (6, 2, 0.3, 0)):
        assert completion_probability(K, T, q, c) == pytest.approx(binom.cdf(T - c, K, q))
    assert completion_probability(1024, 10, 0.005, 0, 0.004) == pytest.approx(
        binom.cdf(10, 1024, 0.005 + 0.995 * 0.004)
    )
    assert completion_probability(64, 2, 0.01, 3) == 0.0  # colluders alone exceed T
    assert completion_probability(64, 2, 0.0) == 1.0


def test_closed_form_only_where_every_drop_counts() -> None:
    """Exact when every drop happens before the summary or at epoch 1 and slow owners are far
    from the deadline; bounds around it otherwise, and the note says why."""
    timing = {"normalise": 0.5, "scan": 0.25, "epochs": 0.25}
    exact = completion_form(_cell(1024, 4, 0.005), timing, (1, 1), 2.0)
    assert exact.exact and exact.low == exact.high == pytest.approx(binom.cdf(4, 1024, 0.005))
    late = completion_form(_cell(1024, 4, 0.005), timing, (1, 40), 2.0)
    assert not late.exact and "epochs up to 40" in late.why
    # the lower bound counts every drop; the upper only those surely lost (3/4 + 1/4 * 1/40)
    assert late.low == pytest.approx(binom.cdf(4, 1024, 0.005))
    assert late.high == pytest.approx(binom.cdf(4, 1024, 0.005 * (0.75 + 0.25 / 40)))
    near = completion_form(_cell(1024, 4, 0.005, s=0.01, delay=2.0), timing, (1, 1), 2.0)
    assert not near.exact and "deadline" in near.why and near.low < near.high
    past = completion_form(_cell(1024, 4, 0.005, s=0.01, delay=4.0), timing, (1, 1), 2.0)
    assert past.exact and past.high == pytest.approx(binom.cdf(4, 1024, 0.005 + 0.995 * 0.01))
    inside = completion_form(_cell(1024, 4, 0.005, s=0.5, delay=0.5), timing, (1, 1), 2.0)
    assert inside.exact and inside.high == pytest.approx(binom.cdf(4, 1024, 0.005))


def test_thousand_owner_study_loads_with_grouped_actors() -> None:
    """The shipped study's K = 1024 cells load (MAX_OWNERS = 2048); a cell beyond 128 owner
    actors groups its owners for --actors replays, smaller cells keep the base's grouping; every
    cell of this study has a closed form."""
    assert MAX_OWNERS == 2048
    study = load_study(ROOT / "configs" / "studies" / "thousand.toml")
    assert {c.owners for c in study.cells} == {16, 64, 256, 1024}
    for cell in study.cells:
        config = study.configs[cell.key]
        assert config.owners == cell.owners
        assert -(-cell.owners // config.owners_per_actor) <= MAX_OWNER_ACTORS
        grouped = {16: 1, 64: 1, 256: 2, 1024: 8}[cell.owners]  # ceil(K / 128) beyond 128
        assert config.owners_per_actor == grouped
    for row in summarise(study, []):
        assert row["p_closed_form"] is not None and row["closed_form_note"] == ""


@pytest.mark.slow
def test_completion_at_1024_owners_agrees_with_the_closed_form(tmp_path: Path) -> None:
    """K = 1024, T = 5, each owner dropping with probability q = 0.005 before normalise, before
    scan or at epoch 1: the run completes iff at most T drop, P = BinomCDF(5; 1024, 0.005) ~ 0.60.
    60 trials (fixed seeds) through the study engine: the closed form lies in the 99.9%
    Clopper-Pearson interval of the completion frequency; a model with q doubled (~0.07), T
    off by three (~0.12 and ~0.95) does not."""
    K, T, q, n = 1024, 5, 0.005, 60
    path = tmp_path / "thousand.toml"
    path.write_text(
        f'[study]\nbase = "{ROOT / "configs" / "dropout.toml"}"\nset = {TINY}\n'
        f"trials = {n}\nseed = 11\n[axes]\nowners = [{K}]\ntolerance = [{T}]\n"
        f"dropout = [{q}]\n[timing]\nnormalise = 0.5\nscan = 0.25\nepochs = 0.25\n"
        "epoch_range = [1, 1]\n",
        encoding="utf-8",
    )
    study = load_study(path)
    results = run_study(study, tmp_path / "out", serial=True, batch=10)
    (row,) = summarise(study, results)
    assert row["trials"] == n and row["p_closed_form"] == pytest.approx(binom.cdf(T, K, q))
    from dpmarket.actors.studies.intervals import clopper_pearson

    low, high = clopper_pearson(row["completed"], n, level=0.999)
    assert low <= row["p_closed_form"] <= high
    for wrong in (binom.cdf(T, K, 2 * q), binom.cdf(T - 3, K, q), binom.cdf(T + 3, K, q)):
        assert not low <= wrong <= high
    # the verdict is the count's: a trial completes iff at most T owners dropped
    for r in results:
        assert (r["verdict"] == "completed") == (len(r["faults"]["drops"]) <= T)


def test_study_transport_delivers_what_the_loopback_does() -> None:
    """The trial's transport (the loopback, only the curator ticked: owners keep no deadlines)
    and one that ticks every party, as before, run the same faulty market to the same result,
    frame for frame; at every frame the curator's counted check of an epoch's answers agrees
    with the waiting set it replaces."""
    import numpy as np

    from dpmarket.actors.parties.transport import FaultPlan, LoopbackTransport
    from dpmarket.protocol.summary.curator import Curator
    from dpmarket.protocol.summary.owner import Owner
    from dpmarket.protocol.wire.codec import Message
    from tests.small import small_params, small_scenario

    class EveryPartyTicked(LoopbackTransport):
        def __init__(self, parties: list[object], faults: FaultPlan) -> None:
            super().__init__(parties, faults)  # type: ignore[arg-type]
            self._timed = list(self.parties.values())

    scenario = small_scenario(5)
    names = list(scenario.owner_names)
    checked = []

    class Checked(Curator):
        def receive(self, msg: Message) -> list[Message]:
            out = super().receive(msg)
            if self.state in ("bidding", "asking"):
                checked.append(self._all_answered() == (not self._waiting()))
            return out

    def run(kind: type[LoopbackTransport]) -> tuple[object, ...]:
        params = small_params(scenario, max_lost=2, phase_timeout=2.0)
        curator = Checked(
            "t", names, scenario.validation, scenario.seed_set, params, np.random.default_rng(1)
        )
        owners = [
            Owner(n, "t", X, y, rng=np.random.default_rng(i))
            for i, (n, (X, y)) in enumerate(zip(names, scenario.owners, strict=True))
        ]
        plan = FaultPlan(kill_at={names[0]: 3}, delay={names[1]: 4.0})
        transport = kind([curator, *owners], plan)
        transport.send(curator.start())
        transport.run_until(lambda: curator.state in ("done", "refused"))
        result = curator.result()
        return (
            curator.state, dict(curator.lost), curator.dropped, result.epochs,
            [(p.owner, p.token) for p in result.provenance], transport.now,
            transport.frames_sent, transport.bytes_sent,
        )  # fmt: skip

    study, loopback = run(LoopbackTransport), run(EveryPartyTicked)
    assert study == loopback
    assert study[0] == "done" and set(study[1]) == {names[0], names[1]}  # both faults counted
    assert checked and all(checked)

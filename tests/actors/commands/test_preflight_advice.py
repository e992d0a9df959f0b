"""Issue 40, item 3: a preflight a user can follow (no Ray: plans and refusals only).

The five cases the issue found, each with its test: a normalise release the plan predicts
will be discarded is not spent (and its advice fits the data as declared); a random purchase
is never called free; a refused combination names the key that fails and the value that
passes; a recommendation says how to follow it; one g_tilde SNR whatever the mechanism. And
the two shipped demo configs follow their own preflights.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from dpmarket.actors.commands.market import print_plan
from dpmarket.actors.config.market import ConfigError, load_market_config
from dpmarket.actors.config.validate import check_inputs
from dpmarket.actors.run.market import market_inputs
from dpmarket.actors.run.preflight import RunPlan, plan_run

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "configs"


def plan_of(tmp_path: Path, config: Path, *sets: str) -> RunPlan:
    """The plan ``dpmarket run CONFIG --set ...`` prints before it starts anything."""
    loaded = load_market_config(config, list(sets))
    headers = check_inputs(loaded).headers if loaded.source == "files" else {}
    inputs = market_inputs(loaded, tmp_path, headers, tmp_path / "attempt-0")
    return plan_run(loaded, inputs.owners, inputs.gamma, inputs.files)


def printed(plan: RunPlan, capsys: pytest.CaptureFixture[str]) -> str:
    print_plan(plan)
    return capsys.readouterr().out


def test_a_normalise_round_predicted_discarded_is_skipped_and_charged_to_nobody(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """400 records against normalise noise sigma ~ 212 (bound 3, k = 10, eps 0.5): the DP
    count could not clear 3 sigma, so the standardisation would drop the release. The plan
    does not spend it: no normalise row, each owner's total lower by the round, one line
    saying why and what it saved; ``normalise_round = "always"`` spends it (and warns)."""
    small = ("data.n_points=400",)
    skipped = plan_of(tmp_path, CONFIGS / "demo.toml", *small)
    spent = plan_of(tmp_path, CONFIGS / "demo.toml", *small, 'privacy.normalise_round="always"')
    assert skipped.normalise_skipped is not None and spent.normalise_skipped is None
    assert "normalise" not in {c.name for c in skipped.checks}
    assert "normalise" in {c.name for c in spent.checks}
    total = {p: next(c.epsilon for c in p.checks if c.name == "owner total")
             for p in (skipped, spent)}  # fmt: skip
    assert total[skipped] < total[spent] - 0.1  # the round's eps 0.5 composed away
    line = skipped.normalise_skipped
    assert "each owner saves eps 0.5 at delta 1e-05" in line and "about 400 records" in line
    assert 'normalise_round = "always"' in line  # the opt-in, named
    assert not any("standardisation" in w for w in skipped.warnings)
    assert any("standardisation will likely be skipped" in w for w in spent.warnings)
    assert line in printed(skipped, capsys)
    # the rounds an owner or node would accept: no normalise round exists to be charged for
    from dpmarket.actors.run.phases import prepare_secure

    config = load_market_config(CONFIGS / "demo.toml", list(small))
    inputs = market_inputs(config, tmp_path, {}, tmp_path / "attempt-0")
    for plan, has in ((skipped, False), (spent, True)):
        prep = prepare_secure(
            config, inputs.owners, inputs.gamma, plan.params, None, None, plan.normalise_skipped
        )
        assert prep is not None
        assert ("normalise" in prep.trust.plan.rounds) is has
        assert "scan" in prep.trust.plan.rounds


def test_the_skip_is_decided_from_public_numbers_only(tmp_path: Path) -> None:
    """The same config and pool size give the same decision whatever the records hold (two
    data seeds, the same n_points), and the decision moves with the public size alone."""
    one = plan_of(tmp_path, CONFIGS / "demo.toml", "data.n_points=400", "run.seed=1")
    two = plan_of(tmp_path, CONFIGS / "demo.toml", "data.n_points=400", "run.seed=2")
    assert one.normalise_skipped == two.normalise_skipped is not None
    assert plan_of(tmp_path, CONFIGS / "demo.toml", "data.n_points=700").normalise_skipped is None


def test_the_advice_names_exact_keys_that_fit_the_declared_data(tmp_path: Path) -> None:
    """wine's features are declared in [-0.5, 0.5] and bound = 0.5 already: the advice is an
    eps_normalise that clears 3 sigma, never a lower bound; with bound 2 it also names the
    declared range as the bound. Each advised value really clears the threshold."""
    weak = "privacy.eps_normalise=0.05"
    at_range = plan_of(tmp_path, CONFIGS / "files-example.toml", weak)
    line = at_range.normalise_skipped or ""
    assert "[data].bound" not in line
    eps = float(re.search(r"\[privacy\]\.eps_normalise = ([0-9.e-]+)", line).group(1))  # type: ignore[union-attr]
    advised = plan_of(tmp_path, CONFIGS / "files-example.toml", f"privacy.eps_normalise={eps}")
    assert advised.normalise_skipped is None
    normalise = next(c for c in advised.checks if c.name == "normalise")
    assert normalise.snr is not None and normalise.snr >= 3.0
    wide = plan_of(tmp_path, CONFIGS / "files-example.toml", weak, "data.bound=2.0")
    assert "[data].bound = 0.5 (the declared range)" in (wide.normalise_skipped or "")


def test_a_random_purchase_is_never_called_free(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default market's owners pay for the secure sums: the recommendation says how much,
    the same number as the owner total row, and never "no privacy cost"."""
    plan = plan_of(tmp_path, CONFIGS / "common-target.toml")
    assert plan.params.mechanism == "random-select"
    total = next(c.epsilon for c in plan.checks if c.name == "owner total")
    assert total > 0.5
    out = printed(plan, capsys)
    assert "no privacy cost" not in out and "at no" not in out
    assert f"owners pay only the secure sums, eps {total:.3g} each" in out


def test_a_refused_combination_names_the_failing_key_and_the_passing_value(
    tmp_path: Path,
) -> None:
    """herding-select's [summary] with explore_share = 1.0, plus a max_points budget (which
    selects allocate-select): the refusal names explore_share, the value 1.0, and 0 as what
    passes, before anything else."""
    with pytest.raises(ConfigError) as caught:
        load_market_config(
            CONFIGS / "demo.toml", ["summary.max_points=60", "summary.explore_share=1.0"]
        )
    message = str(caught.value)
    assert re.search(
        r"\[summary\]\.explore_share: explore_share = 1\.0 cannot be used with allocate-select"
        r".*; explore_share = 0\.0 passes",
        message,
    ), message
    # the value named passes
    fixed = ["summary.max_points=60", "summary.explore_share=0.0"]
    assert load_market_config(CONFIGS / "demo.toml", fixed).curator_params(0.5, 200).allocate


@pytest.mark.parametrize(
    ("sets", "recommended"),
    [
        ((), "random-select"),  # herding-select at (K + 1) p = 5 p
        (("summary.max_points=60", "summary.allocate=false"), "allocate-select"),  # 1.5 p
    ],
)
def test_a_recommendation_says_how_to_follow_it_and_the_flags_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sets: tuple[str, ...], recommended: str
) -> None:
    plan = plan_of(tmp_path, CONFIGS / "demo.toml", *sets)
    assert plan.params.mechanism == "herding-select"
    assert plan.recommendation[0] == recommended
    out = printed(plan, capsys)
    follow = next(line for line in out.splitlines() if "to follow it:" in line)
    flags = shlex.split(follow.split("to follow it:", 1)[1])
    assert flags[0] == "--set" and f"summary.mechanism={recommended}" in flags
    extra = [f for f in flags if f != "--set"]
    followed = plan_of(tmp_path, CONFIGS / "demo.toml", *sets, *extra)
    assert followed.params.mechanism == recommended == followed.recommendation[0]
    assert "to follow it" not in printed(followed, capsys)


def test_one_g_tilde_snr_whatever_the_mechanism(tmp_path: Path) -> None:
    """The same data and [summary]: every mechanism's preflight states the same SNR and the
    same recommendation; a [summary] that changes g_tilde (wine's d = 256) is named with the
    plan's SNR, which is the number a config without those keys states."""
    snrs, names = set(), set()
    for mechanism in ("herding-select", "allocate-select", "random-select"):
        plan = plan_of(tmp_path, CONFIGS / "files-example.toml", f"summary.mechanism={mechanism!r}")
        snrs.add(re.search(r"SNR is ([0-9.]+)", plan.recommendation[1]).group(1))  # type: ignore[union-attr]
        names.add(plan.recommendation[0])
        if mechanism != "random-select":  # the row of the release a steered run makes
            row = next(c for c in plan.checks if c.name == "validation")
            assert f"{row.snr:.2f}" in snrs
    assert len(snrs) == 1 and len(names) == 1
    why = plan.recommendation[1]
    assert "[summary].d = 256" in why
    plan_snr = re.search(r"the plan's release for m = \d+ has SNR ([0-9.]+)", why).group(1)  # type: ignore[union-attr]
    text = (CONFIGS / "files-example.toml").read_text(encoding="utf-8")
    bare = tmp_path / "bare.toml"
    bare.write_text(text[: text.index("[summary]")], encoding="utf-8")
    for name in ("validation.csv", "seed.csv", "owner-1.csv", "owner-2.csv", "owner-3.csv"):
        target = tmp_path / "example-data" / name
        target.parent.mkdir(exist_ok=True)
        target.write_bytes((CONFIGS / "example-data" / name).read_bytes())
    plain = plan_of(tmp_path, bare)
    assert re.search(r"SNR is ([0-9.]+)", plain.recommendation[1]).group(1) == plan_snr  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "mechanism"),
    [("rare-target.toml", "allocate-select"), ("common-target.toml", "random-select")],
)
def test_the_shipped_demos_run_what_their_preflight_recommends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, mechanism: str
) -> None:
    plan = plan_of(tmp_path, CONFIGS / name)
    assert plan.params.mechanism == plan.recommendation[0] == mechanism
    assert plan.normalise_skipped is None and not plan.warnings
    assert "the one the plan expects to do best" in printed(plan, capsys)

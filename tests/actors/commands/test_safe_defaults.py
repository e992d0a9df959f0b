"""Issue 15, items 1, 4 and 7 through the CLI (no Ray: every run here stops before it starts)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from dpmarket.actors.commands.main import main
from dpmarket.actors.commands.market import print_report
from dpmarket.actors.config.market import load_market_config
from dpmarket.actors.run.report import privacy_section
from dpmarket.protocol.privacy.ledger import PrivacyLedger
from dpmarket.protocol.summary.plan import plan_releases

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "configs" / "demo.toml"


def _without_summary(tmp_path: Path, extra: str = "") -> Path:
    """configs/demo.toml with no [summary] section (plus ``extra``)."""
    text = DEMO.read_text(encoding="utf-8")
    text = text[: text.index("[summary]")] + extra
    path = tmp_path / "plain.toml"
    path.write_text(text, encoding="utf-8")
    return path


HERDING = "[summary]\nmechanism = 'herding-select'\n"


def test_a_config_without_summary_buys_at_random_at_the_default_budget(tmp_path: Path) -> None:
    """Issue 30: the default is random-select at (K + 1) p points, the points herding-select
    accessed unbounded; nothing is released to any owner or from the validation set."""
    from dpmarket.protocol.summary.snr import planned_owner_ledger, planned_validation_ledger

    config = load_market_config(_without_summary(tmp_path))
    params = config.curator_params(gamma=0.5, m=200)
    assert params.random_purchase and not params.allocate
    assert params.max_points == (4 + 1) * 40  # K = 4 owners, p = 40
    assert params.final_selection == "exact" and params.max_deliveries == 1
    assert params.explore_share == 0.0
    assert not planned_owner_ledger(params).events
    assert not planned_validation_ledger(params).events
    # an empty [summary], or one without a steering key, is the default too
    for extra in ("[summary]\n", "[summary]\nmax_epochs = 300\n"):
        path = _without_summary(tmp_path, extra)
        assert load_market_config(path).curator_params(0.5, 200).random_purchase, extra
    # a budget of its own is kept
    path = _without_summary(tmp_path, "[summary]\nrandom_purchase = true\nmax_points = 70\n")
    assert load_market_config(path).curator_params(0.5, 200).max_points == 70


def test_herding_select_named_runs_the_planned_mechanism(tmp_path: Path) -> None:
    config = load_market_config(_without_summary(tmp_path, HERDING))
    for m in (15, 200):
        params = config.curator_params(gamma=0.5, m=m)
        assert not params.random_purchase and not params.allocate
        plan = plan_releases(40, m, 4, 1.0, 3.0, 1e-5, "herding", "all", select=True)
        for key, value in plan.overrides().items():
            assert getattr(params, key) == value, key
        assert params.auction_variant == "pure" and params.tau == 1
        assert params.summary_release == "herding" and params.validation_release == "gaussian"
        assert params.max_epochs == 2 * 40 + 10  # from p, not from a config
    assert config.curator_params(0.5, 15).d < config.curator_params(0.5, 200).d  # d from m


@pytest.mark.parametrize(
    ("summary", "mechanism"),
    [
        ("", "random-select"),
        ("max_epochs = 300\n", "random-select"),
        ("herding_ascent_steps = 0\n", "herding-select"),  # a steering key keeps the old default
        ("tau = 2\neps_validation = 1.0\n", "herding-select"),
        ("max_points = 60\n", "allocate-select"),
        ("herding_ascent_steps = 0\nmax_points = 60\n", "allocate-select"),
        ("allocate = false\nmax_points = 60\n", "herding-select"),
        ("random_purchase = true\n", "random-select"),
        ("mechanism = 'herding-select'\nmax_points = 60\n", "herding-select"),
        ("max_deliveries = 3\n", "herding-select"),
        ("allocation_floor = 0.2\n", "allocate-select"),  # allocate-select's own keys
        ("random_share = 0.3\n", "allocate-select"),
        ("herding_ascent_steps = 0\nallocation_rule = 'mixture'\n", "allocate-select"),
        ("less_trusted = true\n", "random-select"),
        ("random_purchase = false\n", "herding-select"),  # as allocate = false
        ("random_purchase = false\nmax_points = 60\n", "allocate-select"),
    ],
)
def test_the_summary_table_selects_the_mechanism(
    tmp_path: Path, summary: str, mechanism: str
) -> None:
    path = _without_summary(tmp_path, "[summary]\n" + summary)
    params = load_market_config(path).curator_params(0.5, 200)
    assert params.mechanism == mechanism
    assert params.random_purchase == (mechanism == "random-select")
    assert params.allocate == (mechanism == "allocate-select")


@pytest.mark.parametrize(
    "summary",
    [
        "mechanism = 'random-select'\nrandom_purchase = false\n",
        "mechanism = 'herding-select'\nallocate = true\n",
        "random_purchase = true\nallocate = true\n",
        "mechanism = 'allocate-select'\nrandom_purchase = true\n",
    ],
)
def test_a_flag_contradicting_the_selected_mechanism_is_refused(
    tmp_path: Path, summary: str
) -> None:
    """Never a hybrid: random-select's plan with random_purchase turned off afterwards ran
    herding epochs at random-select's budget and epoch limit."""
    path = _without_summary(tmp_path, "[summary]\n" + summary)
    with pytest.raises(ValueError, match=r"\[summary\]\.\w+: \w+ = \w+ contradicts the mechanism"):
        load_market_config(path).curator_params(0.5, 200)


def test_strict_refuses_a_validation_set_too_small_for_its_epsilon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = ["run", str(_without_summary(tmp_path, HERDING)), "--out", str(out), "--strict"]
    assert main([*args, "--set", "data.n_validation=15"]) == 2
    captured = capsys.readouterr()
    row = next(line for line in captured.out.splitlines() if line.strip().startswith("validation"))
    signal, noise, snr = (float(x) for x in row.split()[2:5])
    assert noise > 1.0 > snr and signal == pytest.approx(1 / math.sqrt(2), abs=1e-3)
    assert "--strict" in captured.err and "'validation'" in captured.err
    assert f"noise {noise:.3g}" in captured.err  # the numbers are named
    assert not out.exists()  # refused before anything was written, started or spent


def test_strict_refuses_a_normalise_round_noisier_than_its_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With ``normalise_round = "always"`` (by default such a round is skipped, not spent:
    tests/actors/commands/test_preflight_advice.py)."""
    args = ["run", str(_without_summary(tmp_path)), "--out", str(tmp_path / "o"), "--strict"]
    always = ["--set", 'privacy.normalise_round="always"']
    assert main([*args, "--set", "data.n_points=400", "--set", "data.bound=10.0", *always]) == 2
    err = capsys.readouterr().err
    assert "'normalise'" in err and "standardisation will likely be skipped" in err
    sigma = float(re.search(r"normalise noise sigma (\d+)", err).group(1))  # type: ignore[union-attr]
    assert sigma > 400


def test_a_named_paper_auction_warns_and_shows_an_unbounded_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _without_summary(tmp_path, '[summary]\nauction_variant = "paper"\n')
    args = ["run", str(path), "--out", str(tmp_path / "o"), "--strict"]
    assert main([*args, "--set", "data.n_validation=15"]) == 2  # stopped by --strict
    captured = capsys.readouterr()
    assert 'auction_variant = "paper" always asks the top bidder' in captured.err
    rows = {line.split()[0]: line for line in captured.out.splitlines()[2:]}
    assert rows["auction"].split()[-1] == "inf" and rows["owner"].split()[-1] == "inf"


def test_the_default_mechanism_does_not_warn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dpmarket.actors.commands.market import check_plan
    from dpmarket.actors.run.market import market_inputs
    from dpmarket.actors.run.preflight import plan_run

    for extra in ("", HERDING):  # the default (random-select) and the planned herding-select
        config = load_market_config(_without_summary(tmp_path, extra))
        inputs = market_inputs(config, tmp_path, {}, tmp_path / "attempt-0")
        check_plan(strict=True)(plan_run(config, inputs.owners, inputs.gamma))  # no refusal
        captured = capsys.readouterr()
        assert "WARNING" not in captured.err and "owner total" in captured.out, extra


def test_the_default_releases_nothing_from_a_small_validation_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """15 validation points refuse herding-select under --strict (above) but not the default:
    random-select reads D_v only in the consumer's own final selection."""
    from dpmarket.actors.commands.market import check_plan
    from dpmarket.actors.run.market import market_inputs
    from dpmarket.actors.run.preflight import plan_run

    path = _without_summary(tmp_path)
    path.write_text(
        path.read_text(encoding="utf-8").replace("n_validation = 200", "n_validation = 15"),
        encoding="utf-8",
    )
    config = load_market_config(path)
    assert config.data["n_validation"] == 15
    inputs = market_inputs(config, tmp_path, {}, tmp_path / "attempt-0")
    plan = plan_run(config, inputs.owners, inputs.gamma)
    check_plan(strict=True)(plan)  # no refusal
    row = next(c for c in plan.checks if c.name == "validation")
    assert row.epsilon == 0.0 and row.noise is None and "none: random-select" in row.what


def test_report_writes_inf_with_a_note_and_the_cli_prints_n_a(
    capsys: pytest.CaptureFixture[str],
) -> None:
    paper, herding, mwem = PrivacyLedger("owner-1"), PrivacyLedger("owner-2"), PrivacyLedger("v")
    paper.auction(0.05, "paper", count=10, label="auction step")
    herding.auction(1e-6, "pure", count=10, label="auction step")
    mwem.laplace(100.0, 1.0, count=5, paper_epsilon=0.01)
    ledgers = {"owner-1": paper, "owner-2": herding, "validation": mwem}
    privacy = privacy_section({p: ledger.to_dict() for p, ledger in ledgers.items()}, 1e-5, ())
    json.dumps(privacy, allow_nan=False)  # valid JSON: no NaN or Infinity
    for entry in privacy["parties"].values():
        assert all(entry[k] is not None for k in ("pld", "theorem7", "paper"))  # never null
    one, two, val = (privacy["parties"][p] for p in ("owner-1", "owner-2", "validation"))
    assert one["pld"] == "inf" and "always asks the top bidder" in one["note"]
    assert two["paper"] == "n/a" and "note" not in two
    assert isinstance(val["paper"], float) and val["paper"] > 0
    report = {
        "outcome": {"state": "done", "epochs": 10, "reason": "complete"},
        "parsimony": {"summary_size": 4, "distinct_points": 4, "total_transfers": 4, "rho": 1.0},
        "privacy": privacy,
        "faults": {"lost": []},
    }
    print_report(report)
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert lines["owner-1"][1:4] == ["inf", "inf", "n/a"]
    assert lines["owner-2"][3] == "n/a" and lines["owner-2"][1] != "n/a"
    assert lines["validation"][3] == f"{val['paper']:.3f}"


def test_an_epoch_limit_that_stops_the_default_purchase_short_is_warned(tmp_path: Path) -> None:
    """random-select sells one point per owner and epoch after the count epoch: max_epochs = 20
    with K = 4 buys at most 76 of the default 200 points."""
    from dpmarket.actors.run.market import market_inputs
    from dpmarket.actors.run.preflight import plan_run

    for max_epochs, warned in ((20, True), (51, False)):
        path = _without_summary(tmp_path, f"[summary]\nmax_epochs = {max_epochs}\n")
        config = load_market_config(path)
        inputs = market_inputs(config, tmp_path, {}, tmp_path / "attempt-0")
        plan = plan_run(config, inputs.owners, inputs.gamma)
        assert plan.params.mechanism == "random-select" and plan.params.max_points == 200
        found = [w for w in plan.warnings if "stop short" in w]
        assert bool(found) == warned, (max_epochs, plan.warnings)
        if warned:
            assert "at most 76 of its 200 points" in found[0] and "at least 51" in found[0]

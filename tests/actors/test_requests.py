"""[[requests]] in a market config without Ray: parsing, defaults, per-request configs and
the errors that name the file and key; the owner party's fork for a later request."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpmarket.actors.budgets.gate import OwnerBudget
from dpmarket.actors.config.market import ConfigError, load_market_config
from dpmarket.actors.config.requests import Request
from dpmarket.protocol.summary.owner import Owner

HEAD = """
[run]
name = "m"
[market]
owners = 3
tolerance = 1
summary_size = 8
[data]
source = "files"
features = 2
lower = -5.0
upper = 5.0
seed_set = "seed.csv"
[data.files]
owner-1 = ["o1.csv"]
owner-2 = ["o2.csv"]
owner-3 = ["o3.csv"]
[privacy]
ledger_dir = "stores"
owner_budget = 2.0
[summary]
d = 32
[consumer]
budget = {epsilon = 6.0, delta = 1e-5}
"""


def _config(tmp_path: Path, requests: str, head: str = HEAD) -> Path:
    for name in ("seed", "o1", "o2", "o3", "v1", "v2"):
        (tmp_path / f"{name}.csv").write_text("0.1,0.2\n0.3,0.4\n")
    path = tmp_path / "market.toml"
    path.write_text(head + requests)
    return path


TWO = """
[[requests]]
name = "alice"
validation = "v1.csv"
[[requests]]
name = "bob"
validation = "v2.csv"
summary_size = 5
summary = {d = 64}
budget = {epsilon = 4.0, delta = 1e-6}
"""


def test_requests_parse_with_their_defaults(tmp_path: Path) -> None:
    config = load_market_config(_config(tmp_path, TWO))
    alice, bob = config.requests
    assert alice == Request("alice", str(tmp_path / "v1.csv"))
    assert bob.summary_size == 5 and bob.summary == {"d": 64}
    assert bob.consumer == OwnerBudget(str(tmp_path / "stores" / "consumer-bob.sqlite"), 4.0, 1e-6)
    # each request's config: its run name, files, p, summary and consumer; owners unchanged
    a, b = (config.for_request(r) for r in config.requests)
    assert (a.name, b.name) == ("m.alice", "m.bob")
    assert a.data["validation"] == str(tmp_path / "v1.csv")
    assert a.data["seed_set"] == b.data["seed_set"] == str(tmp_path / "seed.csv")  # absolute
    assert (a.summary_size, b.summary_size) == (8, 5)
    assert a.overrides == {"d": 32} and b.overrides == {"d": 64}
    assert a.consumer_budget == config.consumer_budget  # the [consumer]'s store and cap
    assert b.consumer_budget == bob.consumer
    assert a.budgets == b.budgets == config.budgets and a.requests == ()
    assert b.curator_params(1.0, 2).d == 64
    # report.json records the requests without their files or stores
    public = config.public_record()["requests"]
    assert public[1] == {
        "name": "bob",
        "summary_size": 5,
        "summary": {"d": 64},
        "consumer_budget": {"epsilon": 4.0, "delta": 1e-6},
    }
    assert "v1.csv" not in str(public) and "sqlite" not in str(public)


def test_without_requests_nothing_changes(tmp_path: Path) -> None:
    head = HEAD.replace('seed_set = "seed.csv"', 'seed_set = "seed.csv"\nvalidation = "v1.csv"')
    config = load_market_config(_config(tmp_path, "", head))
    assert config.requests == () and config.public_record()["requests"] == []


def test_market_validation_is_the_default_for_requests(tmp_path: Path) -> None:
    head = HEAD.replace('seed_set = "seed.csv"', 'seed_set = "seed.csv"\nvalidation = "v2.csv"')
    config = load_market_config(_config(tmp_path, '[[requests]]\nname = "a"\n', head))
    assert config.for_request(config.requests[0]).data["validation"] == str(tmp_path / "v2.csv")


def test_reproducible_requests_draw_distinct_noise(tmp_path: Path) -> None:
    demo = (Path(__file__).resolve().parents[2] / "configs" / "demo.toml").read_text()
    head = demo.replace("[run]\n", "[run]\nreproducible_noise = true\nnoise_seed = 4\n")
    text = '[[requests]]\nname = "a"\n[[requests]]\nname = "b"\n'
    config = load_market_config(_config(tmp_path, text, head))
    a, b = (config.for_request(r) for r in config.requests)
    assert a.noise_seed != b.noise_seed
    draw = [c.noise.generator("curator").standard_normal(3) for c in (a, b)]
    assert not np.allclose(draw[0], draw[1])
    again = config.for_request(config.requests[0]).noise.generator("curator")
    assert np.allclose(draw[0], again.standard_normal(3))  # the request's own stream, fixed


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        ('[[requests]]\nname = "a"\nvalidation = "v1.csv"\n' * 2,
         r"\[\[requests\]\] #2 \(a\)\.name: two requests are named 'a'"),
        ('[[requests]]\nname = "a"\n',
         r"\[\[requests\]\] #1 \(a\)\.validation: missing"),
        ('[[requests]]\nname = "a"\nvalidation = "nope.csv"\n',
         r"\[\[requests\]\] #1 \(a\)\.validation: file 'nope.csv' not found"),
        ('[[requests]]\nname = "a"\nvalidation = "v1.csv"\ncolour = 1\n',
         r"\[\[requests\]\] #1 \(a\): unknown keys \['colour'\]"),
        ('[[requests]]\nvalidation = "v1.csv"\n', r"\[\[requests\]\] #1\.name: expected a name"),
        ('[[requests]]\nname = "a/b"\nvalidation = "v1.csv"\n', r"#1\.name: expected a name"),
        ('[[requests]]\nname = "a"\nvalidation = "v1.csv"\nsummary = {colour = 1}\n',
         r"\(a\)\.summary: unknown keys \['colour'\]"),
        ('[[requests]]\nname = "a"\nvalidation = "v1.csv"\nsummary = {max_epochs = -5}\n',
         r"\[\[requests\]\] \(a\): \[summary\]\.max_epochs"),
        ('[[requests]]\nname = "a"\nvalidation = "v1.csv"\nsummary_size = 0\n',
         r"\(a\)\.summary_size: expected an integer >= 1"),
        ('[[requests]]\nname = "a"\nvalidation = "v1.csv"\nledger = "x.sqlite"\n',
         r"\(a\)\.ledger: a store needs a cap"),
        ('[[requests]]\nname = "a"\nvalidation = "v1.csv"\nbudget = {epsilon = 1}\n',
         r"\(a\)\.budget: expected \{epsilon = E, delta = D\}"),
        ('[[requests]]\nname = "a"\nvalidation = "v1.csv"\nbudget = {epsilon = -1, delta = 1e-5}\n',
         r"\(a\)\.budget\.epsilon: expected a finite number > 0"),
        ('[faults]\ncolluders = ["owner-1"]\n[[requests]]\nname = "a"\nvalidation = "v1.csv"\n',
         r"\[faults\]: simulated faults belong to one run"),
        ("requests = 3\n", r"\[\[requests\]\]: expected one or more"),
    ],
)  # fmt: skip
def test_bad_requests_are_named(tmp_path: Path, requests: str, message: str) -> None:
    top = requests.startswith("requests =")  # a top-level key: before the tables
    path = _config(tmp_path, "" if top else requests, requests + HEAD if top else HEAD)
    with pytest.raises(ConfigError, match=message) as info:
        load_market_config(path)
    assert str(info.value).startswith(str(path))


def test_a_simulated_source_refuses_request_files(tmp_path: Path) -> None:
    head = "[data]\nsource = 'synthetic'\nn_points = 600\n[market]\nowners = 3\n"
    path = _config(tmp_path, '[[requests]]\nname = "a"\nvalidation = "v1.csv"\n', head)
    with pytest.raises(ConfigError, match=r"\(a\)\.validation: a simulated source draws"):
        load_market_config(path)
    path.write_text(head + '[[requests]]\nname = "a"\nsummary_size = 6\n')
    assert load_market_config(path).requests[0].summary_size == 6


def test_a_consumer_store_cannot_be_an_owners(tmp_path: Path) -> None:
    owners = '[owners.owner-1]\nledger = "shared.sqlite"\n'
    text = owners + '[[requests]]\nname = "a"\nvalidation = "v1.csv"\n'
    text += 'budget = {epsilon = 1.0, delta = 1e-5}\nledger = "shared.sqlite"\n'
    with pytest.raises(ConfigError, match=r"a consumer's store is an owner's store"):
        load_market_config(_config(tmp_path, text))


def test_an_owner_forked_for_a_later_request_keeps_its_records_in_order() -> None:
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(5, 2)), np.arange(5.0)
    owner = Owner("owner-1", "m.a", X, y)
    owner.add_records(X[:2] + 10, np.array([7.0, 8.0]))  # pending: not yet hashed
    owner.retire(np.array([False, True, False, False, False, False, True]))
    fresh = owner.fork("m.b", None, 0.5)
    assert fresh.run == "m.b" and fresh.state == "new" and fresh.name == "owner-1"
    np.testing.assert_array_equal(fresh.records(), owner.records())
    assert fresh.n_records == 7
    np.testing.assert_array_equal(fresh._store.y, [0, 1, 2, 3, 4, 7, 8])
    np.testing.assert_array_equal(fresh._retired, owner._retired)


def test_validate_checks_every_requests_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dpmarket.actors.commands.main import main

    path = _config(tmp_path, TWO)
    assert main(["validate", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "request alice:" in printed and "request bob:" in printed
    assert str(tmp_path / "v2.csv") in printed


def test_budget_lists_a_requests_own_consumer_store_by_its_file(tmp_path: Path) -> None:
    from dpmarket.actors.budgets.store import LedgerStore
    from dpmarket.actors.commands.budget import budget_summary
    from dpmarket.protocol.privacy.filter import RenyiFilter
    from dpmarket.protocol.privacy.ledger import MechanismEvent

    for file, sigma in (("consumer.sqlite", 2.0), ("consumer-bob.sqlite", 4.0)):
        store = LedgerStore(tmp_path / file, "consumer", RenyiFilter(9.0, 1e-5))
        store.begin_run("r")
        store.charge("r:validation", "r", MechanismEvent("gaussian", (("sigma", sigma),), 1.0))
        store.close()
    owners = budget_summary(tmp_path)["owners"]
    assert set(owners) == {"consumer", "consumer-bob"}
    assert owners["consumer"]["spent"] > owners["consumer-bob"]["spent"] > 0


def test_a_bad_request_exits_2_naming_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dpmarket.actors.commands.main import main

    path = _config(tmp_path, '[[requests]]\nname = "a"\nvalidation = "v1.csv"\n' * 2)
    assert main(["run", str(path)]) == 2
    assert (
        f"{path}: [[requests]] #2 (a).name: two requests are named 'a'" in capsys.readouterr().err
    )


def test_a_request_budget_with_blocks_is_refused_naming_the_request(tmp_path: Path) -> None:
    """A request's own max_points selects allocate-select for that request (its histogram reads
    every record), so with block budgets it is refused like the market's [summary] is."""
    head = HEAD.replace("owner_budget = 2.0\n", "owner_budget = 2.0\nblock_records = 50\n")
    alice = '\n[[requests]]\nname = "alice"\nvalidation = "v1.csv"\n'
    budget = alice + "summary = {max_points = 12}\n"
    with pytest.raises(ConfigError, match=r"\[\[requests\]\] \(alice\)\.summary: allocate-select"):
        load_market_config(_config(tmp_path, budget, head))
    kept = alice + "summary = {max_points = 12, allocate = false}\n"
    config = load_market_config(_config(tmp_path, kept, head))
    params = config.for_request(config.requests[0]).curator_params(gamma=1.0, m=2)
    assert not params.allocate and params.max_points == 12  # herding-select under the budget
    assert load_market_config(_config(tmp_path, alice, head)).requests[0].name == "alice"

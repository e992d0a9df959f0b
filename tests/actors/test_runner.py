"""Placement of owners in actor processes and the market config keys that control it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpmarket.actors.config.market import ConfigError, FaultConfig, load_market_config
from dpmarket.actors.config.placement import Placement
from dpmarket.actors.parties.faults import fault_verdicts
from dpmarket.actors.parties.refresh import PoolRefresher
from dpmarket.actors.parties.transport import FaultPlan
from dpmarket.actors.run.spawn import owner_groups
from dpmarket.protocol.securesum.spec import RoundResult

NAMES = [f"owner-{i}" for i in range(1, 8)]


def test_owners_are_chunked_faulty_owners_stand_alone_and_groups_share_a_placement() -> None:
    assert owner_groups(NAMES, 1, FaultPlan(), {}) == [[n] for n in NAMES]
    assert owner_groups(NAMES, 3, FaultPlan(), {}) == [NAMES[0:3], NAMES[3:6], NAMES[6:]]
    faults = FaultPlan(kill_at={"owner-2": 4}, delay={"owner-5": 1.0})
    site_b, site_c = Placement((("site_b", 1.0),)), Placement(node_labels=(("site", "c"),))
    placement = {"owner-7": site_b, "owner-3": site_b, "owner-4": site_c, "owner-2": site_b}
    groups = owner_groups(NAMES, 4, faults, placement)
    assert groups[:2] == [["owner-2"], ["owner-5"]]
    assert groups[2:] == [["owner-1", "owner-6"], ["owner-3", "owner-7"], ["owner-4"]]
    assert sorted(n for g in groups for n in g) == sorted(NAMES)  # everybody exactly once
    for group in groups:  # an actor runs on one node: its owners share a placement
        assert len({placement.get(n) for n in group}) == 1


def test_owners_per_actor_must_be_positive() -> None:
    with pytest.raises(ValueError, match="owners_per_actor"):
        owner_groups(NAMES, 0, FaultPlan(), {})


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[market]\nowners_per_actor = 0\n", "[market].owners_per_actor"),
        ("[privacy]\nstandardize = 'yes'\n", "[privacy].standardize"),
        ("[privacy]\nrefresh_every = -1\n", "[privacy].refresh_every"),
        ("[privacy]\neps_refresh = 0\n", "[privacy].eps_refresh"),
        ("[summary]\ncenter = [0.0]\n", "center"),
        ("[market]\ndca_shares = 'seeds'\n", "[market].dca_shares"),
    ],
)
def test_market_config_refuses_bad_placement_and_standardisation_keys(
    tmp_path: Path, text: str, needle: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        load_market_config(path)


def test_market_config_defaults_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "ok.toml"
    path.write_text("[market]\nowners = 4\n")
    config = load_market_config(path)
    assert config.owners_per_actor == 1 and config.secure["standardize"] is True
    assert config.dca_shares == "derived"
    overrides = ["market.owners_per_actor=2", "privacy.standardize=false"]
    config = load_market_config(path, [*overrides, "market.dca_shares=sealed-seeds"])
    assert config.owners_per_actor == 2 and config.secure["standardize"] is False
    assert config.dca_shares == "sealed-seeds"


def test_fault_verdicts_say_what_was_tolerated_and_what_never_triggered() -> None:
    faults = FaultConfig(
        kill={"owner-1": 4, "owner-3": 99},
        slow={"owner-2": 3.0},
        colluders=("owner-5",),
        kill_curator_at=7,
    )
    payload = {"lost": {"owner-1": 4, "owner-2": 1}, "curator_restarts": 0}
    verdicts = {(v["party"], v["verdict"]) for v in fault_verdicts(faults, payload, 3)}
    assert verdicts == {
        ("owner-5", "tolerated"),
        ("owner-1", "tolerated"),
        ("owner-3", "not triggered"),
        ("owner-2", "tolerated"),
        ("curator", "not triggered"),
    }
    assert all(v["t_used"] == "3 of T = 3" for v in fault_verdicts(faults, payload, 3))


def test_a_killed_actor_stays_among_its_co_located_owners_and_every_owner_lost_counts() -> None:
    """issue 29 part 3: ``kill_actor`` keeps the owner in its group (the process dies with all
    of them); the verdict names every owner its process hosted and T counts owners."""
    faults = FaultPlan(kill_at={"owner-7": 2}, kill_actor_at={"owner-2": 3})
    assert owner_groups(NAMES, 3, faults, {}) == [["owner-7"], NAMES[0:3], NAMES[3:6]]
    assert faults.is_dead("owner-2", 3) and not faults.is_dead("owner-2", 2)
    assert not faults.is_dead("owner-1", 3)  # in one process only the named owner dies
    config = FaultConfig(kill_actor={"owner-2": 3, "owner-5": 9})
    payload = {"lost": {"owner-1": 3, "owner-2": 3, "owner-3": 3}}
    hosts = {"owner-2": NAMES[0:3], "owner-5": NAMES[3:6]}
    hit, missed = fault_verdicts(config, payload, 5, hosts)
    assert hit["party"] == "owner-2" and hit["verdict"] == "tolerated"
    assert hit["owners_lost"] == ["owner-1", "owner-2", "owner-3"]
    assert "3 lost at epoch 3" in hit["detail"] and hit["t_used"] == "3 of T = 5"
    assert missed["verdict"] == "not triggered" and missed["owners_lost"] == []


@pytest.mark.parametrize(
    ("faults", "needle"),
    [
        ("kill_actor = { owner-9 = 3 }", r"\[faults\].kill_actor: unknown owners \['owner-9'\]"),
        ("kill_actor = { owner-1 = 0 }", r"\[faults\].kill_actor.owner-1"),
        ("kill_actor = [1]", r"\[faults\].kill_actor: expected a table"),
        (
            "kill = { owner-1 = 3 }\nkill_actor = { owner-1 = 3 }",
            r"\[faults\].kill_actor: \['owner-1'\] also killed or slow alone",
        ),
    ],
)
def test_kill_actor_is_checked_when_the_config_is_read(
    tmp_path: Path, faults: str, needle: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f"[market]\nowners = 4\n[faults]\n{faults}\n")
    with pytest.raises(ConfigError, match=needle):
        load_market_config(path)
    path.write_text("[market]\nowners = 4\n[faults]\nkill_actor = { owner-2 = 4 }\n")
    assert load_market_config(path).faults.kill_actor == {"owner-2": 4}


def _scan(value: object) -> RoundResult:
    return RoundResult(
        round=2,
        status="released" if value is not None else "insufficient",
        reason="",
        value=value,  # type: ignore[arg-type]
        ring_total=None,
        included=("owner-1", "owner-2"),
        missing=("owner-3",),
        sigma_std=1.0,
        sensitivity=1.0,
    )


def test_refresh_deltas_start_where_a_released_contribution_ended() -> None:
    plan = {"refresh_every": 4}
    released = PoolRefresher(None, plan, None, _scan(np.zeros(4)), None, None)  # type: ignore[arg-type]
    assert released.base == {"owner-1": 2, "owner-2": 2}  # owner-3 was missing: from record 0
    # a scan that released nothing leaves every record for the first delta
    assert PoolRefresher(None, plan, None, _scan(None), None, None).base == {}  # type: ignore[arg-type]
    assert [released.due(e) for e in (1, 3, 4, 5, 7, 8)] == [False, False, True, False, False, True]

"""protocol/summary/counts.py: which mechanisms let the other owners learn a record count, from
the curator's public parameters (issue 36, item 4). The runs behind each rule are in
tests/actors/test_report_counts.py."""

from __future__ import annotations

import dataclasses

import pytest

from dpmarket.protocol.summary.allocate import plan_allocation
from dpmarket.protocol.summary.counts import (
    COUNT_REVEALING_MECHANISMS,
    count_exposure,
    mechanism_of,
    most_epochs,
)
from dpmarket.protocol.summary.params import MARKET_MECHANISMS, CuratorParams
from dpmarket.protocol.summary.plan import plan_releases
from dpmarket.protocol.summary.random_select import plan_random_select

P, K = 8, 4


def _herding() -> CuratorParams:
    plan = plan_releases(P, 40, K, select=True)
    return dataclasses.replace(CuratorParams(p=P, gamma=1.0, h1_seed=1), **plan.overrides())


def _by_mechanism() -> dict[str, CuratorParams]:
    herding = _herding()
    return {
        "herding-select": herding,
        "allocate-select": dataclasses.replace(herding, **plan_allocation(1.0, 1e-5, P)),
        "random-select": dataclasses.replace(herding, **plan_random_select(P, (K + 1) * P)),
    }


def test_mechanism_of_names_every_market_mechanism_as_the_report_does() -> None:
    by_mechanism = _by_mechanism()
    assert set(by_mechanism) == set(MARKET_MECHANISMS)
    for name, params in by_mechanism.items():
        assert mechanism_of(params) == params.mechanism == name
    assert COUNT_REVEALING_MECHANISMS.issubset(MARKET_MECHANISMS)


def test_random_and_allocate_select_reveal_whatever_the_count() -> None:
    for name, params in _by_mechanism().items():
        revealing = name in COUNT_REVEALING_MECHANISMS
        for records in (0, 10, 10**6) if revealing else (10**6,):
            exposure = count_exposure(params, K, records)
            assert bool(exposure) == revealing, (name, records)
            assert not exposure or exposure.startswith(f"{name}: ")


def test_herding_select_reveals_only_a_count_that_can_run_out() -> None:
    params = _herding()
    most = most_epochs(params, K)
    assert most == params.explore_epochs(K) + params.epoch_limit and params.max_deliveries == 1
    assert count_exposure(params, K, most) == ""
    assert f"can run out within the {most} epochs" in count_exposure(params, K, most - 1)
    twice = dataclasses.replace(params, max_deliveries=2)
    assert count_exposure(twice, K, (most + 1) // 2) == ""  # each record sold twice
    budget = dataclasses.replace(twice, max_points=3 * P)
    assert "max_deliveries = 2 under max_points" in count_exposure(budget, K, 10**6)
    assert count_exposure(dataclasses.replace(budget, max_deliveries=1), K, 10**6) == ""


def test_a_mechanism_no_market_selects_is_not_vouched_for() -> None:
    params = CuratorParams(p=P, gamma=1.0, h1_seed=1, final_selection="exact")
    assert mechanism_of(params) == "mwem-select" and "mwem-select" not in MARKET_MECHANISMS
    assert "not a market mechanism" in count_exposure(params, K, 10**6)


def test_impossible_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="owners must be >= 1"):
        most_epochs(_herding(), 0)
    with pytest.raises(ValueError, match="records must be >= 0"):
        count_exposure(_herding(), K, -1)

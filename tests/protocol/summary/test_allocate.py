"""allocate-select (issue 18): the profile's noise scale and sensitivity, the allocation, and
which party each release is charged to."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpmarket.actors.parties.transport import LoopbackTransport
from dpmarket.protocol.summary.allocate import plan_allocation, quotas
from dpmarket.protocol.summary.allocate_mixture import (
    ProfileFrame,
    mixing_weights,
    owner_profile,
    profile_frame,
    profile_scale,
)
from dpmarket.protocol.summary.curator import Curator
from dpmarket.protocol.summary.messages import EpochBody
from dpmarket.protocol.summary.owner import Owner
from dpmarket.protocol.wire.errors import LocalProtocolError, RemoteProtocolError
from dpmarket.streams.synthetic import Scenario
from tests.small import run_small, small_curator, small_params, small_scenario

RUN = "allocate-run"


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return small_scenario(7)


def _frame(d: int = 12, k: int = 3, radius: float = 0.5) -> ProfileFrame:
    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.normal(size=(d, k)))[0].T
    return ProfileFrame(basis, rng.normal(size=d) * 0.1, radius)


def test_profile_noise_has_the_stated_scale() -> None:
    frame = _frame()
    HT = np.random.default_rng(1).normal(size=(12, 40)) * 0.05  # norms well inside the radius
    exact = frame.basis @ (HT - frame.center[:, None]).mean(axis=1)
    z, rng = 2.0, np.random.default_rng(2)
    draws = np.array([owner_profile(HT, frame, z, rng) for _ in range(4000)]) - exact
    expected = z * 2 * frame.radius / 40  # z * (replace-one sensitivity 2 r / n)
    assert profile_scale(z, frame.radius, 40) == pytest.approx(expected)
    # 12,000 coordinates: the sample sd is within 3% of sigma; a scale off by two is far outside
    assert np.std(draws) == pytest.approx(expected, rel=0.03)
    assert abs(np.mean(draws)) < 0.05 * expected


def test_replacing_one_record_moves_the_clipped_mean_by_at_most_two_radii_over_n() -> None:
    frame = _frame(radius=0.3)
    rng = np.random.default_rng(3)
    HT = rng.normal(size=(12, 25))
    zero = np.random.default_rng(0)  # noise of scale 1e-12: compares the means alone

    def mean(H: np.ndarray) -> np.ndarray:
        return owner_profile(H, frame, 1e-12 / (2 * frame.radius / 25), zero)

    worst = 0.0
    for _ in range(200):
        other = HT.copy()
        other[:, rng.integers(25)] = rng.normal(size=12) * 50  # an extreme replacement
        worst = max(worst, float(np.linalg.norm(mean(HT) - mean(other))))
    assert worst <= 2 * frame.radius / 25 + 1e-9
    assert worst > 1.5 * frame.radius / 25  # the bound is reached nearly: the clip is real


def test_profile_frame_is_orthonormal_and_public(scenario: Scenario) -> None:
    H_seed = np.random.default_rng(4).normal(size=(20, 16)) / 4
    g = np.random.default_rng(5).normal(size=16) / 4
    frame = profile_frame(g, H_seed, 6)
    assert frame.basis.shape == (6, 16) and frame.radius > 0
    np.testing.assert_allclose(frame.basis @ frame.basis.T, np.eye(6), atol=1e-9)
    again = profile_frame(g, H_seed, 6)  # a function of public values only
    np.testing.assert_array_equal(again.basis, frame.basis)


def test_mixing_weights_recover_a_mixture_and_quotas_split_the_budget() -> None:
    rng = np.random.default_rng(6)
    profiles = {f"o{i}": rng.normal(size=10) for i in range(4)}
    target = 0.7 * profiles["o1"] + 0.3 * profiles["o3"]
    w = mixing_weights(profiles, target)
    assert w == pytest.approx({"o0": 0.0, "o1": 0.7, "o2": 0.0, "o3": 0.3}, abs=1e-3)
    q = quotas(w, 75)
    assert sum(q.values()) == 75 and q["o1"] in (52, 53) and q["o0"] == 0
    capped = quotas(w, 75, caps={"o0": 100, "o1": 40, "o2": 100, "o3": 100})
    assert capped["o1"] == 40 and sum(capped.values()) == 75  # the excess goes to o3
    assert capped["o3"] == 35
    assert sum(quotas(w, 75, caps=dict.fromkeys(w, 10)).values()) == 40  # all caps bind


def _allocate_run(
    scenario: Scenario, seed: int, rule: str = "histogram"
) -> tuple[Curator, list[Owner]]:
    base = small_params(
        scenario, summary_release="herding", validation_release="gaussian", tau=1,
        auction_variant="pure", eps_auction=1e-6, max_deliveries=1, final_selection="exact",
    )  # fmt: skip
    params = dataclasses.replace(base, **plan_allocation(0.8, 1e-5, base.p, 15, rule))
    curator = small_curator(RUN, scenario, params, seed)
    return curator, run_small(RUN, scenario, curator, seed)


@pytest.mark.parametrize("rule", ["histogram", "mixture"])
def test_each_owner_is_charged_its_own_profile_once_and_nothing_else(
    scenario: Scenario, rule: str
) -> None:
    curator, _ = _allocate_run(scenario, 0, rule)
    assert curator.params.allocation_rule == rule
    z = curator.params.allocation_sigma
    for owner in scenario.owner_names:
        events = curator.ledgers[owner].events
        assert len(events) == 1, events  # no auction step, no summary release
        (event,) = events
        assert event.mechanism == "gaussian" and event.count == 1
        assert dict(event.parameters)["sigma"] == pytest.approx(z) and event.sensitivity == 1.0
        what = "score histogram" if rule == "histogram" else "allocation profile"
        assert what in event.label and "replace" in event.neighbouring
        assert curator.ledgers[owner].epsilon(1e-5) == pytest.approx(0.8, rel=1e-3)
    validation = curator.ledgers["validation"].events
    assert [e.mechanism for e in validation] == ["gaussian"]  # g_tilde only
    assert "allocation" not in validation[0].label  # the profiles are the owners' releases


def test_what_an_owner_receives_depends_on_its_own_deliveries_only(scenario: Scenario) -> None:
    curator, _ = _allocate_run(scenario, 1)
    assert curator.quotas is not None
    for owner in scenario.owner_names:
        g, q = curator._own_direction(owner, curator.epoch.number + 1)
        mine = [e.hashed for e in curator.pool.entries if e.owner == owner]
        assert q == len(mine)
        if mine:
            np.testing.assert_allclose(g, np.mean(mine, axis=0), atol=1e-6)
        assert q <= curator.quotas[owner]


def test_an_owner_without_a_noise_generator_refuses_to_release_a_profile(
    scenario: Scenario,
) -> None:
    X, y = scenario.owners[0]
    owner = Owner("owner-1", RUN, X, y)  # no rng: it cannot draw secret noise
    frame = _frame(d=16, k=2)
    body = EpochBody(np.zeros(16), 0, profile_sigma=1.0, profile_clip=0.5,
                     profile_basis=frame.basis.ravel(), profile_center=frame.center)  # fmt: skip
    with pytest.raises(LocalProtocolError, match="no noise generator"):
        owner._release_profile(body)


@pytest.mark.parametrize("floor,asked", [(None, 1.0), (2.0, 1.0), (2.0, 0.0)])
def test_an_owner_refuses_a_profile_below_the_operators_floor(
    scenario: Scenario, floor: float | None, asked: float
) -> None:
    """Adversary view: a curator (or relay) asking for a profile with less noise than the
    operator fixed at the owner's construction, or for one never planned, gets nothing; the
    owner's generator is not touched."""
    X, y = scenario.owners[0]
    rng = np.random.default_rng(3)
    owner = Owner("owner-1", RUN, X, y, rng=rng, profile_floor=floor)
    frame = _frame(d=16, k=2)
    body = EpochBody(np.zeros(16), 0, profile_sigma=asked, profile_clip=0.5,
                     profile_basis=frame.basis.ravel(), profile_center=frame.center)  # fmt: skip
    state = rng.bit_generator.state
    with pytest.raises(RemoteProtocolError, match="below the operator's floor"):
        owner._release_profile(body)
    assert owner._profile is None and rng.bit_generator.state == state


@pytest.mark.parametrize("rule", ["histogram", "mixture"])
def test_a_curious_owner_sees_another_owner_only_through_its_profile(
    scenario: Scenario, rule: str
) -> None:
    """Adversary view: owner A records every frame it receives. Owner B's records change
    while B's released profile is held fixed; A's frames and ledger stay byte-identical."""
    from dpmarket.actors.parties.transport import FaultPlan
    from dpmarket.protocol.wire.codec import Message, encode

    base = small_params(
        scenario, summary_release="herding", validation_release="gaussian", tau=1,
        auction_variant="pure", eps_auction=1e-6, max_deliveries=1, final_selection="exact",
    )  # fmt: skip
    params = dataclasses.replace(base, **plan_allocation(1.0, 1e-5, base.p, 15, rule))
    a, b = scenario.owner_names[3], scenario.owner_names[1]
    fixed: tuple[np.ndarray, int] | None = None
    views = []
    for variant in range(2):
        owners = []
        for i, (n, (X, y)) in enumerate(zip(scenario.owner_names, scenario.owners, strict=True)):
            if n == b and variant:  # B now holds another distribution's records
                X, y = scenario.owners[2][0] + 0.5, scenario.owners[2][1]
            rng = np.random.default_rng([5, i])
            owners.append(Owner(n, RUN, X, y, rng=rng, profile_floor=params.profile_floor))
        if fixed is not None:  # B's release (profile and count), as published in the first run
            owners[1]._profile, owners[1]._profile_records = fixed[0].copy(), fixed[1]
        seen: list[Message] = []

        def record(msg: Message, seen: list[Message] = seen) -> bool:
            if msg.recipient == a:
                seen.append(msg)
            return False

        curator = small_curator(RUN, scenario, params, 4)
        transport = LoopbackTransport([curator, *owners], faults=FaultPlan(drop=record))
        transport.send(curator.start())
        transport.run_until(lambda curator=curator: curator.done)
        assert owners[1]._profile is not None
        fixed = (owners[1]._profile, owners[1]._profile_records)
        assert curator.quotas is not None and curator.quotas[a] > 0 and curator.quotas[b] > 0
        b_points = sorted(e.token for e in curator.pool.entries if e.owner == b)
        views.append(([encode(m) for m in seen], curator.ledgers[a].to_dict(), b_points))
    assert views[0][0] == views[1][0] and views[0][1] == views[1][1]
    assert views[0][2] != views[1][2]  # B did sell different points

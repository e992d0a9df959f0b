"""Tests for dpmarket.protocol.summary.auction: PRIVAUCTION's ask rule, winner choice, parsimony
count."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from dpmarket.protocol.summary.auction import (
    AuctionBid,
    TransferCounter,
    ask_probabilities,
    choose_winner,
    expected_asks,
    run_auction,
)

NAMES = [f"owner-{i}" for i in range(1, 7)]


def make_bids(values: list[float], times: list[int] | None = None) -> list[AuctionBid]:
    times = times or [1] * len(values)
    return [
        AuctionBid(owner=name, token=i, bid=v, times_bid=t)
        for i, (name, v, t) in enumerate(zip(NAMES, values, times, strict=False))
    ]


def ask_frequencies(variant: str, eps: float, runs: int, seed: int) -> np.ndarray[Any, Any]:
    """Fraction of runs in which each rank was asked (bids in fixed decreasing order)."""
    rng = np.random.default_rng(seed)
    bids = make_bids([6.0, 5.0, 4.0, 3.0, 2.0, 1.0])
    hits = np.zeros(len(bids))
    for _ in range(runs):
        decision = run_auction(bids, eps, tau=10**6, rng=rng, variant=variant)
        assert decision.ranking == tuple(NAMES)
        hits += [name in decision.asked for name in decision.ranking]
    return hits / runs


@pytest.mark.parametrize("variant", ["paper", "pure"])
def test_ask_frequencies_match_formula(variant: str) -> None:
    eps, runs = 0.5, 4000
    freq = ask_frequencies(variant, eps, runs, seed=11)
    scale = 1.0 if variant == "paper" else 1.0 / (1.0 + math.exp(-eps))
    expected = scale * np.exp(-eps * np.arange(6))
    stderr = np.sqrt(np.maximum(expected * (1 - expected), 1e-4) / runs)
    assert np.all(np.abs(freq - expected) < 5 * stderr)
    # Power: an eps off by a factor of two would leave the 5-sigma band at some rank.
    for wrong_eps in (eps / 2, eps * 2):
        wrong = scale * np.exp(-wrong_eps * np.arange(6))
        assert np.any(np.abs(freq - wrong) > 5 * stderr)


def test_paper_variant_always_asks_rank_one() -> None:
    rng = np.random.default_rng(3)
    for _ in range(500):
        values = rng.normal(size=6).tolist()
        decision = run_auction(make_bids(values), 3.0, tau=100, rng=rng)
        assert decision.asked[0] == decision.ranking[0]
        assert decision.probabilities[0] == 1.0


@pytest.mark.parametrize("eps", [0.05, 0.7, 3.0])
def test_pure_variant_likelihood_ratios_bounded(eps: float) -> None:
    decision = run_auction(make_bids([6, 5, 4, 3, 2, 1]), eps, 5, np.random.default_rng(0), "pure")
    p = np.array(decision.probabilities)
    bound = math.exp(eps) * (1 + 1e-12)
    for asked_r, asked_next in ((p[:-1], p[1:]), (1 - p[1:], 1 - p[:-1])):
        assert np.all(asked_r / asked_next <= bound)
        assert np.all(asked_next / asked_r <= bound)
    # The bound is tight: "not asked" at rank 2 vs rank 1 is exactly e^eps.
    assert (1 - p[1]) / (1 - p[0]) == pytest.approx(math.exp(eps), rel=1e-12)


def test_paper_variant_is_not_pure_dp() -> None:
    p = ask_probabilities(6, 0.5, "paper")
    assert 1 - p[0] == 0.0 and 1 - p[1] == pytest.approx(1 - math.exp(-0.5))


def test_tau_rule_forces_asks() -> None:
    bids = make_bids([6, 5, 4, 3, 2, 1], times=[1, 1, 1, 1, 4, 3])
    for seed in range(50):
        decision = run_auction(bids, 30.0, tau=3, rng=np.random.default_rng(seed))
        # eps = 30 makes a coin-ask below rank 1 essentially impossible (p <= e^-30).
        assert decision.forced == ("owner-5", "owner-6")
        assert decision.asked == ("owner-1", "owner-5", "owner-6")
    unforced = run_auction(bids, 30.0, tau=5, rng=np.random.default_rng(0))
    assert unforced.forced == () and unforced.asked == ("owner-1",)


def test_same_seed_same_decision() -> None:
    bids = make_bids([0.3, 0.1, 0.9, 0.5, 0.2, 0.4])
    decisions = [run_auction(bids, 0.4, 3, np.random.default_rng(42), "pure") for _ in range(2)]
    assert decisions[0] == decisions[1]
    others = {run_auction(bids, 0.4, 3, np.random.default_rng(s), "pure").asked for s in range(30)}
    assert len(others) > 1


def test_rng_draws_one_uniform_per_bidder() -> None:
    rng, twin = np.random.default_rng(9), np.random.default_rng(9)
    run_auction(make_bids([1, 2, 3]), 0.5, 2, rng)
    twin.random(3)
    assert rng.random() == twin.random()


def test_ties_are_broken_by_owner_name() -> None:
    bids = [
        AuctionBid("carol", 0, 1.0, 1),
        AuctionBid("alice", 1, 1.0, 1),
        AuctionBid("bob", 2, 2.0, 1),
    ]
    for order in (bids, bids[::-1]):
        decision = run_auction(order, 1.0, 2, np.random.default_rng(0))
        assert decision.ranking == ("bob", "alice", "carol")


def test_empty_auction() -> None:
    decision = run_auction([], 1.0, 1, np.random.default_rng(0))
    assert decision.ranking == decision.asked == decision.forced == ()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"eps_auc": 0.0}, "eps_auc"),
        ({"eps_auc": -1.0}, "eps_auc"),
        ({"eps_auc": float("nan")}, "eps_auc"),
        ({"tau": 0}, "tau"),
        ({"tau": 1.5}, "tau"),
        ({"variant": "exp"}, "variant"),
    ],
)
def test_bad_arguments_raise(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"eps_auc": 1.0, "tau": 2, "variant": "paper"} | kwargs
    with pytest.raises(ValueError, match=match):
        run_auction(make_bids([1, 2]), rng=np.random.default_rng(0), **args)


def test_duplicate_owner_and_bad_bids_raise() -> None:
    dup = [AuctionBid("a", 0, 1.0, 1), AuctionBid("a", 1, 2.0, 1)]
    with pytest.raises(ValueError, match="distinct owners"):
        run_auction(dup, 1.0, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="owner"):
        AuctionBid("", 0, 1.0, 1)
    with pytest.raises(ValueError, match="bid"):
        AuctionBid("a", 0, float("inf"), 1)
    with pytest.raises(ValueError, match="times_bid"):
        AuctionBid("a", 0, 1.0, 0)


def test_choose_winner() -> None:
    assert choose_winner({}) is None
    assert choose_winner({"b": 0.5, "a": 0.2, "c": 0.1}) == "b"
    assert choose_winner({"c": 0.5, "a": 0.5, "b": 0.1}) == "a"
    with pytest.raises(ValueError, match="finite"):
        choose_winner({"a": float("nan")})


@pytest.mark.parametrize("variant", ["paper", "pure"])
def test_expected_asks_lemma5(variant: str) -> None:
    eps = 0.3
    assert expected_asks(6, eps, variant) == pytest.approx(
        sum(ask_probabilities(6, eps, variant)), rel=1e-12
    )
    assert expected_asks(10_000, eps, "paper") <= 1 / (1 - math.exp(-eps))
    assert expected_asks(0, eps, variant) == 0.0
    rng, runs = np.random.default_rng(17), 3000
    counts = [
        len(run_auction(make_bids([6, 5, 4, 3, 2, 1]), eps, 10**6, rng, variant).asked)
        for _ in range(runs)
    ]
    probs = np.array(ask_probabilities(6, eps, variant))
    stderr = math.sqrt(float(np.sum(probs * (1 - probs))) / runs)
    assert abs(np.mean(counts) - expected_asks(6, eps, variant)) < 5 * stderr


def test_transfer_counter() -> None:
    counter = TransferCounter()
    for owner, token in [("a", 1), ("b", 1), ("a", 1), ("a", 2), ("a", 1)]:
        counter.record(owner, token)
    assert counter.total_transfers == 5
    assert counter.distinct_points == 3
    assert counter.ratio(p=2, m=4) == pytest.approx((3 + 4) / (2 + 4))
    assert TransferCounter().ratio(3, 0) == 0.0
    with pytest.raises(ValueError, match="p \\+ m"):
        counter.ratio(0, 0)
    with pytest.raises(ValueError, match="owner"):
        counter.record("", 1)
    with pytest.raises(ValueError, match="token"):
        counter.record("a", -1)

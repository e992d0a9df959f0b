"""Known colluders count against T in every DCA round (issue 12, part 2).

The setting of ``configs/collusion.toml``: K = 6 owners, T = 3, owner-4 and owner-6 collude and
withhold their noise. The adversary is a curious owner (owner-2) pooling with them: it knows its
own input and noise, the colluders' inputs (they add no noise) and the released sum. What it
cannot remove is the residual: released total minus the exact sum of the included inputs minus
its own noise. Theorem 1 promises that residual variance >= sigma_std^2 for every release.

One round with d = 4000 coordinates gives 4000 independent noise draws per client, so a variance
ratio has standard error sqrt(2/4000) = 2.2%; the 5-SE margins never flake, and a factor-2
error in variance (what two uncounted clients cause here) is 20 standard errors away.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from dpmarket.protocol.securesum.client import Client
from dpmarket.protocol.securesum.driver import DcaSession, RoundOutcome
from dpmarket.protocol.securesum.fixedpoint import to_signed
from dpmarket.protocol.securesum.spec import DcaConfig, RoundSpec
from dpmarket.protocol.wire.errors import LocalProtocolError
from tests.small import small_curator, small_params, small_scenario

D = 4000
SE = math.sqrt(2.0 / D)
OWNERS = tuple(f"owner-{i}" for i in range(1, 7))
COLLUDERS = ("owner-4", "owner-6")
CURIOUS = "owner-2"


def collusion_config(t: int = 3, colluders: tuple[str, ...] = COLLUDERS) -> DcaConfig:
    nodes = ("compute-1", "compute-2", "compute-3")
    return DcaConfig(
        "collusion", OWNERS, nodes, tolerance=t, bound=1.0, frac_bits=24, colluders=colluders
    )


def coalition_session(cfg: DcaConfig) -> DcaSession:
    """Colluders withhold their noise; the curious owner records its own (``reveal``)."""
    behaviour = dict.fromkeys(COLLUDERS, "withhold") | {CURIOUS: "reveal"}
    return DcaSession(cfg, batch=1, behaviour=behaviour)


def noise_left(cfg: DcaConfig, out: RoundOutcome, x: npt.NDArray[np.float64]) -> float:
    """Variance per coordinate (value units) of the noise the coalition cannot subtract."""
    assert out.result.ring_total is not None
    included = [cfg.clients.index(c) for c in out.result.included]
    exact = cfg.codec.to_grid(x[included]).sum(axis=0)
    residual = to_signed(out.result.ring_total) - exact - out.revealed[CURIOUS]
    return float(np.mean((residual * cfg.codec.resolution) ** 2))


@pytest.mark.parametrize("lost", [(), ("owner-1",), ("owner-1", "owner-3")])
def test_every_release_keeps_sigma_squared_against_the_coalition(lost: tuple[str, ...]) -> None:
    """Lost owners plus the two known colluders: release only with >= sigma^2 left, else
    release nothing and charge nothing. Today's code released the two-lost round with
    (6 - 2 - 2 - 1) / (6 - 3 - 1) = 0.5 sigma^2 left."""
    cfg, sigma = collusion_config(), 1.0
    session = coalition_session(cfg)
    x = np.random.default_rng(11).uniform(-1, 1, (len(OWNERS), D))
    out = session.run_round(RoundSpec(1, D, sigma), x, np.random.default_rng(12), absent=lost)
    if len(lost) + len(COLLUDERS) <= cfg.tolerance:
        assert out.result.released and sorted(out.result.missing) == sorted(lost)
        assert noise_left(cfg, out, x) / sigma**2 > 1.0 - 5 * SE
        assert len(session.aggregator.ledger.events) == 1
    else:
        assert out.result.status == "insufficient" and out.result.value is None
        assert out.result.ring_total is None
        assert "2 known colluders (owner-4, owner-6) > T = 3" in out.result.reason
        assert out.kinds["dca.partial"] == 0 and out.kinds["dca.abort"] == 3  # no node helps
        assert session.aggregator.ledger.events == ()


def test_colluders_above_t_refuse_every_round_before_any_share_moves() -> None:
    """`--set market.tolerance=1` with two colluders: no round opens, no owner contributes."""
    cfg = collusion_config(t=1)
    session = coalition_session(cfg)
    x = np.zeros((len(OWNERS), 3))
    for round_ in (1, 2, 3):  # normalise, scan, a refresh
        out = session.run_round(RoundSpec(round_, 3, 1.0), x, np.random.default_rng(round_))
        assert out.result.status == "insufficient" and out.result.value is None
        assert "owner-4, owner-6" in out.result.reason and "> T = 1" in out.result.reason
        assert out.frames == 0  # no dca.open, no dca.shares
    assert session.aggregator.ledger.events == ()
    owner = Client(cfg, "owner-1", {n: node.public_key for n, node in session.nodes.items()})
    owner.start()
    with pytest.raises(ValueError, match="unsafe session"):
        owner.contribute(RoundSpec(4, 3, 1.0), np.zeros((1, 3)), np.random.default_rng(0))


def test_cancelled_round_releases_nothing_even_when_every_partial_arrives() -> None:
    """A curator refusal cancels a refresh in flight: the partials come too late."""
    cfg = collusion_config()
    session = coalition_session(cfg)
    spec = RoundSpec(1, 4, 1.0)
    rng = np.random.default_rng(3)
    session.deliver(session.aggregator.open_round(spec, deadline=1.0))
    shares = [m for c in session.clients for m in c.contribute(spec, np.zeros((1, 4)), rng)]
    session.aggregator.cancel("the run was refused")
    result = session.aggregator.result(1)
    assert result is not None and result.status == "cancelled" and result.value is None
    session.deliver(shares)  # nodes agree and send their partials: all late
    assert session.aggregator.late_frames == 3
    assert session.aggregator.result(1) == result
    assert session.aggregator.ledger.events == ()


def test_colluders_must_be_roster_clients() -> None:
    with pytest.raises(ValueError, match="not clients of the roster"):
        collusion_config(colluders=("owner-9",))
    with pytest.raises(ValueError, match="colluders must be distinct"):
        collusion_config(colluders=("owner-4", "owner-4"))


def test_curator_refused_by_a_secure_round_stops_before_any_release() -> None:
    """Refused before start (normalise or scan short of T): no message, no release, and the
    journaled refusal cannot be resumed into a run that never published g_tilde."""
    scenario = small_scenario(1)
    curator = small_curator("r", scenario, small_params(scenario, max_lost=1), seed=2)
    reason = "0 clients missing (none) + 2 known colluders (owner-4, owner-6) > T = 1"
    assert curator.refuse_round("secure sum: normalise", reason, []) == []
    assert curator.state == "refused" and "owner-4, owner-6" in curator.reason
    assert curator.refusal["before_start"] is True
    assert all(not ledger.events for ledger in curator.ledgers.values())
    with pytest.raises(LocalProtocolError, match="refused before the summarisation"):
        curator.resume()
    with pytest.raises(LocalProtocolError):
        curator.start()

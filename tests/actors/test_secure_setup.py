"""The secure sums' set-up stops a purchase before any release (review of issue 38): a compute
node that gave its key but fails its part of the set-up (the roster attestation, the relayed
registrations) is missing, and owners a node refused to register count against T; the stop
writes a journal snapshot, and running the same command again keeps the purchase's ledger run,
so the consumer's validation plan is charged once.

The curator actor's own class runs in this process (its ``secure_phases``, journal and
refusal), with the real DcaHub, compute-node parties, clients and codec; only Ray is replaced
by fake handles whose calls are coroutines (as in test_refresh.py).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dpmarket.actors.budgets.reading import read_store
from dpmarket.actors.config.journaled import same_unreleased_start
from dpmarket.actors.config.market import load_market_config
from dpmarket.actors.parties.curator import CuratorActor
from dpmarket.actors.parties.dca import DcaHub
from dpmarket.actors.randomness import NoiseSource
from dpmarket.actors.run.budgets import consumer_refusal, ledger_run_id
from dpmarket.actors.run.stopped import stopped_report
from dpmarket.protocol.privacy.ledger import ADD_REMOVE, PrivacyLedger
from dpmarket.protocol.securesum.client import Client
from dpmarket.protocol.securesum.node import ComputeNode
from dpmarket.protocol.securesum.plan import SecureSumPlan
from dpmarket.protocol.securesum.sealing import generate_keypair
from dpmarket.protocol.securesum.spec import DcaConfig
from dpmarket.protocol.wire.codec import ReplayGuard, decode, encode
from dpmarket.protocol.wire.errors import RemoteProtocolError
from tests.actors.test_journaled_config import _journal
from tests.actors.test_owner_budget import _config
from tests.small import small_params, small_scenario

OWNERS = ("owner-1", "owner-2", "owner-3", "owner-4")
NODES = ("node-1", "node-2", "node-3")
K = 2


def _remote(fn: Any) -> SimpleNamespace:
    return SimpleNamespace(remote=lambda *a: asyncio.ensure_future(fn(*a)))


class _Node:
    """A compute-node handle as actors/parties/compute.py: a refused frame is logged, not
    raised. ``fails``: the call that raises (a node that gave its key, then failed)."""

    def __init__(
        self, config: DcaConfig, name: str, pinned: dict[str, bytes], fails: str = ""
    ) -> None:
        self.node, self.fails = ComputeNode(config, name, client_keys=pinned), fails
        self.guard = ReplayGuard()
        self.public_key = _remote(self._public_key)
        self.handle = _remote(self._handle)
        self.tick = _remote(self._tick)
        self.attest = _remote(self._attest)

    def _maybe_fail(self, call: str) -> None:
        if call == self.fails:
            raise RuntimeError(f"{self.node.name}: {call} failed")

    async def _public_key(self) -> bytes:
        return bytes(self.node.public_key)

    async def _attest(self) -> dict[str, Any]:
        self._maybe_fail("attest")
        return self.node.attest(True)

    async def _handle(self, frames: list[bytes]) -> list[bytes]:
        self._maybe_fail("handle")
        out: list[bytes] = []
        for frame in frames:
            try:
                out.extend(encode(m) for m in self.node.receive(decode(frame, self.guard)))
            except RemoteProtocolError:
                continue
        return out

    async def _tick(self, now: float) -> list[bytes]:
        return [encode(m) for m in self.node.expire(now)]


class _Owner:
    """An owner handle: sets up its client; a contribution asked is recorded (and fails)."""

    def __init__(self, asked: list[str]) -> None:
        self.asked, self.client = asked, None
        self.dca_setup = _remote(self._setup)
        self.dca_roster = _remote(self._roster)
        self.dca_contribute = _remote(self._contribute)

    async def _setup(self, owner: str, config: DcaConfig, keys: dict[str, bytes]) -> list[bytes]:
        self.client = Client(config, f"client:{owner}", keys, (owner,))
        return [encode(m) for m in self.client.start()]

    async def _roster(self, owner: str, attestations: dict[str, Any]) -> int:
        return len(attestations)

    async def _contribute(self, owner: str, *args: Any) -> list[bytes]:
        self.asked.append(owner)
        raise RuntimeError("no round may open in these tests")


def _session(
    refused: tuple[str, ...] = (), fails: dict[str, str] | None = None
) -> tuple[dict[str, Any], dict[str, _Owner], list[str]]:
    """T = 1 over four owners and three nodes; node-1 pins a key nobody holds for each owner
    in ``refused`` (their registrations are refused there); ``fails``: node -> failing call."""
    config = DcaConfig("run-dca", OWNERS, NODES, tolerance=1, bound=10.0, frac_bits=24)
    plan = SecureSumPlan.calibrated(
        config,
        1e-5,
        {"normalise": ("moments", 2 * K + 1, 1.0, 1.0, 1, {"bound": 10.0})},
        neighbouring=ADD_REMOVE,
    )
    pinned = {o: generate_keypair()[1] for o in refused}
    nodes = {
        n: _Node(config, n, pinned if n == "node-1" else {}, (fails or {}).get(n, ""))
        for n in NODES
    }
    asked: list[str] = []
    owners = {o: _Owner(asked) for o in OWNERS}
    secure = {"config": config, "rounds": plan, "n_features": K, "timeout": 5.0, "sketch": {}}
    return {"nodes": nodes, "owners": owners, "plan": secure}, owners, asked


def _curator(journal: Path | None = None) -> Any:
    """The curator actor's own class, in this process, journaling to ``journal``."""
    scenario = small_scenario(5)
    actor = CuratorActor.__ray_metadata__.modified_class  # type: ignore[attr-defined]
    return actor(
        "run", list(OWNERS), scenario.validation[:, :K], scenario.seed_set[:, :K],
        small_params(scenario, max_lost=1), NoiseSource.reproducible(1),
        str(journal) if journal else None,
    )  # fmt: skip


def _secure_phases(curator: Any, session: dict[str, Any]) -> dict[str, Any]:
    run = curator.secure_phases(session["nodes"], session["owners"], session["plan"])
    return asyncio.run(asyncio.wait_for(run, 120))


@pytest.mark.parametrize("fails", ["attest", "handle"])
def test_a_node_that_gave_its_key_but_fails_the_set_up_stops_before_any_round(
    fails: str,
) -> None:
    """node-3 answers ``public_key`` and then fails its roster attestation, or the relayed
    registrations: the session stops naming node-3, before any round opens (no owner is asked
    to contribute) and with nothing charged."""
    session, _, asked = _session(fails={"node-3": fails})
    out = _secure_phases(_curator(), session)
    refused = out["refused"]
    assert refused["state"] == "refused" and "node-3" in refused["reason"]
    assert refused["refusal"]["nodes"] == ["node-3"] and refused["refusal"]["before_start"]
    assert asked == []
    assert not any(PrivacyLedger.from_dict(v).events for v in refused["ledgers"].values())
    report = stopped_report({}, refused, list(OWNERS), 1e-5, (), "run again")
    assert report["faults"]["nodes"] == ["node-3"] and report["outcome"]["exit_code"] == 3
    assert {c["pld"] for c in report["charged"].values()} == {0.0}


def test_owners_a_node_refused_to_register_are_unready_and_count_against_t() -> None:
    """node-1 refuses the registrations of owner-1 and owner-2: both unready, two > T = 1, so
    the purchase stops before any round opens; one such owner is within T."""
    session, _, asked = _session(refused=("owner-1", "owner-2"))
    out = _secure_phases(_curator(), session)
    assert "refused" in out and asked == []
    assert sorted(out["unready"]) == ["owner-1", "owner-2"]
    assert all("registration refused by ['node-1']" in w for w in out["unready"].values())
    one, _, _ = _session(refused=("owner-3",))
    hub = DcaHub(one["plan"]["config"], one["nodes"], one["owners"], PrivacyLedger("dca"))
    asyncio.run(asyncio.wait_for(hub.setup(), 120))
    assert list(hub.unready) == ["owner-3"] and hub.failed == {}


def test_a_rerun_after_a_stop_at_the_set_up_charges_the_consumer_once(tmp_path: Path) -> None:
    """The steps of ``run_market`` around a stop at the secure sums' set-up: the consumer's
    validation plan is charged, the curator journals the stop, and the same command run again
    into the same OUT recognises the unreleased start, keeps the ledger run and so charges
    the consumer nothing more."""
    path = _config(
        tmp_path,
        "",
        '[consumer]\nledger = "stores/consumer.sqlite"\nbudget = {epsilon = 50.0, delta = 1e-5}',
    )
    out = tmp_path / "out"
    journal_dir = out / ".journal"
    config = _journal(load_market_config(path), out)
    params = config.curator_params(gamma=1.0, m=200)
    first = ledger_run_id(journal_dir, True, config)
    assert consumer_refusal(config, params, first) is None
    session, _, _ = _session(fails={"node-2": "attest"})
    assert "refused" in _secure_phases(_curator(journal_dir / "journal.json"), session)
    assert json.loads((journal_dir / "journal.json").read_text())["state"] == "refused"

    again = _journal(load_market_config(path), out)  # the same command, run again
    rerun = same_unreleased_start(journal_dir, again)
    assert rerun
    second = ledger_run_id(journal_dir, not rerun, again)
    assert second == first
    assert consumer_refusal(again, params, second) is None
    rows = read_store(tmp_path / "stores" / "consumer.sqlite")["rows"]
    assert len(rows) == 1 and rows[0]["state"] == "charged"


def test_a_snapshot_with_a_release_or_an_opened_round_is_not_an_unreleased_start(
    tmp_path: Path,
) -> None:
    """Only a snapshot that shows nothing released lets a rerun keep the ledger run: a round
    journaled as opened (it may have released) or a charged ledger is a new purchase."""
    path = _config(tmp_path)
    out = tmp_path / "out"
    journal_dir = out / ".journal"
    config = _journal(load_market_config(path), out)
    session, _, _ = _session(fails={"node-2": "attest"})
    _secure_phases(_curator(journal_dir / "journal.json"), session)
    assert same_unreleased_start(journal_dir, config)
    snapshot = json.loads((journal_dir / "journal.json").read_text())
    opened = snapshot | {"secure_phases": {"seq": 0, "rounds": {"normalise": {"state": "opened"}}}}
    (journal_dir / "journal.json").write_text(json.dumps(opened))
    assert not same_unreleased_start(journal_dir, config)
    ledger = PrivacyLedger("owner-1")
    ledger.gaussian(1.0, 1.0, label="normalise (secure sum)", neighbouring=ADD_REMOVE)
    charged = snapshot | {"ledgers": snapshot["ledgers"] | {"owner-1": ledger.to_dict()}}
    (journal_dir / "journal.json").write_text(json.dumps(charged))
    assert not same_unreleased_start(journal_dir, config)

"""Owners and compute nodes as independent agents on localhost (issue 26, "What must be shown").

Every owner and node agent is its own OS process with its own configuration and working
directory (tests/integration/remote_setup.py); the market is ``dpmarket run`` in another
process with its own Ray (``RAY_TMPDIR`` of the test). Faults go through the network: a
:class:`~tests.remote.proxy.FaultProxy` between one owner agent and the market. No assertion
reads a clock; waits are generous.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integration.remote_setup import (
    RemoteMarket,
    build,
    charged_labels,
    release_counts,
    wait_until,
)
from tests.remote.proxy import FaultProxy

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RUN = 900.0  # seconds a market run may take on 2 loaded cores (generous; never asserted)
SECURE = ["normalise (secure sum)", "scan (secure sum)"]
# the driver's progress line once the curator runs its epochs (actors/run/phases.py)
EPOCH_LINE = re.compile(r"epoch +\d+  summary")


def _report(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "report.json").read_text()))


def _kinds(store: Path) -> list[str]:
    """The charged rows' kinds: a secure round's label, or "summary plan"."""
    return sorted(label.split(":")[0] for label in charged_labels(store))


def _summary_charged(market: RemoteMarket, owner: str) -> bool:
    return "summary plan" in _kinds(market.store(owner))


def test_agents_in_their_own_processes_buy_what_local_actors_buy(tmp_path: Path) -> None:
    """The purchase completes with every party an agent; the summary equals the same market's
    with local actors under the same public seeds and reproducible noise (noise generators are
    keyed by label, so an agent draws what the local actor would); each owner's ledger store
    lives in its own directory and nowhere else."""
    with build(tmp_path / "m") as market:
        remote_out, local_out = tmp_path / "remote", tmp_path / "local"
        driver = market.run(remote_out)
        market.start_agents()
        assert driver.wait(timeout=RUN) == 0
        codes = market.wait_agents([*market.nodes, *market.owners])
        assert codes == dict.fromkeys([*market.nodes, *market.owners], 0)  # exited by themselves
        # the local owners' records are counted by the plan, which would skip the normalise
        # round it predicts useless (remote owners' counts it cannot see): spent, as remotely
        spend = ["--set", 'privacy.normalise_round="always"']
        assert market.run(local_out, *spend, local=True).wait(timeout=RUN) == 0

        remote, local = np.load(remote_out / "summary.npz"), np.load(local_out / "summary.npz")
        assert sorted(remote.files) == sorted(local.files)
        for key in remote.files:  # points, labels, owners, tokens, epochs
            assert np.array_equal(remote[key], local[key]), key
        report, report_local = _report(remote_out), _report(local_out)
        assert report["outcome"] == report_local["outcome"]
        nodes = report["secure_phases"].pop("nodes"), report_local["secure_phases"].pop("nodes")
        assert nodes == (market.nodes, ["compute-1", "compute-2", "compute-3"])
        assert report["secure_phases"] == report_local["secure_phases"]  # the DCA's releases
        assert report["faults"]["remote"] == {
            "owners": market.owners,
            "nodes": market.nodes,
            "absent": [],
            "declined": {},
        }
        assert report["faults"]["lost"] == {} and report["faults"]["dropped"] == []

        # each owner's store is in its own directory, and nowhere else under the test's root
        stores = sorted(p for p in tmp_path.rglob("*.sqlite*"))
        assert stores == sorted(market.store(o) for o in market.owners)
        for owner in market.owners:
            assert _kinds(market.store(owner)) == sorted([*SECURE, "summary plan"])
            assert max(release_counts(market.store(owner)).values()) == 1
        assert not list(remote_out.rglob("*.sqlite*"))  # the market holds no owner's ledger

        # mixed: owner-1 and owner-2 local actors of the market, owner-3 and owner-4 agents,
        # every compute node an agent (without owners_ca: local owners sign nothing, so the
        # nodes attest a roster they did not check, and owner-3 and owner-4 take part only
        # because their policies admit that: attested_roster = false); the same summary again
        mixed_out = tmp_path / "mixed"
        _mix(market, local=["owner-1", "owner-2"])
        driver = market.run(mixed_out)
        market.start_agents([*market.nodes, "owner-3", "owner-4"])
        assert driver.wait(timeout=RUN) == 0
        mixed = np.load(mixed_out / "summary.npz")
        for key in mixed.files:
            assert np.array_equal(mixed[key], local[key]), key
        assert _report(mixed_out)["faults"]["remote"]["owners"] == ["owner-3", "owner-4"]
        for owner in ("owner-3", "owner-4"):  # a second purchase in their own stores
            assert _kinds(market.store(owner)) == sorted(2 * [*SECURE, "summary plan"])
        assert _kinds(market.store("owner-1")) == sorted([*SECURE, "summary plan"])  # untouched


def _mix(market: RemoteMarket, local: list[str]) -> None:
    """Make ``local`` owners local actors of the market (their files from the all-local
    config), the others stay agents; compute nodes stop checking owners' signatures, and the
    agents' policies admit a roster the nodes attest unchecked (``attested_roster = false``:
    without it they decline such a market, which is what the policy is for)."""
    text = market.market.read_text()
    remote = [o for o in market.owners if o not in local]
    text = text.replace(f"owners = {market.owners!r}".replace("'", '"'),
                        f"owners = {remote!r}".replace("'", '"'))  # fmt: skip
    files = [
        line
        for line in market.local_market.read_text().splitlines()
        if any(line.startswith(f"{o} = ") for o in local)
    ]
    market.market.write_text(text.rstrip("\n") + "\n\n[data.files]\n" + "\n".join(files) + "\n")
    for owner in remote:
        market.set_policy(owner, attested_roster=False)
    for node in market.nodes:
        path = market.config(node)
        path.write_text(
            "\n".join(line for line in path.read_text().splitlines() if "owners_ca" not in line)
            + "\n"
        )


def test_an_owner_declines_by_its_own_policy_and_counts_against_t(tmp_path: Path) -> None:
    """An owner whose own cap is below the plan's charge declines, is charged nothing and
    counts against T: one declining owner with T = 1 -> exit 0 and report.json names it; a
    second one (its noise floor above the plan's multiplier) -> exit 3."""
    with build(tmp_path / "m") as market:
        market.set_policy("owner-4", epsilon=0.05)  # the plan charges each owner about 1.1
        out = tmp_path / "one"
        driver = market.run(out)
        market.start_agents()
        assert driver.wait(timeout=RUN) == 0
        parties = [*market.nodes, *market.owners]
        assert market.wait_agents(parties) == dict.fromkeys(parties, 0)
        declined = _report(out)["faults"]["remote"]["declined"]
        assert list(declined) == ["owner-4"] and "cap" in declined["owner-4"]
        assert charged_labels(market.store("owner-4")) == []  # charged nothing
        for owner in ("owner-1", "owner-2", "owner-3"):
            assert _kinds(market.store(owner)) == sorted([*SECURE, "summary plan"])
        summary = np.load(out / "summary.npz")
        assert "owner-4" not in set(summary["owners"].tolist())  # it sold nothing

        market.set_policy(
            "owner-3",
            min_noise="{ normalise = 1000.0, scan = 1.0, refresh = 1.0, profile = 1.0, "
            "summary = 1.0 }",
        )
        before = {o: charged_labels(market.store(o)) for o in market.owners}
        out = tmp_path / "two"
        driver = market.run(out)
        market.start_agents()
        assert driver.wait(timeout=RUN) == 3  # two owners lost, T = 1
        assert market.wait_agents(parties) == dict.fromkeys(parties, 3)  # told: stopped short
        assert charged_labels(market.store("owner-3")) == before["owner-3"]
        assert charged_labels(market.store("owner-4")) == []
        log = market.log("owner-3").read_text()
        assert "noise multiplier" in log and "below the policy's 1000" in log


def test_an_owner_sigkilled_in_the_epochs_is_tolerated(tmp_path: Path) -> None:
    """An owner agent SIGKILLed during the summary epochs: a lost owner within T (exit 0)."""
    with build(tmp_path / "m") as market:
        out = tmp_path / "out"
        driver = market.run(out)
        market.start_agents()
        charged = lambda: _summary_charged(market, "owner-2")  # noqa: E731
        assert wait_until(lambda: charged() or driver.poll() is not None, RUN, 0.01)
        assert driver.poll() is None, "the market finished before the kill"
        market.kill("owner-2")
        assert driver.wait(timeout=RUN) == 0
        others = [p for p in [*market.nodes, *market.owners] if p != "owner-2"]
        assert market.wait_agents(others) == dict.fromkeys(others, 0)
        report = _report(out)
        assert report["outcome"]["state"] == "done"
        faults = report["faults"]
        assert "owner-2" in faults["lost"] or "owner-2" in faults["dropped"], faults
        summary = np.load(out / "summary.npz")
        assert len(summary["owners"]) > 0


def test_owners_cut_or_delayed_above_t_then_resume_with_a_half_open_owner(
    tmp_path: Path,
) -> None:
    """Two owners' connections cut (proxy drop) and delayed beyond the deadline (proxy delay)
    in the summary epochs: exit 3. With the proxies restored and the stopped agents
    started again, ``dpmarket resume`` completes (exit 0) although a third owner's connection
    goes half-open in its epochs (a lost owner within T); no owner's store holds a release
    charged twice."""
    with build(tmp_path / "m") as market:
        proxies = {o: FaultProxy(("127.0.0.1", market.port)).start() for o in market.owners[:3]}
        try:
            for owner, proxy in proxies.items():
                market.route_through(owner, proxy.port)
            out = tmp_path / "out"
            driver = market.run(out)
            market.start_agents()
            # in the epochs: a refusal in a secure-sum phase is not resumable (run again)
            paid = lambda o: _summary_charged(market, o)  # noqa: E731
            both = lambda: paid("owner-1") and paid("owner-2")  # noqa: E731
            assert wait_until(lambda: both() or driver.poll() is not None, RUN, 0.01)
            proxies["owner-1"].drop()
            proxies["owner-2"].delay(60.0)  # beyond the round deadline and the call timeout
            assert driver.wait(timeout=RUN) == 3
            stopped = ["owner-3", "owner-4", *market.nodes]
            assert market.wait_agents(stopped) == dict.fromkeys(stopped, 3)
            before = {o: release_counts(market.store(o)) for o in market.owners}

            said = len(market.log("owner-2").read_bytes())
            for proxy in proxies.values():
                proxy.restore()
            # owner-2 either receives what was held (the market's end) and stops, or its held
            # connection is gone and it redials (a retry said after the restore): either way
            # it is not about to stop under the loop below
            assert wait_until(lambda: _stopped_or_redialling(market, "owner-2", said), RUN)
            for party in [*market.nodes, *market.owners]:
                if market.procs[party].poll() is not None:
                    market.start_agent(party)  # owner-1 never stopped: it keeps redialling
            resume = market.start_driver(["resume", str(out)], name="resume")
            accepted = lambda: market.log("owner-3").read_text().count("accepted purchase") >= 2  # noqa: E731
            # its summary plan was charged before the cut
            assert wait_until(lambda: accepted() or resume.poll() is not None, RUN)
            # the resumed market ingests, then replays the epochs: its first epoch line
            epochs = lambda: EPOCH_LINE.search(market.log("resume").read_text())  # noqa: E731
            assert wait_until(lambda: epochs() or resume.poll() is not None, RUN)
            proxies["owner-3"].half_open()
            assert resume.wait(timeout=RUN) == 0
        finally:
            for proxy in proxies.values():
                proxy.close()
        report = _report(out)
        assert report["outcome"]["state"] == "done"
        assert report["faults"]["remote"]["declined"] == {}
        for owner in market.owners:
            counts = release_counts(market.store(owner))
            assert counts and max(counts.values()) == 1, (owner, counts)
            assert all(counts[r] == n for r, n in before[owner].items())  # kept, not redone
        for owner in ("owner-1", "owner-2", "owner-4"):
            assert _kinds(market.store(owner)) == sorted([*SECURE, "summary plan"])


def _stopped_or_redialling(market: RemoteMarket, owner: str, said: int) -> bool:
    """The owner's agent has exited, or said a retry after the first ``said`` bytes of its
    log."""
    if market.procs[owner].poll() is not None:
        return True
    return b"retrying in" in market.log(owner).read_bytes()[said:]


def test_requests_are_offered_to_each_remote_owner_in_turn(tmp_path: Path) -> None:
    """``[[requests]]`` with remote owners: every request is offered to every agent, each takes
    part in as many as its own policy admits (owner-2: one purchase), a declined request costs
    it nothing and counts against T, and every purchase it bought is recorded as finished."""
    with build(tmp_path / "m") as market:
        config = market.market
        config.write_text(
            config.read_text() + '\n[[requests]]\nname = "first"\n\n[[requests]]\nname = "second"\n'
        )
        market.set_policy("owner-2", purchases=1)
        out = tmp_path / "out"
        driver = market.run(out)
        market.start_agents()
        assert driver.wait(timeout=2 * RUN) == 0
        parties = [*market.nodes, *market.owners]
        assert market.wait_agents(parties) == dict.fromkeys(parties, 0)
        index = json.loads((out / "requests.json").read_text())
        assert [r["state"] for r in index["requests"]] == ["complete", "complete"]
        first = _report(out / "requests" / "first")["faults"]["remote"]
        second = _report(out / "requests" / "second")["faults"]["remote"]
        assert first["declined"] == {}
        assert (
            list(second["declined"]) == ["owner-2"] and "purchases" in second["declined"]["owner-2"]
        )
        assert _kinds(market.store("owner-2")) == sorted([*SECURE, "summary plan"])
        for owner in ("owner-1", "owner-3", "owner-4"):
            assert _kinds(market.store(owner)) == sorted(2 * [*SECURE, "summary plan"])
            assert max(release_counts(market.store(owner)).values()) == 1  # each release once
            finished = (market.store(owner).parent / "purchases.jsonl").read_text().splitlines()
            assert len(finished) == 2  # neither ledger run can be reopened

"""The remote market under faults (issue 38): stop before charging, never skip a phase.

Every party is its own agent process (tests/integration/remote_setup.py). A party that "does not
join" is one whose agent is never started: at the join deadline the market sees it as refused
or absent, the same as an agent whose connection the network or the gateway refuses. No
assertion reads a clock.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dpmarket.actors.remote import tls
from tests.integration.remote_setup import (
    RemoteMarket,
    build,
    charged_labels,
    charged_rows,
    release_counts,
    wait_until,
)
from tests.remote.proxy import FaultProxy

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RUN = 900.0  # seconds a market run may take on 2 loaded cores (generous; never asserted)
JOIN = 20.0  # the join deadline: the absent parties are waited for this long (the present
# agents are started with the driver and join within their 5 s backoff of its gateway opening)


def _report(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "report.json").read_text()))


@contextlib.contextmanager
def _through_proxies(market: RemoteMarket, owners: list[str]) -> Iterator[dict[str, FaultProxy]]:
    """Each of ``owners`` dials the market through its own fault proxy, closed at the end."""
    proxies = {o: FaultProxy(("127.0.0.1", market.port)).start() for o in owners}
    try:
        for owner, proxy in proxies.items():
            market.route_through(owner, proxy.port)
        yield proxies
    finally:
        for proxy in proxies.values():
            proxy.close()


def test_two_owners_absent_at_the_join_stop_before_any_release_and_a_rerun_is_clean(
    tmp_path: Path,
) -> None:
    """Two of four owners absent at the join deadline with T = 1: exit 3 before the normalise
    round opens, owner-1 and owner-2 (who joined and accepted) charged nothing, report.json
    names the absent owners and why; the same command run again with every owner back
    completes and charges each release once."""
    with build(tmp_path / "m", join_deadline=JOIN) as market:
        out = tmp_path / "out"
        driver = market.run(out)
        market.start_agents([*market.nodes, "owner-1", "owner-2"])
        assert driver.wait(timeout=RUN) == 3
        for owner in market.owners:
            assert charged_rows(market.store(owner)) == [], owner  # nothing released or paid
        report = _report(out)
        assert report["outcome"]["state"] == "refused"
        assert report["outcome"]["phase"] == "join" and not report["outcome"]["resumable"]
        assert report["faults"]["lost"] == ["owner-3", "owner-4"]
        assert report["faults"]["remote"]["absent"] == ["owner-3", "owner-4"]
        assert "not joined by the deadline" in report["outcome"]["reason"]
        assert {c["pld"] for c in report["charged"].values()} == {0.0}
        stopped = [*market.nodes, "owner-1", "owner-2"]
        assert market.wait_agents(stopped) == dict.fromkeys(stopped, 3)  # told: stopped short

        again = market.run(out)  # the same command
        market.start_agents()
        assert again.wait(timeout=RUN) == 0
        assert _report(out)["outcome"]["state"] == "done"
        for owner in market.owners:
            counts = release_counts(market.store(owner))
            assert counts and max(counts.values()) == 1, (owner, counts)


def test_a_compute_node_missing_stops_the_purchase_naming_it(tmp_path: Path) -> None:
    """node-3 never joins: the run does not complete; it stops before any release with exit 3
    naming node-3 (in its own output and in report.json), nobody is charged, and no raw
    traceback reaches the operator."""
    with build(tmp_path / "m", join_deadline=JOIN) as market:
        out = tmp_path / "out"
        driver = market.run(out)
        market.start_agents([*market.nodes[:2], *market.owners])
        assert driver.wait(timeout=RUN) == 3
        log = market.log("market").read_text()
        assert "node-3" in log and "Traceback" not in log, log[-3000:]
        report = _report(out)
        assert report["outcome"]["state"] == "refused"
        assert "node-3" in report["outcome"]["reason"] and report["faults"]["nodes"] == ["node-3"]
        for owner in market.owners:
            assert charged_rows(market.store(owner)) == [], owner
        assert {c["pld"] for c in report["charged"].values()} == {0.0}


def _impostor(market: RemoteMarket, name: str, cert_of: str) -> Path:
    """A copy of ``cert_of``'s agent directory whose configuration claims to be ``name``."""
    home = market.root / f"impostor-{name}"
    shutil.copytree(market.root / cert_of, home)
    config = home / "owner.toml"
    config.write_text(config.read_text().replace(f'name = "{cert_of}"', f'name = "{name}"', 1))
    return config


def test_a_name_claimed_with_another_partys_certificate_is_named_and_the_real_party_buys(
    tmp_path: Path,
) -> None:
    """An agent with owner-2's certificate claiming owner-1: refused (exit 2), named with the
    certificate's fingerprint in ``dpmarket run``'s own output and in report.json's
    ``faults.remote.refusals``; owner-1 itself, started after the refusal, completes the
    purchase. (The market waits for owner-1 at its join deadline, so it cannot finish, and
    close its gateway, before the impostor has been refused.)"""
    with build(tmp_path / "m") as market:
        out = tmp_path / "out"
        driver = market.run(out)
        market.start_agents([*market.nodes, *market.owners[1:]])
        config = _impostor(market, "owner-1", "owner-2")
        args = ["owner", "serve", str(config), "--give-up", str(RUN)]
        impostor = market.procs["impostor"] = market._popen("impostor", args, config.parent)
        assert wait_until(lambda: impostor.poll() is not None or driver.poll() is not None, RUN)
        # refused: a configuration or identity error (never left waiting on a market that ended)
        assert impostor.poll() == 2, (driver.poll(), market.tail("impostor"), market.tail("market"))
        market.start_agent("owner-1")
        assert driver.wait(timeout=RUN) == 0, market.tail("market")
        fp = tls.fingerprint((market.root / "pki" / "owner-2.crt").read_bytes())
        said = [line for line in market.log("market").read_text().splitlines() if fp in line]
        assert said and "'owner-1'" in said[0] and "certificate of owner-2" in said[0], said
        report = _report(out)
        assert report["outcome"]["state"] == "done"
        refusals = report["faults"]["remote"]["refusals"]
        assert [(r["claimed"], r["fingerprint"]) for r in refusals] == [("owner-1", fp)]
        assert refusals[0]["count"] >= 1 and "owner-2" in refusals[0]["reason"]
        labels = charged_labels(market.store("owner-1"))
        assert any(label.startswith("summary plan") for label in labels), labels


def test_a_one_second_cut_of_an_owners_link_in_the_epochs_costs_nothing(tmp_path: Path) -> None:
    """owner-1's link cut (the suite's proxy resets every connection and refuses new ones)
    during the epochs and restored once the agent has seen the cut and retried (about a
    second): the agent reconnects within the epoch deadline, the call in flight is sent again,
    and the run completes (exit 0) with owner-1 neither lost nor dropped."""
    with build(tmp_path / "m", deadline_seconds=15.0) as market:
        with _through_proxies(market, ["owner-1"]) as proxies:
            proxy = proxies["owner-1"]
            out = tmp_path / "out"
            driver = market.run(out)
            market.start_agents()
            paid = lambda: "summary plan" in " ".join(charged_labels(market.store("owner-1")))  # noqa: E731
            assert wait_until(lambda: paid() or driver.poll() is not None, RUN, 0.01)
            assert driver.poll() is None, "the market finished before the cut"
            log = market.log("owner-1")
            retries = log.read_text().count("retrying")
            proxy.drop()
            assert wait_until(lambda: log.read_text().count("retrying") > retries, RUN)
            proxy.restore()
            assert driver.wait(timeout=RUN) == 0
        report = _report(out)
        assert report["outcome"]["state"] == "done"
        assert "owner-1" not in report["faults"]["lost"], report["faults"]
        assert all(d[1] != "owner-1" for d in report["faults"]["dropped"]), report["faults"]
        assert log.read_text().count("joined market") >= 2  # it was cut and came back

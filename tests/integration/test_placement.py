"""Owners placed by Ray custom resource on a two-node cluster (ray.cluster_utils.Cluster): the
placement observed through Ray's state API, the on-node preflight, dead owners asked after the
summary (issue 16, items 1 and 4)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpmarket.actors.cluster.placement import preflight_owners
from dpmarket.actors.commands.main import main
from dpmarket.actors.config.market import ConfigError
from dpmarket.actors.config.placement import Placement
from dpmarket.actors.randomness import NoiseSource
from dpmarket.actors.run.spawn import spawn_market, unique_actors
from dpmarket.actors.run.survivors import owner_reports
from tests.small import small_params, small_scenario

pytestmark = [pytest.mark.ray, pytest.mark.slow]
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SITE_A, SITE_B = Placement((("site_a", 1.0),)), Placement((("site_b", 1.0),))


@pytest.fixture(scope="module")
def two_sites() -> Iterator[dict[str, str]]:
    """A head offering site_a and a second node offering site_b, one unit each as
    configs/cluster-*.yaml start them (issue 27 part 2: several owners per site); site -> Ray
    node id."""
    import ray
    from ray.cluster_utils import Cluster

    from dpmarket.actors.cluster.connect import connect

    was_connected = ray.is_initialized()
    ray.shutdown()
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"site_a": 1}}
    )
    cluster.add_node(num_cpus=1, resources={"site_b": 1})
    cluster.wait_for_nodes()
    connect(cluster.address)  # a cluster address: the driver's code is shipped (py_modules)
    sites = {
        site: n["NodeID"]
        for n in ray.nodes()
        for site in ("site_a", "site_b")
        if site in n["Resources"]
    }
    yield sites
    ray.shutdown()
    cluster.shutdown()
    if was_connected:  # the session's local instance, for the tests that follow
        connect(num_cpus=2)


def _actor_nodes(run: str) -> dict[str, str]:
    import ray
    from ray.util.state import list_actors

    actors = list_actors(
        address=ray.get_runtime_context().gcs_address,
        filters=[("ray_namespace", "=", f"dpmarket-{run}")],
        limit=100,
    )
    return {a.name.split(":")[-1]: a.node_id for a in actors if a.state == "ALIVE"}


def test_owners_run_on_the_node_their_placement_names(two_sites: dict[str, str]) -> None:
    scenario = small_scenario(5, n_points=200)  # owner-1 .. owner-4
    placement = {"owner-1": SITE_A, "owner-2": SITE_B, "owner-3": SITE_A, "owner-4": SITE_B}
    market = spawn_market(
        scenario, small_params(scenario), NoiseSource.reproducible(1), run_id="placed",
        placement=placement, owners_per_actor=2,
    )  # fmt: skip
    try:
        reports = preflight_owners(market.owners, {}, placement)
        nodes = _actor_nodes("placed")  # Ray's state API: where each actor runs
        assert nodes["owners-1-3"] == two_sites["site_a"]
        assert nodes["owners-2-4"] == two_sites["site_b"]
        for owner, site in placement.items():  # and each actor's own view of its node
            assert reports[owner]["node_id"] == two_sites[dict(site.resources).popitem()[0]]
        assert len(unique_actors(market.owners)) == 2  # co-located within a placement only
    finally:
        market.kill_all()


def test_several_owner_actors_per_site_all_start_on_their_site(two_sites: dict[str, str]) -> None:
    """The documented ``resources = { site_a = 1 }`` for every owner of a site, one actor each,
    on nodes offering one unit: every actor starts (they share the unit) on its site."""
    scenario = small_scenario(9, n_points=200)  # owner-1 .. owner-4
    placement = {"owner-1": SITE_A, "owner-2": SITE_B, "owner-3": SITE_A, "owner-4": SITE_B}
    market = spawn_market(
        scenario, small_params(scenario), NoiseSource.reproducible(1), run_id="shared",
        placement=placement,
    )  # fmt: skip
    try:
        reports = preflight_owners(market.owners, {}, placement)
        assert len(unique_actors(market.owners)) == 4
        for owner, site in placement.items():
            assert reports[owner]["node_id"] == two_sites[dict(site.resources).popitem()[0]]
    finally:
        market.kill_all()


def test_an_owner_that_cannot_be_placed_is_said_with_what_it_asked_and_what_nodes_offer(
    two_sites: dict[str, str],
) -> None:
    """Another actor holds site_b's unit: the owner placed there waits; the preflight says so
    after its grace, naming the request and every alive node's resources, and refuses by name
    when its time is up."""
    import ray

    @ray.remote(num_cpus=0)
    class Holder:
        def ready(self) -> bool:
            return True

    holder = Holder.options(resources={"site_b": 1.0}).remote()  # type: ignore[attr-defined]
    ray.get(holder.ready.remote())
    scenario = small_scenario(10, n_points=200)
    placement = {"owner-2": SITE_B}
    market = spawn_market(
        scenario, small_params(scenario), NoiseSource.reproducible(1), run_id="unplaced",
        placement=placement,
    )  # fmt: skip
    said: list[str] = []
    try:
        with pytest.raises(ConfigError) as info:
            preflight_owners(
                market.owners, {}, placement, timeout=20.0, grace=2.0, warn=said.append
            )
    finally:
        market.kill_all()
        ray.kill(holder)
    # on a loaded machine owner-1 may also be slow to start within the grace: it may be named
    # too; what is checked is what the message says about owner-2, the one that cannot start
    warned = [w for w in said if "owner-2 asks" in w]
    assert warned and "not placed on any node" in warned[0]
    for text in (warned[0], str(info.value)):
        assert "owner-2 asks" in text and "'site_b': 1.0" in text
        assert "placed resources {'site_b': 1.0}" in text
        assert two_sites["site_a"] in text and two_sites["site_b"] in text  # every alive node
        assert "free now" in text
    assert "owner-2 did not start within 20 s" in str(info.value)


def test_preflight_names_the_owner_its_node_and_the_path(
    two_sites: dict[str, str], tmp_path: Path
) -> None:
    scenario = small_scenario(6, n_points=200)
    readable = tmp_path / "here.csv"
    readable.write_text("1,2,3,4,0\n")
    placement = {"owner-2": SITE_B}
    market = spawn_market(
        scenario, small_params(scenario), NoiseSource.reproducible(1), run_id="preflight",
        placement=placement,
    )  # fmt: skip
    files = {"owner-1": [str(readable)], "owner-2": ["/no/such/dir/owner-2.csv"]}
    try:
        with pytest.raises(ConfigError) as info:
            preflight_owners(market.owners, files, placement)
    finally:
        market.kill_all()
    message = str(info.value)
    assert "owner-2" in message and "/no/such/dir/owner-2.csv" in message
    assert two_sites["site_b"] in message and "No such file" in message
    assert "owner-1" not in message  # its file is readable where it runs


def test_a_killed_owner_is_left_out_of_the_preflight_and_the_status(
    two_sites: dict[str, str],
) -> None:
    import ray

    scenario = small_scenario(7, n_points=200)
    market = spawn_market(
        scenario, small_params(scenario), NoiseSource.reproducible(1), run_id="dead"
    )
    try:
        ray.kill(market.owners["owner-3"], no_restart=True)
        # the preflight leaves a dead owner out (a lost party, counted against T), no error
        assert sorted(preflight_owners(market.owners, {}, {})) == ["owner-1", "owner-2", "owner-4"]
        reports, lost = owner_reports(market.owners, timeout=60.0)
    finally:
        market.kill_all()
    assert sorted(reports) == ["owner-1", "owner-2", "owner-4"]
    assert set(lost) == {"owner-3"} and "Error" in lost["owner-3"]
    assert all(r["ingested"] == 0 for r in reports.values())


def _placed_files_config(tmp_path: Path, extra: str) -> Path:
    shutil.copytree(CONFIGS / "example-data", tmp_path / "example-data")
    path = tmp_path / "placed.toml"
    text = (CONFIGS / "files-example.toml").read_text()
    path.write_text(text.replace("[privacy]", extra + "\n[privacy]", 1))
    return path


def test_a_placed_files_market_runs_and_a_missing_file_on_its_node_exits_2(
    two_sites: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    placed = (
        "[owners.owner-1]\nresources = { site_a = 1 }\n"
        "[owners.owner-2]\nresources = { site_b = 1 }\n"
        "[owners.owner-3]\nresources = { site_b = 1 }\n"
    )
    config = _placed_files_config(tmp_path / "ok", placed)
    code = main(["run", str(config), "--out", str(tmp_path / "ok" / "out")])
    assert code == 0, capsys.readouterr().err[-2000:]
    assert (tmp_path / "ok" / "out" / "report.json").exists()
    broken = _placed_files_config(tmp_path / "broken", placed)
    (tmp_path / "broken" / "example-data" / "owner-3.csv").unlink()
    capsys.readouterr()
    code = main(["run", str(broken), "--out", str(tmp_path / "broken" / "out")])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert "owner-3" in err and "owner-3.csv" in err and two_sites["site_b"] in err


def test_actors_run_the_shipped_code_and_a_different_one_is_refused_by_name(
    two_sites: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dpmarket.actors.cluster import shipping

    scenario = small_scenario(8, n_points=200)
    market = spawn_market(
        scenario, small_params(scenario), NoiseSource.reproducible(1), run_id="shipped",
        placement={"owner-2": SITE_B},
    )  # fmt: skip
    try:
        reports = preflight_owners(market.owners, {}, {"owner-2": SITE_B})
        mine = shipping.code_identity()
        for report in reports.values():  # the driver's code, imported from the shipped package
            assert report["code"]["fingerprint"] == mine["fingerprint"]
            assert report["code"]["path"] != mine["path"]
            assert report["code"]["path"].endswith("dpmarket")
        # the driver edited after the actors started: their code is no longer the driver's
        edited = mine | {"fingerprint": "0123456789abcdef"}
        monkeypatch.setattr(shipping, "code_identity", lambda: edited)
        with pytest.raises(ConfigError) as info:
            preflight_owners({"owner-2": market.owners["owner-2"]}, {}, {})
    finally:
        market.kill_all()
    message = str(info.value)
    assert message.startswith("owner-2 on node " + two_sites["site_b"])
    assert "refused" in message and mine["fingerprint"] in message and "0123456789abcdef" in message

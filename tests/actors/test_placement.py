"""[owners.NAME] placements: parsed and checked, refused by name, matched against the nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpmarket.actors.cluster.placement import require_placeable
from dpmarket.actors.config.market import ConfigError, load_market_config
from dpmarket.actors.config.placement import Placement, parse_placements

OWNERS = ("owner-1", "owner-2", "owner-3")


def test_a_placement_becomes_the_owner_actors_ray_options(tmp_path: Path) -> None:
    path = tmp_path / "placed.toml"
    path.write_text(
        "[market]\nowners = 3\n"
        "[owners.owner-1]\nresources = { site_a = 1 }\n"
        '[owners.owner-3]\nresources = { site_b = 0.5 }\nnode_labels = { site = "b" }\n'
    )
    config = load_market_config(path)
    assert set(config.placement) == {"owner-1", "owner-3"}
    assert config.placement["owner-1"].options() == {"resources": {"site_a": 1.0}}
    assert config.placement["owner-3"].options() == {
        "resources": {"site_b": 0.5},
        "label_selector": {"site": "b"},
    }
    assert "owner-2" not in config.placement  # unplaced: anywhere
    assert config.public_record()["placement"]["owner-1"]["resources"] == (("site_a", 1.0),)


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ({"owner-9": {"resources": {"a": 1}}}, "unknown owners ['owner-9']"),
        ({"owner-1": {"resource": {"a": 1}}}, "[owners.owner-1]: unknown keys ['resource']"),
        ({"owner-1": {"resources": {"CPU": 1}}}, "'CPU' is not a custom resource name"),
        ({"owner-1": {"resources": {"a b": 1}}}, "'a b' is not a custom resource name"),
        ({"owner-1": {"resources": {"a": 0}}}, "[owners.owner-1].resources.a: expected a number"),
        ({"owner-1": {"resources": {"a": True}}}, "resources.a: expected a number > 0"),
        ({"owner-1": {"resources": ["a"]}}, "[owners.owner-1].resources: expected a table"),
        ({"owner-1": {"node_labels": {"site": 1}}}, "node_labels.site: expected a label value"),
        ({"owner-1": {"node_labels": {"-x": "a"}}}, "'-x' is not a valid Ray label key"),
        ({"owner-1": "site_a"}, "[owners.owner-1]: expected a table"),
    ],
)
def test_bad_placements_are_refused_by_owner_and_key(table: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        parse_placements("m.toml", table, OWNERS)


def test_an_unknown_top_level_key_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "typo.toml"
    path.write_text("[owner.owner-1]\nresources = { site_a = 1 }\n")
    with pytest.raises(ConfigError, match="unknown keys \\['owner'\\]"):
        load_market_config(path)


def _node(alive: bool, resources: dict[str, float], labels: dict[str, str]) -> dict[str, object]:
    return {"Alive": alive, "Resources": {"CPU": 2.0, **resources}, "Labels": labels}


def test_a_placement_no_alive_node_satisfies_is_refused_before_spawning() -> None:
    nodes = [
        _node(True, {"site_a": 1.0}, {"site": "a"}),
        _node(False, {"site_b": 1.0}, {"site": "b"}),  # dead: does not count
    ]
    site_a = Placement((("site_a", 1.0),), (("site", "a"),))
    require_placeable({"owner-1": site_a}, nodes)  # satisfied: no error
    require_placeable({}, [])  # nothing placed: nothing to check
    with pytest.raises(ConfigError, match=r"\[owners.owner-2\]: no alive Ray node offers"):
        require_placeable({"owner-2": Placement((("site_b", 1.0),))}, nodes)
    with pytest.raises(ConfigError, match="offered: \\['site_a'\\]"):
        require_placeable({"owner-2": Placement((("site_a", 2.0),))}, nodes)  # not enough
    with pytest.raises(ConfigError, match="node labels"):
        require_placeable({"owner-3": Placement((("site_a", 1.0),), (("site", "b"),))}, nodes)


def test_owner_actors_naming_a_resource_share_the_amount_written() -> None:
    """Issue 27 part 2: ``site_a = 1`` selects the node; five actors on it ask 0.2 each, so
    all of them fit on a node offering one unit (Ray's unit is 0.0001, rounded down)."""
    from dpmarket.actors.config.placement import shared_requests

    site_a, site_b = Placement((("site_a", 1.0),)), Placement((("site_b", 1.0),))
    both = Placement((("site_a", 2.0), ("gpu_box", 1.0)))
    asked = shared_requests([site_a] * 5 + [site_b] * 3 + [Placement()])
    assert asked[:5] == [{"site_a": 0.2}] * 5
    assert asked[5:8] == [{"site_b": 0.3333}] * 3 and asked[8] == {}
    assert sum(a["site_b"] for a in asked[5:8]) <= 1.0
    mixed = shared_requests([site_a, site_a, both])  # three name site_a: a third of each amount
    assert mixed == [{"site_a": 0.3333}, {"site_a": 0.3333}, {"site_a": 0.6666, "gpu_box": 1.0}]
    assert shared_requests([site_a]) == [{"site_a": 1.0}]  # one actor asks what is written
    assert site_a.options({"site_a": 0.2}) == {"resources": {"site_a": 0.2}}
    with pytest.raises(ConfigError, match="less than Ray's unit"):
        shared_requests([Placement((("site_a", 0.001),))] * 20)

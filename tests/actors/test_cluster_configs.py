"""The shipped `ray up` cluster files pass Ray's own cluster-config validation (offline)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["cluster-local.yaml", "cluster-aws.yaml"])
def test_cluster_yaml_is_valid_for_ray_up(name: str) -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((ROOT / "configs" / name).read_text())
    validate_config(prepare_config(config))


def test_validation_rejects_an_unknown_key() -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((ROOT / "configs" / "cluster-local.yaml").read_text())
    config["not_a_ray_key"] = 1
    with pytest.raises(Exception, match="not_a_ray_key"):
        validate_config(prepare_config(config))


def _text_and_config(name: str) -> tuple[str, dict[str, object]]:
    text = (ROOT / "configs" / name).read_text()
    return text, yaml.safe_load(text)


@pytest.mark.parametrize("name", ["cluster-local.yaml", "cluster-aws.yaml"])
def test_cluster_yaml_pins_the_tested_ray_and_python(name: str) -> None:
    import re

    import ray

    text, _ = _text_and_config(name)
    pins = set(re.findall(r"ray\[default\]==([0-9.]+)", text))
    pins |= set(re.findall(r"rayproject/ray:([0-9.]+)-py", text))
    assert pins == {ray.__version__}  # one version: the one installed and tested here
    assert re.findall(r"py311|python3\.11|\(3, 11\)", text)
    assert "pip install" in text and "~/dpmarket" in text


@pytest.mark.parametrize("name", ["cluster-local.yaml", "cluster-aws.yaml"])
def test_cluster_yaml_mounts_the_project_without_ignored_files(name: str) -> None:
    _, config = _text_and_config(name)
    assert isinstance(config["file_mounts"], dict) and config["file_mounts"]["~/dpmarket"] == "."
    assert config["rsync_filter"] == [".gitignore"]
    ignored = (ROOT / ".gitignore").read_text().split()
    assert ".venv/" in ignored and "out/" in ignored  # what the filter keeps off the nodes


@pytest.mark.parametrize("name", ["cluster-local.yaml", "cluster-aws.yaml"])
def test_cluster_yaml_keeps_the_dashboard_local_and_requires_tokens(name: str) -> None:
    text, config = _text_and_config(name)
    heads = " ".join(str(c) for c in config["head_start_ray_commands"])  # type: ignore[union-attr]
    assert "--dashboard-host=127.0.0.1" in heads and "0.0.0.0" not in heads
    assert "RAY_AUTH_MODE=token" in text and "ray get-auth-token --generate" in text
    assert "ray dashboard configs/" + name in text


def test_every_site_has_its_custom_resource() -> None:
    _, aws = _text_and_config("cluster-aws.yaml")
    types = aws["available_node_types"]
    assert isinstance(types, dict)
    assert {n: t["resources"] for n, t in types.items()} == {
        "head": {},
        "site_a": {"site_a": 1},
        "site_b": {"site_b": 1},
    }
    _, local = _text_and_config("cluster-local.yaml")
    assert "site_a" in str(local["head_start_ray_commands"])
    assert "site_b" in str(local["worker_start_ray_commands"])


def test_the_aws_start_commands_are_the_local_ones_with_resources_from_the_node_types() -> None:
    """tests/integration/test_cluster_yaml_start.py runs cluster-local.yaml's start commands as
    written (a token cluster that runs a placed market). cluster-aws.yaml's are the same
    commands, but for the sites' resources, which its node types give (Ray's autoscaler sets
    RAY_OVERRIDE_RESOURCES from them) instead of ``--resources``: so the live test of the local
    file covers them, and this test keeps the two from drifting apart."""
    _, local = _text_and_config("cluster-local.yaml")
    _, aws = _text_and_config("cluster-aws.yaml")
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        without = [re.sub(r" --resources='[^']*'", "", str(c)) for c in local[key]]  # type: ignore[union-attr]
        assert [str(c) for c in aws[key]] == without, key  # type: ignore[union-attr]
        assert "--resources" not in " ".join(str(c) for c in aws[key])  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["cluster-local.yaml", "cluster-aws.yaml"])
def test_cluster_yaml_comes_up_as_written(name: str) -> None:
    """Issue 27 part 1, what can be read: the token reaches every node by file mounts before
    any `ray start` (the README has it generated before `ray up`), every start command sets
    token mode, the head's monitor gets the bootstrap config (it starts the workers), no
    docker (a site's data directory is on the machine its owners run on), one machine per
    site."""
    _, config = _text_and_config(name)
    mounts = config["file_mounts"]
    assert isinstance(mounts, dict) and mounts["~/.ray/auth_token"] == "~/.ray/auth_token"
    starts = [*config["head_start_ray_commands"], *config["worker_start_ray_commands"]]  # type: ignore[misc]
    for command in starts:
        if "ray start" in command:
            assert "RAY_AUTH_MODE=token ray start" in command
    heads = " ".join(config["head_start_ray_commands"])  # type: ignore[arg-type]
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in heads
    assert "docker" not in config
    if name == "cluster-aws.yaml":
        types = config["available_node_types"]
        assert isinstance(types, dict)
        assert all(
            types[s]["min_workers"] == types[s]["max_workers"] == 1 for s in ("site_a", "site_b")
        )
        assert config["max_workers"] == 2
    else:
        provider = config["provider"]
        assert isinstance(provider, dict)
        assert config["max_workers"] == len(provider["worker_ips"])

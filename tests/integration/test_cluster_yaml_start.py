"""Each ``ray up`` file's own start commands, executed on this machine (issue 27 part 1).

What ``ray up`` and the head's monitor do on a node after the setup commands is emulated: a
temporary HOME per node holding ``~/dpmarket-venv`` (this test's venv) and the file mounts
(the token made on a "workstation" HOME by ``ray get-auth-token --generate``, before any
``ray start``), ``RAY_HEAD_IP`` and the node type's resources (``RAY_OVERRIDE_RESOURCES``) as
the autoscaler sets them, and ``~/ray_bootstrap_config.yaml`` the YAML after Ray's own
``prepare_config`` and validation with its workers emptied (no SSH or cloud from a test). Each
start command runs as written through ``bash -c``, with only what a shared machine needs
changed: the ports (6379 and the others, free ones instead), the node IP (127.0.0.1) and a
temp dir of the test's own. ``ray stop`` lines are never run (they would stop every Ray on the
machine); each node's processes are stopped by PID. The two nodes form a cluster with token
authentication (a driver without the token is refused) and run a placed market: the owners
of site_b, two of them, share its one unit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.raylets import RAY, Node, RayletCluster, free_port

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
STOP = "~/dpmarket-venv/bin/ray stop"


def _yaml(name: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((ROOT / "configs" / name).read_text())
    return config


def _bootstrap(config: dict[str, Any], home: Path) -> None:
    """``~/ray_bootstrap_config.yaml`` as ``ray up`` writes it, without workers to set up."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(json.loads(json.dumps(config)))
    validate_config(prepared)
    prepared["provider"] = {"type": "local", "head_ip": "127.0.0.1", "worker_ips": []}
    prepared["available_node_types"] = {
        "head": prepared["available_node_types"][prepared["head_node_type"]] | {"max_workers": 0}
    }
    prepared["head_node_type"], prepared["max_workers"] = "head", 0
    (home / "ray_bootstrap_config.yaml").write_text(yaml.safe_dump(prepared))


def _node_home(root: Path, name: str, config: dict[str, Any], workstation: Path) -> Path:
    """A node's HOME after setup and file mounts: the venv, and each mount copied there."""
    home = root / name
    home.mkdir()
    (home / "dpmarket-venv").symlink_to(Path(sys.prefix))
    for target, source in config["file_mounts"].items():
        if target == "~/dpmarket":
            continue  # the checkout: installed in the venv already
        src = Path(source.replace("~", str(workstation), 1))
        dst = Path(target.replace("~", str(home), 1))
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dst)
    return home


def _start(
    cluster: RayletCluster, name: str, commands: list[str], home: Path, env: dict[str, str]
) -> Node:
    """Run a node's start commands (``ray stop`` skipped) as ``bash -c``; its new processes."""
    assert commands[0] == STOP  # the only line not run here
    before = set(cluster._ours())
    extra = [
        "--node-ip-address=127.0.0.1", f"--temp-dir={cluster.temp_dir}",
        "--min-worker-port=0", "--max-worker-port=0", "--disable-usage-stats", *cluster._ports(),
    ]  # fmt: skip
    if "--head" in " ".join(commands):
        extra += [f"--dashboard-port={free_port()}", f"--ray-client-server-port={free_port()}"]
    node = Node(name)
    cluster.nodes.append(node)
    for command in commands[1:]:
        command = command.replace("--port=6379", f"--port={cluster.gcs_port}")
        command = command.replace("$RAY_HEAD_IP:6379", cluster.address)
        done = subprocess.run(
            ["bash", "-c", f"{command} {' '.join(extra)}"],
            env=env | {"HOME": str(home)}, capture_output=True, text=True, timeout=180,
            check=False,
        )  # fmt: skip
        node.pids |= set(cluster._ours()) - before
        assert done.returncode == 0, f"{name}: {command}\n{done.stderr[-3000:]}"
    return node


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dpy-", dir="/tmp"))  # socket paths stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _market(root: Path) -> Path:
    shutil.copytree(ROOT / "configs" / "example-data", root / "market" / "example-data")
    text = (ROOT / "configs" / "files-example.toml").read_text()
    placed = "".join(
        f"[owners.{o}]\nresources = {{ {s} = 1 }}\n"
        for o, s in (("owner-1", "site_a"), ("owner-2", "site_b"), ("owner-3", "site_b"))
    )
    path = root / "market" / "market.toml"
    path.write_text(text.replace("[privacy]", placed + "\n[privacy]", 1))
    return path


# cluster-local.yaml only: cluster-aws.yaml's start commands are the same but for the sites'
# resources, which its node types give (tests/actors/test_cluster_configs.py holds the two
# files together); running both cost a second cluster and market (about a minute)
@pytest.mark.parametrize(
    ("name", "resources"),
    [("cluster-local.yaml", {"head": None, "worker": None})],  # in the start commands
)
def test_the_yamls_start_commands_form_a_token_cluster_that_runs_a_placed_market(
    workdir: Path, name: str, resources: dict[str, Any]
) -> None:
    config = _yaml(name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    workstation = workdir / "workstation"
    workstation.mkdir()
    subprocess.run(  # README step 1, before `ray up`
        [RAY, "get-auth-token", "--generate"], env=env | {"HOME": str(workstation)},
        capture_output=True, check=True, timeout=120,
    )  # fmt: skip
    homes = {n: _node_home(workdir, n, config, workstation) for n in ("head", "worker")}
    _bootstrap(config, homes["head"])
    cluster = RayletCluster(workdir / "ray", env)
    cluster.gcs_port = free_port()
    try:
        for node, key in (
            ("head", "head_start_ray_commands"),
            ("worker", "worker_start_ray_commands"),
        ):
            node_env = env | {"RAY_HEAD_IP": "127.0.0.1"}
            if resources[node] is not None:
                node_env["RAY_OVERRIDE_RESOURCES"] = json.dumps(resources[node])
            _start(cluster, node, config[key], homes[node], node_env)
        market = _market(workdir)
        run = [sys.executable, "-m", "dpmarket.actors.commands.main", "run", str(market),
               "--address", cluster.address, "--out", str(workdir / "out")]  # fmt: skip
        stranger = workdir / "stranger"  # a driver without the token
        stranger.mkdir()
        refused = subprocess.run(
            run, env=env | {"HOME": str(stranger), "RAY_AUTH_MODE": "token"},
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert refused.returncode != 0 and "token" in refused.stderr.lower(), refused.stderr
        assert not (workdir / "out" / "report.json").exists()
        done = subprocess.run(
            run, env=env | {"HOME": str(workstation), "RAY_AUTH_MODE": "token"},
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads((workdir / "out" / "report.json").read_text())
        assert report["outcome"]["state"] == "done"
    finally:
        cluster.stop()

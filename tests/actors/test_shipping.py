"""The code shipped with a job: when it is shipped, what the package holds, and its identity."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dpmarket.actors.cluster.shipping import (
    build_package,
    code_identity,
    connect_runtime_env,
    require_same_code,
)
from dpmarket.actors.config.market import ConfigError


def test_the_built_package_imports_as_dpmarket_with_the_drivers_identity(tmp_path: Path) -> None:
    package = build_package(tmp_path / "ship")
    assert package == tmp_path / "ship" / "dpmarket"
    assert (package / "actors" / "cluster" / "shipping.py").is_file()
    assert not list(package.rglob("__pycache__"))
    assert (package / "api.py").is_file()  # the API, which the command line calls
    probe = (
        "import json, dpmarket.api as api; "
        "from dpmarket.actors.cluster.shipping import code_identity as c; "
        "print(json.dumps(c() | {'api': api.__file__}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(package.parent), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    shipped, mine = json.loads(done.stdout), code_identity()
    assert shipped["path"] == str(package)  # imported from the package, not the install
    assert shipped.pop("api") == str(package / "api.py")
    assert shipped["fingerprint"] == mine["fingerprint"]
    assert shipped["version"] == mine["version"]


def test_code_is_shipped_to_clusters_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPMARKET_SHIP", raising=False)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert connect_runtime_env(None) is None  # the embedded local instance
    env = connect_runtime_env("10.0.0.10:6379")
    assert env is not None
    (shipped,) = env["py_modules"]
    assert Path(shipped).name == "dpmarket" and (Path(shipped) / "__init__.py").is_file()
    assert connect_runtime_env("auto") == env  # built once per driver
    monkeypatch.setenv("DPMARKET_SHIP", "never")
    assert connect_runtime_env("10.0.0.10:6379") is None
    monkeypatch.setenv("DPMARKET_SHIP", "always")
    assert connect_runtime_env(None) == env
    monkeypatch.setenv("DPMARKET_SHIP", "sometimes")
    with pytest.raises(ConfigError, match="DPMARKET_SHIP: 'sometimes'"):
        connect_runtime_env("auto")


def test_a_job_that_already_ships_py_modules_is_not_shipped_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DPMARKET_SHIP", raising=False)
    job = {"runtime_env": {"py_modules": ["gcs://_ray_pkg_abc.zip"]}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    assert connect_runtime_env("auto") is None
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {}}))
    assert connect_runtime_env("auto") is not None


def test_a_different_dpmarket_is_refused_by_actor_and_node() -> None:
    mine = code_identity()
    same = {"code": mine, "node_id": "n1", "ip": "10.0.0.11"}
    require_same_code({"owner-1": same})  # the driver's code: accepted
    older = {"code": mine | {"version": "0.0.9"}, "node_id": "n2", "ip": "10.0.0.12"}
    with pytest.raises(
        ConfigError, match=r"^owner-2 on node n2 \(10\.0\.0\.12\) runs dpmarket 0\.0\.9"
    ):
        require_same_code({"owner-1": same, "owner-2": older})
    edited = {"code": mine | {"fingerprint": "ffff"}, "node_id": "n3", "ip": "10.0.0.13"}
    with pytest.raises(ConfigError, match="compute-1 on node n3"):
        require_same_code({"compute-1": edited})
    with pytest.raises(ConfigError, match="curator on node"):
        require_same_code({"curator": {}})  # an actor that reports no code at all

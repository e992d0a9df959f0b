"""One local Ray instance per test process for the integration tests (issue 37).

Tests that need Ray but do not test its start-up, shutdown or the loss of a node use
``ray_local``: the instance is started once, the first time a test asks for it, and shared by
every later one. Between tests nothing of a run is left in it: every actor a run spawns is
named (``dpmarket:RUN:ROLE`` in namespace ``dpmarket-RUN``), and any still alive after a test
is killed (``_no_leftover_actors``), so the next test's run can take the same names. Journals
and outputs live in each test's ``tmp_path``; ports are chosen free by the tests that open one.

Tests of Ray's start-up, of raylets, of node kills and of the YAML start (test_cli_terminal,
test_raylet_cluster, test_placement, test_cluster_yaml_start) and the drivers
killed with their own embedded Ray keep their own instance.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    import ray

    from dpmarket.actors.cluster.connect import connect

    connect(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def _no_leftover_actors(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test on the shared instance: kill the named actors its runs left alive."""
    yield
    if "ray_local" not in request.fixturenames:
        return
    import ray

    if not ray.is_initialized():
        return
    for entry in ray.util.list_named_actors(all_namespaces=True):
        with contextlib.suppress(ValueError):  # gone in the meantime
            handle = ray.get_actor(entry["name"], namespace=entry["namespace"])
            ray.kill(handle, no_restart=True)

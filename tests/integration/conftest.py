"""A session-scoped local Ray instance for the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    import ray

    from dpmarket.actors.cluster.connect import connect

    connect(num_cpus=2)
    yield
    ray.shutdown()

"""A multi-node Ray cluster on one machine: losing a node loses the owners placed on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_removing_a_node_loses_its_owners() -> None:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.multinode_script"],
        cwd=root, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    tolerated, refused = result["tolerated"], result["refused"]
    assert tolerated["state"] == "done" and tolerated["summary"] == 10
    assert tolerated["lost"] == ["owner-1", "owner-2"]
    assert refused["state"] == "refused"
    assert refused["lost"] == ["owner-3", "owner-4"]

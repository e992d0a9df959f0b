"""Issue 17: a study's trials run as Ray tasks, and the in-process verdicts of sampled trials
agree with the same faults replayed as real markets on actors (``simulate --actors``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpmarket.actors.commands.main import main
from tests.actors.test_study import _study

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]


def test_study_on_ray_agrees_with_actor_markets(tmp_path: Path) -> None:
    # K = 6, T = 1 and 2: each owner drops with probability 0.2, before the secure sums or at
    # epoch 1 or 2; with this seed one trial refuses (2 drops, T = 1) and three complete, one
    # of them with a drop. Both trials of both cells are replayed on actors.
    axes = "owners = [6]\ntolerance = [1, 2]\ndropout = [0.2]"
    path = _study(tmp_path, axes, "normalise = 0.5\nepochs = 0.5\nepoch_range = [1, 2]", 2, 4)
    out = tmp_path / "out"
    code = main(["simulate", str(path), "--out", str(out), "--actors", "2", "--actors-trials", "2"])
    check = json.loads((out / "actors.json").read_text(encoding="utf-8"))
    assert check["compared"] == 4
    verdicts = [(r["in_process"], r["actors"]) for r in check["rows"]]
    assert all(a == b for a, b in verdicts), verdicts
    assert {a for a, _ in verdicts} == {"completed", "refused"}  # both verdicts were checked
    assert code == 0
    table = json.loads((out / "study.json").read_text(encoding="utf-8"))["cells"]
    assert [row["trials"] for row in table] == [2, 2]

"""An agent's install completes a purchase against a market from the full install (issue 39).

A fresh virtual environment gets only ``pip install dpmarket`` from this working tree (no
extra: no Ray, scikit-learn, matplotlib, pyarrow or numba; pip takes its dependencies from the
package registries or its own cache). Its ``dpmarket owner serve`` and ``dpmarket node serve``
run configs/remote/'s agents as shipped (remote_setup.py ``build_shipped``) against ``dpmarket
run`` of this interpreter's full install, and the purchase completes: every agent exits 0 and
every owner's own store holds its charges. The same install's ``dpmarket run`` names the extra
it lacks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.remote_setup import ROOT, build_shipped, charged_labels

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.venv]

RUN = 900.0  # seconds a market run may take on 2 loaded cores (generous; never asserted)
INSTALL = 1200.0  # seconds for pip to build and install the agent's install (never asserted)
SOURCES = ("pyproject.toml", "README.md", "api", "protocol", "streams", "actors")
MARKET_RUNTIME = {"ray", "scikit-learn", "matplotlib", "pyarrow", "numba", "llvmlite"}


def _env() -> dict[str, str]:
    """This environment without what would point the new install at this tree's packages."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def agent_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` folder of a fresh virtual environment holding only the agent's install.
    The sources are copied first, so pip's build leaves nothing in the working tree."""
    root = tmp_path_factory.mktemp("agent-install")
    source = root / "source"
    source.mkdir()
    for name in SOURCES:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, source / name)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=_env())
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(source)],
        check=True, env=_env(), timeout=INSTALL, cwd=root,
    )  # fmt: skip
    return venv / "bin"


def test_the_agents_install_holds_no_market_runtime(agent_install: Path) -> None:
    listed = subprocess.run(
        [str(agent_install / "python"), "-m", "pip", "list", "--format=json"],
        check=True, capture_output=True, text=True, env=_env(),
    )  # fmt: skip
    installed = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert "dpmarket" in installed and "grpcio" in installed
    assert installed & MARKET_RUNTIME == set()
    refused = subprocess.run(
        [str(agent_install / "dpmarket"), "run", str(ROOT / "configs" / "demo.toml")],
        capture_output=True, text=True, env=_env(), cwd=agent_install,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "pip install 'dpmarket[market]'" in refused.stderr


def test_agents_from_the_agents_install_complete_a_purchase(
    agent_install: Path, tmp_path: Path
) -> None:
    agent = [str(agent_install / "dpmarket")]
    with build_shipped(tmp_path / "m") as market:
        parties = [*market.nodes, *market.owners]
        out = tmp_path / "out"
        driver = market.run(out)  # the market: this interpreter's full install
        market.start_agents(entry=agent)
        assert driver.wait(timeout=RUN) == 0, market.log("market").read_text()[-4000:]
        assert market.wait_agents(parties) == dict.fromkeys(parties, 0)
        report = json.loads((out / "report.json").read_text())
        assert report["faults"]["remote"]["owners"] == market.owners
        assert report["faults"]["remote"]["declined"] == {}
        assert report["faults"]["lost"] == {}
        for owner in market.owners:
            kinds = sorted(label.split(":")[0] for label in charged_labels(market.store(owner)))
            assert kinds == ["normalise (secure sum)", "scan (secure sum)", "summary plan"]

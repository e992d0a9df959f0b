"""Packages by role (issue 39): ``pip install dpmarket`` is an agent's install, the market's
runtime is the ``market`` extra.

Every third-party module the three packages import is declared in pyproject.toml; the agents'
modules and ``dpmarket owner serve --help`` / ``node serve --help`` load none of the market's
runtime (checked in a fresh interpreter, where nothing a test imported earlier is loaded); in a
process that cannot import the market's runtime the agents' code takes its numpy paths and a
market command says which extra it needs. tests/integration/test_agent_install.py builds the
agent's install for real and completes a purchase with it.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from dpmarket.actors.commands import main as cli

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
# modules an agent's process must never load: the market's runtime and the compiled kernels
# (numba is an agent's option, imported on first use, never by importing the agent)
NOT_IN_AGENTS = ("ray", "sklearn", "matplotlib", "pyarrow", "numba", "llvmlite")
AGENT_MODULES = (
    "dpmarket.actors.remote.owneragent",
    "dpmarket.actors.remote.nodeagent",
    "dpmarket.actors.remote.agentconfig",
    "dpmarket.actors.parties.owner",
    "dpmarket.actors.parties.compute",
    "dpmarket.actors.commands.main",
)


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement string (``ray[default]>=2`` -> ray)."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _declared() -> dict[str, set[str]]:
    """Distribution names per group: "base" and each extra."""
    project = PYPROJECT["project"]
    groups = {"base": {_name(r) for r in project["dependencies"]}}
    for extra, requirements in project["optional-dependencies"].items():
        groups[extra] = {_name(r) for r in requirements}
    return groups


def _optional(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside a ``try`` that catches ImportError: used when installed
    (tqdm's progress bar), never required."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
            for h in node.handlers
        ):
            found |= {id(n) for part in node.body for n in ast.walk(part)}
    return found


def _imported_modules() -> set[str]:
    """Top-level names of every module imported anywhere in api/ (the Python API, the
    dpmarket package), protocol/, streams/, actors/ (except optional ones, :func:`_optional`)."""
    found: set[str] = set()
    for package in ("api", "protocol", "streams", "actors"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            optional = _optional(tree)
            for node in ast.walk(tree):
                if id(node) in optional:
                    continue
                if isinstance(node, ast.Import):
                    found |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"dpmarket", "__future__"}


def test_every_imported_package_is_declared() -> None:
    declared = set().union(*_declared().values())
    owners = packages_distributions()
    undeclared = {
        module: owners.get(module)
        for module in _imported_modules()
        if not {_name(d) for d in owners.get(module, [module])} & declared
    }
    assert undeclared == {}, f"imported but not in pyproject.toml: {undeclared}"


def test_the_agents_install_holds_none_of_the_markets_runtime() -> None:
    groups = _declared()
    assert "grpc" in _imported_modules() and "grpcio" in groups["base"]  # actors/remote/
    assert groups["base"].isdisjoint({"ray", "scikit-learn", "matplotlib", "pyarrow", "numba"})
    # the CLI's table of what a market command needs is the market extra, less numba (whose
    # absence only means the numpy paths)
    assert {_name(d) for d in cli.MARKET_EXTRA.values()} == groups["market"] - {"numba"}
    assert groups["numba"] == {"numba"} and "numba" in groups["market"]


def _fresh(code: str) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter; its last stdout line is a JSON object."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_agent_modules_and_their_commands_load_no_market_runtime() -> None:
    """Importing every agent module and running ``owner serve --help``, ``node serve --help``
    and ``certs init --help`` loads neither Ray nor anything else of the market's extra."""
    code = f"""
import contextlib, io, json, sys
for module in {AGENT_MODULES!r}:
    __import__(module)
from dpmarket.actors.commands.main import main
for argv in (["owner", "serve", "--help"], ["node", "serve", "--help"], ["certs", "init", "-h"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main(argv)
print(json.dumps({{"loaded": [m for m in {NOT_IN_AGENTS!r} if m in sys.modules]}}))
"""
    assert _fresh(code) == {"loaded": []}


# a fresh interpreter in which the market's runtime cannot be imported (as in an agent's
# install): a None entry in sys.modules makes ``import ray`` raise ModuleNotFoundError
WITHOUT_MARKET = f"""
import sys
for module in {NOT_IN_AGENTS!r}:
    sys.modules[module] = None
"""


def test_without_the_market_runtime_the_agents_code_takes_its_numpy_paths() -> None:
    code = (
        WITHOUT_MARKET
        + """
import json
import numpy as np
from dpmarket.streams.race.kernels import resolve_backend
from dpmarket.streams.race.lsh import make_family
from dpmarket.streams.race.sketch import RaceSketch
from dpmarket.streams.records.schema import Schema
from dpmarket.streams.records.text import CsvDecoder

sketch = RaceSketch(make_family("l2", 2, 8, 0, bandwidth=1.0), 16)
sketch.update(np.array([[0.1, 0.2], [0.3, -0.4]], dtype=np.float32))
decoded = CsvDecoder(Schema(2, (-1.0, -1.0), (1.0, 1.0))).decode(b"0.5,0.25\\n1e-1, -2\\n")
print(json.dumps({
    "auto": resolve_backend("auto"),
    "sketch": sketch.backend,
    "counted": int(sketch.counts.sum()),
    "rows": decoded.batch.features.tolist(),
}))
"""
    )
    assert _fresh(code) == {
        "auto": "numpy",
        "sketch": "numpy",
        "counted": 16,  # two records in each of 8 rows
        "rows": [[0.5, 0.25], [0.10000000149011612, -1.0]],  # clipped to the bounds
    }


def test_a_market_command_without_the_market_runtime_names_the_extra(tmp_path: Path) -> None:
    code = (
        WITHOUT_MARKET
        + f"""
import contextlib, io, json
from dpmarket.actors.commands.main import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    code = main(["run", {str(ROOT / "configs" / "demo.toml")!r}, "--out", {str(tmp_path)!r}])
print(json.dumps({{"code": code, "err": err.getvalue()}}))
"""
    )
    out = _fresh(code)
    assert out["code"] == 2
    assert "dpmarket run: needs the market's runtime" in str(out["err"])
    assert "pip install 'dpmarket[market]'" in str(out["err"])
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_an_input_that_needs_the_market_extra_is_told_so(tmp_path: Path) -> None:
    """A command an agent's install runs, asked for something that needs the market's extra
    (``budget --plot`` draws with matplotlib), names the extra instead of a traceback."""
    store = tmp_path / "ledger.sqlite"
    code = (
        WITHOUT_MARKET
        + f"""
import contextlib, io, json
from dpmarket.actors.budgets.store import LedgerStore
from dpmarket.actors.commands.main import main
from dpmarket.protocol.privacy.filter import RenyiFilter
LedgerStore({str(store)!r}, "owner-1", RenyiFilter(1.0, 1e-5)).close()
err = io.StringIO()
with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    code = main(["budget", {str(store)!r}, "--plot", {str(tmp_path / "spent.png")!r}])
print(json.dumps({{"code": code, "err": err.getvalue()}}))
"""
    )
    assert _fresh(code) == {
        "code": 2,
        "err": "dpmarket budget: needs the market's runtime, which this install lacks "
        "(matplotlib not installed): pip install 'dpmarket[market]'\n",
    }


def test_the_python_api_without_the_market_runtime_names_the_extra() -> None:
    """``import dpmarket`` loads nothing of the market (its names load on first use); calling
    one without the market's extra is an ImportError that names it (issue 40)."""
    code = (
        WITHOUT_MARKET
        + f"""
import json, sys
import dpmarket
loaded = [m for m in {NOT_IN_AGENTS!r} if sys.modules.get(m) is not None]
try:
    dpmarket.run_market
    message = ""
except ImportError as exc:
    message = str(exc)
print(json.dumps({{"loaded": loaded, "message": message}}))
"""
    )
    out = _fresh(code)
    assert out["loaded"] == []
    assert "dpmarket.run_market needs the market's runtime" in str(out["message"])
    assert cli.INSTALL_MARKET in str(out["message"])  # the command's words

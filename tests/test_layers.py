"""Layer rules: ``protocol/`` and ``streams/`` stay pure (numpy + stdlib, no I/O, no clocks).

Every ``.py`` file under those two folders is parsed with :mod:`ast` (never imported) and
checked for: imports of I/O, concurrency, clock and global-randomness modules, imports of
``dpmarket.actors`` (and of ``dpmarket.streams`` from ``protocol/``), ``open(...)`` and
``__import__(...)`` calls, and uses of numpy's global random state (``np.random.seed``,
``np.random.rand``, ``np.random.normal``, ...; only ``default_rng``, ``Generator`` and the bit
generators are allowed). Three files of ``streams/`` may do file I/O: ``tail.py`` (asyncio, os,
pathlib), ``files.py`` (pathlib, os, io) and ``position.py`` (pathlib, os). A failure lists
every offence as ``file:line``.
The checker is itself tested on synthetic sources so that it cannot pass vacuously.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PURE_PACKAGES = ("protocol", "streams")

FORBIDDEN = frozenset(
    {
        "ray",
        "asyncio",
        "socket",
        "selectors",
        "subprocess",
        "threading",
        "multiprocessing",
        "concurrent",
        "time",
        "datetime",
        "random",
        "os",
        "pathlib",
        "io",
        "shutil",
        "tempfile",
        "glob",
        "pickle",
        "importlib",
    }
)
FILE_EXCEPTIONS: dict[str, frozenset[str]] = {
    "streams/records/tail.py": frozenset({"asyncio", "os", "pathlib"}),
    "streams/records/files.py": frozenset({"pathlib", "os", "io"}),
    "streams/records/position.py": frozenset({"pathlib", "os"}),
}
MAY_OPEN = frozenset(FILE_EXCEPTIONS)

# Inner rules of the sans-I/O core: which protocol subsystems each may import. wire and privacy
# are the shared foundation; the three papers' systems never reach into each other, except that
# regression runs its sums through securesum. streams may use the foundation and never the
# summarisation (its sketches must stay usable without a market).
PROTOCOL_DEPENDENCIES: dict[str, frozenset[str]] = {
    "wire": frozenset(),
    "privacy": frozenset(),
    "summary": frozenset({"wire", "privacy"}),
    "securesum": frozenset({"wire", "privacy"}),
    "regression": frozenset({"wire", "privacy", "securesum"}),
    "agents": frozenset({"wire", "privacy", "securesum", "summary"}),
}
STREAMS_MAY_NOT = ("dpmarket.protocol.summary",)
NUMPY_RANDOM_ALLOWED = frozenset(
    {"default_rng", "Generator", "BitGenerator", "SeedSequence", "PCG64", "PCG64DXSM", "Philox"}
    | {"SFC64", "MT19937"}
)


def package_of(relpath: str) -> list[str]:
    """The installed dotted package of a file, e.g. protocol/x.py -> [dpmarket, protocol]."""
    folders = relpath.split("/")[:-1]
    return ["dpmarket", *(folders[1:] if folders[:1] == ["api"] else folders)]  # api/: dpmarket


@dataclass
class Checker(ast.NodeVisitor):
    """Collects layer violations of one source file as ``relpath:line: reason`` strings."""

    relpath: str
    found: list[str] = field(default_factory=list)
    numpy_names: set[str] = field(default_factory=set)  # names bound to the numpy module
    random_names: set[str] = field(default_factory=set)  # names bound to numpy.random

    def flag(self, node: ast.AST, reason: str) -> None:
        self.found.append(f"{self.relpath}:{getattr(node, 'lineno', 0)}: {reason}")

    def check_module(self, node: ast.AST, module: str) -> None:
        """One imported absolute module name against the layer rules."""
        top = module.split(".")[0]
        allowed = FILE_EXCEPTIONS.get(self.relpath, frozenset())
        if top in FORBIDDEN and top not in allowed:
            self.flag(node, f"imports {module!r} (no I/O, clocks, threads or global RNG)")
        if module == "dpmarket.actors" or module.startswith("dpmarket.actors."):
            self.flag(node, f"imports {module!r} (the actors layer sits above this one)")
        streams = module == "dpmarket.streams" or module.startswith("dpmarket.streams.")
        if self.relpath.startswith("protocol/") and streams:
            self.flag(node, f"imports {module!r} (protocol/ must not depend on streams/)")
        self.check_subsystem(node, module)

    def check_subsystem(self, node: ast.AST, module: str) -> None:
        """The inner rules: PROTOCOL_DEPENDENCIES and STREAMS_MAY_NOT."""
        parts = module.split(".")
        if self.relpath.startswith("streams/") and any(
            module == banned or module.startswith(banned + ".") for banned in STREAMS_MAY_NOT
        ):
            self.flag(node, f"imports {module!r} (streams/ never uses the summarisation)")
        if not self.relpath.startswith("protocol/") or parts[:2] != ["dpmarket", "protocol"]:
            return
        if len(parts) < 3 or parts[2] not in PROTOCOL_DEPENDENCIES:
            return  # the protocol package itself (nothing else lives at its top)
        own_parts = self.relpath.split("/")
        own = own_parts[1] if len(own_parts) > 2 else ""
        target = parts[2]
        if target != own and target not in PROTOCOL_DEPENDENCIES.get(own, frozenset()):
            self.flag(
                node,
                f"imports {module!r} (protocol/{own or '<top>'} may use only "
                f"{sorted(PROTOCOL_DEPENDENCIES.get(own, frozenset())) or 'itself'})",
            )

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.check_module(node, alias.name)
            if alias.name == "numpy":
                self.numpy_names.add(alias.asname or "numpy")
            elif alias.name == "numpy.random":
                if alias.asname:
                    self.random_names.add(alias.asname)
                else:
                    self.numpy_names.add("numpy")
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module.split(".") if node.module else []
        if node.level:
            package = package_of(self.relpath)
            base = package[: len(package) - node.level + 1] + base
        module = ".".join(base)
        self.check_module(node, module)
        for alias in node.names:
            if alias.name != "*":
                self.check_module(node, f"{module}.{alias.name}")
            if module == "numpy" and alias.name == "random":
                self.random_names.add(alias.asname or "random")
            elif module == "numpy.random" and alias.name not in NUMPY_RANDOM_ALLOWED:
                self.flag(node, f"imports numpy.random.{alias.name} (global random state)")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name):
            if node.func.id == "open" and self.relpath not in MAY_OPEN:
                self.flag(node, "calls open() (files are opened only by streams/records/files.py)")
            if node.func.id == "__import__":
                self.flag(node, "calls __import__() (dynamic imports hide dependencies)")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        target = node.value
        numpy_random = (
            isinstance(target, ast.Attribute)
            and target.attr == "random"
            and isinstance(target.value, ast.Name)
            and target.value.id in self.numpy_names
        )
        alias_random = isinstance(target, ast.Name) and target.id in self.random_names
        if (numpy_random or alias_random) and node.attr not in NUMPY_RANDOM_ALLOWED:
            self.flag(node, f"uses numpy.random.{node.attr} (pass a numpy Generator instead)")
        self.generic_visit(node)


def violations(source: str, relpath: str) -> list[str]:
    """All layer violations of one source text, as ``relpath:line: reason`` strings."""
    try:
        tree = ast.parse(source, filename=relpath)
    except SyntaxError as exc:
        return [f"{relpath}:{exc.lineno}: does not parse ({exc.msg})"]
    checker = Checker(relpath)
    # Imports first, so that aliases are known wherever numpy.random is used.
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            checker.visit(node)
    checker.found.clear()
    checker.visit(tree)
    return checker.found


def pure_files() -> list[Path]:
    return sorted(p for pkg in PURE_PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_pure_layers_have_no_io_clocks_threads_or_global_rng() -> None:
    files = pure_files()
    assert ROOT / "protocol" / "wire" / "codec.py" in files  # the scan really looks at the tree
    found = [
        v
        for path in files
        for v in violations(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    ]
    assert not found, "layer violations:\n" + "\n".join(found)


# --------------------------------------------------------------------- the checker itself
BAD_SOURCE = """\
import numpy as np
import ray
from asyncio import sleep
import time, os.path
from datetime import datetime
import random
from dpmarket.actors.run.spawn import run
from ..actors import transport
from dpmarket import actors
x = open("f")
np.random.seed(3)
y = np.random.rand(2) + np.random.normal(size=2)
from numpy import random as npr
z = npr.uniform()
from numpy.random import randint
m = __import__("socket")
"""
BAD_LINES = {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 15, 16}


def lines(found: list[str]) -> set[int]:
    return {int(v.split(":")[1]) for v in found}


def test_checker_flags_every_kind_of_offence() -> None:
    found = violations(BAD_SOURCE, "streams/example.py")
    assert lines(found) == BAD_LINES, found
    assert all(v.startswith("streams/example.py:") for v in found)
    assert sum(":12:" in v for v in found) == 2  # rand and normal on one line
    assert any("'os.path'" in v and "'time'" not in v for v in found)
    assert any("'time'" in v for v in found)


def test_checker_refuses_streams_in_protocol_only() -> None:
    source = "from dpmarket.streams.synthetic import blobs\nfrom ..streams import records\n"
    assert lines(violations(source, "protocol/x.py")) == {1, 2}
    assert violations(source, "streams/x.py") == []
    assert violations("from . import records\n", "streams/x.py") == []


def test_checker_accepts_clean_source() -> None:
    source = (
        "from __future__ import annotations\n"
        "import math\nimport numpy as np\nimport numpy.typing as npt\n"
        "from dpmarket.protocol.wire.errors import ProtocolError\n"
        "from .messages import encode\n"
        "def f(rng: np.random.Generator) -> float:\n"
        "    g = np.random.default_rng(np.random.SeedSequence(1))\n"
        "    return float(rng.normal() + g.random() + math.pi)\n"
        "class C:\n    def open(self) -> None:\n        self.random = 1\n"
    )
    assert violations(source, "protocol/summary/x.py") == []


@pytest.mark.parametrize(
    ("relpath", "source", "flagged"),
    [
        ("streams/records/tail.py", "import asyncio\nimport os\nfrom pathlib import Path\n", set()),
        ("streams/records/tail.py", "import io\nimport time\n", {1, 2}),
        ("streams/records/files.py", "import io\nimport os\nx = open('f')\n", set()),
        ("streams/records/files.py", "import asyncio\n", {1}),
        ("protocol/tail.py", "import asyncio\nx = open('f')\n", {1, 2}),
        ("streams/other.py", "import pathlib\n", {1}),
    ],
)
def test_checker_exceptions_are_exact(relpath: str, source: str, flagged: set[int]) -> None:
    assert lines(violations(source, relpath)) == flagged


def test_checker_reports_unparsable_files() -> None:
    assert violations("def broken(:\n", "protocol/bad.py")[0].startswith("protocol/bad.py:1:")


def test_every_protocol_and_streams_module_lives_in_a_subsystem() -> None:
    """The tree reads as the architecture: nothing but ``__init__.py`` at the top of protocol/,
    and every protocol subpackage is one the dependency rules know."""
    top = sorted(p.name for p in (ROOT / "protocol").glob("*.py"))
    assert top == ["__init__.py"]
    subsystems = {p.name for p in (ROOT / "protocol").iterdir() if (p / "__init__.py").exists()}
    assert subsystems == set(PROTOCOL_DEPENDENCIES)
    assert {p.name for p in (ROOT / "streams").iterdir() if (p / "__init__.py").exists()} == {
        "records",
        "race",
    }


@pytest.mark.parametrize(
    ("relpath", "source", "flagged"),
    [
        ("protocol/wire/x.py", "from dpmarket.protocol.privacy.ledger import L\n", {1}),
        ("protocol/privacy/x.py", "from dpmarket.protocol.wire.codec import encode\n", {1}),
        ("protocol/summary/x.py", "from dpmarket.protocol.securesum.spec import D\n", {1}),
        ("protocol/securesum/x.py", "from ..summary import curator\n", {1}),
        ("protocol/securesum/x.py", "from dpmarket.protocol.regression import model\n", {1}),
        ("protocol/summary/x.py", "from dpmarket.protocol.wire.codec import encode\n"
         "from dpmarket.protocol.privacy.ledger import L\nfrom .releases import r\n", set()),
        ("protocol/regression/x.py", "from dpmarket.protocol.securesum.driver import d\n", set()),
        ("streams/race/x.py", "from dpmarket.protocol.summary.h1 import h\n", {1}),
        ("streams/race/x.py", "from dpmarket.protocol.privacy.ledger import L\n", set()),
    ],
)  # fmt: skip
def test_checker_enforces_the_subsystem_rules(relpath: str, source: str, flagged: set[int]) -> None:
    assert lines(violations(source, relpath)) == flagged


# ------------------------------------------------------------------ the runtime's rooms (issue 25)
# Which rooms of ``actors/`` each room may import (docs/ARCHITECTURE.md, "Rooms of the runtime",
# states the same table; a test holds the two equal). ``randomness`` is the one module at the top.
ACTORS_DEPENDENCIES: dict[str, frozenset[str]] = {
    "randomness": frozenset(),
    "budgets": frozenset(),
    "config": frozenset({"randomness", "budgets"}),
    "cluster": frozenset({"config"}),
    "parties": frozenset({"randomness", "budgets", "cluster"}),
    "harness": frozenset({"randomness", "config", "parties"}),
    "remote": frozenset({"randomness", "budgets", "config", "cluster", "parties"}),
    "run": frozenset(
        {"randomness", "budgets", "config", "cluster", "parties", "harness", "remote"}
    ),
    "studies": frozenset({"randomness", "config", "cluster", "parties", "run", "harness"}),
    "commands": frozenset(
        {"randomness", "budgets", "config", "cluster", "parties", "harness", "remote", "run"}
        | {"studies"}
    ),
}


def actors_module(relpath: str) -> str:
    """actors/run/market.py -> run.market; actors/randomness.py -> randomness."""
    parts = relpath.removesuffix(".py").split("/")[1:]
    return ".".join(p for p in parts if p != "__init__")


def actors_imports(source: str, relpath: str, modules: set[str]) -> list[tuple[int, str]]:
    """Every ``dpmarket.actors`` module ``source`` imports, anywhere in the file (top level,
    inside functions, under ``TYPE_CHECKING``), as (line, module)."""
    found = []
    for node in ast.walk(ast.parse(source, filename=relpath)):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = node.module
            if node.level:
                package = package_of(relpath)
                module = ".".join([*package[: len(package) - node.level + 1], module])
            if module == "dpmarket.actors" or module.startswith("dpmarket.actors."):
                base = module.removeprefix("dpmarket.actors").lstrip(".")
                for alias in node.names:
                    name = f"{base}.{alias.name}".lstrip(".")
                    found.append((node.lineno, name if name in modules else base))
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name.removeprefix("dpmarket.actors."))
                for a in node.names
                if a.name.startswith("dpmarket.actors.")
            ]
    return [(line, m) for line, m in found if m]


def room_violations(sources: dict[str, str]) -> list[str]:
    """``relpath:line`` for every import of a room that ``ACTORS_DEPENDENCIES`` does not allow
    (an unknown room is a violation too)."""
    modules = {actors_module(r) for r in sources}
    found = []
    for relpath, source in sources.items():
        own = actors_module(relpath).split(".")[0]
        allowed = ACTORS_DEPENDENCIES.get(own)
        for line, module in actors_imports(source, relpath, modules):
            room = module.split(".")[0]
            if allowed is None or (room != own and room not in allowed):
                found.append(f"{relpath}:{line}: {own} imports {module} (allowed: "
                             f"{sorted(allowed or ())})")  # fmt: skip
    return found


def import_cycles(sources: dict[str, str]) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself)
    in the graph of ``actors`` imports, every import counted (Tarjan)."""
    modules = {actors_module(r) for r in sources}
    edges = {
        actors_module(r): {m for _, m in actors_imports(s, r, modules) if m in modules}
        for r, s in sources.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = [stack.pop()]
            while component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1 or v in edges[v]:
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return cycles


def actors_sources() -> dict[str, str]:
    return {
        p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted((ROOT / "actors").rglob("*.py"))
    }


def test_actors_rooms_import_only_what_the_architecture_allows() -> None:
    sources = actors_sources()
    assert "actors/run/market.py" in sources  # the scan really looks at the tree
    rooms = {actors_module(r).split(".")[0] for r in sources if r.count("/") > 1}
    assert rooms | {"randomness"} == set(ACTORS_DEPENDENCIES)  # every room has its rule
    found = room_violations(sources)
    assert not found, "room violations:\n" + "\n".join(found)


def test_no_import_circle_anywhere_in_actors() -> None:
    cycles = import_cycles(actors_sources())
    assert not cycles, f"import circles: {cycles}"


def test_the_room_checks_flag_a_wrong_import_and_a_circle() -> None:
    sources = {
        "actors/config/a.py": "from dpmarket.actors.run.market import run_market\n",
        "actors/run/market.py": "from dpmarket.actors.config import a\n",
        "actors/run/x.py": "def f():\n    from dpmarket.actors.run.y import g\n",
        "actors/run/y.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from dpmarket.actors.run.x import f\n",
        "actors/mystery/z.py": "from dpmarket.actors.run import x\n",
    }
    found = room_violations(sources)
    assert [f.split(":")[0] for f in found] == ["actors/config/a.py", "actors/mystery/z.py"]
    assert sorted(import_cycles(sources)) == [["config.a", "run.market"], ["run.x", "run.y"]]
    assert import_cycles({**sources, "actors/run/x.py": "", "actors/config/a.py": ""}) == []


def test_the_architecture_document_states_the_same_room_rules() -> None:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("## Rooms of the runtime", 1)[1].split("\n## ", 1)[0]
    stated: dict[str, frozenset[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            room = cells[0].strip("`").removeprefix("actors/").rstrip("/").removesuffix(".py")
            names = {n.strip("` ") for n in cells[2].split(",")} - {"nothing", ""}
            stated[room] = frozenset(n.rstrip("/").removesuffix(".py") for n in names)
    assert stated == ACTORS_DEPENDENCIES


# The Python API (api/, installed as the dpmarket package itself, issue 40) sits above every
# room and below the commands: only actors/commands/ may call it, and it never imports a
# command (the CLI prints what it returns).
def api_imports(source: str) -> list[tuple[int, str]]:
    """Every module a source imports that is the top-level package or its API, or a command."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        found += [
            (node.lineno, n)
            for n in names
            if n.startswith(("dpmarket.api", "dpmarket.actors.commands"))
            or (n.count(".") == 1 and n.split(".")[0] == "dpmarket" and n.split(".")[1] not in
                ("protocol", "streams", "actors"))  # an API name: from dpmarket import run_market
        ]  # fmt: skip
    return found


def api_violations(sources: dict[str, str]) -> list[str]:
    out = []
    for relpath, source in sources.items():
        for line, name in api_imports(source):
            commands = name.startswith("dpmarket.actors.commands")
            if relpath.startswith("api/") and commands:
                out.append(f"{relpath}:{line}: the API imports a command, {name}")
            top = not commands
            if top and relpath.startswith("actors/") and not relpath.startswith("actors/commands/"):
                out.append(f"{relpath}:{line}: only actors/commands/ may call the API, {name}")
    return out


def test_the_api_is_called_only_by_the_commands_and_imports_none() -> None:
    sources = actors_sources() | {
        p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted((ROOT / "api").glob("*.py"))
    }
    assert "api/api.py" in sources
    found = api_violations(sources)
    assert not found, "\n".join(found)
    bad = {
        "api/api.py": "from dpmarket.actors.commands.market import print_report\n",
        "actors/run/x.py": "import dpmarket.api as api\n",
        "actors/commands/x.py": "def f():\n    import dpmarket.api as api\n",
        "actors/studies/x.py": "from dpmarket import simulate\n",
        "actors/cluster/x.py": "import dpmarket\nfrom dpmarket import protocol\n",  # allowed
    }
    assert {v.split(":")[0] for v in api_violations(bad)} == {
        "api/api.py",
        "actors/run/x.py",
        "actors/studies/x.py",
    }


def test_importing_a_subpackage_loads_no_api_and_no_ray() -> None:
    """``api/__init__.py`` (the ``dpmarket`` package) loads its names on first use: the
    sans-I/O core and an agent's modules import without the runtime behind the API."""
    import subprocess
    import sys

    probe = (
        "import sys, dpmarket, dpmarket.protocol.wire.codec, dpmarket.streams.race.sketch\n"
        "print('dpmarket.api' in sys.modules, 'ray' in sys.modules)\n"
        "dpmarket.load_config\n"
        "print('dpmarket.api' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False", "True"]

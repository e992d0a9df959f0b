"""The code shipped with a job: a ``dpmarket`` package for Ray's runtime_env, and its identity.

The checkout has no ``dpmarket/`` folder (setuptools maps ``api/`` to ``dpmarket`` and
``protocol/``, ``streams/`` and ``actors/`` to ``dpmarket.*``), so Ray's ``working_dir`` cannot
carry the code, and a worker whose path holds the checkout (Ray puts the driver's directory
there) finds no ``dpmarket`` in it to shadow the shipped one. Instead the
driver assembles a ``dpmarket`` package directory from the very modules it imported (the three
subpackages' ``.py`` files and an ``__init__.py`` that records the version) and passes it as
``runtime_env={"py_modules": [dir]}``: Ray uploads it once and puts it on every worker's path,
so the nodes need only Ray, Python and the dependencies (installed by the cluster YAMLs).

:func:`connect_runtime_env` decides (actors/cluster/connect.py calls it): ship when joining a
cluster by
address, never for the embedded local instance (its workers import the driver's own install),
and not inside a Ray job whose own runtime_env already ships ``py_modules`` (``ray job submit``
with the directory ``python -m dpmarket.actors.cluster.shipping DIR`` writes; Ray refuses two
values of
one field). ``DPMARKET_SHIP=always|never`` overrides the choice.

Every actor reports :func:`code_identity` (version and a fingerprint of the source files);
:func:`require_same_code` refuses, by actor name and node, any that differs from the driver's.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from dpmarket.actors.config.checks import ConfigError

__all__ = [
    "build_package",
    "code_identity",
    "connect_runtime_env",
    "require_same_code",
]

SUBPACKAGES = ("protocol", "streams", "actors")
_BUILT: dict[str, Path] = {}  # one package directory per driver process


def _roots() -> dict[str, Path]:
    import dpmarket.actors
    import dpmarket.protocol
    import dpmarket.streams

    modules = {
        "protocol": dpmarket.protocol,
        "streams": dpmarket.streams,
        "actors": dpmarket.actors,
    }
    return {name: Path(str(m.__file__)).parent for name, m in modules.items()}


def _top() -> list[Path]:
    """The files of the ``dpmarket`` package itself, beside its subpackages: the Python API
    (``api/`` in a checkout; ``__init__.py``, ``api.py``, ``py.typed``), which the command line
    calls, so a job's driver needs it too."""
    import dpmarket

    top = Path(str(dpmarket.__file__)).parent
    return sorted(p for p in top.iterdir() if p.is_file() and p.suffix in (".py", ".typed"))


def _sources(root: Path) -> list[Path]:
    return sorted(
        p for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".typed")
        and "__pycache__" not in p.parts
    )  # fmt: skip


def _version() -> str:
    import dpmarket

    shipped = getattr(dpmarket, "__version__", None)  # the shipped package records it
    if isinstance(shipped, str):
        return shipped
    try:
        return importlib.metadata.version("dpmarket")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def code_identity() -> dict[str, str]:
    """This process's dpmarket: its version, a fingerprint of every source file (path and
    bytes) and where it was imported from."""
    digest = hashlib.blake2b(digest_size=8)
    roots = _roots()
    for name, root in roots.items():
        for path in _sources(root):
            digest.update(f"{name}/{path.relative_to(root).as_posix()}\0".encode())
            digest.update(path.read_bytes())
    for path in _top():  # the API; not __init__.py, which the shipped copy extends
        if path.name != "__init__.py":
            digest.update(f"{path.name}\0".encode())
            digest.update(path.read_bytes())
    return {
        "version": _version(),
        "fingerprint": digest.hexdigest(),
        "path": str(roots["actors"].parent),
    }


def build_package(target: Path | None = None) -> Path:
    """Write ``TARGET/dpmarket`` (default: a fresh temporary directory) from the imported
    modules; return the package directory, the value for ``py_modules``."""
    root = Path(target) if target is not None else Path(tempfile.mkdtemp(prefix="dpmarket-ship-"))
    package = root / "dpmarket"
    if package.exists():
        shutil.rmtree(package)
    for name, source in _roots().items():
        for path in _sources(source):
            dest = package / name / path.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
    package.mkdir(parents=True, exist_ok=True)
    for path in _top():  # the API, and the package's own __init__.py
        shutil.copyfile(path, package / path.name)
    init = package / "__init__.py"
    own = init.read_text(encoding="utf-8") if init.exists() else ""
    init.write_text(
        f"{own}\n# shipped with a Ray job (actors/cluster/shipping.py)\n"
        f"__version__ = {_version()!r}\n",
        encoding="utf-8",
    )
    return package


def _job_ships_code() -> bool:
    """Inside a Ray job whose runtime_env already carries ``py_modules``."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return False
    try:
        runtime_env = json.loads(raw).get("runtime_env") or {}
    except (ValueError, AttributeError):
        return False
    return bool(runtime_env.get("py_modules"))


def connect_runtime_env(target: str | None) -> dict[str, Any] | None:
    """The runtime_env for ``ray.init`` (``None``: ship nothing); see the module docstring."""
    mode = os.environ.get("DPMARKET_SHIP", "auto")
    if mode not in ("auto", "always", "never"):
        raise ConfigError(f"DPMARKET_SHIP: {mode!r} is not one of 'auto', 'always', 'never'")
    if mode == "never" or (mode == "auto" and (not target or _job_ships_code())):
        return None
    if "dir" not in _BUILT:  # uploaded by ray.init; removed when the driver exits
        _BUILT["dir"] = build_package()
        atexit.register(shutil.rmtree, _BUILT["dir"].parent, ignore_errors=True)
    return {"py_modules": [str(_BUILT["dir"])]}


def require_same_code(reports: dict[str, dict[str, Any]]) -> None:
    """Refuse (ConfigError, exit 2) actors whose dpmarket differs from this driver's;
    ``reports`` maps an actor's name to its :func:`code_identity` (plus ``node_id``, ``ip``)."""
    mine = code_identity()
    for name, report in reports.items():
        theirs = report.get("code", {})
        if (theirs.get("version"), theirs.get("fingerprint")) != (
            mine["version"],
            mine["fingerprint"],
        ):
            raise ConfigError(
                f"{name} on node {report.get('node_id', '?')} ({report.get('ip', '?')}) runs "
                f"dpmarket {theirs.get('version')} ({theirs.get('fingerprint')}, from "
                f"{theirs.get('path')}); the driver runs {mine['version']} "
                f"({mine['fingerprint']}, from {mine['path']}): refused. Ship the driver's code "
                "(docs/guide/deploying.md) or install the same version on every node"
            )


if __name__ == "__main__":  # python -m dpmarket.actors.cluster.shipping DIR: for ray job submit
    if len(sys.argv) != 2:
        sys.exit("usage: python -m dpmarket.actors.cluster.shipping DIR  (writes DIR/dpmarket)")
    print(build_package(Path(sys.argv[1])))

"""docs/ARCHITECTURE.md stays true: its tree lists every module of the three packages, and
every module it lists exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("api", "protocol", "streams", "actors")


def listed_modules(text: str) -> set[str]:
    """Module paths of the fenced block under "## The tree": a line ``top/`` opens a package,
    a token ``sub/`` at the start of an indented line opens a subpackage (until the next one
    or a line that starts with a module), tokens ``x.py`` are modules."""
    block = text.split("## The tree", 1)[1].split("```", 2)[1]
    found: set[str] = set()
    top, sub = "", ""
    for line in block.splitlines():
        if re.match(r"^[a-z]+/\s*$", line):
            top, sub = line.strip(), ""
            continue
        tokens = line.split()
        if not tokens:
            continue
        if tokens[0].endswith("/") and line.startswith("  "):
            sub, tokens = tokens[0], tokens[1:]
        elif line.startswith("  ") and re.match(r"^  \S", line) and tokens[0].endswith(".py"):
            sub = ""  # a module directly in the top package
        elif not line.startswith(" ") and tokens[0].endswith(".py"):
            top, sub = "", ""  # a module at the top of the tree (streams/synthetic.py style)
        name = next((t for t in tokens if t.endswith(".py")), None)
        if name:
            found.add(f"{top}{sub}{name}")
    return found


def actual_modules() -> set[str]:
    return {
        p.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if p.name != "__init__.py"
    }


def test_the_tree_lists_exactly_the_modules_that_exist() -> None:
    listed = listed_modules((ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8"))
    actual = actual_modules()
    assert actual - listed == set(), "modules missing from docs/ARCHITECTURE.md"
    assert listed - actual == set(), "docs/ARCHITECTURE.md lists modules that do not exist"


def test_the_parser_reads_nested_and_top_level_modules() -> None:
    text = "## The tree\n```\nprotocol/\n  wire/  codec.py  x\n         checks.py  y\n"
    text += "  synthetic.py  z\nactors/\n  commands/  main.py\n  market.py  run\n```\n"
    assert listed_modules(text) == {
        "protocol/wire/codec.py",
        "protocol/wire/checks.py",
        "protocol/synthetic.py",
        "actors/commands/main.py",
        "actors/market.py",
    }

"""The README and the user guide (docs/guide/) stay true to the code: every ``dpmarket`` command
line they show parses with the real parser, every flag a command table names exists for that
command, every ``python -m`` module they name exists, and every configuration key they name
(``[section].key``, ``[owners.NAME].key``, ``--set section.key=...``) is one the config parser
accepts."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from dpmarket.actors.commands.main import build_parser
from dpmarket.actors.config.budgets import OWNER_BUDGET_KEYS
from dpmarket.actors.config.market import MARKET_SECTIONS
from dpmarket.actors.config.placement import PLACEMENT_KEYS
from dpmarket.actors.config.remote import REMOTE_KEYS
from dpmarket.actors.config.requests import REQUEST_KEYS
from dpmarket.actors.remote.agentconfig import SECTIONS_NODE, SECTIONS_OWNER

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
PROGRAMS = ("dpmarket", ".venv/bin/dpmarket", "python -m dpmarket.actors.commands.main")
KNOWN_KEYS: dict[str, set[str]] = {
    **{section: set(keys) for section, keys in MARKET_SECTIONS.items()},
    "owners.NAME": set(OWNER_BUDGET_KEYS | PLACEMENT_KEYS),
    "consumer": set(OWNER_BUDGET_KEYS),
    "requests": set(REQUEST_KEYS),
    "remote": set(REMOTE_KEYS),
    "nodes": {"pins"},
}
# an agent's own configuration (actors/remote/agentconfig.py): a section both files have
# ([market], [data]) accepts the keys of either
for _sections in (SECTIONS_OWNER, SECTIONS_NODE):
    for _name, _keys in _sections.items():
        KNOWN_KEYS.setdefault(_name, set()).update(_keys or set())
KEY = re.compile(r"\[\[?([a-z_]+(?:\.[A-Za-z_-]+)?)\]\]?\.([a-z_]+)")
SET = re.compile(r"--set[ =]([a-z_]+)\.([a-z_]+)=")


def fenced_lines(text: str) -> list[str]:
    """The logical lines of the fenced code blocks (continuations joined, comments cut)."""
    lines, inside, joined = [], False, ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("```"):
            inside = not inside
            continue
        if not inside:
            continue
        joined += raw.rstrip().removesuffix("\\")
        if raw.rstrip().endswith("\\"):
            continue
        line = joined.split(" #", 1)[0].strip().removesuffix("&")
        lines.append(" ".join(line.split()))
        joined = ""
    return lines


def command_lines() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for line in fenced_lines(page.read_text(encoding="utf-8")):
            for program in PROGRAMS:
                if line.startswith(program + " "):
                    out.append((f"{page.relative_to(ROOT)}", line.removeprefix(program).strip()))
            if " -- python -m dpmarket.actors.commands.main " in line:  # ray job submit ... --
                out.append((f"{page.relative_to(ROOT)}", line.split("commands.main ", 1)[1]))
    return out


def test_the_pages_show_commands_and_keys() -> None:
    assert len(command_lines()) >= 6  # the scan really finds the guide's commands
    assert any("[privacy].block_records" in p.read_text(encoding="utf-8") for p in PAGES)


@pytest.mark.parametrize(("page", "line"), command_lines())
def test_every_documented_command_line_parses(page: str, line: str) -> None:
    try:
        build_parser().parse_args(shlex.split(line))
    except SystemExit as exc:
        pytest.fail(f"{page}: `dpmarket {line}` does not parse (exit {exc.code})")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_flag_in_a_command_table_exists_for_its_command() -> None:
    commands = _subparsers(build_parser())
    problems, seen = [], 0
    for page in PAGES:
        for span in re.findall(r"`dpmarket ([a-z]+)([^`]*)`", page.read_text(encoding="utf-8")):
            name, rest = span
            seen += 1
            if name not in commands:
                problems.append(f"{page.name}: `dpmarket {name}`: no such command")
                continue
            flags = {o for a in commands[name]._actions for o in a.option_strings}
            for nested in _subparsers(commands[name]).values():  # sketch build|merge|...
                flags |= {o for a in nested._actions for o in a.option_strings}
            problems += [
                f"{page.name}: `dpmarket {name}` has no flag {flag}"
                for flag in re.findall(r"(--[a-z][a-z-]*)", rest)
                if flag not in flags
            ]
    assert seen >= 10
    assert not problems, "\n".join(problems)


def test_every_python_module_named_exists() -> None:
    names = {
        m for p in PAGES for m in re.findall(r"python -m (dpmarket[\w.]+)", p.read_text("utf-8"))
    }
    assert "dpmarket.actors.cluster.shipping" in names
    missing = [n for n in sorted(names) if importlib.util.find_spec(n) is None]
    assert not missing, f"modules named in the docs that do not exist: {missing}"


def test_every_configuration_key_named_exists() -> None:
    problems, seen = [], 0
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for section, key in [*KEY.findall(text), *SET.findall(text)]:
            seen += 1
            section = "owners.NAME" if section.startswith("owners.") else section
            if section == "section":  # the generic `--set section.key=value`
                continue
            if section not in KNOWN_KEYS or key not in KNOWN_KEYS[section]:
                problems.append(f"{page.name}: [{section}].{key} is not a configuration key")
    assert seen >= 10
    assert not problems, "\n".join(problems)


def test_the_checks_catch_a_wrong_command_and_a_wrong_key() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(shlex.split("run configs/demo.toml --outt x"))
    assert KEY.findall("set [privacy].blok_records") == [("privacy", "blok_records")]
    assert "blok_records" not in KNOWN_KEYS["privacy"]
    assert fenced_lines("```sh\ndpmarket run a.toml \\\n  --out b  # why\n```\n") == [
        "dpmarket run a.toml --out b"
    ]

"""The Python API (issue 40, item 4): docs/guide/python.md's snippets run as a notebook would
run them (one namespace, in order, from a copy of the repository's root), using only the
names at the package's top level: a purchase on Ray and a small study in process."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import dpmarket

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide" / "python.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)


def deep_names(source: str) -> list[str]:
    """Every use of dpmarket beyond its top-level names: ``import dpmarket.x``, ``from
    dpmarket.x import``, ``from dpmarket import y`` or ``dpmarket.y`` for y not exported."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("dpmarket.")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dpmarket"):
            if node.module != "dpmarket":
                found.append(str(node.module))
            found += [a.name for a in node.names if a.name not in dpmarket.__all__]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "dpmarket"
            and node.attr not in dpmarket.__all__
        ):
            found.append(f"dpmarket.{node.attr}")
    return found


def test_the_guide_uses_only_top_level_names() -> None:
    code = snippets()
    assert len(code) >= 6
    assert all(not deep_names(snippet) for snippet in code), [deep_names(s) for s in code]
    assert deep_names("import dpmarket.actors.run.market\ndpmarket.run\n") == [
        "dpmarket.actors.run.market",
        "dpmarket.run",
    ]  # the check sees what it must refuse


def test_the_guide_runs_a_purchase_and_a_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    for snippet in snippets():
        exec(compile(snippet, str(GUIDE), "exec"), namespace)  # the notebook's cells
    out = capsys.readouterr().out
    result, again, found = (namespace[k] for k in ("result", "again", "found"))
    assert isinstance(result, dpmarket.MarketResult) and isinstance(again, dpmarket.MarketResult)
    assert result.exit_code == 0 and result.outcome["state"] == "done"
    assert result.summary is not None and result.summary.features.shape == (40, 10)
    assert list(result.utility) == ["private", "random", "uniform", "greedy"]
    assert set(result.epsilon) == {"owner-1", "owner-2", "owner-3", "owner-4", "validation"}
    assert (tmp_path / "out" / "notebook-purchase" / "report.json") == result.paths["report.json"]
    assert "[summary].explore_share" in out and "explore_share = 0.0 passes" in out
    assert isinstance(found, dpmarket.StudyResult)
    assert len(found.cells) == 2 and len(found.trials) == 6
    assert {row["trials"] for row in found.cells} == {3}
    assert (tmp_path / "out" / "notebook-study" / "study.csv").is_file()

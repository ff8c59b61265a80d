"""The parameters a notebook takes: the assignments of its cell tagged `parameters`
(papermill's convention), with their defaults and the comments that explain them."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Parameter", "notebook_parameters"]


@dataclass(frozen=True)
class Parameter:
    """One parameter: its name, its default as written, and its comment."""

    name: str
    default: str
    help: str


def _parameters_cell(notebook: Path) -> str | None:
    # Plain JSON, not nbformat: `mtwork run --help` reads every notebook and should be quick.
    cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
    for cell in cells:
        if cell.get("cell_type") == "code" and "parameters" in cell.get("metadata", {}).get(
                "tags", []):
            source = cell.get("source", "")
            return "".join(source) if isinstance(source, list) else source
    return None


def notebook_parameters(notebook: Path) -> list[Parameter]:
    """The parameters of `notebook` in the order they are assigned (none without a
    `parameters` cell). A comment on the assignment's line explains it; failing that, the
    comment lines just above it."""
    source = _parameters_cell(notebook)
    if source is None:
        return []
    lines = source.splitlines()
    found = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.Assign | ast.AnnAssign):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        value = ast.get_source_segment(source, node.value) if node.value else ""
        help_text = _comment(lines, node)
        found += [Parameter(t.id, " ".join((value or "").split()), help_text)
                  for t in targets if isinstance(t, ast.Name)]
    return found


def _comment(lines: list[str], node: ast.stmt) -> str:
    last = lines[(node.end_lineno or node.lineno) - 1]
    code_end = node.end_col_offset or 0
    trailing = last[code_end:].strip()
    if trailing.startswith("#"):
        return trailing.lstrip("#").strip()
    above = []
    row = node.lineno - 2
    while row >= 0 and lines[row].strip().startswith("#"):
        above.insert(0, lines[row].strip().lstrip("#").strip())
        row -= 1
    return " ".join(above)

"""Every notebook runs headlessly through papermill with small parameters, and its HTML
walkthrough holds its figures. An oracle mismatch inside a notebook fails here. The
notebooks run once per session (`walkthroughs`); the browser checks of the same HTML are
in test_walkthrough_browser.py."""

import json
import os
import re
from pathlib import Path

import pytest

from mtwork.walkthrough.execute import NotebookRun
from mtwork.walkthrough.parameters import notebook_parameters
from mtwork.walkthrough.side_by_side import run_notebooks

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def ci_parameters(notebook: Path) -> dict:
    """The small parameters a notebook declares for CI, in its metadata (mtwork.ci)."""
    metadata = json.loads(notebook.read_text())["metadata"]
    return dict(metadata.get("mtwork", {}).get("ci", {}))


_RUNS: dict[str, NotebookRun] = {}


def executed_walkthroughs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, NotebookRun]:
    """Every notebook run on sim with its CI parameters and exported to HTML, once per
    session, whichever test module asks first; side by side, one per core."""
    if not _RUNS:
        out = tmp_path_factory.mktemp("walkthroughs")
        parameters = {nb: {"backend": "sim", **ci_parameters(nb)} for nb in NOTEBOOKS}
        runs = run_notebooks(NOTEBOOKS, out, parameters, jobs=os.cpu_count() or 1,
                             env={"MTWORK_BACKEND": "sim"})
        _RUNS.update({run.notebook.stem: run for run in runs})
    return _RUNS


@pytest.fixture(scope="session")
def walkthroughs(tmp_path_factory) -> dict[str, NotebookRun]:
    return executed_walkthroughs(tmp_path_factory)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_and_exports_html_with_figures(notebook, walkthroughs):
    run = walkthroughs[notebook.stem]
    assert run.ok, f"{notebook.name} failed in cell [{run.failed_cell}]: {run.error}"
    text = run.html.read_text()
    assert "plotly-graph-div" in text and "Plotly.newPlot" in text
    assert "Traceback" not in text


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_ci_parameters_are_parameters_the_notebook_declares(notebook):
    declared = {p.name for p in notebook_parameters(notebook)}
    assert "backend" in declared
    assert set(ci_parameters(notebook)) <= declared


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_are_committed_without_outputs(notebook):
    """Outputs belong in the walkthroughs, not in git (nbstripout keeps it so)."""
    cells = json.loads(notebook.read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    assert all(not c["outputs"] and c["execution_count"] is None for c in code)


def accidental_list_lines(markdown: str) -> list[str]:
    """Lines that start a list in the middle of a paragraph (a `+ ` or `- ` that wrapped
    onto the start of a line), outside code fences and $$ blocks."""
    found, fenced, prose = [], False, False
    for line in markdown.splitlines():
        if line.startswith("```") or line.strip() == "$$":
            fenced = not fenced
            prose = False
            continue
        if fenced:
            continue
        if re.match(r"[+*-] ", line) and prose:
            found.append(line)
        prose = bool(line.strip()) and not re.match(r"\s*([+*-]|\d+\.) |#|\||\s", line)
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_markdown_has_no_line_that_turns_into_a_list_by_accident(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    lines = [line for c in cells if c["cell_type"] == "markdown"
             for line in accidental_list_lines("".join(c["source"]))]
    assert not lines


def test_the_list_check_sees_a_wrapped_plus():
    assert accidental_list_lines("sums $x = ((0 + p)\n+ q) + r$ then") == ["+ q) + r$ then"]
    assert not accidental_list_lines("Intro:\n\n- one\n- two\n  more\n- three")

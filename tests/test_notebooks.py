"""Every notebook runs headlessly through papermill with small parameters, and its HTML
walkthrough holds its figures. An oracle mismatch inside a notebook fails here."""

from pathlib import Path

import pytest

from mtwork.cli import main, run_notebook

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def ci_parameters(notebook: Path) -> dict:
    """The small parameters a notebook declares for CI, in its metadata (mtwork.ci)."""
    import nbformat

    return dict(nbformat.read(notebook, as_version=4).metadata.get("mtwork", {}).get("ci", {}))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_and_exports_html_with_figures(notebook, tmp_path):
    html = run_notebook(notebook, tmp_path, {"backend": "sim", **ci_parameters(notebook)})
    text = html.read_text()
    assert "plotly-graph-div" in text and "Plotly.newPlot" in text
    assert "Traceback" not in text


def test_cli_reports_failure_for_a_missing_notebook(tmp_path, capsys):
    with pytest.raises(SystemExit, match="not found"):
        main(["run", str(tmp_path / "nope.ipynb"), "--out", str(tmp_path)])


def test_a_failing_notebook_makes_run_exit_nonzero(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("assert 1 + 1 == 3, 'oracle mismatch'")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 1

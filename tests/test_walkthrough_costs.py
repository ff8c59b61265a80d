"""What `mtwork run` does to cost less than running notebooks naively: the executed
notebook saved at most every few seconds (and always at the end), kernels that skip
importing jsonschema's IRI check, and the builds every notebook's first kernel waits for
started before the notebooks."""

import os
import subprocess
import sys

import nbformat
import papermill.engines
import pytest
from test_cli import write_notebook

from mtwork import cli
from mtwork.walkthrough import saving
from mtwork.walkthrough.shared_builds import start_shared_builds


@pytest.fixture
def writes(monkeypatch):
    """The notebooks papermill's manager writes, as the number of cells done in each."""
    done = []
    monkeypatch.setattr(papermill.engines, "write_ipynb", lambda nb, path: done.append(
        sum(c.metadata.papermill.get("status") == "completed" for c in nb.cells)))
    return done


def manager(tmp_path, cells: int):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"x = {i}") for i in range(cells)]
    for cell in nb.cells:
        cell.metadata.papermill = {}
    nb.metadata.papermill = {}
    return saving.SparseSaves(nb, output_path=str(tmp_path / "out.ipynb"), progress_bar=False)


def run_cells(man, clock, monkeypatch, seconds_each: float) -> None:
    for i, cell in enumerate(man.nb.cells):
        monkeypatch.setattr(saving.time, "monotonic", lambda: clock[0])
        man.cell_start(cell, i)
        clock[0] += seconds_each
        man.cell_complete(cell, i)


def test_quick_cells_save_once_at_the_start_and_once_at_the_end(tmp_path, writes, monkeypatch):
    man = manager(tmp_path, cells=20)
    clock = [1000.0]
    monkeypatch.setattr(saving.time, "monotonic", lambda: clock[0])
    man.notebook_start()
    run_cells(man, clock, monkeypatch, seconds_each=0.01)
    assert writes == [0]  # papermill alone writes 41 times here
    man.notebook_complete()
    assert writes == [0, 20]  # the end always saves, with every cell done


def test_slow_cells_are_saved_as_they_finish(tmp_path, writes, monkeypatch):
    man = manager(tmp_path, cells=4)
    clock = [1000.0]
    monkeypatch.setattr(saving.time, "monotonic", lambda: clock[0])
    man.notebook_start()
    run_cells(man, clock, monkeypatch, seconds_each=saving.SAVE_EVERY + 1)
    # Each cell's end comes SAVE_EVERY seconds after the last save: each is kept.
    assert writes == [0, 1, 2, 3, 4]


def test_a_failed_run_still_saves_what_ran(tmp_path):
    nb = write_notebook(tmp_path / "broken.ipynb", "x = 1", "raise ValueError('stop')",
                        "y = 2")
    assert cli.main(["run", str(nb), "--out", str(tmp_path / "out"), "--jobs", "1"]) == 1
    saved = nbformat.read(tmp_path / "out" / "broken.ipynb", as_version=4)
    code = [c for c in saved.cells if c.cell_type == "code"]
    assert [c.metadata.papermill["status"] for c in code] == ["completed", "failed", "pending"]
    assert code[1].outputs[0]["ename"] == "ValueError"


def test_kernels_skip_the_iri_check_but_keep_a_startup_file_of_the_callers(
        tmp_path, monkeypatch):
    skipped = write_notebook(tmp_path / "skipped.ipynb",
                             "import sys\nassert sys.modules['rfc3987_syntax'] is None",
                             "import plotly.io as pio\nimport jsonschema\n"
                             "jsonschema.validate(3, {'type': 'integer'})")
    assert cli.main(["run", str(skipped), "--out", str(tmp_path / "out"), "-j", "1"]) == 0
    startup = tmp_path / "startup.py"
    startup.write_text("callers_own = True\n")
    monkeypatch.setenv("PYTHONSTARTUP", str(startup))
    theirs = write_notebook(tmp_path / "theirs.ipynb", "assert callers_own")
    assert cli.main(["run", str(theirs), "--out", str(tmp_path / "out"), "-j", "1"]) == 0
    assert os.environ["PYTHONSTARTUP"] == str(startup)


def test_shared_builds_start_on_sim_only_and_build_what_a_first_kernel_needs(tmp_path):
    assert start_shared_builds("metal") == []
    cache = tmp_path / "cache"
    build = ("from mtwork.walkthrough.shared_builds import start_shared_builds\n"
             "threads = start_shared_builds('sim')\n"
             "assert [t.daemon for t in threads] == [True, True]\n"
             "for t in threads: t.join()\n")
    subprocess.run([sys.executable, "-c", build], check=True,
                   env={**os.environ, "MTWORK_CACHE_DIR": str(cache)})
    assert list(cache.glob("libmtwrt-*.so")), "the emulator's runtime"
    pch = {p.name.startswith("check-") for p in (cache / "pch").glob("*.pch")}
    assert pch == {True, False}, "the kernels' and the check's precompiled headers"
    assert list((cache / "kernels").glob("*-profile")), "the profiled variant's header too"
    assert list((cache / "graph").glob("*/_mtwork_graph*")), "mtwork's MLX extension"

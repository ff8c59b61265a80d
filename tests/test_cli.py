"""`mtwork run` and friends: quiet kernels, a progress bar per notebook, a summary table,
the backend checked before any notebook starts, failed notebooks still published with the
failing cell marked, atomic HTML, --version and a --help that explains -p."""

import os
from pathlib import Path

import nbformat
import pytest
from bs4 import BeautifulSoup

import mtwork
from mtwork import cli
from mtwork.backends import register, unregister
from mtwork.walkthrough import export, side_by_side

REPO = Path(__file__).resolve().parents[1]


def write_notebook(path: Path, *cells: str, parameters: str | None = None) -> Path:
    nb = nbformat.v4.new_notebook()
    if parameters is not None:
        nb.cells.append(nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]}))
    nb.cells += [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    return path


class Unusable:
    """A backend that can never run here."""

    name = "nowhere"

    def unavailable_reason(self) -> str:
        return "it needs a device this machine does not have"


@pytest.fixture
def unusable_backend():
    register("nowhere", Unusable)
    yield "nowhere"
    unregister("nowhere")


@pytest.fixture
def no_notebook_may_start(monkeypatch):
    def started(*args, **kwargs):
        raise AssertionError("a notebook started")

    monkeypatch.setattr(cli, "run_notebooks", started)


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"mtwork {mtwork.__version__}"


def test_help_explains_p_and_lists_every_notebooks_parameters(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "-p NAME VALUE" in text and "Python literal" in text
    for notebook in sorted((REPO / "notebooks").glob("*.ipynb")):
        assert notebook.name in text
        for parameter in cli.notebook_parameters(notebook):
            assert f"{parameter.name} = {parameter.default}" in text


def test_an_unusable_backend_stops_the_run_before_any_notebook(
        unusable_backend, no_notebook_may_start, capsys, tmp_path):
    nb = write_notebook(tmp_path / "a.ipynb", "print(1)")
    assert cli.main(["run", str(nb), "--backend", unusable_backend]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot run here" in err and "a device" in err
    assert "Traceback" not in err


def test_an_unknown_backend_is_named_with_the_choices(no_notebook_may_start, capsys, tmp_path):
    nb = write_notebook(tmp_path / "a.ipynb", "print(1)")
    assert cli.main(["run", str(nb), "--backend", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "unknown backend 'cuda'" in err and "sim" in err


def test_a_parameter_no_notebook_declares_is_an_error(no_notebook_may_start, capsys, tmp_path):
    nb = write_notebook(tmp_path / "a.ipynb", "print(n)", parameters="n = 1  # a count")
    assert cli.main(["run", str(nb), "-p", "m", "2"]) == 2
    assert "m" in capsys.readouterr().err


def test_run_is_quiet_shows_progress_and_ends_with_a_summary(capfd, tmp_path):
    takes_n = write_notebook(tmp_path / "takes_n.ipynb", "assert n == 3, n",
                             parameters="n = 1  # a count")
    plain = write_notebook(tmp_path / "plain.ipynb", "print('plain')", "print('two')")
    out_dir = tmp_path / "out"
    assert cli.main(["run", str(takes_n), str(plain), "-p", "n", "3", "--out",
                     str(out_dir), "--jobs", "1"]) == 0
    out, err = capfd.readouterr()
    assert "without encryption" not in err and "WARNING" not in err
    assert "takes_n: 100%" in err and "plain: 100%" in err and "3/3" in err  # cells
    header, *rows = out.strip().splitlines()
    assert header.split() == ["notebook", "status", "time", "HTML"]
    assert [r.split()[1] for r in rows] == ["ok", "ok"]
    assert str(out_dir / "plain.html") in rows[1]
    assert (out_dir / "plain.html").is_file() and (out_dir / "takes_n.html").is_file()


def test_a_failed_notebook_is_published_with_its_failing_cell_marked(capsys, tmp_path):
    nb = write_notebook(tmp_path / "broken.ipynb", "x = 1",
                        "assert 1 + 1 == 3, 'oracle mismatch'", "print('never')")
    assert cli.main(["run", str(nb), "--out", str(tmp_path / "out")]) == 1
    captured = capsys.readouterr()
    row = captured.out.splitlines()[1]
    assert "FAILED in cell [2]: AssertionError: oracle mismatch" in row
    assert "1 of 1 notebook(s) failed" in captured.err
    page = BeautifulSoup((tmp_path / "out" / "broken.html").read_text(), "html.parser")
    marked = page.select(f".jp-Cell.celltag_{export.FAILED_TAG}")
    assert len(marked) == 1 and "assert 1 + 1 == 3" in marked[0].get_text()
    assert "AssertionError" in marked[0].get_text()


def test_a_missing_notebook_is_named(tmp_path):
    with pytest.raises(SystemExit, match="not found"):
        cli.main(["run", str(tmp_path / "nope.ipynb"), "--out", str(tmp_path)])


def test_html_is_written_beside_and_renamed_into_place(tmp_path, monkeypatch):
    target = tmp_path / "walk.html"
    target.write_text("old")
    export.write_atomically(target, "new")
    assert target.read_text() == "new" and oct(target.stat().st_mode & 0o777) == "0o644"

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export.write_atomically(target, "half")
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["walk.html"]  # no temporary left


def hinted(path: Path, seconds: float, *cells: str) -> Path:
    """A notebook whose metadata says how long it typically runs."""
    write_notebook(path, *cells)
    nb = nbformat.read(path, as_version=4)
    nb.metadata["mtwork"] = {"typical_seconds": seconds}
    nbformat.write(nb, path)
    return path


def test_jobs_run_notebooks_at_once_slowest_first_and_keep_every_result(
        capfd, tmp_path, monkeypatch):
    monkeypatch.setenv("MTWORK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # paths relative to here stay right while others run
    # These notebooks run no kernel: a fresh cache's shared builds beside them would only
    # load the machine and blur the order of their ends, which this test reads.
    monkeypatch.setattr(cli, "start_shared_builds", lambda backend: [])
    (tmp_path / "nb").mkdir()
    in_its_folder = f"import os; assert os.getcwd() == {str(tmp_path / 'nb')!r}"
    quick = hinted(Path("nb/quick.ipynb"), 1, in_its_folder)
    broken = hinted(Path("nb/broken.ipynb"), 5, "import time; time.sleep(1)",
                    "assert False, 'mismatch'")
    slow = hinted(Path("nb/slow.ipynb"), 50, "import time; time.sleep(2)", in_its_folder)
    out_dir = Path("out")
    assert cli.main(["run", str(quick), str(broken), str(slow), "-j", "2",
                     "--out", str(out_dir)]) == 1
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.startswith(("quick", "broken", "slow"))]
    # The two slowest start at once; the quick one waits for a free slot.
    assert sorted(lines[:2]) == ["broken: started", "slow: started"]
    failed = next(i for i, line in enumerate(lines) if line.startswith("broken: FAILED"))
    assert lines[failed].startswith("broken: FAILED in cell [2] after ")
    assert lines.index("quick: started") > failed
    assert any(line.startswith("slow: ok after") for line in lines)
    rows = out.strip().splitlines()[1:]
    assert [r.split()[0] for r in rows] == [str(quick), str(broken), str(slow)]
    assert [r.split()[1] for r in rows] == ["ok", "FAILED", "ok"]
    assert all((out_dir / f"{nb}.html").is_file() for nb in ("quick", "broken", "slow"))
    # Their times are kept: the next run starts the slowest by what it took.
    recorded = side_by_side.expected_seconds(slow, {})
    assert 2 <= recorded < 50


def test_jobs_must_be_a_whole_number_of_at_least_one(capsys, tmp_path):
    nb = write_notebook(tmp_path / "a.ipynb", "print(1)")
    with pytest.raises(SystemExit):
        cli.main(["run", str(nb), "--jobs", "0"])
    assert "--jobs" in capsys.readouterr().err


def test_default_jobs_are_the_cpus_on_sim_and_one_on_metal(tmp_path, monkeypatch):
    import importlib

    backends_module = importlib.import_module("mtwork.backends")  # `mtwork.backends` is a function
    nb = write_notebook(tmp_path / "a.ipynb", "print(1)")
    asked: list[int] = []
    monkeypatch.setattr(cli, "run_notebooks", lambda *a, jobs, **k: asked.append(jobs) or [])
    assert cli.main(["run", str(nb), "--backend", "sim"]) == 0
    # Side by side, notebooks on metal would share one GPU and disturb each other's timings.
    monkeypatch.setattr(backends_module, "resolve", lambda name: "metal")
    assert cli.main(["run", str(nb), "--backend", "sim"]) == 0
    assert cli.main(["run", str(nb), "--backend", "sim", "-j", "3"]) == 0
    assert asked == [os.cpu_count() or 1, 1, 3]

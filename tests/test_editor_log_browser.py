"""The kernel's log in the live editor: after a run, the messages its threads logged are
listed beside the diff, each naming its thread and line; clicking one in the browser
(JupyterLab, headless Chromium driven by Playwright) takes the code editor to the line
that wrote it, in the body or the header. Without a browser, the panel's rows and the
outcome's log are checked from Python.

Needs Debian's `chromium` at /usr/bin/chromium and the `playwright` Python package for the
browser part."""

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mtwork
import mtwork.editor
from mtwork.editor.panels import result_html
from tests.helpers.jupyterlab import (
    CHROMIUM,
    CHROMIUM_ARGS,
    KERNEL_READY,
    serve_lab,
)

LIVE = ".mtw-editor-live"

BODY = """\
const uint i = thread_position_in_grid.x;
if (i < 2) {
    os_log_default.log("body sees %.1f at %u", inp[i], i);
}
out[i] = twice(inp[i], i);
"""

HEADER = """\
template <typename T>
T twice(T x, uint i) {
    if (i == 1) metal::os_log_default.log("header doubles %.1f", float(x));
    return x * T(2);
}
"""

SETUP = """\
import mlx.core as mx, numpy as np, mtwork
import mtwork.editor
from pathlib import Path

spec = mtwork.KernelSpec(name="logged_scale", source="scale.metal", header="scale.h",
                         input_names=["inp"], output_names=["out"], folder=Path.cwd())
n = 64

def build(c):
    return mtwork.Launch(spec.kernel(), grid=(n, 1, 1), threadgroup=(c["tg"], 1, 1),
                         template=[("T", mx.float32)], output_shapes=[(n,)],
                         output_dtypes=[mx.float32])
"""

CELL = SETUP + """
ed = mtwork.editor(spec, build, inputs=[mx.arange(n, dtype=mx.float32)],
                   oracle=lambda x: 2 * np.asarray(x, np.float64), space={"tg": [32, 64]},
                   bench_rounds=1)
ed
"""


def _folder(folder: Path) -> None:
    (folder / "scale.metal").write_text(BODY)
    (folder / "scale.h").write_text(HEADER)


def test_the_last_runs_log_is_listed_beside_the_diff_with_each_line(tmp_path, monkeypatch):
    _folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    names: dict = {}
    exec(SETUP, names)
    ed = mtwork.editor(names["spec"], names["build"],
                       inputs=[mx.arange(64, dtype=mx.float32)],
                       oracle=lambda x: 2 * np.asarray(x, np.float64), space={"tg": [32, 64]},
                       bench_rounds=1, run=False)
    outcome = ed.run()
    assert outcome.status == "ok"
    log = outcome.log
    assert [(m.place, m.text) for m in log] == [
        ("source:3", "body sees 0.0 at 0"), ("source:3", "body sees 1.0 at 1"),
        ("header:3", "header doubles 1.0")]
    panel = result_html(ed.loop, uid="u1")
    assert panel.index("diffs against the oracle") < panel.index("mtw-editor-log")
    assert panel.count('data-mtw-uid="u1"') == 3
    assert 'data-mtw-file="header" data-mtw-line="3"' in panel
    assert "kernel `logged_scale` logged 3 messages" in panel
    # A break that faults keeps the messages written before it, shown with the fault.
    ed.set_header(HEADER.replace("return x * T(2);",
                                 "if (i == 1) { device float* p = nullptr; *p = 1; }\n"
                                 "    return x * T(2);"))
    faulted = ed.run()
    assert faulted.status == "fault" and "header doubles 1.0" in faulted.message
    assert [m.text for m in faulted.log.where(grid=1)] == ["body sees 1.0 at 1",
                                                           "header doubles 1.0"]


if not CHROMIUM.is_file():
    pytest.skip("no browser: install Debian's chromium (apt-get install -y chromium) to run "
                "the browser test of the editor's log", allow_module_level=True)
try:
    from playwright import sync_api as playwright_api
except ImportError:
    pytest.skip("the browser test of the editor's log needs the playwright package",
                allow_module_level=True)


@pytest.fixture
def lab(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    _folder(work)
    notebook = {
        "cells": [{"cell_type": "code", "execution_count": None, "id": "editor",
                   "metadata": {}, "outputs": [], "source": CELL}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    (work / "edit.ipynb").write_text(json.dumps(notebook))
    monkeypatch.chdir(work)  # compile the kernel here first: a cold cache is slow
    names: dict = {}
    exec(SETUP, names)
    mx.eval(names["build"]({"tg": 32})(mx.arange(64, dtype=mx.float32), backend="sim"))
    with serve_lab(work, tmp_path) as url:
        yield url


def test_clicking_a_message_takes_the_editor_to_the_line_that_wrote_it(lab, tmp_path):
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                    headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        try:
            page.goto(f"{lab}/lab/tree/edit.ipynb")
            page.wait_for_function(KERNEL_READY, timeout=30_000)
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            rows = page.locator(f"{LIVE} .mtw-editor-log .mtw-log-row")
            rows.first.wait_for(timeout=60_000)
            assert rows.count() == 3
            assert "header doubles 1.0" in rows.nth(2).inner_text()
            # The header's message: the editor shows the header, its line 3 selected.
            rows.nth(2).click()
            active = page.locator(".mtw-editor .mtw-editor-tab-active")
            active.filter(has_text="scale.h").wait_for(timeout=5_000)
            selected = page.evaluate("() => window.getSelection().toString()")
            assert selected.strip() == HEADER.splitlines()[2].strip()
            # A body message: back to the body, at its line 3.
            rows.nth(0).click()
            active.filter(has_text="scale.metal").wait_for(timeout=5_000)
            selected = page.evaluate("() => window.getSelection().toString()")
            assert selected.strip() == BODY.splitlines()[2].strip()
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()

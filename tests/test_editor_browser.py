"""The live MSL editor in a real browser: JupyterLab on localhost, a notebook that shows
`mtwork.editor`, headless Chromium driven by Playwright. A typed edit that breaks the
kernel shows the compiler's error at its line; the fix, run with Ctrl-Enter, shows the
corrected diff summary.

Needs Debian's `chromium` at /usr/bin/chromium and the `playwright` Python package (no
browser download: Playwright drives the system Chromium)."""

import json
from pathlib import Path

import pytest

from mtwork.cli import export_html
from tests.helpers.jupyterlab import (
    CHROMIUM,
    CHROMIUM_ARGS,
    KERNEL_READY,
    serve_lab,
    wait_for_text,
)

LIVE = ".mtw-editor-live"  # the widget, not its static copy for exported HTML

if not CHROMIUM.is_file():
    pytest.skip("no browser: install Debian's chromium (apt-get install -y chromium) to run "
                "the browser test of the editor", allow_module_level=True)
try:
    from playwright import sync_api as playwright_api
except ImportError:
    pytest.skip("the browser test of the editor needs the playwright package (pip install "
                "playwright; no browser download: PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1)",
                allow_module_level=True)

BODY = """\
// Each thread doubles EPT consecutive elements.
const uint first = thread_position_in_grid.x * EPT;
for (uint k = 0; k < EPT; ++k) {
    out[first + k] = twice(inp[first + k]);
}
"""

HEADER = """\
template <typename T>
T twice(T x) {
    return x * T(2);
}
"""

SETUP = """\
import mlx.core as mx, numpy as np, mtwork
import mtwork.editor
from pathlib import Path

spec = mtwork.KernelSpec(name="browser_scale", source="scale.metal", header="scale.h",
                         input_names=["inp"], output_names=["out"], folder=Path.cwd())
n = 1024

def build(c):
    return mtwork.Launch(spec.kernel(), grid=(n // c["ept"], 1, 1), threadgroup=(c["tg"], 1, 1),
                         template=[("T", mx.float32), ("EPT", c["ept"])],
                         output_shapes=[(n,)], output_dtypes=[mx.float32])
"""

# Edits run after this many seconds of quiet; Ctrl-Enter runs at once, well before that.
DEBOUNCE = 4.0

CELL = SETUP + f"""
ed = mtwork.editor(spec, build, inputs=[mx.arange(n, dtype=mx.float32)],
                   oracle=lambda x: 2 * np.asarray(x, np.float64),
                   space={{"ept": [1, 2, 4], "tg": [32, 64, 128]}}, bench_rounds=2,
                   debounce={DEBOUNCE})
ed
"""


def write_notebook(folder: Path) -> None:
    (folder / "scale.metal").write_text(BODY)
    (folder / "scale.h").write_text(HEADER)
    notebook = {
        "cells": [{"cell_type": "code", "execution_count": None, "id": "editor",
                   "metadata": {}, "outputs": [], "source": CELL}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    (folder / "edit.ipynb").write_text(json.dumps(notebook))


def warm_the_emulator(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compile and run the notebook's kernel here first: in a cold cache the emulator
    builds its runtime once (about a minute), longer than the browser's waits."""
    import mlx.core as mx

    monkeypatch.chdir(work)
    names: dict = {}
    exec(SETUP, names)
    launch = names["build"]({"ept": 1, "tg": 32})
    mx.eval(launch(mx.arange(1024, dtype=mx.float32), backend="sim"))


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """JupyterLab serving a fresh folder with the notebook; yields its URL and the folder."""
    work = tmp_path / "work"
    work.mkdir()
    write_notebook(work)
    warm_the_emulator(work, monkeypatch)
    with serve_lab(work, tmp_path) as url:
        yield url, work


def test_typing_a_break_shows_the_error_at_its_line_and_the_fix_shows_the_diff(lab, tmp_path):
    url, work = lab
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                    headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        try:
            run = run_the_editor_session(page, url)
            page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
            saved = wait_for_text(work / "edit.ipynb", f'data-run=\\"{run}\\"')
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    assert (work / "scale.metal").read_text() == BODY  # nothing saved without asking
    # The notebook saved from the browser exports the editor's last state as static HTML.
    assert "mtw-editor-static" in saved
    export_html(work / "edit.ipynb", tmp_path / "edit.html")
    html = (tmp_path / "edit.html").read_text()
    static = html[html.index('class="mtw-editor-static"'):]
    assert f'data-run="{run}" data-status="ok"' in static
    assert "twice(inp[first + k]);</div>" in static and "mtw-editor-errors" not in static


def run_the_editor_session(page, url):
    page.goto(f"{url}/lab/tree/edit.ipynb")
    page.wait_for_function(KERNEL_READY, timeout=30_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")

    editor = page.locator(".mtw-editor .cm-content")
    editor.wait_for(timeout=40_000)
    first = page.locator(f'{LIVE} .mtw-editor-result[data-status="ok"]')
    first.wait_for(timeout=40_000)
    assert "out: PASS" in first.inner_text()
    assert not page.locator(".mtw-editor-static").first.is_visible()  # the export copy
    assert page.locator(".cm-lineNumbers .cm-gutterElement", has_text="4").count() == 1

    # Break line 4: delete its semicolon, as a person would.
    page.locator(".mtw-editor .cm-line").nth(3).click()
    page.keyboard.press("End")
    page.keyboard.press("Backspace")
    marked = page.locator('.cm-mtw-error-line[data-mtw-line="4"]')
    marked.wait_for(timeout=20_000)
    assert page.locator(".mtw-editor .cm-line").nth(3).get_attribute("data-mtw-line") == "4"
    errors = page.locator(f"{LIVE} .mtw-editor-errors")
    assert "source:4:" in errors.inner_text() and "expected ';'" in errors.inner_text()
    assert page.locator(".cm-lint-marker-error").count() >= 1
    assert page.locator(".mtw-editor-bar .mtw-editor-status").inner_text().startswith("run #")
    # the last good result stays on screen
    assert "out: PASS" in page.locator(f"{LIVE} .mtw-editor-result").inner_text()

    # Fix it and run at once with Ctrl-Enter: the result comes before the debounce would.
    page.keyboard.type(";")
    page.keyboard.press("Control+Enter")
    quick = (DEBOUNCE - 1) * 1000
    errors.wait_for(state="detached", timeout=quick)
    marked.wait_for(state="detached", timeout=quick)
    result = page.locator(f'{LIVE} .mtw-editor-result[data-status="ok"]')
    result.wait_for(timeout=quick)
    assert int(result.get_attribute("data-run")) >= 3
    summary = result.inner_text()
    assert "out: PASS" in summary and "emulator CPU time" in summary
    text = page.evaluate("() => document.querySelector('.mtw-editor .cm-content').innerText")
    assert "twice(inp[first + k]);" in text
    return int(result.get_attribute("data-run"))


"""A kernel author's session in a real browser, from a new notebook to a published page:
JupyterLab on localhost, headless Chromium driven by Playwright.

A new notebook: a formula in markdown, a kernel written in a cell and diffed against its
oracle, the editor opened on it; a break shows the error at its line and the fix clears
it; a hang is ended by Stop; with a barrier removed, the Sanitize toggle shows the race
at its line; the Sweep button sweeps. The notebook, saved from the browser, is exported,
and the HTML, opened with the network blocked, shows the formula as MathML and draws its
figures.

Needs Debian's `chromium` and the `playwright` package (no browser download)."""

import time
from pathlib import Path

import pytest

from mtwork.walkthrough.export import export_html
from tests.helpers.jupyterlab import (
    CHROMIUM,
    CHROMIUM_ARGS,
    KERNEL_READY,
    serve_lab,
    wait_for_text,
)

if not CHROMIUM.is_file():
    pytest.skip("no browser: install Debian's chromium (apt-get install -y chromium) to run "
                "the browser scenario", allow_module_level=True)
try:
    from playwright import sync_api as playwright_api
except ImportError:
    pytest.skip("the browser scenario needs the playwright package (pip install playwright; "
                "no browser download: PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1)",
                allow_module_level=True)

from test_walkthrough_browser import open_offline  # noqa: E402 - after the skips

LIVE = ".mtw-editor-live"
DEBOUNCE = 4.0  # seconds of quiet before an edit runs; Ctrl-Enter runs at once

PROSE = "# Shifting by one\n\nEach thread writes $y_i = 2\\,x_{(i+1) \\bmod T}$ of its group."

# Each thread doubles its right neighbour's value, staged in threadgroup memory.
KERNEL = '''\
import mlx.core as mx, numpy as np, mtwork
mtwork.plots.setup_offline()

SOURCE = """\\
threadgroup float tile[TG];
uint i = thread_position_in_threadgroup.x;
tile[i] = inp[thread_position_in_grid.x];
threadgroup_barrier(mem_flags::mem_threadgroup);
out[thread_position_in_grid.x] = 2.0f * tile[(i + 1) % TG];
"""
n = 256
x = mx.arange(n, dtype=mx.float32)
shift = mtwork.metal_kernel("shift", ["inp"], ["out"], SOURCE)

def build(c):
    return mtwork.Launch(shift, grid=(n, 1, 1), threadgroup=(c["tg"], 1, 1),
                         template=[("TG", c["tg"])], output_shapes=[(n,)],
                         output_dtypes=[mx.float32])

def shifted(x, config):
    t = config["tg"]
    groups = np.asarray(x, np.float64).reshape(-1, t)
    return 2 * np.roll(groups, -1, axis=1).reshape(-1)

report = mtwork.diff(build({"tg": 64})(x)[0], shifted(x, config={"tg": 64}))
report
'''

EDITOR = f'''\
ed = mtwork.editor(shift, build, inputs=[x], oracle=shifted, space={{"tg": [32, 64, 128]}},
                   config={{"tg": 64}}, bench_rounds=1, timeout=300, debounce={DEBOUNCE})
ed
'''

FIGURES = '''\
ed.wait(120)
display(report.plot())
mtwork.plots.lines(ed.loop.last_sweep, "tg")
'''

IDLE = ("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status"
        " === 'idle'")

# JupyterLab's own commands and models, as a person's clicks would reach them.
ADD_CELL = """async ([text, kind]) => {
  const app = window.jupyterapp, panel = app.shell.currentWidget, nb = panel.content;
  nb.activeCellIndex = nb.widgets.length - 1;  // the empty cell at the end, not the editor's
  if (kind === 'markdown') await app.commands.execute('notebook:change-cell-to-markdown');
  nb.activeCell.model.sharedModel.setSource(text);
  app.commands.execute('notebook:run-cell-and-insert-below');  // not awaited: runs on
}"""


def test_a_kernel_from_a_new_notebook_to_a_published_page(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    with serve_lab(work, tmp_path) as url, playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                    headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 1600})
        try:
            notebook = write_and_use_the_kernel(page, url, work)
        except Exception:
            page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    html = export_html(notebook, tmp_path / "shift.html")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                    headless=True)
        try:
            facts, blocked, errors = open_offline(browser, html)
        finally:
            browser.close()
    assert not blocked and not errors, (blocked[:3], errors[:3])
    assert facts["math"] >= 1 and "$" not in facts["prose"]
    assert facts["figures"] >= 2 and facts["drawn"] == facts["figures"]  # diff and sweep
    assert facts["editorSnapshots"] == 1


def write_and_use_the_kernel(page, url: str, work: Path) -> Path:
    page.goto(f"{url}/lab")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.commands"
                           ".hasCommand('notebook:create-new')", timeout=60_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:create-new', "
                  "{kernelName: 'python3'})")
    page.wait_for_function(KERNEL_READY, timeout=60_000)
    page.evaluate(ADD_CELL, [PROSE, "markdown"])
    page.evaluate(ADD_CELL, [KERNEL, "code"])
    page.locator(".jp-OutputArea-output", has_text="PASS").first.wait_for(timeout=180_000)
    page.evaluate(ADD_CELL, [EDITOR, "code"])
    ok = page.locator(f'{LIVE} .mtw-editor-result[data-status="ok"]')
    ok.wait_for(timeout=120_000)

    break_and_fix(page)
    hang_and_stop(page)
    race_and_sanitize(page)
    sweep(page)

    page.evaluate(ADD_CELL, [FIGURES, "code"])
    time.sleep(1.0)
    page.wait_for_function(IDLE, timeout=120_000)
    # The document's own save (the Save command would ask to rename an untitled notebook).
    page.evaluate("() => window.jupyterapp.shell.currentWidget.context.save()")
    notebook = work / "Untitled.ipynb"
    wait_for_text(notebook, "mtw-editor-static", timeout=30)
    return notebook


def code_line(page, number: int):
    return page.locator(".mtw-editor .cm-line").nth(number - 1)


def status(page) -> str:
    return page.locator(".mtw-editor-bar .mtw-editor-status").inner_text()


def break_and_fix(page) -> None:
    """Line 3 loses its semicolon: the error is marked there; typed back, it runs clean."""
    code_line(page, 3).click()
    page.keyboard.press("End")
    page.keyboard.press("Backspace")
    page.locator('.cm-mtw-error-line[data-mtw-line="3"]').wait_for(timeout=30_000)
    assert "source:3:" in page.locator(f"{LIVE} .mtw-editor-errors").inner_text()
    page.keyboard.type(";")
    page.keyboard.press("Control+Enter")
    page.locator('.cm-mtw-error-line').first.wait_for(state="detached", timeout=30_000)
    page.locator(f'{LIVE} .mtw-editor-result[data-status="ok"]').wait_for(timeout=30_000)


def hang_and_stop(page) -> None:
    """A loop that never ends, started with Ctrl-Enter, is ended by Stop within seconds."""
    code_line(page, 1).click()
    page.keyboard.press("Home")
    page.keyboard.type("volatile uint spins = 0; while (inp[0] > -1.0f) { spins = spins + 1; }")
    page.keyboard.press("Enter")
    page.keyboard.press("Control+Enter")
    stop = page.locator(f"{LIVE} button", has_text="Stop")
    page.wait_for_function(f"() => document.querySelector('{LIVE} .mtw-editor-status')"
                           ".textContent.startsWith('running')", timeout=60_000)
    time.sleep(1.0)
    pressed = time.monotonic()
    stop.click()
    page.wait_for_function(f"() => document.querySelector('{LIVE} .mtw-editor-status')"
                           ".textContent.includes('stopped')", timeout=15_000)
    assert time.monotonic() - pressed < 15
    assert page.locator(f"{LIVE} .mtw-editor-status-cancelled").count() == 1
    # Take the loop out again: select its line and delete it.
    code_line(page, 1).click()
    page.keyboard.press("Home")
    page.keyboard.press("Shift+ArrowDown")
    page.keyboard.press("Backspace")
    page.keyboard.press("Control+Enter")
    page.locator(f'{LIVE} .mtw-editor-result[data-status="ok"]').wait_for(timeout=60_000)


def race_and_sanitize(page) -> None:
    """Without its barrier (line 4) the kernel races; Sanitize marks the racing line."""
    code_line(page, 4).click()
    page.keyboard.press("Home")
    page.keyboard.press("Shift+ArrowDown")
    page.keyboard.press("Backspace")
    page.locator(f"{LIVE} button", has_text="Sanitize").click()  # runs, sanitized
    marked = page.locator('.cm-mtw-error-line[data-mtw-line="3"], '
                          '.cm-mtw-error-line[data-mtw-line="4"]').first
    marked.wait_for(timeout=120_000)
    assert "Sanitizer:" in page.locator(f"{LIVE} .mtw-editor-result").inner_text()
    assert page.locator(".mtw-editor-status-unsafe").count() == 1
    page.locator(f"{LIVE} button", has_text="Sanitize").click()  # off again
    code_line(page, 1).click()
    page.keyboard.press("Control+z")
    page.keyboard.press("Control+Enter")
    page.locator(f'{LIVE} .mtw-editor-result[data-status="ok"]').wait_for(timeout=60_000)
    marked.wait_for(state="detached", timeout=30_000)


def sweep(page) -> None:
    """The Sweep button sweeps every tile size and shows the table."""
    page.locator(f"{LIVE} button", has_text="Sweep (3 settings)").click()
    table = page.locator(f"{LIVE} .jp-OutputArea-output", has_text="Sweep of 3 of 3")
    table.wait_for(timeout=180_000)
    assert "3 ok" in table.inner_text()

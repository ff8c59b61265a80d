"""Every exported walkthrough, opened in headless Chromium with the network blocked, draws
everything it shows: no request leaves the page, formulas are MathML (no TeX left in the
text), every figure is drawn, diff heatmaps start their colour scale at zero, code is in
a monospace font, and no script fails.

Needs Debian's `chromium` at /usr/bin/chromium and the `playwright` Python package (no
browser download: Playwright drives the system Chromium)."""

import re
from pathlib import Path

import pytest
from test_notebooks import NOTEBOOKS, executed_walkthroughs

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
LOCAL = ("file:", "data:", "blob:", "about:")

if not CHROMIUM.is_file():
    pytest.skip("no browser: install Debian's chromium (apt-get install -y chromium) to run "
                "the browser checks of the walkthroughs", allow_module_level=True)
try:
    from playwright import sync_api as playwright_api
except ImportError:
    pytest.skip("the browser checks of the walkthroughs need the playwright package (pip "
                "install playwright; no browser download: PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1)",
                allow_module_level=True)

# Prose as the reader sees it (markdown cells and Markdown/HTML outputs), without code.
PAGE_FACTS = """() => {
  const prose = [...document.querySelectorAll('.jp-RenderedMarkdown, .jp-RenderedHTMLCommon')]
    .map(el => { const copy = el.cloneNode(true);
                 copy.querySelectorAll('pre, code, script, style').forEach(c => c.remove());
                 return copy.textContent; }).join('\\n');
  const figures = [...document.querySelectorAll('.plotly-graph-div')];
  const heatmaps = figures.flatMap(gd => (gd.data || []).filter(t => t.type === 'heatmap'
      && (t.colorbar?.title?.text || '') === '|a−e|'));
  const fonts = [...document.querySelectorAll('pre, code')]
    .map(el => getComputedStyle(el).fontFamily);
  return {
    prose,
    math: document.querySelectorAll('math').length,
    figures: figures.length,
    drawn: figures.filter(gd => gd._fullLayout && gd.querySelector('.main-svg')).length,
    heatmapZmin: heatmaps.map(t => t.zmin),
    proportional: fonts.filter(f => !/mono|courier|menlo|consolas/i.test(f)),
    editorSnapshots: document.querySelectorAll('.mtw-editor-static').length,
  };
}"""


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                     headless=True)
        yield chromium
        chromium.close()


def open_offline(browser, html: Path) -> tuple[dict, list[str], list[str]]:
    """The page's facts, the requests it tried beyond the file, and its script errors."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    blocked, errors = [], []

    def route(r):
        if r.request.url.startswith(LOCAL):
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("requestfailed", lambda request: blocked.append(f"failed: {request.url}"))
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.goto(html.as_uri(), wait_until="load")
        page.wait_for_function("() => [...document.querySelectorAll('.plotly-graph-div')]"
                               ".every(gd => gd._fullLayout)", timeout=30_000)
        return page.evaluate(PAGE_FACTS), blocked, errors
    finally:
        page.close()


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_walkthrough_draws_everything_offline(notebook, browser, tmp_path_factory):
    run = executed_walkthroughs(tmp_path_factory)[notebook.stem]
    assert run.html is not None, run.error
    facts, blocked, errors = open_offline(browser, run.html)
    assert not blocked, f"requests beyond the file: {blocked[:5]}"
    assert not errors, errors
    tex = re.findall(r"\$[^$\n]{1,60}\$|\\[A-Za-z]{2,}", facts["prose"])
    assert not tex, f"raw TeX in the text: {tex[:5]}"
    if "$" in notebook.read_text():
        assert facts["math"] > 0
    assert facts["figures"] > 0 and facts["drawn"] == facts["figures"]
    assert all(z == 0 for z in facts["heatmapZmin"]), facts["heatmapZmin"]
    assert not facts["proportional"], facts["proportional"][:3]
    if "mtwork.editor(" in notebook.read_text():  # the editor, as its static snapshot
        assert facts["editorSnapshots"] == 1


def test_the_checks_see_what_they_look_for(browser, tmp_path):
    """A page with a CDN script, raw TeX and code in a proportional font fails them."""
    page = tmp_path / "bad.html"
    page.write_text('<html><body><div class="jp-RenderedMarkdown"><p>$x^2$ and \\\\frac</p>'
                    '<pre style="font-family:serif">code</pre></div>'
                    '<script src="https://cdn.example/lib.js"></script></body></html>')
    facts, blocked, _ = open_offline(browser, page)
    assert blocked and "$x^2$" in facts["prose"] and facts["proportional"]

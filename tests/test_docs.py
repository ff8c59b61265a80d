"""The documentation site builds from the docstrings with warnings as errors, offline, and
holds what the README promises: the API reference and the tutorial notebook as a page."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "docs" / "mkdocs.yml"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(CONFIG), "-d", str(out)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return out


def page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text(encoding="utf-8")


def test_the_api_reference_documents_the_public_names(site):
    kernels, tuning = page(site, "api/kernels"), page(site, "api/tuning")
    for name in ("mtwork.metal_kernel", "mtwork.Launch", "mtwork.KernelSpec",
                 "mtwork.load_metal"):
        assert f'id="{name}"' in kernels, name
    assert 'id="mtwork.sweep.driver.sweep"' in tuning
    assert "returns a `Launch`" in tuning or "returns a <code>Launch</code>" in tuning
    plots = page(site, "api/plots")
    for name in ("heatmap", "lines", "speedup_bars", "roofline", "setup_offline"):
        assert f'id="mtwork.plots.{name}"' in plots, name


def test_the_tutorial_page_is_the_notebook_with_its_formulas_as_mathml(site):
    tutorial = page(site, "tutorial")
    assert "Your first kernel" in tutorial and "<math" in tutorial
    assert "mtwork.editor(" in tutorial and "mtwork.sweep(" in tutorial
    text = re.sub(r"<pre.*?</pre>|<code.*?</code>|<script.*?</script>", "", tutorial, flags=re.S)
    assert not re.search(r"\$[^$\n<]{1,40}\$", text)


def test_the_site_asks_no_font_or_script_service(site):
    for html in site.rglob("*.html"):
        text = html.read_text(encoding="utf-8")
        assert not re.search(r'<(script|link)[^>]+(src|href)="https?://', text), html

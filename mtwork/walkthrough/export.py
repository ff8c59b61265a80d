"""Executed notebooks to self-contained HTML walkthroughs: no request leaves the page.

nbconvert's `lab` template, less what it loads from CDNs (require.js, MathJax, mermaid,
the widget manager): formulas become MathML at export (`math.py`), figures carry their
own plotly.js (`mtwork.plots.setup_offline`), and external `<script src>` tags that
plotly's renderer adds to every figure (MathJax, for TeX in figure titles) are dropped.
The file is written beside its destination and renamed into place, so a reader never
sees half a walkthrough.
"""

from __future__ import annotations

import copy
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import nbformat
from jinja2 import DictLoader, pass_context
from nbconvert import HTMLExporter
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

from .math import MATH_CSS, tex_to_mathml

__all__ = ["FAILED_TAG", "WalkthroughExporter", "export_html", "write_atomically"]

FAILED_TAG = "mtwork-failed"  # on the cell that stopped a run; the template marks it

_CSS = MATH_CSS + f"""
/* Code in monospace wherever it appears: nbconvert's lab template lets <pre> in outputs
   inherit the prose font, which puts kernel sources shown as Markdown in a proportional one
   (this sheet comes after the template's, so it wins). */
.jp-OutputArea-output pre, .jp-RenderedHTMLCommon pre, .jp-RenderedHTMLCommon code,
.jp-RenderedMarkdown pre, .jp-RenderedMarkdown code {{
  font-family: var(--jp-code-font-family, monospace);
}}
.jp-RenderedHTMLCommon details > summary {{ cursor: pointer; margin: 0.3em 0; }}
.celltag_{FAILED_TAG} {{ border-left: 4px solid #cf222e; padding-left: 4px; }}
"""

_TEMPLATE = "mtwork_walkthrough.html.j2"
_TEMPLATE_TEXT = (
    "{%- extends 'index.html.j2' -%}\n"
    "{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}\n"
    "{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}\n"
    "{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}\n"
    "{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}\n"
    "{%- block html_head_css -%}<style type=\"text/css\">" + _CSS + "</style>"
    "{%- endblock html_head_css -%}\n"
)
_EXTERNAL_SCRIPT = re.compile(r"<script\b[^>]*\bsrc=[\"']https?://[^>]*>\s*</script>", re.I)


class _MathMLRenderer(IPythonRenderer):
    """nbconvert's Markdown renderer with formulas written as MathML, not left for MathJax."""

    def block_math(self, body: str) -> str:
        return tex_to_mathml(body, display=True)

    def inline_math(self, body: str) -> str:
        return tex_to_mathml(body)

    def latex_environment(self, name: str, body: str) -> str:
        return tex_to_mathml(f"\\begin{{{name}}}{body}\\end{{{name}}}", display=True)


class WalkthroughExporter(HTMLExporter):
    """HTML that draws everything offline: see the module's docstring."""

    def __init__(self, **kwargs: Any):
        super().__init__(template_name="lab", extra_loaders=[DictLoader({_TEMPLATE:
                                                                          _TEMPLATE_TEXT})],
                         **kwargs)
        self.template_file = _TEMPLATE

    @pass_context
    def markdown2html(self, context: Any, source: str) -> str:
        cell = context.get("cell", {})
        renderer = _MathMLRenderer(
            escape=False, attachments=cell.get("attachments", {}),
            embed_images=self.embed_images,
            path=context.get("resources", {}).get("metadata", {}).get("path", ""),
            anchor_link_text=self.anchor_link_text,
            exclude_anchor_links=self.exclude_anchor_links, **self.lexer_options)
        return MarkdownWithMath(renderer=renderer).render(source)


def _offline(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy without external scripts in its outputs, its failed cell tagged."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if cell.metadata.get("papermill", {}).get("exception"):
            cell.metadata.setdefault("tags", []).append(FAILED_TAG)
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "text/html" in data:
                text = data["text/html"]
                text = "".join(text) if isinstance(text, list) else text
                data["text/html"] = _EXTERNAL_SCRIPT.sub("", text)
    return nb


def write_atomically(path: Path, text: str) -> None:
    """Writes `text` to a temporary file beside `path`, then renames it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep the walkthrough from its readers
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export_html(notebook: Path, html: Path) -> Path:
    """Writes the HTML walkthrough of an executed notebook (figures embedded, formulas as
    MathML, no network needed to read it); returns `html`."""
    nb = nbformat.read(notebook, as_version=4)
    body, _ = WalkthroughExporter().from_notebook_node(
        _offline(nb), resources={"metadata": {"name": notebook.stem,
                                              "path": str(notebook.parent)}})
    write_atomically(html, body)
    return html

"""mkdocs hooks: the tutorial page is notebooks/first_kernel.ipynb as Markdown (its prose
with formulas as MathML, its code cells as Python blocks), so the site and the notebook
never drift apart; a page's line `--8<-- "PATH"` shows the file docs/PATH as it is (the
CI recipe's workflow, which the tests lint as a file)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's mtwork, whatever else is installed
from mtwork.walkthrough.math import MATH_CSS, tex_to_mathml  # noqa: E402

TUTORIAL = ROOT / "notebooks" / "first_kernel.ipynb"
_DISPLAY = re.compile(r"\$\$(.+?)\$\$", re.S)
_INLINE = re.compile(r"(?<![\\$])\$([^$\n]+?)\$")


def _prose(markdown: str) -> str:
    parts = re.split(r"(```.*?```)", markdown, flags=re.S)  # leave code blocks alone
    for i in range(0, len(parts), 2):
        text = _DISPLAY.sub(lambda m: tex_to_mathml(m.group(1), display=True), parts[i])
        parts[i] = _INLINE.sub(lambda m: tex_to_mathml(m.group(1)), text)
    return "".join(parts)


def notebook_markdown(notebook: Path) -> str:
    """The notebook as one Markdown page."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    blocks = [f"<style>{MATH_CSS}</style>"]
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            blocks.append(_prose(source))
        elif cell["cell_type"] == "code":
            blocks.append(f"```python\n{source}\n```")
    blocks.append(f"*This page is `notebooks/{notebook.name}`; `mtwork run "
                  f"notebooks/{notebook.name}` publishes it with its outputs.*")
    return "\n\n".join(blocks) + "\n"


def on_files(files: Files, config) -> Files:
    files.append(File.generated(config, "tutorial.md", content=notebook_markdown(TUTORIAL)))
    return files


_INCLUDE = re.compile(r'^--8<-- "([^"]+)"$', re.M)


def on_page_markdown(markdown: str, page, config, files) -> str:
    def content(m: re.Match[str]) -> str:
        return (ROOT / "docs" / m.group(1)).read_text(encoding="utf-8").rstrip("\n")

    return _INCLUDE.sub(content, markdown)

"""TeX formulas to MathML, for walkthroughs that render their math with no network.

Markdown's `$...$` and `$$...$$` become MathML when a notebook is exported (the
`latex2mathml` package), so the HTML needs no MathJax: browsers draw MathML themselves
(Chromium since version 109, Firefox and Safari for longer).
"""

from __future__ import annotations

import re

__all__ = ["MATH_CSS", "UnrenderableFormula", "tex_to_mathml"]

# latex2mathml knows `align*` (a table of right/left column pairs) but not amsmath's
# `aligned`, which is the same table inside a formula.
_ENVIRONMENTS = {"aligned": "align*", "alignedat": "align*", "gathered": "gather*"}
_ENVIRONMENT = re.compile(r"\\(begin|end)\{(" + "|".join(_ENVIRONMENTS) + r")\}")
# Text-mode quotes and escapes inside \text{...}.
_TEXT_REPLACEMENTS = (("``", "\u201c"), ("''", "\u201d"), (r"\_", "_"), (r"\&", "&"))
_TEXT = re.compile(r"\\text\{([^{}]*)\}")
_LEFTOVER_COMMAND = re.compile(r">[^<]*\\[A-Za-z]+[^<]*<")

# MathML Core leaves out `columnalign`; CSS gives aligned equations their columns back.
MATH_CSS = """
math[display="block"] { display: block math; margin: 0.5em 0; overflow-x: auto; }
mtd[columnalign="right"] { text-align: right; }
mtd[columnalign="left"] { text-align: left; }
math { font-size: 1.05em; }
"""


class UnrenderableFormula(ValueError):
    """A formula that latex2mathml cannot turn into MathML (an unknown command)."""


def _text_mode(match: re.Match[str]) -> str:
    text = match.group(1)
    for old, new in _TEXT_REPLACEMENTS:
        text = text.replace(old, new)
    return r"\text{" + text + "}"


def tex_to_mathml(tex: str, *, display: bool = False) -> str:
    """One formula as a single-line `<math>` element (block when `display`); raises
    `UnrenderableFormula` naming the formula when a command is left untranslated."""
    source = _ENVIRONMENT.sub(lambda m: f"\\{m.group(1)}{{{_ENVIRONMENTS[m.group(2)]}}}", tex)
    source = _TEXT.sub(_text_mode, source)
    try:
        from latex2mathml.converter import convert
    except ImportError as missing:
        raise UnrenderableFormula("formulas in walkthroughs need the latex2mathml package: "
                                  "pip install latex2mathml") from missing
    try:
        mathml = convert(source.strip(), display="block" if display else "inline")
    except Exception as error:  # latex2mathml raises many kinds for malformed TeX
        raise UnrenderableFormula(f"cannot render ${tex}$ as MathML: {error}") from error
    leftover = _LEFTOVER_COMMAND.search(mathml)
    if leftover:
        raise UnrenderableFormula(f"cannot render ${tex}$ as MathML: "
                                  f"{leftover.group(0)[1:-1]!r} is not a command it knows")
    return mathml.replace("\n", " ")

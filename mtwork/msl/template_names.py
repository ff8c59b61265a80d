"""A template's values as MLX writes them into a body-form kernel: the argument list
(``<1, 3, float16_t>``), the hash the kernel's name is made from, and each parameter's
kind in the template declaration."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..dtypes import type_string
from .checks import TemplateValue, validate_template

__all__ = ["template_hash", "template_param_kind", "template_text"]


def _template_value_text(value: TemplateValue) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"  # MLX prints bools without boolalpha
    if isinstance(value, int):
        return str(value)
    return type_string(value)


def template_param_kind(value: TemplateValue) -> str:
    if isinstance(value, bool):
        return "bool"
    return "int" if isinstance(value, int) else "typename"


def template_text(template: Iterable[tuple[str, Any]] | None) -> str:
    """The template value list, e.g. ``"<1, 3, float16_t>"``; ``""`` without template."""
    args = validate_template(template)
    if not args:
        return ""
    return "<" + ", ".join(_template_value_text(v) for _, v in args) + ">"


def template_hash(text: str) -> str:
    """The part of the kernel name made from :func:`template_text`.

    Angle brackets, ``", "`` and minus signs each become ``_`` and the last character
    is dropped. (MLX 0.32.1 mapped ``-`` through unchanged; 0.32.4 maps it to ``_``,
    which keeps the name a valid identifier.)
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c in "<>-":
            out.append("_")
        elif text.startswith(", ", i):
            out.append("_")
            i += 1
        else:
            out.append(c)
        i += 1
    return "".join(out)[:-1]

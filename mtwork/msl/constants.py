"""Function constants set at compile time, and the MSL-only syntax C++ cannot read.

Metal specialises a library's ``[[function_constant(n)]]`` values when it builds a
pipeline; mtwork writes them into the source instead: each constant becomes a
``constexpr`` whose value is a macro, defined per compilation.
"""

from __future__ import annotations

import re

from .declarations import constant_declarations
from .lexing import code_without_directives

__all__ = ["defined_macro", "function_constant_macros", "rewrite_function_constants",
           "strip_msl_only_syntax", "value_macro"]


_IS_DEFINED = re.compile(r"\bis_function_constant_defined\s*\(\s*([A-Za-z_]\w*)\s*\)")


def value_macro(name: str) -> str:
    return f"__mtw_fc_{name}"


def defined_macro(name: str) -> str:
    return f"__mtw_fc_defined_{name}"


def rewrite_function_constants(text: str) -> str:
    """Turns function constants into compile-time constants whose values are macros.

    ``constant T x [[function_constant(n)]];`` becomes ``constexpr constant T x =
    __mtw_fc_x;`` (a declaration that is already ``constexpr``, e.g. through a macro such
    as MLX's ``STEEL_CONST``, only loses its attribute), and
    ``is_function_constant_defined(x)`` becomes ``__mtw_fc_defined_x``;
    `function_constant_macros` defines both for one choice of values. Keeping the values
    out of the text lets every choice share one rewritten copy of a file. Lines stay where
    they were, and so does the kernel's own text around them.
    """
    mask = code_without_directives(text)
    edits = []
    for d in constant_declarations(mask):
        a, b = d.attribute
        edits.append((a, b, f"= {value_macro(d.name)}" + "\n" * text.count("\n", a, b)))
        if d.words[0] == "constant" and "constexpr" not in d.words:
            first = d.start + len(mask[d.start:]) - len(mask[d.start:].lstrip())
            edits.append((first, first, "constexpr "))
    edits += [(m.start(), m.end(), defined_macro(m.group(1))) for m in _IS_DEFINED.finditer(mask)]
    for a, b, new in sorted(edits, reverse=True):
        text = text[:a] + new + text[b:]
    return text


def function_constant_macros(values: dict[str, tuple[str, str | None]]) -> str:
    """``#define`` lines giving each constant (name -> (type, value text or None for
    "not set")) its value; an unset constant reads as zero and is not defined."""
    lines = []
    for name, (type_text, value) in sorted(values.items()):
        lines.append(f"#define {value_macro(name)} ({type_text})({value or 0})")
        lines.append(f"#define {defined_macro(name)} {'true' if value else 'false'}")
    return "\n".join(lines) + ("\n" if lines else "")


_KERNEL_KEYWORD = re.compile(r"\bkernel(?=\s+void\b)")
_THREADGROUP_ATTRIBUTE = re.compile(r"\[\[[^\[\]]*\bthreadgroup\s*\([^\[\]]*\]\]")


def strip_msl_only_syntax(text: str) -> str:
    """Blanks what C++ cannot read once the address spaces are empty macros: the
    ``kernel`` qualifier (``kernel void f(...)``) and ``[[threadgroup(n)]]`` attributes."""
    mask = code_without_directives(text)
    spans = [m.span() for m in _KERNEL_KEYWORD.finditer(mask)]
    spans += [m.span() for m in _THREADGROUP_ATTRIBUTE.finditer(mask)]
    for a, b in sorted(spans, reverse=True):
        text = text[:a] + " " * (b - a) + text[b:]
    return text

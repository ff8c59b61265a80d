"""Function-constant declarations in MSL text: where each program-scope
``... T name [[function_constant(index)]];`` sits, its type and name, and its index when
that is written as integer arithmetic (llama.cpp writes ``FC_MUL_MV + 0`` with the base
a macro; once the macro is expanded the index is ``600 + 0``)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from .types import normalise_type

__all__ = ["ConstantDeclaration", "constant_declarations", "constant_index"]

_FUNCTION_CONSTANT_ATTRIBUTE = re.compile(
    r"\[\[\s*function_constant\s*\((?P<index>[^\[\]]*)\)\s*\]\]\s*;")
_QUALIFIERS = frozenset({"constant", "static", "constexpr", "const", "volatile"})


@dataclass(frozen=True)
class ConstantDeclaration:
    """Where a program-scope ``... T name [[function_constant(index)]];`` sits in a text:
    the declaration's start, the attribute's span, the words before it, the index text."""

    start: int
    attribute: tuple[int, int]  # from `[[` to just before the `;`
    words: tuple[str, ...]
    index: str

    @property
    def name(self) -> str:
        return self.words[-1]

    @property
    def type_text(self) -> str:
        """The declared type: the words before the name that are not qualifiers."""
        return normalise_type(" ".join(w for w in self.words[:-1] if w not in _QUALIFIERS))


def constant_declarations(mask: str) -> list[ConstantDeclaration]:
    """Every function-constant declaration in `mask` (a `code_mask` of the text)."""
    found = []
    for m in _FUNCTION_CONSTANT_ATTRIBUTE.finditer(mask):
        start = max(mask.rfind(c, 0, m.start()) for c in ";{}") + 1
        words = tuple(re.findall(r"[A-Za-z_][\w:]*(?:<[^<>;]*>)?", mask[start : m.start()]))
        if len(words) >= 2:
            end = m.end() - 1  # the `;` stays
            found.append(ConstantDeclaration(start, (m.start(), end), words,
                                             m.group("index").strip()))
    return found


def constant_index(text: str) -> int | None:
    """The value of an index written as integer arithmetic (``600 + 0``), else None."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return None
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.operator, ast.unaryop)
    if not all(isinstance(node, allowed) for node in ast.walk(tree)):
        return None
    try:
        value = eval(compile(tree, "<index>", "eval"), {"__builtins__": {}})
    except (ArithmeticError, TypeError, ValueError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None

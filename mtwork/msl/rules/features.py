"""The C++ features Metal leaves out (MSL 3.2 specification, section 1.5.4 "Restrictions"),
and its scalar types (section 2.1: Metal has no ``double``), found token by token in the
author's code.

Derived classes are on the specification's list too, but Apple's compiler accepts them
(MLX's kernels derive structs, and Metal's own library derives its type traits), so no
rule refuses them. Lambdas are part of MSL 3.2 and later (the MSL 4 specification says
so in the same section); placement ``new`` of MSL 4.1 and later.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ..target import MslTarget, MslVersion
from .code import Code
from .table import Violation

__all__ = ["feature_violations"]

# Words that are an excluded feature wherever they appear, with their rule and message.
_FORBIDDEN = {
    "dynamic_cast": ("dynamic-cast", "dynamic_cast is not available in Metal"),
    "typeid": ("typeid", "type identification (typeid) is not available in Metal"),
    "goto": ("goto", "goto is not available in Metal"),
    "register": ("storage-class", "the register storage class is not available in Metal"),
    "thread_local": ("storage-class", "thread_local is not available in Metal: a kernel's "
                                      "variables are per thread already"),
    "virtual": ("virtual", "virtual functions are not available in Metal"),
    "try": ("exceptions", "exception handling (try) is not available in Metal"),
    "catch": ("exceptions", "exception handling (catch) is not available in Metal"),
    "throw": ("exceptions", "exception handling (throw) is not available in Metal"),
}
_WORD = re.compile(r"\b(?:dynamic_cast|typeid|goto|register|thread_local|virtual|try|catch|"
                   r"throw|double|new|delete|noexcept|main)\b")
# What may come just before a `noexcept` that is a function's specifier, not the operator.
_SPECIFIER_BEFORE = re.compile(r"(?:\)|\]|\b(?:const|volatile|mutable|thread|device|constant|"
                               r"threadgroup|override|final)|&&?)$")
# A lambda's introducer: `[captures]` then `(`, `{` or `mutable`, where an expression
# starts (not a subscript, an array declarator or an attribute).
_LAMBDA = re.compile(r"\[(?P<captures>[^\[\]]*)\]\s*(?=[({]|mutable\b)")
_EXPRESSION_BEFORE = re.compile(r"(?:[=(,{};?:!&|+\-*/%^~]|\breturn)$")
_PLACEMENT_NEW = MslVersion(4, 1)
_LAMBDAS = MslVersion(3, 2)


def _before(mask: str, pos: int) -> str:
    """The code just before `pos`, spaces dropped (up to 40 characters)."""
    return mask[max(0, pos - 40):pos].rstrip()


def _after(mask: str, pos: int) -> str:
    return mask[pos:pos + 40].lstrip()


def feature_violations(code: Code, target: MslTarget) -> Iterator[Violation]:
    """Every use of an excluded feature in the author's code."""
    mask, version = code.mask, target.msl_version
    for m in _WORD.finditer(mask):
        found = _word_violation(m.group(), _before(mask, m.start()), _after(mask, m.end()),
                                version)
        if found is not None:
            v = code.violation(found[0], m.start(), found[1])
            if v is not None:
                yield v
    if version < _LAMBDAS:
        for m in _LAMBDA.finditer(mask):
            before = _before(mask, m.start())
            if (before == "" or _EXPRESSION_BEFORE.search(before)) and not before.endswith("["):
                v = code.violation("lambda", m.start(), f"lambda expressions need MSL 3.2 or "
                                   f"later (the kernel is compiled as MSL {version})")
                if v is not None:
                    yield v


def _word_violation(word: str, before: str, after: str,
                    version: MslVersion) -> tuple[str, str] | None:
    """(rule, message) when `word` between `before` and `after` breaks a rule."""
    if word in _FORBIDDEN:
        return _FORBIDDEN[word]
    if word == "double":
        what = "long double" if re.search(r"\blong$", before) else "double"
        return "double", f"{what} is not a Metal type: use float (or half)"
    if word == "new":
        if version >= _PLACEMENT_NEW and after.startswith("("):
            return None
        placement = " (placement new needs MSL 4.1 or later)" if after.startswith("(") else ""
        return "new-delete", f"operator new is not available in Metal{placement}"
    if word == "delete":
        if before.endswith("="):
            return None  # a deleted function, `= delete`
        return "new-delete", "operator delete is not available in Metal"
    if word == "noexcept":
        if _SPECIFIER_BEFORE.search(before):
            return None
        return "noexcept-operator", "the noexcept operator is not available in Metal"
    if word == "main" and after.startswith("(") and re.search(r"[\w>*&]$", before) \
            and not re.search(r"\b(?:return|new|delete|case)$", before):
        return "main", "a Metal function cannot be called main"
    return None

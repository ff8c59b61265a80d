"""Program scope: the declarations outside every function and class (namespaces and
``extern "C"`` blocks are still program scope), and the rules of where Metal keeps
variables (MSL 3.2 specification, chapter 4 "Address Spaces"):

- a program-scope variable lives in the ``constant`` address space and is initialized
  (section 4.2); from MSL 3.1 a program-scope variable may instead carry a built-in
  attribute of Table 5.8, and from MSL 3.2 a resource binding (section 5.9);
- a ``threadgroup`` variable is declared in a kernel function (section 4.4).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from ..body import METAL_ATTRIBUTES
from ..lexing import matching
from ..target import MslTarget, MslVersion
from .code import Code
from .table import Violation

__all__ = ["Statement", "program_scope", "scope_violations"]


@dataclass(frozen=True)
class Statement:
    """One program-scope statement: a declaration (to its `;`), or a function definition
    (to its body's `}`), with the body's braces."""

    start: int
    end: int
    kind: Literal["declaration", "function"]
    body: tuple[int, int] | None = None


_NAMESPACE = re.compile(r"^\s*(?:inline\s+)?namespace\b[^;()]*$|^\s*extern\s*\"[^\"]*\"\s*$")
_ATTRIBUTES = re.compile(r"\[\[(?:[^\[\]]|\[[^\[\]]*\])*\]\]")
_TEMPLATE_HEAD = re.compile(r"^\s*template\s*<")
_CLASS = re.compile(r"^\s*(?:(?:struct|class|union|enum)\b)")


_PUNCTUATION = re.compile(r"[;{}(]")


@lru_cache(maxsize=8)
def program_scope(mask: str) -> tuple[Statement, ...]:
    """The program-scope statements of `mask` (a code mask), in order."""
    out: list[Statement] = []
    start, i, n = 0, 0, len(mask)
    while i < n:
        m = _PUNCTUATION.search(mask, i)
        if m is None:
            break
        i, c = m.start(), m.group()
        if c == ";":
            out.append(Statement(start, i + 1, "declaration"))
            start = i + 1
        elif c == "{":
            head = mask[start:i]
            if _NAMESPACE.search(head):
                start = i + 1  # into the namespace: still program scope
            else:
                end = matching(mask, i, "{", "}")
                if _block_kind(head) == "function":
                    out.append(Statement(start, end, "function", (i, end)))
                    start = end
                i = end  # a class body or braced initializer: the statement goes on
                continue
        elif c == "}":
            start = i + 1  # the end of a namespace
        else:
            i = matching(mask, i, "(", ")")
            continue
        i += 1
    return tuple(out)


def _strip_heads(text: str) -> str:
    """`text` without leading attribute groups and ``template <...>`` headers."""
    while True:
        text = text.lstrip()
        m = _ATTRIBUTES.match(text)
        if m:
            text = text[m.end():]
            continue
        if _TEMPLATE_HEAD.match(text):
            text = text[_angle_end(text, text.index("<")):]
            continue
        return text


def _angle_end(text: str, open_at: int) -> int:
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] in "<(":
            depth += 1
        elif text[k] in ">)":
            depth -= 1
            if depth == 0:
                return k + 1
    return len(text)


_OPERATOR = re.compile(r"\boperator\s*(?:\(\s*\)|\[\s*\]|[^\w\s(]+)")


def _top_level(text: str) -> str:
    """`text` with the insides of (), [] and <> blanked (where `=` and `(` are read); an
    operator's name (`operator<`, `operator()`) is one word."""
    text = _OPERATOR.sub(lambda m: "operator" + "_" * (len(m.group()) - 8), text)
    out, depth = [], 0
    for c in text:
        if c in "([<":
            out.append(c if depth == 0 else " ")
            depth += 1
        elif c in ")]>" and depth:
            depth -= 1
            out.append(c if depth == 0 else " ")
        else:
            out.append(c if depth == 0 else " ")
    return "".join(out)


def _block_kind(head: str) -> str:
    """What a `{` after `head` opens: a "class" body, a "function" body or an
    "initializer"."""
    text = _strip_heads(_ATTRIBUTES.sub(lambda m: " " * len(m.group()), head))
    if _CLASS.match(text):
        return "class"
    top = _top_level(re.sub(r"\b(?:decltype|alignas|__attribute__)\s*\(", "(", text))
    if "=" in top.split("(", 1)[0]:
        return "initializer"
    return "function" if "(" in top else "initializer"


_ADDRESS_SPACE = re.compile(r"\b(constant|device|threadgroup|thread|threadgroup_imageblock)\b")
_SKIP = re.compile(r"^\s*(?:typedef|using|static_assert|_Static_assert|namespace|friend|asm|"
                   r"template|enum)\b")
_BUILT_IN = re.compile(r"\[\[\s*(?:" + "|".join(n for n, _ in METAL_ATTRIBUTES) + r")\s*\]\]")
_BINDING = re.compile(r"\[\[[^\]]*\b(?:buffer|threadgroup|texture|sampler)\s*\(")
_FUNCTION_CONSTANT = re.compile(r"\[\[[^\]]*\bfunction_constant\s*\(")
_NAME = re.compile(r"([A-Za-z_]\w*)\s*$")
_GLOBAL_BUILT_INS = MslVersion(3, 1)
_GLOBAL_BINDINGS = MslVersion(3, 2)


@dataclass(frozen=True)
class Variable:
    """A program-scope variable: the offset of its name, the name, the address spaces
    written, and whether it is initialized, a function constant, or bound."""

    at: int
    name: str
    spaces: tuple[str, ...]
    initialized: bool
    function_constant: bool
    built_in: bool
    binding: bool
    external: bool


_BRACE = re.compile(r"[{}]")


def _blank_braces(text: str) -> str:
    """`text` with what is inside its outermost braces blanked."""
    if "{" not in text:
        return text
    out, depth, kept = [], 0, 0  # text[:kept] is in out
    for m in _BRACE.finditer(text):
        at = m.start()
        if m.group() == "{":
            if depth == 0:
                out.append(text[kept:at + 1])
                kept = at + 1
            depth += 1
        elif depth:
            depth -= 1
            if depth == 0:
                out.append(" " * (at - kept))
                kept = at
    out.append(text[kept:] if depth == 0 else " " * (len(text) - kept))
    return "".join(out)


def variable(mask: str, s: Statement) -> Variable | None:
    """The variable `s` declares, or None when it declares none (functions, types,
    aliases, assertions, instantiations)."""
    raw = _blank_braces(mask[s.start:s.end - 1])
    text = _strip_heads(raw)
    if not text.strip() or _SKIP.match(text):
        return None
    offset = s.start + len(raw) - len(text)
    attributes = " ".join(_ATTRIBUTES.findall(text))
    plain = _ATTRIBUTES.sub(lambda m: " " * len(m.group()), text)
    first = 0
    if _CLASS.match(plain):
        close = plain.rfind("}")
        if close < 0 and len(plain.split()) <= 2:
            return None  # `struct S;`
        first = close + 1 if close >= 0 else 0  # the declarators after a class body
        if not plain[first:].strip():
            return None
    top = _top_level(re.sub(r"\b(?:decltype|alignas|__attribute__)\s*\(", "(", plain))
    equals = top.find("=", first)
    declarator = top[: equals if equals >= 0 else len(top)]
    if "(" in declarator[first:]:
        return None  # a function declaration
    bracket = declarator.find("[", first)
    cut = bracket if bracket >= 0 else len(declarator)
    name = _NAME.search(declarator[:cut].rstrip("{} "))
    if name is None or name.start(1) < first:
        return None
    spaces = tuple(_ADDRESS_SPACE.findall(declarator[:cut]))
    return Variable(offset + name.start(1), name.group(1), spaces,
                    equals >= 0 or "{" in declarator[name.end(1):],
                    bool(_FUNCTION_CONSTANT.search(attributes)),
                    bool(_BUILT_IN.search(attributes)), bool(_BINDING.search(attributes)),
                    bool(re.match(r"\s*extern\b", plain)))


def constant_names(mask: str) -> set[str]:
    """Names of the program-scope constants (function constants among them)."""
    out = set()
    for s in program_scope(mask):
        v = variable(mask, s) if s.kind == "declaration" else None
        if v is not None and "constant" in v.spaces:
            out.add(v.name)
    return out


def scope_violations(code: Code, target: MslTarget) -> Iterator[Violation]:
    """Program-scope variables outside `constant`, constants without a value, and
    threadgroup variables outside kernel functions."""
    mask, version = code.mask, target.msl_version
    for s in program_scope(mask):
        if s.kind == "function":
            yield from _threadgroup_variables(code, s)
            continue
        v = variable(mask, s)
        if v is None:
            continue
        found = _variable_violation(v, version)
        if found is not None:
            violation = code.violation(found[0], v.at, found[1])
            if violation is not None:
                yield violation


def _variable_violation(v: Variable, version: MslVersion) -> tuple[str, str] | None:
    if "constant" in v.spaces:
        if v.initialized or v.function_constant or v.external or v.binding:
            return None
        return ("constant-initialized", f"`{v.name}` is in the constant address space, "
                "which must be initialized where it is declared (a function constant "
                "takes [[function_constant(index)]])")
    if v.built_in and version >= _GLOBAL_BUILT_INS:
        return None
    if v.binding and version >= _GLOBAL_BINDINGS:
        return None
    space = next((w for w in v.spaces if w != "constant"), "thread")
    return ("program-scope", f"program scope variable must reside in constant address space: "
            f"`{v.name}` is in the {space} address space (write `constant` and initialize it; "
            f"a kernel's per-thread or shared data lives in the kernel)")


_THREADGROUP_VARIABLE = re.compile(r"(?<![\w.])threadgroup\s+(?![*&])")
# Where Metal allocates threadgroup variables: kernel, mesh and object functions.
_KERNEL = re.compile(r"\[\[[^\]]*\b(?:kernel|mesh|object)\b|\bkernel\b")


def _threadgroup_variables(code: Code, s: Statement) -> Iterator[Violation]:
    """Threadgroup variables declared in the body of a function that is not a kernel."""
    assert s.body is not None
    mask = code.mask
    if _KERNEL.search(mask[s.start:s.body[0]]):
        return
    for m in _THREADGROUP_VARIABLE.finditer(mask, s.body[0], s.body[1]):
        before = mask[s.body[0]:m.start()].rstrip()
        if before and before[-1] not in ";{}":
            continue  # a parameter, a cast, a pointer's type
        end = mask.find(";", m.end(), s.body[1])
        declaration = _top_level(mask[m.end(): end if end >= 0 else s.body[1]])
        head = declaration.split("=", 1)[0]
        if "*" in head or "&" in head or "(" in head:
            continue  # a pointer or reference to threadgroup memory, or a function
        v = code.violation("threadgroup-variable", m.start(), "a threadgroup variable can be "
                           "declared in a kernel function only (pass threadgroup memory to "
                           "helpers as a threadgroup pointer)")
        if v is not None:
            yield v

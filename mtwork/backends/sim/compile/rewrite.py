"""Source rewrites that turn MSL into C++ the emulator's compiler accepts.

Each rewrite keeps every line where it was (replacements carry the newlines of the text
they replace), so compiler messages point at the author's own line numbers.

- ``threadgroup T name[N];`` in a function body becomes a reference into the
  threadgroup's shared memory (``auto& name = __mtw_threadgroup_var<T[N]>("name");``).
- Functions overloaded only on an address space (``f() threadgroup`` beside
  ``f() thread``) and class specializations that differ only in one
  (``pointer_element<device T*>``) collapse to one: without address spaces they would be
  redefinitions.
- Unsuffixed floating literals are ``float`` (Metal has no ``double``); ``1.0h`` is a
  ``half``.
- ``[[threadgroup(n)]]`` becomes ``[[mtw_threadgroup(n)]]`` (the word alone is a macro).
- A constructor declared for the ``constant`` address space loses the word (it is
  ``const`` here, which a constructor cannot be).
- Explicit instantiations (``template [[host_name("k")]] [[kernel]] ...;``) are dropped:
  the launcher instantiates the one kernel it runs.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable

from ....msl.lexing import (
    code_mask,
    code_without_directives,
    matching,
    matching_back,
    same_lines,
    split_top_level,
)

_ADDRESS_SPACES = ("device", "constant", "threadgroup")


def _declaration_start(mask: str, pos: int) -> int:
    """Start of the declaration containing `pos` (after the previous `;`, `{`, `}`)."""
    i = pos - 1
    while i >= 0:
        c = mask[i]
        if c == ")":
            i = matching_back(mask, i, "(", ")") - 1
            continue
        if c == ">":
            # Template headers: skip balanced angle brackets.
            depth = 0
            while i >= 0:
                if mask[i] == ">":
                    depth += 1
                elif mask[i] == "<":
                    depth -= 1
                    if depth == 0:
                        break
                elif mask[i] in ";{}":
                    return i + 1
                i -= 1
            i -= 1
            continue
        if c in ";{}":
            return i + 1
        if c == ":" and re.search(r"\b(public|private|protected)\s*$", mask[: i]):
            return i + 1
        i -= 1
    return 0


def _definition_end(mask: str, pos: int) -> int:
    """End of a member function declared or defined from `pos` (after its qualifiers)."""
    i = pos
    while i < len(mask):
        c = mask[i]
        if c == ";":
            return i + 1
        if c == "{":
            end = matching(mask, i, "{", "}")
            tail = re.match(r"\s*;", mask[end:])
            return end + (tail.end() if tail else 0)
        if c == "(":
            i = matching(mask, i, "(", ")")
            continue
        i += 1
    return len(mask)


_DEFINITION = re.compile(
    r"\)\s*(?:const\s+)?(?:(?:thread|device|constant|threadgroup)\s*)?(?=\{|:(?!:))"
)
_ADDRESS_SPACE_WORD = re.compile(r"\b(?:thread|device|constant|threadgroup)\b")
_NOT_FUNCTIONS = frozenset({"if", "for", "while", "switch", "catch", "return", "sizeof",
                            "decltype", "alignof", "static_assert", "noexcept"})


_BRACE = re.compile(r"[{}]")


def _word_before(mask: str, pos: int) -> str:
    """The word that ends just before `pos`, spaces between allowed ("" if none)."""
    end = pos
    while end > 0 and mask[end - 1].isspace():
        end -= 1
    start = end
    while start > 0 and (mask[start - 1].isalnum() or mask[start - 1] == "_"):
        start -= 1
    return mask[start:end]


def _scopes(mask: str) -> Callable[[int], int]:
    """A function giving, for a position, where the innermost `{` still open there is
    (-1 at file scope); one pass over the braces for every question."""
    at, inner, open_braces = [], [], []
    for m in _BRACE.finditer(mask):
        if m.group() == "{":
            open_braces.append(m.start())
        elif open_braces:
            open_braces.pop()
        at.append(m.start())
        inner.append(open_braces[-1] if open_braces else -1)

    def enclosing(pos: int) -> int:
        k = bisect.bisect_left(at, pos) - 1
        return inner[k] if k >= 0 else -1

    return enclosing


# Definitions grouped by (scope, signature without address spaces): for each, the number
# of address-space words, start and end offsets.
Variants = dict[tuple[int, str], list[tuple[int, int, int]]]


def _collapse_address_space_overloads(text: str) -> str:
    """Keeps one of each group of functions that differ only in address spaces. (Directive
    lines are blanked: a definition starts after a `#define` before it.)"""
    mask = code_without_directives(text)
    enclosing_scope = _scopes(mask)
    groups: Variants = {}
    last_end = 0
    for m in _DEFINITION.finditer(mask):
        if m.start() < last_end:
            continue  # inside the previous definition (its initializers or body)
        open_paren = matching_back(mask, m.start(), "(", ")")
        if _word_before(mask, open_paren) in _NOT_FUNCTIONS:
            continue
        start = _declaration_start(mask, open_paren)
        signature = mask[start : m.end()]
        spaces = [w for w in _ADDRESS_SPACE_WORD.findall(signature) if w != "thread"]
        key = re.sub(r"\s+", " ", _ADDRESS_SPACE_WORD.sub(" ", signature)).strip()
        scope = enclosing_scope(start)
        last_end = _definition_end(mask, m.end())
        groups.setdefault((scope, key), []).append((len(spaces), start, last_end))
    return _keep_one_of_each(text, groups)


def _keep_one_of_each(text: str, groups: Variants) -> str:
    """For each group of (address-space words, start, end) definitions that differ only in
    address spaces, keeps the one with the fewest (the `thread` or plain one)."""
    removals = []
    for defs in groups.values():
        if len(defs) < 2 or all(n == 0 for n, _, _ in defs):
            continue
        keep = min(defs, key=lambda d: d[0])
        removals += [(a, b) for d in defs if d is not keep for _, a, b in [d]]
    for a, b in sorted(removals, reverse=True):
        text = text[:a] + same_lines(text[a:b], "") + text[b:]
    return text


_SPECIALIZATION = re.compile(r"\b(?:struct|class)\s+\w+\s*<")


def _collapse_address_space_specializations(text: str) -> str:
    """Keeps one of each group of class specializations that differ only in address spaces
    (`pointer_element<device T*>` beside `pointer_element<thread T*>`)."""
    mask = code_without_directives(text)
    enclosing_scope = _scopes(mask)
    groups: Variants = {}
    for m in _SPECIALIZATION.finditer(mask):
        close = m.end() - 1
        depth = 0
        for close in range(m.end() - 1, len(mask)):
            depth += {"<": 1, ">": -1}.get(mask[close], 0)
            if depth == 0:
                break
        args = mask[m.end() : close]
        if not _ADDRESS_SPACE_WORD.search(args):
            continue
        body = re.match(r"\s*\{", mask[close + 1 :])
        if not body:
            continue
        open_brace = close + 1 + body.end() - 1
        end = matching(mask, open_brace, "{", "}")
        tail = re.match(r"\s*;", mask[end:])
        end += tail.end() if tail else 0
        start = _declaration_start(mask, m.start())
        spaces = [w for w in _ADDRESS_SPACE_WORD.findall(args) if w != "thread"]
        key = re.sub(r"\s+", " ", _ADDRESS_SPACE_WORD.sub(" ", mask[start:open_brace])).strip()
        groups.setdefault((enclosing_scope(start), key), []).append(
            (len(spaces), start, end)
        )
    return _keep_one_of_each(text, groups)


_THREADGROUP_DECL = re.compile(r"(?<![\w.])threadgroup\s+(?!\s*[*&])")


_DECLARATOR = re.compile(r"^\s*(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(\[[^\]]*\]\s*)*)$")
_COMPARISON = frozenset("=!<>")


def _initializer_start(declarator: str) -> int:
    """Index of the `=` that starts `declarator`'s initializer, or -1 (the `==` of an array
    size such as `[n == 0 ? 1 : n]` is no initializer)."""
    depth = 0
    for i, c in enumerate(declarator):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "=" and depth == 0:
            before = declarator[i - 1] if i else ""
            after = declarator[i + 1] if i + 1 < len(declarator) else ""
            if before not in _COMPARISON and after != "=":
                return i
    return -1


def _outside_brackets(text: str) -> str:
    """`text` with the insides of `[...]` blanked (array sizes may hold any expression)."""
    out, depth = [], 0
    for c in text:
        depth += c == "["
        out.append(" " if depth and c not in "[]" else c)
        depth -= c == "]"
    return "".join(out)


def _rewrite_threadgroup_variables(text: str) -> str:
    """`threadgroup T a[N], b;` in a body becomes references into threadgroup memory.

    An initializer (`threadgroup float buf[32] = {0};`, as in MLX's layer_norm) is dropped:
    a threadgroup variable is one allocation per threadgroup, which the MSL specification
    (section 4.4) gives no initial contents, so kernels fill it themselves (layer_norm
    zeroes its buffer from SIMD-group 0, then synchronizes). Keeping the initializer
    instead would make the variable thread-private, or let each thread clear memory that
    threads ahead of it already wrote.
    """
    mask = code_mask(text)
    edits: list[tuple[int, int, str]] = []
    for m in _THREADGROUP_DECL.finditer(mask):
        before = mask[: m.start()].rstrip()
        after_directive = before.rsplit("\n", 1)[-1].lstrip().startswith("#")
        if before and before[-1] not in ";{}" and not after_directive:
            continue  # a parameter, cast or pointer type, not a variable declaration
        end = mask.find(";", m.end())
        if end < 0:
            continue
        decl = mask[m.end() : end]
        parts = []
        for part in split_top_level(decl):
            cut = _initializer_start(part)
            parts.append(part if cut < 0 else part[:cut])
        if "(" in _outside_brackets(parts[0]):
            continue  # a function returning a threadgroup pointer or reference
        first = parts[0].rstrip()
        bracket = first.find("[")
        head = first if bracket < 0 else first[:bracket]
        name_match = re.search(r"([A-Za-z_]\w*)\s*$", head)
        if not name_match:
            continue
        type_text = head[: name_match.start()].strip()
        if not type_text or type_text.endswith(("*", "&")):
            continue
        declarators = [first[name_match.start() :]] + parts[1:]
        pieces = []
        for d in declarators:
            dm = _DECLARATOR.match(d)
            if not dm:
                break
            dims = re.sub(r"\s+", "", dm.group("dims"))
            pieces.append(
                f"auto& {dm.group('name')} = "
                f"__mtw_threadgroup_var<{type_text}{dims}>(\"{dm.group('name')}\");"
            )
        else:
            original = text[m.start() : end + 1]
            edits.append((m.start(), end + 1, same_lines(original, " ".join(pieces))))
    for a, b, new in reversed(edits):
        text = text[:a] + new + text[b:]
    return text


_FLOAT_LITERAL = re.compile(
    r"(?<![\w.])(?P<num>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)"
    r"(?P<suffix>[fFhHlL]|bf)?(?![\w.])"
)


def _rewrite_literals(text: str) -> str:
    mask = code_mask(text)
    lines_mask = mask.split("\n")
    edits: list[tuple[int, int, str]] = []
    offset = 0
    for line in lines_mask:
        if not line.lstrip().startswith("#"):
            for m in _FLOAT_LITERAL.finditer(line):
                suffix = m.group("suffix")
                a, b = offset + m.start(), offset + m.end()
                if suffix is None:
                    edits.append((a, b, m.group("num") + "f"))
                elif suffix in "hH":
                    edits.append((a, b, f"half({m.group('num')}f)"))
                elif suffix == "bf":
                    edits.append((a, b, f"bfloat({m.group('num')}f)"))
        offset += len(line) + 1
    for a, b, new in reversed(edits):
        text = text[:a] + new + text[b:]
    return text


# `template [[host_name("k")]] [[kernel]] decltype(f<T>) f<T>;`, also split over a macro's
# line continuations (MLX's and llama.cpp's instantiation macros).
_EXPLICIT_INSTANTIATION = re.compile(
    r"\btemplate(?:\s|\\\n)*(?:\[\[(?:[^\[\]]|\[[^\[\]]*\])*\]\](?:\s|\\\n)*)+")


def _drop_explicit_instantiations(text: str) -> str:
    """Blanks every explicit instantiation of a kernel: the launcher names the one it
    runs, so the compiler instantiates that one only, not all the library's."""
    mask = code_mask(text)
    edits = []
    for m in _EXPLICIT_INSTANTIATION.finditer(mask):
        end = mask.find(";", m.end())
        if end >= 0:
            edits.append((m.start(), end + 1))
    for a, b in reversed(edits):
        text = text[:a] + same_lines(text[a:b], "") + text[b:]
    return text


_THREADGROUP_ATTRIBUTE = re.compile(r"\[\[\s*threadgroup\s*\(")


_CLASS_NAME = re.compile(r"\b(?:struct|class)\s+([A-Za-z_]\w*)")


def _drop_constant_on_constructors(text: str) -> str:
    """Blanks `constant` after a constructor's parameters (MLX's os_log stub for MSL
    before 3.2 has `os_log(...) constant {}`): the word is `const` here, which a
    constructor cannot be."""
    mask = code_mask(text)
    names = sorted(set(_CLASS_NAME.findall(mask)))
    if "constant" not in mask or not names:
        return text
    edits = []
    calls = re.compile(r"\b(?:" + "|".join(map(re.escape, names)) + r")\s*\(")
    for m in calls.finditer(mask):
        close = matching(mask, m.end() - 1, "(", ")")
        after = re.match(r"\s*(constant)\b(?=\s*[{:])", mask[close:close + 64])
        if after:
            edits.append((close + after.start(1), close + after.end(1)))
    for a, b in sorted(edits, reverse=True):
        text = text[:a] + " " * (b - a) + text[b:]
    return text


def rewrite_keeping_address_spaces(text: str) -> str:
    """The rewrites the address-space check needs (`address_spaces.py`): threadgroup
    variables as references into threadgroup memory and explicit instantiations dropped;
    overloads on address spaces stay (they are real there) and literals as written."""
    text = _THREADGROUP_ATTRIBUTE.sub("[[mtw_threadgroup(", text)
    text = _rewrite_threadgroup_variables(text)
    return _drop_explicit_instantiations(text)


def rewrite_msl(text: str) -> str:
    """Applies every rewrite; see the module docstring."""
    # `threadgroup` is an empty macro, so its attribute form must not see it.
    text = _THREADGROUP_ATTRIBUTE.sub("[[mtw_threadgroup(", text)
    text = _collapse_address_space_overloads(text)
    text = _collapse_address_space_specializations(text)
    text = _drop_constant_on_constructors(text)
    text = _rewrite_threadgroup_variables(text)
    text = _rewrite_literals(text)
    return _drop_explicit_instantiations(text)

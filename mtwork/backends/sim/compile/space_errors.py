"""clang's address-space errors in the check, sorted into Metal's rules and told in Metal's
words.

The check maps Metal's spaces onto C++ for OpenCL's (`address_spaces.py`): ``device`` to
``__global``, ``constant`` to ``__constant``, ``threadgroup`` to ``__local``, and ``thread``
(a local variable; before MSL 4.1 also an unqualified pointer, reference or member
function) to ``__private``. A conversion between two of them is clang's error, as it is
Metal's. Some are not Metal's errors, and are left out here:

- a copy of an object from another space: C++ for OpenCL's implicit copy constructor and
  assignment take a reference in one space, Metal copies from and to any;
- the shim's types and functions used on memory in any space: Metal's own vectors,
  ``bfloat`` and library functions take every address space (the shim declares them once),
  and what clang finds inside the shim is the mapping's;
- a string literal, which C++ for OpenCL puts in ``__constant``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Diagnostic", "diagnostics", "explains", "metal_terms", "rule_of"]

_LOCATION = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): "
                       r"(?P<kind>error|fatal error|note): (?P<message>.*)$")


@dataclass
class Diagnostic:
    file: str
    line: int
    column: int
    message: str
    notes: list[Diagnostic]


def diagnostics(stderr: str) -> list[Diagnostic]:
    """The errors in `stderr`, each with the notes after it."""
    out: list[Diagnostic] = []
    for raw in stderr.splitlines():
        m = _LOCATION.match(raw)
        if m is None:
            continue
        d = Diagnostic(m.group("file"), int(m.group("line")), int(m.group("col")),
                       m.group("message"), [])
        if m.group("kind") == "note":
            if out:
                out[-1].notes.append(d)
        else:
            out.append(d)
    return out


_SPACES = ("__global", "__local", "__constant", "__private", "__generic")
# Errors about the mapping itself, not a Metal rule (the text rules cover these places).
_NOT_CONVERSIONS = ("program scope variable", "non-kernel function variable",
                    "cannot be used to declare a program scope", "may not be qualified with",
                    "automatic variable qualified", "variable in constant address space")
_CONVERSION = re.compile(r"cannot pass pointer to address space|converts between mismatching "
                         r"address spaces|cannot bind reference in address space|"
                         r"changes address space|non-overlapping address spaces|"
                         r"different address spaces")
_MEMBER = re.compile(r"'this' (?:object|argument)|object parameter of type")
_TYPE_PAIR = re.compile(r"'([^']*)'[^']*'([^']*)'")
_IMPLICIT_MEMBER = re.compile(r"\(the implicit (?:copy|move) (?:constructor|assignment "
                              r"operator)\) not viable: .*address space "
                              r"'__(?:constant|global|local)'")
_STRING = re.compile(r"__constant char\b")
_CLASS = re.compile(r"^(?:\s*\b(?:const|volatile|__\w+)\b)*\s*(?:metal::)?(?P<name>\w+)")


def rule_of(d: Diagnostic, shim: Path) -> str | None:
    """Which address-space rule an error (with its notes) reports, or None (not one, or
    one of the mapping's own, above); `shim` is the shim's folder."""
    texts = [d.message, *(n.message for n in d.notes if not n.message.startswith("in "))]
    if any(p in d.message for p in _NOT_CONVERSIONS) or any(_STRING.search(t) for t in texts):
        return None
    if _within(d.file, shim):
        return None  # inside Metal's own library, which takes every address space
    if any(_IMPLICIT_MEMBER.search(n.message) for n in d.notes):
        return None  # a copy of an object in constant memory
    candidates = [n for n in d.notes if n.message.startswith("candidate")]
    if candidates and all(_within(n.file, shim) for n in candidates):
        return None  # the shim's functions: Metal's take every address space
    for t in texts:
        if _MEMBER.search(t) and any(s in t for s in _SPACES):
            return None if _shim_object(t, shim) else "member-address-space"
        if _CONVERSION.search(t) or _differ_in_space_only(t):
            return "address-space-conversion"
    return None


def _within(file: str, folder: Path) -> bool:
    try:
        Path(file).relative_to(folder)
    except ValueError:
        return False
    return True


def _shim_object(message: str, shim: Path) -> bool:
    """Whether a member function's object is of one of the shim's types (a Metal vector,
    `bfloat`, ...: Metal's own types take member access in every address space)."""
    names = _shim_classes(shim)
    for quoted in re.findall(r"'([^']*)'", message):
        m = _CLASS.match(quoted)
        if m and m.group("name") in names:
            return True
    return False


_classes: dict[Path, frozenset[str]] = {}


def _shim_classes(shim: Path) -> frozenset[str]:
    if shim not in _classes:
        names = set()
        for header in shim.glob("*"):
            if header.is_file():
                names.update(re.findall(r"\b(?:struct|class)\s+(\w+)",
                                        header.read_text(errors="replace")))
                names.update(re.findall(r"\btypedef\s+[\w:<>, ]+?\s(\w+)\s*;",
                                        header.read_text(errors="replace")))
        _classes[shim] = frozenset(names)
    return _classes[shim]


def explains(note: str) -> bool:
    """Whether a note says which address spaces did not match."""
    return bool(_CONVERSION.search(note) or (_MEMBER.search(note) and "address space" in note)
                or _differ_in_space_only(note))


def _differ_in_space_only(message: str) -> bool:
    """Whether the two types a message quotes are the same but for address spaces."""
    m = _TYPE_PAIR.search(message)
    if m is None or not any(s in message for s in _SPACES):
        return False
    if not any(c in t for t in m.groups() for c in "*&["):
        return False  # objects, not pointers or references: a value has no address space
    a, b = (_without_spaces(t) for t in m.groups())
    return a == b and _spaces_of(m.group(1)) != _spaces_of(m.group(2))


def _spaces_of(type_text: str) -> list[str]:
    """The address spaces a type names, the pointer's own (after its `*`) left out."""
    text = re.sub(r"\*\s*(?:__private|__generic)\b", "*", type_text)
    return re.findall(r"\b(?:__global|__local|__constant|__private)\b", text)


def _without_spaces(type_text: str) -> str:
    """A type without address spaces and qualifiers, arrays decayed (a conversion may add
    const, and an array passes as a pointer)."""
    text = re.sub(r"\b(?:__global|__local|__constant|__private|__generic|const|volatile)\b",
                  " ", type_text)
    text = re.sub(r"\[\d*\]", "*", text.replace("&&", "&"))
    return re.sub(r"\s+", "", text)


_METAL_NAMES = (("__global", "device"), ("__constant", "constant"), ("__local", "threadgroup"),
                ("__private", "thread"), ("__generic ", ""), ("__generic", "thread"),
                ("__mtw_half", "half"))


def metal_terms(message: str) -> str:
    """A message of clang's in Metal's words."""
    message = re.sub(r"\*\s*(?:__private|__generic)\b", "*", message)  # the pointer's own
    for opencl, metal in _METAL_NAMES:
        message = message.replace(opencl, metal)
    return re.sub(r"  +", " ", message)

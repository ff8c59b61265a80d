"""Metal's address spaces, checked: a pointer or reference never converts between
``device``, ``constant``, ``threadgroup`` and ``thread`` (MSL 3.2 specification, chapter 4),
implicitly or by a cast, and a member function is called only on objects in the address
spaces it is declared for.

The emulator's build keeps no address spaces (its shim makes the words empty), so it
accepts every mismatch. This check parses the program a second time, without building
it, as C++ for OpenCL, whose address spaces are real types in clang: Metal's map onto
OpenCL's (mtw_base.h: ``device`` to ``__private``, ``constant`` to ``__global``,
``threadgroup`` to ``__local``, ``thread`` to the generic space that holds the other
three), so that each pair of Metal's named spaces is distinct while an object in any of
them still copies, and a conversion between two of them is clang's error. Only those
errors are reported, at the author's lines; every other difference between C++ for OpenCL
and Metal is left to the build. What the mapping cannot see (a ``device`` pointer to a
``thread`` variable, since locals are ``__private`` too; a named space converted to
``thread``) passes.

The sources are read as written, with the rewrites that are not about address spaces
(`rewrite.rewrite_keeping_address_spaces`: threadgroup variables, function constants),
and MLX's headers likewise (a copy in the cache). Results are cached by content, like
kernels; the shim's parse is a precompiled header.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .... import cachedir
from ....cachedir import cache_dir
from ....dispatch import Program
from ....errors import EmulatorUnavailable
from ....msl.constants import rewrite_function_constants, strip_msl_only_syntax
from ....msl.includes import mlx_include_dir
from ....msl.rules import Violation
from ....msl.rules.code import column_in
from ....toolchain import builtin_headers, run_clang, toolchain_identity
from . import precompiled
from .compiler import SHIM_DIR, digest, shim_version
from .rewrite import rewrite_keeping_address_spaces
from .sources import SourceTree, rewriters_digest, source_tree
from .translation import Translation

__all__ = ["address_space_violations", "for_check"]

# fp64 stays on: the shim's double overloads must parse (the text rules refuse `double`
# in the author's code).
# C++ for OpenCL is C++17: some of the shim's C++20 (constexpr bfloat) and of MLX's
# headers are errors there, which are not the check's business, so its precompiled header
# keeps them.
_LANGUAGE = ("-x", "clcpp", "-cl-std=clc++2021", "-cl-no-stdinc", "-ffreestanding",
             "-fdeclspec", "-fno-exceptions", "-fno-rtti",
             "-Xclang", "-fallow-pch-with-compiler-errors",
             "-Xclang", "-cl-ext=+cl_khr_fp16,+__cl_clang_function_pointers,"
                        "+__cl_clang_variadic_functions")
_DIAGNOSTICS = ("-fsyntax-only", "-ferror-limit=0", "-Wno-everything", "-fno-caret-diagnostics",
                "-fno-diagnostics-fixit-info", "-fno-color-diagnostics",
                "-fno-diagnostics-show-option")
_DEFINES = ("-DMLX_METAL_JIT", "-D__HAVE_MTWORK_EMULATOR__=1")
_CHECK_PRELUDE = SHIM_DIR / "mtw_check.h"
_headers_lock = threading.Lock()
_pch_lock = threading.Lock()


@cache
def _checker_digest() -> str:
    """This module's code: a change to how diagnostics are read checks anew."""
    return digest(Path(__file__).read_text())


def for_check(text: str) -> str:
    """An author's file as the check reads it (every line where it was)."""
    return rewrite_keeping_address_spaces(
        strip_msl_only_syntax(rewrite_function_constants(text)))


@cache
def check_headers_dir() -> Path:
    """A copy of MLX's Metal kernel headers as the check reads them."""
    source = mlx_include_dir()
    if source is None:
        raise EmulatorUnavailable("the installed mlx package has no Metal kernel headers")
    kernels = source / "mlx" / "backend" / "metal" / "kernels"
    h = digest(rewriters_digest(), *(f"{p.relative_to(kernels)}\0{p.read_text()}"
                                     for p in sorted(kernels.rglob("*.h"))))
    target = cache_dir() / f"mlx-check-headers-{h}"
    cachedir.pin(target)
    with _headers_lock:
        if cachedir.is_sealed(target):
            cachedir.used(target)
            return target
        cachedir.discard(target)
        tmp = cachedir.work_dir()
        for header in kernels.rglob("*.h"):
            out = tmp / header.relative_to(source)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(for_check(header.read_text()))
        cachedir.publish(tmp, target)
    return target


def _flags(program: Program) -> list[str]:
    """clang's flags for the check (the same for its precompiled header)."""
    macros = [f"-D{k}={v}" for k, v in program.msl_target.predefined_macros().items()]
    return [*_LANGUAGE, *_DEFINES, *macros, "-isystem", str(builtin_headers()),
            "-isystem", str(SHIM_DIR)]


_PRELUDE_INCLUDES = ("-include", str(_CHECK_PRELUDE), "-include", str(SHIM_DIR / "metal_types"))


def _precompiled(program: Program, tree: SourceTree, flags: list[str],
                 includes: list[str]) -> Path | None:
    """A precompiled header of what the check's unit starts with (the check's first lines,
    the shim, and the MLX headers the program includes first), built once per header
    list and flags, as the build's are (`precompiled.py`)."""
    head = f"#include <metal_types>\n{program.defines}{_prelude(program)}"
    tu = Translation(head, program.sources, tree.root, head)
    headers = precompiled.leading_headers(tu, SHIM_DIR, check_headers_dir())
    key = digest("check", *headers, " ".join(flags), *includes, shim_version(),
                 toolchain_identity())
    target = cache_dir() / "pch" / f"check-{key}.pch"
    header = target.with_suffix(".h")
    if precompiled.usable(target) and precompiled.usable(header):
        return target
    with _pch_lock:
        work = cachedir.work_dir()
        try:
            text = work / header.name
            text.write_text(f'#include "{_CHECK_PRELUDE.name}"\n#include <metal_types>\n'
                            + "".join(f'#include "{h}"\n' for h in headers))
            cachedir.publish(text, header)
            built = work / target.name
            result = run_clang([*flags, *includes, "-c", "-Xclang", "-emit-pch", str(header),
                                "-o", str(built)], "the check's precompiled header", raw=True)
            if result.returncode != 0:
                return None
            cachedir.publish(built, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target if precompiled.usable(target) else None


def _prelude(program: Program) -> str:
    prelude = program.sources.prelude
    return prelude if not prelude or prelude.endswith("\n") else prelude + "\n"


def _unit(program: Program, main: Path) -> str:
    """The translation unit: defines, prelude, the main file, and the kernel function
    named (so that a template kernel is instantiated, as the build instantiates it)."""
    path = str(main).replace("\\", "\\\\").replace('"', '\\"')
    return (f'{program.defines}{_prelude(program)}#include "{path}"\n'
            f"void __mtw_check_instantiate() {{ (void)&{program.function}; }}\n")


def address_space_violations(program: Program, every_file: bool = False
                             ) -> tuple[Violation, ...]:
    """The address-space rules `program` breaks, at the author's lines (cached by
    content); `every_file`: in MLX's headers too."""
    tree = source_tree(program, for_check, "check-sources")
    includes = [arg for d in (*tree.include_dirs, check_headers_dir())
                for arg in ("-I", str(d))]
    unit = _unit(program, tree.main)
    flags = _flags(program)
    key = digest(_checker_digest(), unit, " ".join(flags), *includes, shim_version(),
                 toolchain_identity(), str(every_file))
    cached = cache_dir() / "checks" / f"{key}.json"
    if cachedir.is_sealed(cached):
        cachedir.used(cached)
        return tuple(Violation(**v) for v in json.loads(cached.read_text()))
    pch = _precompiled(program, tree, flags, includes)
    work = cachedir.work_dir()
    try:
        cpp = work / "check.cpp"
        cpp.write_text(unit)
        # The header's key holds the digests of everything it was built from, so clang
        # need not validate it against them (which reads every header it holds).
        start = (list(_PRELUDE_INCLUDES) if pch is None else
                 ["-include-pch", str(pch), "-Xclang", "-fno-validate-pch"])
        args = [*flags, *_DIAGNOSTICS, *includes, str(cpp)]
        result = run_clang([*start, *args], program.label, raw=True)
        if result.returncode != 0 and pch is not None and str(pch) in result.stderr:
            cachedir.discard(pch)  # unreadable: parse everything, and build it again later
            result = run_clang([*_PRELUDE_INCLUDES, *args], program.label, raw=True)
        found = _violations(result.stderr, _Places(program, tree, every_file))
        out = work / cached.name
        out.write_text(json.dumps([v.__dict__ for v in found]))
        cachedir.publish(out, cached)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return found


# ---------------------------------------------------------------------------------------
# clang's diagnostics, told as Metal's


_LOCATION = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): "
                       r"(?P<kind>error|fatal error|note): (?P<message>.*)$")


@dataclass
class _Diagnostic:
    file: str
    line: int
    column: int
    message: str
    notes: list[_Diagnostic]


def _diagnostics(stderr: str) -> list[_Diagnostic]:
    """The errors in `stderr`, each with the notes after it."""
    out: list[_Diagnostic] = []
    for raw in stderr.splitlines():
        m = _LOCATION.match(raw)
        if m is None:
            continue
        d = _Diagnostic(m.group("file"), int(m.group("line")), int(m.group("col")),
                        m.group("message"), [])
        if m.group("kind") == "note":
            if out:
                out[-1].notes.append(d)
        else:
            out.append(d)
    return out


_SPACES = ("__global", "__local", "__private", "__generic")
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


def _rule(d: _Diagnostic) -> str | None:
    """Which address-space rule an error (with its notes) reports, or None."""
    texts = [d.message, *(n.message for n in d.notes if not n.message.startswith("in "))]
    if any("__constant" in t for t in texts):
        return None  # a string literal's space, which Metal's `constant` is not here
    if any(p in d.message for p in _NOT_CONVERSIONS):
        return None
    for t in texts:
        if _MEMBER.search(t) and any(s in t for s in _SPACES):
            return "member-address-space"
        if _CONVERSION.search(t) or _differ_in_space_only(t):
            return "address-space-conversion"
    return None


def _explains(note: str) -> bool:
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
    return re.findall(r"\b(?:__global|__local|__private)\b", text)


def _without_spaces(type_text: str) -> str:
    """A type without address spaces and qualifiers, arrays decayed (a conversion may add
    const, and an array passes as a pointer)."""
    text = re.sub(r"\b(?:__global|__local|__private|__generic|const|volatile)\b", " ",
                  type_text)
    text = re.sub(r"\[\d*\]", "*", text.replace("&&", "&"))
    return re.sub(r"\s+", "", text)


_METAL_NAMES = (("__private", "device (or thread)"), ("__global", "constant"),
                ("__local", "threadgroup"), ("__generic ", ""), ("__generic", "thread"),
                ("__mtw_half", "half"))


def _metal_terms(message: str) -> str:
    """A message of clang's in Metal's words."""
    message = re.sub(r"\*\s*(?:__private|__generic)\b", "*", message)  # the pointer's own
    for opencl, metal in _METAL_NAMES:
        message = message.replace(opencl, metal)
    return re.sub(r"  +", " ", message)


class _Places:
    """Which diagnostics are the author's (or, with `every_file`, in MLX's headers), and
    their text as written and as the check read it."""

    def __init__(self, program: Program, tree: SourceTree, every_file: bool) -> None:
        self.program, self.tree, self.every_file = program, tree, every_file
        self.originals = _originals(program)
        self.copies: dict[str, list[str]] = {}
        self.mlx = check_headers_dir() if every_file else None

    def place(self, file: str, line: int) -> tuple[str, int] | None:
        """The (file, line) of the code at `file`:`line` of the check, when it is held to
        the rules."""
        src = self.program.sources
        if file == src.label:
            return src.author_line(line)
        if any(file == str(p) for p, _ in src.files):
            return file, line
        original = self._mlx_original(file)
        return (str(original), line) if original is not None else None

    def _mlx_original(self, file: str) -> Path | None:
        root = mlx_include_dir()
        if self.mlx is None or root is None:
            return None
        try:
            return root / Path(file).relative_to(self.mlx)
        except ValueError:
            return None

    def lines(self, name: str) -> list[str]:
        """The lines of `name` as its author wrote them."""
        if name not in self.originals and Path(name).is_file():
            self.originals[name] = Path(name).read_text().split("\n")
        return self.originals.get(name, [])

    def compiled(self, file: str) -> list[str]:
        """The lines of the check's copy of `file` (as clang numbers them)."""
        if file not in self.copies:
            self.copies[file] = self._read_copy(file)
        return self.copies[file]

    def _read_copy(self, file: str) -> list[str]:
        src = self.program.sources
        path = next((p for p, _ in src.files if str(p) == file), None)
        if file == src.label:
            copy, skip = self.tree.main, 1
        elif path is not None:
            copy, skip = self.tree.root / path.relative_to(path.anchor), 1
        else:
            copy, skip = Path(file), 0
        try:
            return copy.read_text().split("\n")[skip:]  # after its #line directive
        except OSError:
            return []


def _violations(stderr: str, places: _Places) -> tuple[Violation, ...]:
    found: dict[tuple, Violation] = {}
    for d in _diagnostics(stderr):
        rule = _rule(d)
        if rule is None:
            continue
        at = next((a for a in (d, *(n for n in d.notes
                                    if n.message.startswith("in instantiation")))
                   if places.place(a.file, a.line) is not None), None)
        if at is None:
            continue  # in the shim, or (unless every file is held) in MLX's headers
        name, line = places.place(at.file, at.line)  # type: ignore[misc]
        detail = next((n.message for n in d.notes if _explains(n.message)), "")
        message = _metal_terms(d.message + (f" ({detail})" if detail else ""))
        lines = places.lines(name)
        excerpt = lines[line - 1].rstrip() if 0 < line <= len(lines) else ""
        copy = places.compiled(at.file)
        compiled = copy[at.line - 1] if 0 < at.line <= len(copy) else excerpt
        column = column_in(excerpt, compiled, at.column - 1) if excerpt else at.column
        found.setdefault((name, line, rule), Violation(rule, name, line, column, message,
                                                       excerpt))
    return tuple(found.values())


def _originals(program: Program) -> dict[str, list[str]]:
    src = program.sources
    texts = {src.label: src.text.split("\n")}
    texts |= {str(p): t.split("\n") for p, t in src.files}
    form = program.form
    for name in ("source", "header"):
        text = getattr(form, name, None)
        if isinstance(text, str):
            texts[name] = text.split("\n")
    return texts

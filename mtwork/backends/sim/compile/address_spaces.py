"""Metal's address spaces, checked: a pointer or reference never converts between
``device``, ``constant``, ``threadgroup`` and ``thread`` (MSL 3.2 specification, chapter 4),
implicitly or by a cast, and a member function is called only on objects in the address
spaces it is declared for (an unmarked one is ``thread``'s).

The emulator's build keeps no address spaces (its shim makes the words empty), so it
accepts every mismatch. This check parses the program a second time, syntax only, as C++
for OpenCL, whose address spaces are real types in clang: Metal's map onto OpenCL's
(mtw_base.h: ``device`` to ``__global``, ``constant`` to ``__constant``, ``threadgroup``
to ``__local``). Before MSL 4.1 the check turns off OpenCL's generic space, an optional
feature of C++ for OpenCL 2021: a local variable and an unqualified pointer, reference or
member function are then ``__private``, as they are Metal's ``thread``, and every
conversion between the four spaces is clang's error (`space_errors.py` reads them, leaving
out what is the mapping's, not Metal's). From MSL 4.1, where an unqualified pointer is
generic in Metal too (it may point to ``device``, ``threadgroup`` or ``thread`` memory, not
``constant``), the generic space stays on. Only the author's code is reported, at the
author's lines; every other difference between C++ for OpenCL and Metal is left to the
build.

The sources are read as written, with the rewrites that are not about address spaces
(`rewrite.rewrite_keeping_address_spaces`: threadgroup variables, function constants),
and MLX's headers likewise (a copy in the cache). Results are cached by content, like
kernels; the shim's parse is a precompiled header.
"""

from __future__ import annotations

import json
import shutil
import threading
from functools import cache
from pathlib import Path

from .... import cachedir, clang_sessions
from ....cachedir import cache_dir
from ....dispatch import BodyForm, Program
from ....msl.constants import rewrite_function_constants, strip_msl_only_syntax
from ....msl.includes import mlx_include_dir
from ....msl.rules import Violation
from ....msl.rules.code import column_in
from ....msl.target import MslVersion
from ....toolchain import builtin_headers, run_clang, run_clang_front_end, toolchain_identity
from . import precompiled
from .compiler import SHIM_DIR, digest, rewritten_mlx_headers, shim_version
from .rewrite import rewrite_keeping_address_spaces
from .sources import SourceTree, rewriters_digest, source_tree_in
from .space_errors import Diagnostic, diagnostics, explains, metal_terms, rule_of
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
_DIAGNOSTICS = ("-fsyntax-only", "-ferror-limit=0", "-Wno-everything", "-fno-spell-checking",
                "-fno-caret-diagnostics",
                "-fno-diagnostics-fixit-info", "-fno-color-diagnostics",
                "-fno-diagnostics-show-option")
# Before MSL 4.1 an unqualified pointer, reference or member function is Metal's `thread`:
# without OpenCL's generic space (an optional feature of C++ for OpenCL 2021, with the two
# that need it) it is the private space, so a conversion of device or threadgroup memory to
# it is clang's error too.
_PRIVATE = ("-Xclang", "-cl-ext=-__opencl_c_generic_address_space,-__opencl_c_pipes,"
                       "-__opencl_c_device_enqueue")
_DEFINES = ("-DMLX_METAL_JIT", "-D__HAVE_MTWORK_EMULATOR__=1")
_CHECK_PRELUDE = SHIM_DIR / "mtw_check.h"
_pch_lock = threading.Lock()


# From this version an unqualified pointer is generic in Metal too.
_GENERIC_POINTERS = MslVersion(4, 1)


@cache
def _checker_digest() -> str:
    """The check's code: a change to how diagnostics are read checks anew."""
    here = Path(__file__).parent
    return digest(*(here.joinpath(f).read_text()
                    for f in ("address_spaces.py", "space_errors.py")))


def for_check(text: str) -> str:
    """An author's file as the check reads it (every line where it was)."""
    return rewrite_keeping_address_spaces(
        strip_msl_only_syntax(rewrite_function_constants(text)))


@cache
def check_headers_dir() -> Path:
    """A copy of MLX's Metal kernel headers as the check reads them."""
    return rewritten_mlx_headers("mlx-check-headers", for_check)


def _flags(program: Program) -> list[str]:
    """clang's flags for the check (the same for its precompiled header)."""
    private = program.msl_target.msl_version < _GENERIC_POINTERS
    return [*_LANGUAGE, *(_PRIVATE if private else ()), *_DEFINES,
            *program.msl_target.define_flags(),
            "-isystem", str(builtin_headers()), "-isystem", str(SHIM_DIR)]


_PRELUDE_INCLUDES = ("-include", str(_CHECK_PRELUDE), "-include", str(SHIM_DIR / "metal_types"))


def _precompiled(program: Program, tree: SourceTree, flags: list[str]) -> Path | None:
    """A precompiled header of what the check's unit starts with (the check's first lines,
    the shim, and the MLX headers the program includes first), built once per header
    list and flags, as the build's are (`precompiled.py`). It holds MLX's headers only,
    none of which an author's header shadows, so it is built seeing MLX's copy alone."""
    head = f"#include <metal_types>\n{program.defines}{_prelude(program)}"
    tu = Translation(head, program.sources, tree.root, head)
    headers = precompiled.leading_headers(tu, SHIM_DIR, check_headers_dir())
    includes = ["-I", str(check_headers_dir())]
    key = digest("check", *headers, " ".join([*flags, *precompiled.BUILD_FLAGS]), *includes,
                 shim_version(), toolchain_identity())
    target = cache_dir() / "pch" / f"check-{key}.pch"
    header = target.with_suffix(".h")
    if precompiled.usable(target) and precompiled.usable(header):
        return target
    with _pch_lock, cachedir.build_lock(target):  # its header is not rewritten while in use
        if precompiled.usable(target) and precompiled.usable(header):
            return target
        work = cachedir.work_dir()
        try:
            text = work / header.name
            text.write_text(f'#include "{_CHECK_PRELUDE.name}"\n#include <metal_types>\n'
                            + "".join(f'#include "{h}"\n' for h in headers))
            cachedir.publish(text, header)
            built = work / target.name
            result = run_clang([*flags, *precompiled.BUILD_FLAGS, *includes, "-c", "-Xclang",
                                "-emit-pch", str(header), "-o", str(built)],
                               "the check's precompiled header", raw=True)
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
    """The translation unit: defines, prelude, the main file, and the kernel function named
    when it is a template the source does not instantiate itself (so that it is
    instantiated, as the build instantiates it). Every other kernel of a file with the
    same defines has the same unit, and so one check: Metal compiles the whole file too."""
    path = str(main).replace("\\", "\\\\").replace('"', '\\"')
    form = program.form
    named = isinstance(form, BodyForm) or (form.template_args and not form.instantiated)
    instantiate = (f"void __mtw_check_instantiate() {{ (void)&{program.function}; }}\n"
                   if named else "")
    return f'{program.defines}{_prelude(program)}#include "{path}"\n{instantiate}'


def address_space_violations(program: Program, every_file: bool = False
                             ) -> tuple[Violation, ...]:
    """The address-space rules `program` breaks, at the author's lines (cached by
    content); `every_file`: in MLX's headers too."""
    src = program.sources
    flags = _flags(program)
    # Keyed by content: the copy clang reads is written afresh in a folder of the check's.
    key = digest(_checker_digest(), rewriters_digest(), src.label, src.text, str(src.path),
                 *(part for path, text in sorted(src.files) for part in (str(path), text)),
                 *map(str, src.search_dirs), _unit(program, Path("main")), " ".join(flags),
                 str(check_headers_dir()), shim_version(), toolchain_identity(),
                 str(every_file))
    cached = cache_dir() / "checks" / f"{key}.json"
    if cachedir.is_sealed(cached):
        cachedir.used(cached)
        return tuple(Violation(**v) for v in json.loads(cached.read_text()))
    work = cachedir.work_dir()
    kept = False
    try:
        tree = source_tree_in(work / "sources", program, for_check)
        includes = [arg for d in (*tree.include_dirs, check_headers_dir())
                    for arg in ("-I", str(d))]
        pch = _precompiled(program, tree, flags)
        cpp = work / "check.cpp"
        cpp.write_text(_unit(program, tree.main))
        # The header's key holds the digests of everything it was built from, so clang
        # need not validate it against them (which reads every header it holds).
        fixed = [*flags, *_DIAGNOSTICS, "-Xclang", "-fno-validate-pch"]
        args = [*flags, *_DIAGNOSTICS, *includes, str(cpp)]
        extra = ["-include-pch", str(pch), *includes]
        result = None
        if pch is not None and _shareable(program, tree):
            shared = clang_sessions.run(fixed, extra, cpp.read_text(), work,
                                        depends=(pch, check_headers_dir()))
            if shared is not None:
                result, kept = shared  # a folder kept is the session's, removed at its end
        if result is None:
            result = (run_clang([*_PRELUDE_INCLUDES, *args], program.label, raw=True)
                      if pch is None else
                      run_clang_front_end(fixed, extra, cpp, program.label))
        if result.returncode != 0 and pch is not None and str(pch) in result.stderr:
            cachedir.discard(pch)  # unreadable: parse everything, and build it again later
            result = run_clang([*_PRELUDE_INCLUDES, *args], program.label, raw=True)
        places = _Places(program, tree, every_file)
        found = _violations(result.stderr, places)
        out = work / cached.name
        out.write_text(json.dumps([v.__dict__ for v in found]))
        cachedir.publish(out, cached)
    finally:
        if not kept:
            shutil.rmtree(work, ignore_errors=True)
    return found


def _shareable(program: Program, tree: SourceTree) -> bool:
    """Whether the check of `program` can go to a clang session (`clang_sessions`): its
    flags are the same as other programs' (no folder of the author's to search, whose
    copy is in this check's own folder), and neither its texts nor MLX's headers set
    diagnostic state by pragma."""
    src = program.sources
    return (not tree.include_dirs and _headers_shareable(check_headers_dir())
            and clang_sessions.reads_like_a_session(
                (program.defines, src.prelude, src.text, *(t for _, t in src.files))))


@cache
def _headers_shareable(folder: Path) -> bool:
    return clang_sessions.reads_like_a_session(
        [p.read_text(errors="replace") for p in sorted(folder.rglob("*")) if p.is_file()])


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

    def violation(self, rule: str, at: Diagnostic, message: str) -> Violation:
        """A finding at clang's place `at` (held to the rules), at the author's line and
        column."""
        name, line = self.place(at.file, at.line)  # type: ignore[misc]
        lines = self.lines(name)
        excerpt = lines[line - 1].rstrip() if 0 < line <= len(lines) else ""
        copy = self.compiled(at.file)
        compiled = copy[at.line - 1] if 0 < at.line <= len(copy) else excerpt
        column = column_in(excerpt, compiled, at.column - 1) if excerpt else at.column
        return Violation(rule, name, line, column, message, excerpt)

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
    """clang's address-space errors that are Metal's, at the author's lines."""
    found: dict[tuple, Violation] = {}
    for d in diagnostics(stderr):
        rule = rule_of(d, SHIM_DIR)
        if rule is None:
            continue
        at = next((a for a in (d, *(n for n in d.notes
                                    if n.message.startswith("in instantiation")))
                   if places.place(a.file, a.line) is not None), None)
        if at is None:
            continue  # in the shim, or (unless every file is held) in MLX's headers
        detail = next((n.message for n in d.notes if explains(n.message)), "")
        message = metal_terms(d.message + (f" ({detail})" if detail else ""))
        v = places.violation(rule, at, message)
        found.setdefault((v.file, v.line, rule), v)
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

"""The text rules of the Metal front end, run over a program's source as Apple's compiler
would see it after the preprocessor (for the target's language version, so ``#if
__METAL_VERSION__ >= 320`` goes the same way): excluded C++ features and scalar types,
program-scope variables, threadgroup variables, function constants, kernel functions and
their arguments. Only the author's code is held to them (MLX's headers, which a kernel
includes, compile on Apple's compiler already; the conformance suite checks them as an
author's files).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

from ...errors import CompileError
from ..preprocess import Preprocessed, macro_names, preprocess
from ..signature import parse_source
from ..target import MslTarget
from .code import Code, Place
from .features import feature_violations
from .kernels import (
    constant_violations,
    host_name_violations,
    kernel_return_violations,
    signature_violations,
)
from .scope import constant_names, scope_violations
from .table import Violation

__all__ = ["AuthorText", "text_violations"]

# (first, last, name, offset): lines first..last of the main file are the author's `name`,
# counted from offset + 1 (a body-form kernel's `source` and `header`).
Region = tuple[int, int, str, int]
AuthorText = tuple[str, str]  # (name, text) of a text the author wrote


def _struct_names(mask: str) -> set[str]:
    return set(re.findall(r"\b(?:struct|class|union)\s+([A-Za-z_]\w*)", mask))


@lru_cache(maxsize=256)
def text_violations(text: str, *, label: str, target: MslTarget,
                    files: tuple[tuple[Path, str], ...] = (),
                    search_dirs: tuple[Path, ...] = (), prelude: str = "",
                    defines: tuple[tuple[str, str], ...] = (),
                    regions: tuple[Region, ...] = (),
                    authored: tuple[AuthorText, ...] = (),
                    kernels: bool = True,
                    every_file: bool = False) -> tuple[Violation, ...]:
    """The rules `text` (the main file, named `label`, with the author's included `files`)
    breaks when compiled for `target`. `regions` say which lines of the main file are the
    author's and under which name (`authored` gives those names' texts); without them
    the whole file is. `kernels`: check the kernel functions' signatures too (a body-form
    kernel's signature is MLX's). `every_file`: hold the files the author did not write
    (MLX's headers) to the rules too."""
    macros = {**target.predefined_macros(), **dict(defines)}
    try:
        if regions and not every_file and _reads_the_same(authored, prelude, search_dirs,
                                                          macros):
            seen = Preprocessed(text, tuple((label, k + 1)
                                            for k in range(text.count("\n") + 1)))
        else:
            seen = preprocess(text, label=label, search_dirs=search_dirs, prelude=prelude,
                              defines=macros, files=files)
    except CompileError:
        return ()  # the compile itself reports what the preprocessor could not read
    texts: dict[str, Sequence[str]] = {label: text.split("\n")}
    texts |= {str(p): t.split("\n") for p, t in files}
    texts |= {name: t.split("\n") for name, t in authored}
    if every_file:
        texts |= {f: _read(f) for f in {f for f, _ in seen.origins} if f not in texts
                  and Path(f).is_file()}
    places = [_author_place(file, line, label, texts, regions) for file, line in seen.origins]
    code = Code(seen.text, places, texts.get, [file == label for file, _ in seen.origins])
    found = [*feature_violations(code, target), *scope_violations(code, target),
             *constant_violations(code, _struct_names(code.mask)),
             *kernel_return_violations(code)]
    if kernels:
        # The author's kernels and instantiations (the lines of the files the author did
        # not write are empty in author_text); the constants an argument's
        # [[function_constant(name)]] may name are anyone's.
        parsed = parse_source(code.author_text, label, origin=seen.origin)
        constants = (constant_names(code.mask) | {c.name for c in parse_source(
            seen.text, label, origin=seen.origin).function_constants}
            if "function_constant" in code.mask else set())
        for k in parsed.kernels:
            if k.file in texts and not regions:
                found += signature_violations(k, target, constants, code)
        found += host_name_violations(parsed.instantiations, parsed.kernels, code)
    unique = dict.fromkeys(found)
    return tuple(sorted(unique, key=lambda v: (v.file != label, v.file, v.line, v.column)))


_WORD = re.compile(r"[A-Za-z_]\w*")


def _reads_the_same(authored: tuple[AuthorText, ...], prelude: str,
                    search_dirs: tuple[Path, ...], macros: Mapping[str, str]) -> bool:
    """Whether the author's texts come out of the preprocessor as they are: no directive,
    and no name of a macro the prelude or the compiler defines (most body-form kernels;
    they skip the preprocessor's run)."""
    if any("#" in t for _, t in authored):
        return False
    names = macro_names(prelude, search_dirs=search_dirs, defines=macros) | set(macros)
    return not any(w in names for _, t in authored for w in _WORD.findall(t))


def _read(path: str) -> Sequence[str]:
    return Path(path).read_text().split("\n")


def _author_place(file: str, line: int, label: str, texts: Mapping[str, Sequence[str]],
                  regions: tuple[Region, ...]) -> Place | None:
    if file == label and regions:
        for first, last, name, offset in regions:
            if first <= line <= last:
                return name, line - offset
        return None
    return (file, line) if file in texts else None

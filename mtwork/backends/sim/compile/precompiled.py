"""Precompiled headers of what every kernel starts with: the shim's <metal_stdlib>, and
MLX's headers when a kernel's first lines include them (the body form's ``utils.h``).

clang parsing <metal_stdlib> and ``utils.h`` is most of a small kernel's compile (0.2 of
0.3 CPU seconds); a precompiled header is read instead in a few milliseconds. One is built
per header list and per compile flags (a precompiled header is only valid for the flags it
was built with), kept in the cache like the kernels (``pch/<key>.pch``, sealed), and used
by every later compile with the same start.

Only headers that nothing before them can change go in: <metal_types> (which every unit
includes first), then the MLX headers its leading ``#include "mlx/..."`` lines name, in
their order, with no definition or code between them.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .... import cachedir
from ....cachedir import cache_dir
from ....toolchain import run_clang, toolchain_identity
from .translation import Translation

__all__ = ["leading_headers", "precompiled_header", "run_from", "usable"]

_MLX_INCLUDE = re.compile(r'#\s*include\s*"(mlx/backend/metal/kernels/[^"]+)"\s*$')
# Lines that change nothing a later header sees: blanks, line comments, #line markers.
_NEUTRAL = re.compile(r"\s*(?://.*)?$|\s*#\s*line\b")
# A function constant's value (`msl/constants.py`): only code that names it can change.
_CONSTANT_DEFINE = re.compile(r"\s*#\s*define\s+__mtw_fc_\w+")
_CONSTANT_USE = "__mtw_fc_"
_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
_SHIM_INCLUDE = re.compile(r"\s*#\s*include\s*<(metal_\w+)>\s*$")
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\b", re.M)
# Validate by content: a checkout that rewrites a header with the same bytes (a new
# modification time) keeps its precompiled header.
_VALIDATE = ("-fpch-validate-input-files-content",)
_lock = threading.Lock()
_checked: dict[Path, tuple[int, int, int]] = {}  # seal verified for this (inode, size, mtime)


def leading_headers(tu: Translation, shim_dir: Path, mlx_dir: Path) -> tuple[str, ...]:
    """The MLX headers `tu` includes before anything else: from the text before the
    author's main file, then from that file's first lines (when nothing but includes came
    before it). `shim_dir` is the shim's include folder, `mlx_dir` that of MLX's
    rewritten headers. Only headers included once (``#pragma once``) go in: the author's
    own include of one then adds nothing (MLX's kernel headers, sort.h say, have none)."""
    found: list[str] = []
    scan = _Scan(_within_metal_types(shim_dir), mlx_dir)
    head = tu.head.splitlines()[1:]  # the first is #include <metal_types>
    # Function constants' values may come first: the headers that never name one go in.
    constants = [line for line in head if _CONSTANT_DEFINE.match(line)]
    for line in head:
        if not _CONSTANT_DEFINE.match(line) and not scan.take(line, found):
            return _before_constants(found, mlx_dir) if constants else tuple(found)
    for line in tu.sources.text.splitlines():
        if not scan.take(line, found):
            break
    if constants:
        found = list(_before_constants(found, mlx_dir))
    # A quoted include finds the author's header first, when there is one of that name
    # beside the main file or in the author's folders: the list ends before it.
    folders = list(tu.sources.search_dirs)
    if tu.tree is not None and tu.sources.path is not None:
        folders.append(tu.tree / tu.sources.path.parent.relative_to(tu.sources.path.anchor))
    shadowed = [i for i, h in enumerate(found) if any((d / h).exists() for d in folders)]
    return tuple(found[: shadowed[0]] if shadowed else found)


def _before_constants(headers: list[str], mlx_dir: Path) -> tuple[str, ...]:
    """`headers` up to the first that names a function constant's value, itself or by an
    MLX header it includes."""
    kept = []
    for header in headers:
        if _names_constants(mlx_dir / header, mlx_dir):
            break
        kept.append(header)
    return tuple(kept)


@cache
def _names_constants(header: Path, mlx_dir: Path) -> bool:
    seen, todo = set(), [header]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue  # not an MLX header (the shim's name no constant)
        seen.add(path)
        text = path.read_text()
        if _CONSTANT_USE in text:
            return True
        todo += [folder / name for name in _QUOTED_INCLUDE.findall(text)
                 for folder in (mlx_dir, path.parent)]
    return False


@dataclass(frozen=True)
class _Scan:
    shim: frozenset[str]  # shim headers <metal_types> holds
    mlx_dir: Path

    def take(self, line: str, found: list[str]) -> bool:
        """Adds an MLX header `line` includes to `found`; whether the scan goes on (past
        lines that change nothing, and shim headers <metal_types> already holds)."""
        m = _MLX_INCLUDE.match(line.strip())
        if m:
            if not _included_once(self.mlx_dir / m.group(1)):
                return False
            if m.group(1) not in found:
                found.append(m.group(1))
            return True
        included = _SHIM_INCLUDE.match(line)
        if included:
            return included.group(1) in self.shim
        return bool(_NEUTRAL.match(line))


@cache
def _included_once(header: Path) -> bool:
    try:
        text = header.read_text()
    except OSError:
        return False
    return _PRAGMA_ONCE.search(text) is not None


@cache
def _within_metal_types(shim_dir: Path) -> frozenset[str]:
    """The shim's headers that only include <metal_stdlib> (which <metal_types> does)."""
    inside = {"metal_stdlib"}
    for header in shim_dir.glob("metal_*"):
        lines = [t.strip() for t in header.read_text().splitlines()]
        directives = [t for t in lines if t.startswith("#") and t != "#pragma once"]
        if directives == ['#include "metal_stdlib"']:
            inside.add(header.name)
    return frozenset(inside)


# Templates that the headers' own inline functions use are instantiated in the header,
# once, not at the end of every unit that reads it: 26 of the 84 ms a kernel's compile
# spends before its own code (MLX's utils.h instantiates the shim's SIMD-group shuffles).
BUILD_FLAGS = ("-fpch-instantiate-templates",)


def precompiled_header(headers: Sequence[str], flags: Sequence[str],
                       includes: Sequence[str], shim_version: str) -> Path | None:
    """The precompiled header of <metal_types> and `headers` for `flags` (built once), or
    None when it cannot be built (the kernel's own compile then says why)."""
    h = hashlib.sha256()
    for part in (*headers, " ".join([*flags, *BUILD_FLAGS]), " ".join(includes),
                 shim_version, toolchain_identity()):
        h.update(part.encode() + b"\0")
    key = h.hexdigest()[:24]
    target = cache_dir() / "pch" / f"{key}.pch"
    # The header stays beside it: clang reads a precompiled header's own source back.
    header = target.with_suffix(".h")
    if usable(target) and usable(header):
        return target
    with _lock, cachedir.build_lock(target):  # its header is not rewritten while in use
        if usable(target) and usable(header):
            return target
        work = cachedir.work_dir()
        try:
            text = work / header.name
            text.write_text("#include <metal_types>\n"
                            + "".join(f'#include "{h}"\n' for h in headers))
            cachedir.publish(text, header)
            built = work / target.name
            result = run_clang([*flags, *BUILD_FLAGS, *includes, "-x", "c++-header", str(header),
                                "-o", str(built)], "the kernels' precompiled header")
            if result.returncode != 0:
                return None
            cachedir.publish(built, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target if usable(target) else None


def usable(target: Path) -> bool:
    """Whether `target` is whole (its seal checked once per process and file version)."""
    try:
        st = os.stat(target)
    except OSError:
        return False
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    if _checked.get(target) != stamp:
        if not cachedir.is_sealed(target):
            cachedir.discard(target)  # cut short or changed: built again
            return False
        _checked[target] = stamp
        cachedir.pin(target)
    cachedir.used(target)
    return True


def run_from(pch: Path | None, args: list[str],
             run: Callable[[list[str]], subprocess.CompletedProcess]
             ) -> subprocess.CompletedProcess:
    """`run(args)` with clang reading `pch` first; again without it when the compile
    failed on that header itself (it is then removed, to be built again)."""
    result = run(args if pch is None else ["-include-pch", str(pch), *_VALIDATE, *args])
    if result.returncode != 0 and pch is not None and str(pch) in result.stderr:
        _checked.pop(pch, None)
        cachedir.discard(pch)
        result = run(args)
    return result

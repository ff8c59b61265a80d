"""A library's source as the Metal compiler sees it after the preprocessor: macros
expanded (instantiation macros such as MLX's ``instantiate_kernel``, constants such as
llama.cpp's ``FC_MUL_MV``), ``#if`` branches that are off left out, includes pasted in.

Listing kernels from this text, not from the file as written, is what makes host names
made by macros and kernels under ``#ifdef`` come out as Metal would see them. clang's
preprocessor does the work, with the Metal standard library's headers as empty stubs (the
words ``device``, ``kernel``, ... must survive, and no stdlib macro decides what a
library defines). Each line of the result knows the file and line it came from.

Results are kept in the cache, keyed by every input.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import cachedir
from ..cachedir import cache_dir
from ..errors import CompileError
from ..toolchain import run_clang
from .includes import mlx_include_dir

__all__ = ["METAL_DEFINES", "Preprocessed", "macro_names", "preprocess"]

# What Apple's compiler defines that libraries test (MLX's defines.h tests __METAL__).
METAL_DEFINES = {"__METAL__": "1", "__METAL_VERSION__": "320", "__METAL_MACOS__": "1"}

_MARKER = re.compile(r'^# (\d+) "((?:[^"\\]|\\.)*)"')
_MISSING = re.compile(r"fatal error: '([^']+)' file not found")
_CACHE_FORMAT = "1"
# The last few results in memory: a library's load and the Metal check's text rules read
# the same file's preprocessed text one after the other.
_RECENT_SIZE = 8
_recent: dict[str, Preprocessed] = {}
_recent_lock = threading.Lock()


@dataclass(frozen=True)
class Preprocessed:
    """Preprocessed text, and for each of its lines the (file, line) it came from."""

    text: str
    origins: tuple[tuple[str, int], ...]

    def origin(self, line: int) -> tuple[str, int]:
        """(file, line) of line `line` (1-based) of `text`."""
        return self.origins[min(max(line, 1), len(self.origins)) - 1]


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _stubs() -> Path:
    path = cache_dir() / "preprocess-stubs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _lines(output: str) -> Preprocessed:
    """Splits clang's output at its line markers into lines that know their origin."""
    lines, origins = [], []
    file, line = "<stdin>", 1
    for raw in output.split("\n"):
        marker = _MARKER.match(raw)
        if marker:
            line = int(marker.group(1))
            file = re.sub(r"\\(.)", r"\1", marker.group(2))
            continue
        lines.append(raw)
        origins.append((file, line))
        line += 1
    return Preprocessed("\n".join(lines), tuple(origins))


def preprocess(text: str, *, label: str, search_dirs: Sequence[Path] = (), prelude: str = "",
               defines: Mapping[str, str] | None = None,
               files: Sequence[tuple[Path, str]] = ()) -> Preprocessed:
    """`prelude` then `text` (named `label`) through the preprocessor, ``#include "..."``
    searching `search_dirs`, then MLX's kernel headers. `files` (the author's included
    files with their text) key the cache; `defines` are set first."""
    macros = {**METAL_DEFINES, **dict(defines or {})}
    mlx_root = mlx_include_dir()
    dirs = [*map(str, search_dirs), *([str(mlx_root)] if mlx_root else [])]
    source = prelude + ("\n" if prelude and not prelude.endswith("\n") else "") + \
        '#line 1 "' + label.replace("\\", "\\\\").replace('"', '\\"') + '"\n' + text
    key = _digest(_CACHE_FORMAT, source, json.dumps(sorted(macros.items())), *dirs,
                  *(f"{p}\0{t}" for p, t in sorted(files)), str(mlx_root))
    with _recent_lock:
        if key in _recent:
            return _recent[key]
    cached = cache_dir() / "preprocessed" / f"{key}.json"
    if cachedir.is_sealed(cached):
        cachedir.used(cached)
        data = json.loads(cached.read_text())
        result = Preprocessed(data["text"], tuple(map(tuple, data["origins"])))
    else:
        result = _run(source, label, dirs, macros)
        _store(cached, {"text": result.text, "origins": result.origins})
    with _recent_lock:
        _recent[key] = result
        while len(_recent) > _RECENT_SIZE:
            del _recent[next(iter(_recent))]
    return result


def macro_names(prelude: str, *, search_dirs: Sequence[Path] = (),
                defines: Mapping[str, str] | None = None) -> frozenset[str]:
    """The macros `prelude` defines (MLX's headers a body-form kernel starts with): code
    that names none of them, and has no directive, reads the same preprocessed."""
    macros = {**METAL_DEFINES, **dict(defines or {})}
    mlx_root = mlx_include_dir()
    dirs = [*map(str, search_dirs), *([str(mlx_root)] if mlx_root else [])]
    key = _digest(_CACHE_FORMAT, "macros", prelude,
                  json.dumps(sorted(macros.items())), *dirs, str(mlx_root))
    cached = cache_dir() / "preprocessed" / f"{key}.json"
    if cachedir.is_sealed(cached):
        cachedir.used(cached)
        return frozenset(json.loads(cached.read_text()))
    output = _run(prelude, "the prelude", dirs, macros, extra=("-dM",), raw_output=True)
    names = sorted(set(re.findall(r"^#define (\w+)", output, flags=re.M)))
    _store(cached, names)  # type: ignore[arg-type]
    return frozenset(names)


def _run(source: str, label: str, dirs: Sequence[str], macros: Mapping[str, str],
         extra: Sequence[str] = (), raw_output: bool = False):
    args = ["-E", *extra, "-x", "c++", "-std=c++20", "-nostdinc", "-nostdinc++",
            "-Wno-everything", "-isystem", str(_stubs()),
            *[arg for d in dirs for arg in ("-I", d)],
            *[f"-D{name}={value}" for name, value in macros.items()], "-"]
    for _ in range(64):  # each round adds the stub of one more Metal header
        result = run_clang(args, label, stdin=source)
        if result.returncode == 0:
            return result.stdout if raw_output else _lines(result.stdout)
        missing = _MISSING.search(result.stderr)
        name = missing.group(1) if missing else ""
        angled = re.search(r"#\s*include\s*<" + re.escape(name) + ">", result.stderr)
        stub = _stubs() / name
        if not (missing and angled and re.fullmatch(r"[\w./+-]+", name)) or stub.exists():
            raise CompileError(label, result.stderr.replace("<stdin>", label))
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.touch()
    raise CompileError(label, "too many missing headers while preprocessing")


def _store(path: Path, data: dict | list) -> None:
    work = cachedir.work_dir()
    try:
        built = work / path.name
        built.write_text(json.dumps(data))
        cachedir.publish(built, path)
    finally:
        shutil.rmtree(work, ignore_errors=True)

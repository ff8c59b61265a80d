"""A program's sources as the emulator compiles them: a rewritten copy of the author's
files in the cache, and the translation unit that includes it.

Each file is rewritten for C++ (function constants as macros, MSL-only syntax blanked,
the rewrites of `rewrite.py`) with every line kept in place, and starts with a ``#line``
directive naming the author's file, so compiler messages and debug line tables name the
author's files and lines. The copy keeps the files at the same relative places as the
originals, so ``#include "..."`` finds the rewritten neighbours.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

from .... import cachedir
from ....cachedir import cache_dir
from ....dispatch import Param, Program
from ....limits import MAX_BUFFER_INDEX
from ....msl.constants import rewrite_function_constants, strip_msl_only_syntax
from .launcher import LaunchParam, launcher_source
from .rewrite import rewrite_msl
from .translation import Translation

__all__ = ["THREADGROUP_SLOT_BASE", "SourceTree", "for_emulator", "never_blocks",
           "rewriters_digest", "source_tree", "source_tree_in", "translation_unit"]

Launcher = Callable[[str, Sequence[LaunchParam]], str]

# Calls that can suspend a thread. A kernel without any runs as plain loops per threadgroup
# (see launcher.py); the runtime reports it if one slips through.
_BLOCKING = re.compile(
    r"\b(?:threadgroup_barrier|simdgroup_barrier|simd_\w+|quad_\w+|threadgroup|"
    r"simdgroup_(?!index_in_threadgroup\b)\w+|schedule_row_tile)\b"
)

# [[threadgroup(n)]] offsets follow the buffers in the launcher's table.
THREADGROUP_SLOT_BASE = MAX_BUFFER_INDEX + 1

# What the rewritten copy depends on besides the sources.
_REWRITERS = (Path(__file__).with_name("rewrite.py"),
              *sorted((Path(__file__).parents[3] / "msl").glob("*.py")))
_tree_lock = threading.Lock()
# Metal declares its scalar and vector types before any include (llama.cpp's
# ggml-metal-impl.h uses int32_t before <metal_stdlib>): the shim's types come first.
_METAL_TYPES = "#include <metal_types>\n"


def for_emulator(text: str) -> str:
    """An author's file as the emulator compiles it (every line where it was)."""
    return rewrite_msl(strip_msl_only_syntax(rewrite_function_constants(text)))


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def _line_directive(label: str) -> str:
    return '#line 1 "' + label.replace("\\", "\\\\").replace('"', '\\"') + '"\n'


@dataclass(frozen=True)
class SourceTree:
    """The rewritten copy: the main file and the folders ``#include`` searches."""

    root: Path
    main: Path
    include_dirs: tuple[Path, ...]


@cache
def rewriters_digest() -> str:
    """A digest of the code that rewrites sources: a change to it rewrites them anew."""
    return _digest(*(p.read_text() for p in _REWRITERS))


Rewrite = Callable[[str], str]


def source_tree(program: Program, rewrite: Rewrite = for_emulator,
                folder: str = "sources") -> SourceTree:
    """Writes (once per content) the rewritten copy of `program`'s files (`rewrite` turns
    one file's text into what is compiled, into the cache's `folder`)."""
    src = program.sources
    parts = [rewriters_digest(), src.label, src.text, str(src.path)]
    for path, text in sorted(src.files):
        parts += [str(path), text]
    tree = _laid_out(cache_dir() / folder / _digest(*parts, *map(str, src.search_dirs)),
                     program)
    with _tree_lock:
        if not cachedir.is_sealed(tree.root):
            cachedir.discard(tree.root)
            tmp = cachedir.work_dir()
            _write_tree(tree, tmp, program, rewrite)
            cachedir.publish(tmp, tree.root)
    return tree


def source_tree_in(root: Path, program: Program, rewrite: Rewrite) -> SourceTree:
    """Writes the rewritten copy of `program`'s files under `root` (a folder of the
    caller's, not the cache's: for a copy read once)."""
    tree = _laid_out(root, program)
    _write_tree(tree, root, program, rewrite)
    return tree


def _laid_out(root: Path, program: Program) -> SourceTree:
    src = program.sources

    def mirrored(path: Path) -> Path:
        return root / path.relative_to(path.anchor)

    main = mirrored(src.path) if src.path else root / "__source__" / "source.metal"
    return SourceTree(root, main, tuple(mirrored(d) for d in src.search_dirs))


def _write_tree(tree: SourceTree, into: Path, program: Program, rewrite: Rewrite) -> None:
    """Writes `tree`'s files into folder `into`, laid out as under `tree.root`."""
    src = program.sources
    files = [(into / tree.main.relative_to(tree.root),
              _line_directive(src.label) + rewrite(src.text))]
    files += [(into / p.relative_to(p.anchor), _line_directive(str(p)) + rewrite(t))
              for p, t in src.files]
    for path, text in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for d in tree.include_dirs:
        (into / d.relative_to(tree.root)).mkdir(parents=True, exist_ok=True)


def _launch_param(p: Param) -> LaunchParam:
    if p.kind == "attribute":
        return LaunchParam("attribute", p.type_text, attribute=p.attribute)
    if p.kind == "threadgroup":
        return LaunchParam("threadgroup", p.type_text, slot=THREADGROUP_SLOT_BASE + p.index)
    return LaunchParam("buffer", p.type_text, slot=p.index)


@lru_cache(maxsize=1024)  # asked at every dispatch; a large source takes milliseconds
def never_blocks(program: Program) -> bool:
    """Whether the program's text has no barrier, SIMD-group function or threadgroup
    memory: then it can run as plain loops over each threadgroup's threads."""
    texts = [program.sources.text, *(t for _, t in program.sources.files)]
    return not any(_BLOCKING.search(t) for t in texts)


def translation_unit(program: Program, launcher: Launcher | None = None
                     ) -> tuple[Translation, SourceTree]:
    """The C++ the emulator compiles for `program`: the defines, the prelude, the
    rewritten main file and the launcher that calls the kernel function (`launcher`
    writes it: the fast engine has its own; by default `launcher_source`, with the
    kernel forced into its plain loops where it can run in them)."""
    tree = source_tree(program)
    main = str(tree.main).replace("\\", "\\\\").replace('"', '\\"')
    prelude = program.sources.prelude
    if prelude and not prelude.endswith("\n"):
        prelude += "\n"
    params = [_launch_param(p) for p in program.params]
    entry = (launcher(program.function, params) if launcher is not None else
             launcher_source(program.function, params, inline_loops=never_blocks(program)))
    head = f"{_METAL_TYPES}{program.defines}{prelude}"
    text = f'{head}#include "{main}"\n{entry}'
    return Translation(text, program.sources, tree.root, head), tree

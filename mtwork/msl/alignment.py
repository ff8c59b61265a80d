"""Whether MSL code declares a type aligned beyond its members (``alignas``, the ``aligned``
attribute), in its own text or in any header it includes.

The emulator compiles kernels so that an access through a pointer assumes no more than
4-byte alignment (``-fmax-type-align``; Apple GPUs take a ``float4`` at any 4-byte
boundary), so a buffer can start anywhere. A declared alignment is the exception: the
compiler keeps it, and an x86 aligned vector move of such a type faults on memory that
does not have it (MLX's steel GEMM loader reads rows as an ``alignas(16)`` struct). The
answer is read from the text, every ``#if`` branch counted: a yes may be needless, a no
is sure for the files found. A quoted include it cannot find counts as a yes; an angled
one names the Metal (or C) standard library, whose types declare no alignment beyond
their members' (the emulator's shim: tests/test_alignment.py checks it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from .includes import INCLUDE, find_include, mlx_include_dir

__all__ = ["declares_alignment"]

_ALIGNMENT = re.compile(r"\balignas\b|\b_{0,2}aligned_{0,2}\s*\(")


@lru_cache(maxsize=256)
def declares_alignment(texts: tuple[str, ...], folder: Path | None,
                       search_dirs: tuple[Path, ...]) -> bool:
    """True when `texts` (sources read from `folder`, whose quoted includes look in
    `search_dirs` and then MLX's headers), or a file they include, declare an alignment."""
    mlx_root = mlx_include_dir()
    dirs: Sequence[Path] = [*search_dirs, *([mlx_root] if mlx_root else [])]
    pending = [(text, folder) for text in texts]
    seen: set[Path] = set()
    while pending:
        text, here = pending.pop()
        if _ALIGNMENT.search(text):
            return True
        for m in INCLUDE.finditer(text):
            name, quoted = m.group("name"), m.group("open") == '"'
            path = find_include(name, quoted, here, dirs)
            if path is None:
                if quoted:
                    return True
                continue
            if path not in seen:
                seen.add(path)
                pending.append((path.read_text(errors="replace"), path.parent))
    return False

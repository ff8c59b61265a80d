"""``#include`` in MSL sources: where a name is found, which of the author's files a source
reaches, and a source with its includes pasted in (MLX compiles a kernel from one string).

``#include "..."`` looks in the including file's folder, then the search folders, then
MLX's kernel headers (``"mlx/backend/metal/kernels/utils.h"``, from the installed `mlx`
package); ``<...>`` names the Metal standard library.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path

__all__ = ["INCLUDE", "find_include", "included_files", "inline_includes",
           "mlx_include_dir", "mlx_prelude_files"]

INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*(?P<open>[<"])(?P<name>[^>"\n]+)[>"]', re.M)
_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once[ \t]*$", re.M)
_MLX_UTILS = Path("mlx") / "backend" / "metal" / "kernels" / "utils.h"


@cache
def mlx_include_dir() -> Path | None:
    """The `include/` folder of the installed mlx package, when it ships the Metal kernel
    headers (``mlx/backend/metal/kernels/...``)."""
    try:
        import mlx
    except ImportError:
        return None
    for root in getattr(mlx, "__path__", []):
        inc = Path(root) / "include"
        if (inc / _MLX_UTILS).exists():
            return inc
    return None


def find_include(name: str, quoted: bool, including_dir: Path | None,
                 search_dirs: Sequence[Path]) -> Path | None:
    """Where ``#include`` finds `name` among `search_dirs` (and, for a quoted name, the
    including file's folder first); None when it is elsewhere."""
    dirs = ([including_dir] if quoted and including_dir else []) + list(search_dirs)
    for d in dirs:
        candidate = d / name
        if candidate.is_file():
            return candidate.resolve()
    return None


def included_files(text: str, folder: Path | None,
                   search_dirs: Sequence[Path]) -> dict[Path, str]:
    """Every file among `search_dirs` that `text` reaches through ``#include``, with its
    text."""
    found: dict[Path, str] = {}
    pending = [(text, folder)]
    while pending:
        current, here = pending.pop()
        for m in INCLUDE.finditer(current):
            path = find_include(m.group("name"), m.group("open") == '"', here, search_dirs)
            if path is not None and path not in found:
                found[path] = path.read_text()
                pending.append((found[path], path.parent))
    return found


@cache
def mlx_prelude_files() -> frozenset[Path]:
    """MLX's headers every body-form kernel already has: utils.h and what it includes."""
    root = mlx_include_dir()
    if root is None:
        return frozenset()
    utils = (root / _MLX_UTILS).resolve()
    return frozenset({utils, *included_files(utils.read_text(), utils.parent, [root])})


def inline_includes(text: str, folder: Path | None, search_dirs: Sequence[Path]) -> str:
    """`text` with the author's and MLX's included files pasted in, once each, leaving out
    what MLX's body-form prelude has already; ``<...>`` includes stay includes."""
    mlx_root = mlx_include_dir()
    dirs = [*search_dirs, *([mlx_root] if mlx_root else [])]
    seen = set(mlx_prelude_files())

    def expand(current: str, here: Path | None) -> str:
        def replace(m: re.Match) -> str:
            path = find_include(m.group("name"), m.group("open") == '"', here, dirs)
            if path is None:
                return m.group(0)
            if path in seen:
                return ""
            seen.add(path)
            return expand(_PRAGMA_ONCE.sub("", path.read_text()), path.parent)

        return INCLUDE.sub(replace, current)

    return expand(_PRAGMA_ONCE.sub("", text), folder)

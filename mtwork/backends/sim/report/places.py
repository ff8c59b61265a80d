"""Where a sanitizer finding happened, in the author's terms.

A finding carries a code address and the calls that led to it; the symbolizer gives each
its frames (inlined functions first). Those frames are told here as the author's files
and lines: the body form's ``source`` and ``header``, a full-source kernel's file and the
files it includes, MLX's headers by their path in MLX's tree. The shim stands in for
Metal's standard library, so its frames are never the place: the author's call of it is.
A finding inside a helper (the author's header, MLX's headers) names the helper's line
and the call site in the author's code: ``header:3``, called from ``source:7``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ....cachedir import cache_dir
from ....errors import EmulatorUnavailable
from ..compile.compiler import SHIM_DEBUG_DIR, prelude_dir
from ..compile.translation import Translation
from .symbolizer import Frame

__all__ = ["Place", "Places"]

# The subscripted expression at a column: `a`, `tile.v`, `frag->val`.
_SUBSCRIPTED = re.compile(r"[A-Za-z_]\w*(?:(?:\.|->)[A-Za-z_]\w*)*")
# What makes a subscript the target of a store: an assignment after its `]` (not `==`),
# or an increment.
_STORE_AFTER = re.compile(r"\s*(?:(?:[-+*/%&|^]|<<|>>)?=(?!=)|\+\+|--)")
# An assignment operator at a column (where the check of a store points).
_ASSIGNMENT = re.compile(r"(?:[-+*/%&|^]|<<|>>)?=(?!=)")


@dataclass(frozen=True)
class Place:
    """One frame as the author reads it."""

    text: str           # "source:7", "kernel.metal:12", "mlx/backend/metal/.../mma.h:80"
    author: bool        # in the author's own files
    shim: bool = False  # in mtwork's Metal standard library
    file: str = ""      # the file as the compiled code names it (the author's files only)
    line: int = 0       # that file's line
    column: int = 0


def _is_file(frame_file: str, label: str) -> bool:
    # Debug info joins a relative `#line` name (``<generated>``, ``source``) to the
    # compiler's working folder.
    return frame_file == label or frame_file.endswith("/" + label)


def _inside(file: str, folder: Path | None) -> str | None:
    """`file` relative to `folder`, or None when it lies elsewhere."""
    if folder is None:
        return None
    try:
        return Path(file).relative_to(folder).as_posix()
    except ValueError:
        return None


def _mlx_copy() -> Path | None:
    try:
        return prelude_dir()
    except EmulatorUnavailable:
        return None


class Places:
    """The frames of one dispatch's findings (`frames`: code offset to its frames,
    innermost first, from `symbolize`)."""

    def __init__(self, tu: Translation, frames: Mapping[int, list[Frame]]) -> None:
        self.tu, self.frames = tu, frames
        self.translation_units = cache_dir() / "kernels"  # where kernel.cpp is compiled
        self.mlx = _mlx_copy()

    def place(self, frame: Frame) -> Place | None:
        """The author's reading of `frame`; None for mtwork's generated code (the
        launcher, the lines the body form adds around the author's)."""
        file, line, column = frame
        sources = self.tu.sources
        if line <= 0:
            return None
        if _is_file(file, sources.label):
            found = sources.author_line(line)
            if found is None:
                return None
            return Place(f"{found[0]}:{found[1]}", True, file=sources.label, line=line,
                         column=column)
        for path, _ in sources.files:
            if _is_file(file, str(path)):
                return Place(f"{path}:{line}", True, file=str(path), line=line, column=column)
        shim = _inside(file, Path(SHIM_DEBUG_DIR))
        if shim is not None:
            return Place(f"{shim}:{line}", False, shim=True)
        if Path(file).parent.parent == self.translation_units:
            return None
        mlx = _inside(file, self.mlx)
        return Place(f"{mlx if mlx is not None else file}:{line}", False, file=file, line=line,
                     column=column)

    def stack(self, offsets: Iterable[int]) -> list[Place]:
        """The places of a finding's code offset and the calls that led to it, innermost
        first."""
        found = (self.place(f) for o in offsets if o for f in self.frames.get(o, []))
        return [p for p in found if p is not None]

    @staticmethod
    def line(stack: list[Place]) -> tuple[str, str]:
        """The innermost place outside the shim, and the outermost place in the author's
        code when that is another (the call site of a helper, else ""); ("", "") without
        frames."""
        shown = [p for p in stack if not p.shim] or stack
        if not shown:
            return "", ""
        author = [p for p in shown if p.author]
        caller = author[-1].text if author and author[-1].text != shown[0].text else ""
        return shown[0].text, caller

    def subscripted(self, stack: list[Place]) -> tuple[str, str]:
        """What is subscripted at the innermost place, and whether it is read or written
        ("" for each where it cannot be told): an array-bounds check's location points
        at the subscripted array when it is read, at the assignment when it is written."""
        inner = stack[0] if stack else None
        text = self._line_text(inner) if inner is not None and inner.column > 0 else None
        if inner is None or text is None:
            return "", ""
        at = inner.column - 1
        if _ASSIGNMENT.match(text, at):
            target = _subscript_before(text, at)
            return (target, "write") if target else ("", "")
        found = _SUBSCRIPTED.match(text, at)
        if found is None:
            return "", ""
        close = _subscript_end(text, found.end())
        stored = close is not None and _STORE_AFTER.match(text, close)
        return found.group(0), "write" if stored else "read"

    def _line_text(self, place: Place) -> str | None:
        """The compiled text of `place`'s line (the author's files' rewritten copies, or
        MLX's headers' copy), when it can be read."""
        if place.author:
            lines = self.tu.lines_of(place.file)
            compiled = lines[1] if lines is not None else []
        else:
            try:
                compiled = Path(place.file).read_text().split("\n")
            except OSError:
                return None
        return compiled[place.line - 1] if 0 < place.line <= len(compiled) else None


def _subscript_end(text: str, start: int) -> int | None:
    """Just past the subscripts that follow `start` (`[i]`, `[i][j]`), or None."""
    at, depth = start, 0
    while at < len(text):
        c = text[at]
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0 and not text[at + 1:].lstrip().startswith("["):
                return at + 1
        elif depth == 0 and not c.isspace():
            return None
        at += 1
    return None


def _subscript_before(text: str, end: int) -> str:
    """The array subscripted on the left of an assignment ending at `end`: `a` of
    `a[i][j] =`, `tile.v` of `tile.v[k] +=`."""
    left = text[:end].rstrip()
    depth = 0
    at = len(left) - 1
    if at < 0 or left[at] != "]":
        return ""
    while at >= 0:
        if left[at] == "]":
            depth += 1
        elif left[at] == "[":
            depth -= 1
            if depth == 0 and not left[:at].rstrip().endswith("]"):
                break
        at -= 1
    names = re.search(r"[A-Za-z_]\w*(?:\s*(?:\.|->)\s*[A-Za-z_]\w*)*\s*$", left[:at])
    return re.sub(r"\s+", "", names.group(0)) if names else ""

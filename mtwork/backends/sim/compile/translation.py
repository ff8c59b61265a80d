"""A kernel's translation unit, and its compiler's messages told in the author's terms.

clang compiles the rewritten copy of the author's files (see `sources.py`), so its
messages quote rewritten lines: ``auto& tile = __mtw_threadgroup_var<float[32][Q]>(...)``
where the author wrote ``threadgroup float tile[32][Q];``. `author_message` turns every
location into the author's file and line (the body form's ``source`` and ``header``),
quotes the author's own line with the column moved onto the same token there, and leaves
out the errors in mtwork's generated code that only follow from an error of the author's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ....dispatch import Sources

__all__ = ["Translation", "author_message"]


@dataclass(frozen=True)
class Translation:
    """One kernel's C++ translation unit, the sources whose lines its messages name, the
    folder of their rewritten copy (each copy starts with one ``#line`` line), and the
    unit's text before the author's main file (its defines and prelude)."""

    text: str
    sources: Sources
    tree: Path | None = None
    head: str = ""

    def lines_of(self, file: str) -> tuple[list[str], list[str]] | None:
        """(the author's lines, the compiled lines) of `file`, when it is the author's."""
        src = self.sources
        if self.tree is None:
            return None
        if file == src.label:
            original, copy = src.text, self._copy_of(src.path)
        else:
            match = next(((p, t) for p, t in src.files if str(p) == file), None)
            if match is None:
                return None
            original, copy = match[1], self._copy_of(match[0])
        if copy is None or not copy.is_file():
            return None
        return original.split("\n"), copy.read_text().split("\n")[1:]

    def _copy_of(self, path: Path | None) -> Path | None:
        if path is None:
            return self.tree / "__source__" / "source.metal"  # type: ignore[operator]
        return self.tree / path.relative_to(path.anchor)  # type: ignore[operator]


_LOCATION = re.compile(r"(?P<file>[^\s:]+):(?P<line>\d+):(?P<col>\d+):")
_EXCERPT = re.compile(r"^(?P<gutter>\s*\d+ \| )(?P<code>.*)$")
_CARET = re.compile(r"^(?P<gutter>\s* \| )(?P<marks>\s*[\^~]+.*)$")
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+|\S")


def _column_in(original: str, compiled: str, col: int) -> int:
    """The column in `original` of the token at `col` (1-based) of `compiled`: the same
    occurrence of the same token, counted from the line's start."""
    if original == compiled:
        return col
    for m in _TOKEN.finditer(compiled):
        if m.start() <= col - 1 < m.end():
            nth = sum(1 for t in _TOKEN.finditer(compiled[: m.start()])
                      if t.group() == m.group())
            same = [t for t in _TOKEN.finditer(original) if t.group() == m.group()]
            if same:
                return same[min(nth, len(same) - 1)].start() + 1 + (col - 1 - m.start())
            break
    return min(col, len(original) + 1)


@dataclass
class _Block:
    """One diagnostic: its location line and the excerpt and notes under it."""

    lines: list[str]
    generated: bool  # located in mtwork's generated code
    error: bool


def author_message(stderr: str, tu: Translation, cpp_path: str) -> str:
    """clang's `stderr` with locations, excerpts and carets in the author's terms."""
    blocks: list[_Block] = []
    place: _Place | None = None
    for raw in stderr.splitlines():
        if raw.startswith(f"In file included from {cpp_path}:"):
            continue  # every author's file is included from the generated unit
        located = _LOCATION.search(raw)
        if located:
            line, place = _relocate(raw, located, tu, cpp_path)
            severity = raw[located.end():].lstrip()
            blocks.append(_Block([line], line[located.start():].startswith("<generated>"),
                                 severity.startswith(("error", "fatal error"))))
            continue
        if not blocks:
            blocks.append(_Block([], False, False))
        blocks[-1].lines.append(_excerpt_line(raw, place))
    authored = any(b.error and not b.generated for b in blocks)
    kept = [b for b in blocks if not (authored and b.generated)]
    return "\n".join(line for b in kept for line in b.lines).replace(cpp_path, "<generated>")


@dataclass(frozen=True)
class _Place:
    """Where a diagnostic's excerpt is: the author's line text, its number as shown, and
    the column on it."""

    text: str
    number: int
    col: int


def _relocate(raw: str, m: re.Match, tu: Translation, cpp_path: str
              ) -> tuple[str, _Place | None]:
    """The location line in the author's terms, and what its excerpt needs."""
    file, line, col = m.group("file"), int(m.group("line")), int(m.group("col"))
    if file == cpp_path:
        return raw[: m.start()] + f"<generated>:{line}:{col}:" + raw[m.end():], None
    texts = tu.lines_of(file)
    new_col = col
    if texts is not None and 0 < line <= min(len(texts[0]), len(texts[1])):
        new_col = _column_in(texts[0][line - 1], texts[1][line - 1], col)
    name, at = file, line
    if file == tu.sources.label and tu.sources.regions:
        found = tu.sources.author_line(line)
        name, at = found if found else ("<generated>", line)
    place = None
    if texts is not None and 0 < line <= len(texts[0]):
        place = _Place(texts[0][line - 1], at, new_col)
    return raw[: m.start()] + f"{name}:{at}:{new_col}:" + raw[m.end():], place


def _excerpt_line(raw: str, place: _Place | None) -> str:
    """An excerpt line quoting the author's text under the author's line number, or a
    caret line moved onto the author's column."""
    if place is None:
        return raw
    excerpt = _EXCERPT.match(raw)
    if excerpt:
        width = len(excerpt.group("gutter")) - 3
        return f"{str(place.number).rjust(width)} | {place.text}"
    caret = _CARET.match(raw)
    if caret:
        return f"{caret.group('gutter')}{' ' * (place.col - 1)}{caret.group('marks').strip()}"
    return raw

"""The author's code as the rules read it: a program's source after the preprocessor (what
Apple's compiler parses), with a mask of it in which only the author's own code is left
(comments, literals, directives and every line that came from elsewhere, MLX's headers or
mtwork's generated text, are blanked), and for each line the author's file and line.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..lexing import code_without_directives
from .table import Violation

__all__ = ["Code", "Place", "column_in"]

Place = tuple[str, int]  # the author's (file, line)
_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+|\S")


@dataclass
class Code:
    """Preprocessed text whose line ``k`` (0-based) is the author's `places[k]`, or not
    the author's where that is None; `originals(file)` gives the author's lines of a file
    (to quote them). The mask keeps the author's lines and those `kept` for their
    structure (the code mtwork generates around a body-form kernel's body); the lines it
    does not keep are empty in it, so that the rules read only the author's code (a
    kernel file that includes MLX's headers is mostly theirs after the preprocessor).
    `author_text` is the text with the same lines emptied: offsets in it are the mask's."""

    text: str
    places: Sequence[Place | None]
    originals: Callable[[str], Sequence[str] | None]
    kept: Sequence[bool] = ()
    mask: str = field(init=False)
    author_text: str = field(init=False)
    _lines: list[str] = field(init=False)
    _starts: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self._lines = self.text.split("\n")
        n = len(self._lines)
        # Whole-list steps: a file that includes MLX's headers is thousands of lines.
        keeps = [p is not None for p in itertools.islice(self.places, n)]
        keeps += [False] * (n - len(keeps))
        for k in itertools.compress(range(min(n, len(self.kept))), self.kept):
            keeps[k] = True
        mask = code_without_directives(self.text).split("\n")
        self.mask = "\n".join(m if keep else "" for m, keep in zip(mask, keeps))
        self.author_text = "\n".join(t if keep else "" for t, keep in zip(self._lines, keeps))
        self._starts = list(itertools.accumulate(
            (len(m) + 1 if keep else 1 for m, keep in zip(mask[:-1], keeps)), initial=0))

    def line_index(self, pos: int) -> int:
        return bisect.bisect_right(self._starts, pos) - 1

    def place(self, pos: int) -> Place | None:
        k = self.line_index(pos)
        return self.places[k] if k < len(self.places) else None

    def violation(self, rule: str, pos: int, message: str) -> Violation | None:
        """A violation of `rule` at offset `pos` of the mask, told at the author's line and
        column (the same token on the author's own line); None outside the author's code."""
        place = self.place(pos)
        if place is None:
            return None
        file, line = place
        k = self.line_index(pos)
        compiled = self._lines[k]
        lines = self.originals(file)
        original = lines[line - 1] if lines is not None and 0 < line <= len(lines) else compiled
        column = column_in(original, compiled, pos - self._starts[k])
        return Violation(rule, file, line, column, message, original.rstrip())


def column_in(original: str, compiled: str, offset: int) -> int:
    """The 1-based column in `original` of the token at `offset` of `compiled` (the same
    occurrence of the same token), 0 when it is not there (a macro made it)."""
    if original == compiled:
        return offset + 1
    for m in _TOKEN.finditer(compiled):
        if m.start() <= offset < m.end():
            nth = sum(1 for t in _TOKEN.finditer(compiled[: m.start()]) if t.group() == m.group())
            same = [t for t in _TOKEN.finditer(original) if t.group() == m.group()]
            return same[min(nth, len(same) - 1)].start() + 1 if same else 0
    return 0

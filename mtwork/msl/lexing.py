"""Lexing helpers shared by everything that reads MSL text: comment and literal masks,
bracket matching, top-level splitting.

Every helper works on a *mask* of the text (`code_mask`): the same length, with comments
and string/character literals blanked, so offsets found in the mask are offsets in the
text and brackets inside comments or strings never count.
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = [
    "code_mask",
    "code_without_directives",
    "line_of",
    "matching",
    "matching_back",
    "same_lines",
    "split_top_level",
]


# A comment (to the line's end, or to */), or a string or character literal (to its
# closing quote, an unescaped line break or the end; a backslash escapes any character,
# a line break too) whose contents are blanked, quotes kept.
_HIDDEN = re.compile(r"""//[^\n]*|/\*[\s\S]*?(?:\*/|\Z)|(["'])((?:\\[\s\S]?|(?!\1)[^\\\n])*)\1?""")
_NOT_NEWLINE = re.compile(r"[^\n]")


@lru_cache(maxsize=16)  # the rewrites one after another mask the same text, mostly
def code_mask(text: str) -> str:
    """`text` with comments, string and character literals blanked (newlines kept)."""
    out = []
    last = 0
    for m in _HIDDEN.finditer(text):
        start, end = m.span(2) if m.group(1) else m.span()
        out += (text[last:start], _NOT_NEWLINE.sub(" ", text[start:end]))
        last = end
    out.append(text[last:])
    return "".join(out)


@lru_cache(maxsize=8)  # a file's preprocessed text is read by its load and by the check
def code_without_directives(text: str) -> str:
    """`code_mask(text)` with preprocessor directives (and their continuations) blanked
    too: declarations inside macros are not the file's own."""
    mask = code_mask(text)
    out = []
    continued = False
    for line in mask.split("\n"):
        directive = continued or line.lstrip().startswith("#")
        continued = directive and line.rstrip().endswith("\\")
        out.append(" " * len(line) if directive else line)
    return "\n".join(out)


def matching(mask: str, start: int, open_c: str, close_c: str) -> int:
    """Index just past the bracket that closes the one at `start`."""
    depth = 0
    for i in range(start, len(mask)):
        if mask[i] == open_c:
            depth += 1
        elif mask[i] == close_c:
            depth -= 1
            if depth == 0:
                return i + 1
    return len(mask)


def matching_back(mask: str, end: int, open_c: str, close_c: str) -> int:
    """Index of the bracket that opens the one at `end` (which is `close_c`)."""
    depth = 0
    for i in range(end, -1, -1):
        if mask[i] == close_c:
            depth += 1
        elif mask[i] == open_c:
            depth -= 1
            if depth == 0:
                return i
    return 0


def split_top_level(s: str, sep: str = ",") -> list[str]:
    """`s` split at each `sep` outside brackets of any kind."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(s):
        if c in "([<{":
            depth += 1
        elif c in ")]>}":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:])
    return parts


def same_lines(original: str, replacement: str) -> str:
    """`replacement` followed by the line breaks of `original`, macro continuations kept,
    so that an edit leaves every later line where it was."""
    breaks = "".join("\\\n" if original[i - 1 : i] == "\\" else "\n"
                     for i, c in enumerate(original) if c == "\n")
    return replacement + breaks


def line_of(text: str, pos: int) -> int:
    """The 1-based line of offset `pos`."""
    return text.count("\n", 0, pos) + 1

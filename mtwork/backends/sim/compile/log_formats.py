"""The compiler's message for a logging call whose format Metal refuses, in the author's
words.

The shim checks each `os_log` call's format against its arguments while the kernel
compiles (include/mtw_logging.h); a refused one ends the constant evaluation of the
format's constructor, and clang says so in a page of notes about the shim's insides. Here
that diagnostic becomes one line at the author's call, which names the conversion and what
is wrong with it, and the specification's section:

    source:3:20: error: MSL 3.2 §6.19: os_log format "x=%n": %n is not supported: ...
"""

from __future__ import annotations

import re

__all__ = ["SECTION", "clarify"]

SECTION = "MSL 3.2 §6.19"  # the Metal Shading Language Specification's "Logging Functions"

_LOCATION = re.compile(r"^\S+:\d+:\d+: ")
_SUMMARY = re.compile(r"^\d+ errors? generated\.$")
_CONSTEVAL = re.compile(r"error: call to consteval function "
                        r"'metal::__os_log_format::checked<.*>' is not a constant expression")
_STRING = r'&"((?:[^"\\]|\\.)*)"\[0\]'
_REFUSED = re.compile(rf"note: in call to 'refuse\({_STRING}, {_STRING}, (\d+)\)'")
_NOT_LITERAL = re.compile(r"error: conversion function from '[^']*' to "
                          r"'[^']*checked<[^']*>'(?: \(aka '[^']*'\))? invokes a deleted "
                          r"function: (.*)$")
_CONVERSION = re.compile(r"%[-+ #0]*(?:\*|\d+)?(?:\.(?:\*|\d*))?(?:v\d*)?"
                         r"(?:hh|hl|ll|[hljztLq])?.?")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", '"': '"', "\\": "\\", "'": "'"}


def _unescaped(text: str) -> str:
    """A string literal's text as clang quotes it, unescaped."""
    return re.sub(r"\\(x[0-9a-fA-F]{2}|.)",
                  lambda m: (chr(int(m.group(1)[1:], 16)) if m.group(1)[0] == "x"
                             else _ESCAPES.get(m.group(1), m.group(1))), text)


def _refusal(problem: str, fmt: str, offset: int) -> str:
    """The error's text: the format, the conversion at `offset` (none at its end) and why."""
    shown = fmt.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    found = _CONVERSION.match(fmt, offset) if 0 <= offset < len(fmt) else None
    at = ""
    if found and found.group(0) != fmt:
        nth = sum(1 for c in _CONVERSION.finditer(fmt, 0, offset) if c.group(0) != "%%") + 1
        at = f' at "{found.group(0)}" (conversion {nth})'
    return f'error: {SECTION}: os_log format "{shown}"{at}: {problem}'


def _blocks(message: str) -> list[list[str]]:
    """The message's diagnostics: each a location line and the lines under it."""
    blocks: list[list[str]] = []
    for line in message.splitlines():
        if (_LOCATION.match(line) and not line.split(": ", 2)[1].startswith("note")
                or _SUMMARY.match(line)):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
        else:
            blocks.append([line])
    return blocks


def _clarified(block: list[str]) -> list[str]:
    """One diagnostic, told in the author's words when it is a refused logging format."""
    head = block[0]
    location = _LOCATION.match(head)
    if location is None:
        return block
    excerpt = block[1:3]  # the author's line and the caret under it
    if _CONSTEVAL.search(head):
        for line in block:
            refused = _REFUSED.search(line)
            if refused:
                text = _refusal(_unescaped(refused.group(1)), _unescaped(refused.group(2)),
                                int(refused.group(3)))
                return [location.group(0) + text, *excerpt]
    literal = _NOT_LITERAL.search(head)
    if literal:
        return [f"{location.group(0)}error: {SECTION}: {literal.group(1)}", *excerpt]
    return block


def clarify(message: str) -> str:
    """The compiler's `message` (already in the author's terms) with each refused logging
    format told as one error at the author's call."""
    if "__os_log_format" not in message:
        return message
    return "\n".join(line for block in _blocks(message) for line in _clarified(block))

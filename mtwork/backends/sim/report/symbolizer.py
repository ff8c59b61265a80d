"""Source lines of code addresses in a kernel library, from its debug line tables
(llvm-symbolizer where installed, else binutils' addr2line)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path

__all__ = ["symbolize"]


@cache
def _symbolizer() -> list[str] | None:
    for tool in ("llvm-symbolizer", "addr2line"):
        path = shutil.which(tool)
        if path:
            return [path]
    return None


Frame = tuple[str, int, int]  # file, line, column (0: not known)


def _frames(lines: Sequence[str]) -> list[Frame]:
    frames = []
    for line in lines:
        parts = line.strip().rsplit(":", 2)
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():  # file:line:col
            frames.append((parts[0], int(parts[1]), int(parts[2])))
        elif len(parts) >= 2 and parts[-1].split(" ")[0].isdigit():  # file:line (discriminator)
            frames.append((":".join(parts[:-1]), int(parts[-1].split(" ")[0]), 0))
    return frames


def symbolize(library: Path, offsets: Sequence[int]) -> dict[int, list[Frame]]:
    """Maps code offsets (return addresses) to their inlined frames, innermost first, as
    (file, line, column) of the compiled translation unit; empty when no symbolizer is
    installed."""
    tool = _symbolizer()
    wanted = sorted({o for o in offsets if o})
    if not tool or not wanted:
        return {}
    addresses = [hex(o - 1) for o in wanted]  # the call instruction, not the one after it
    llvm = tool[0].endswith("llvm-symbolizer")
    if llvm:
        args = [*tool, f"--obj={library}", "--inlines", "--functions=none", *addresses]
    else:
        args = [*tool, "-a", "-i", "-e", str(library), *addresses]
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if llvm:  # one block per address, blocks separated by a blank line
        blocks = [b.splitlines() for b in out.split("\n\n") if b.strip()]
    else:  # each address printed ("0x..."), then its frames
        blocks, current = [], None
        for line in out.splitlines():
            if line.startswith("0x"):
                current = []
                blocks.append(current)
            elif current is not None:
                current.append(line)
    if len(blocks) != len(wanted):
        return {}
    return {offset: _frames(block) for offset, block in zip(wanted, blocks)}

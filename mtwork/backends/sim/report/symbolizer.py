"""Source lines of code addresses in a kernel library, from its debug line tables
(llvm-symbolizer where installed, else binutils' addr2line).

llvm-symbolizer runs as one process for the whole session, asked one address a line:
started afresh for each library it took about 0.1 s, more than counting a sampled
dispatch, and a sweep profiles a new library for every setting."""

from __future__ import annotations

import atexit
import shutil
import subprocess
import threading
from collections.abc import Sequence
from functools import cache
from pathlib import Path

__all__ = ["symbolize"]

_AT_ONCE = 64  # addresses asked before their answers are read (pipes hold 64 KB)
_QUERY_SECONDS = 30.0


class _Server:
    """One llvm-symbolizer process answering `"library" address` lines."""

    def __init__(self, tool: str):
        self.tool = tool
        self.process: subprocess.Popen[str] | None = None
        self.lock = threading.Lock()
        atexit.register(self.close)

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def blocks(self, library: Path, addresses: list[str]) -> list[list[str]] | None:
        """Each address's output lines, or None when the process failed (it is ended,
        and started again at the next question)."""
        with self.lock:
            try:
                return self._ask(library, addresses)
            except (OSError, ValueError, EOFError):
                self.close()
                return None

    def _ask(self, library: Path, addresses: list[str]) -> list[list[str]]:
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [self.tool, "--inlines", "--functions=none"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        process = self.process
        assert process.stdin is not None and process.stdout is not None
        watchdog = threading.Timer(_QUERY_SECONDS, process.kill)  # a symbolizer that hangs
        watchdog.start()
        try:
            out: list[list[str]] = []
            for at in range(0, len(addresses), _AT_ONCE):
                chunk = addresses[at:at + _AT_ONCE]
                process.stdin.write("".join(f'"{library}" {a}\n' for a in chunk))
                process.stdin.flush()
                for _ in chunk:
                    block: list[str] = []
                    while (line := process.stdout.readline()) != "\n":
                        if not line:
                            raise EOFError("llvm-symbolizer ended")
                        block.append(line.rstrip("\n"))
                    out.append(block)
            return out
        finally:
            watchdog.cancel()


@cache
def _server(tool: str) -> _Server:
    return _Server(tool)


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
    if tool[0].endswith("llvm-symbolizer") and '"' not in str(library):
        blocks = _server(tool[0]).blocks(library, addresses) or []
    else:
        blocks = _addr2line(tool, library, addresses)
    if len(blocks) != len(wanted):
        return {}
    return {offset: _frames(block) for offset, block in zip(wanted, blocks)}


def _addr2line(tool: list[str], library: Path, addresses: list[str]) -> list[list[str]]:
    """Each address's frames from one run of addr2line (or llvm-symbolizer)."""
    llvm = tool[0].endswith("llvm-symbolizer")
    if llvm:
        args = [*tool, f"--obj={library}", "--inlines", "--functions=none", *addresses]
    else:
        args = [*tool, "-a", "-i", "-e", str(library), *addresses]
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    if llvm:  # one block per address, blocks separated by a blank line
        return [b.splitlines() for b in out.split("\n\n") if b.strip()]
    blocks: list[list[str]] = []
    current = None
    for line in out.splitlines():  # each address printed ("0x..."), then its frames
        if line.startswith("0x"):
            current = []
            blocks.append(current)
        elif current is not None:
            current.append(line)
    return blocks

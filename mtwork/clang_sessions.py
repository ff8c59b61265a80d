"""clang's front end kept running across syntax-only runs: one process reads many units.

Starting clang (the `zig` binary, then its front end) costs about 6 ms of CPU: most of
what a small syntax-only check costs. A session starts ``zig -cc1`` once with `SIZE`
inputs, each the read end of a pipe (``/dev/fd/N``), and hands each run the next one:
clang parses its inputs in turn, in one process, each with a preprocessor, AST and Sema
of its own. After each unit comes a marker input, a ``#pragma clang __debug macro`` of a
fresh name, which clang prints: everything it wrote before that name is the unit's.

What one input leaves in the process must not change the next one's result, and clang
keeps two things across inputs: its diagnostics engine (after a fatal error it reports
nothing more; a ``#pragma clang diagnostic`` outside push and pop carries over) and its
file manager (a file is read once, and known again by its inode). So a session goes on
only after a unit that clang found nothing in (any diagnostic ends it), each unit's
diagnostic state is pushed before it and popped after it, the folders of files a unit
read stay until the session ends (no inode of theirs is reused meanwhile), and a session
whose files (a precompiled header, a folder of headers) changed on disk is ended. Units
that write diagnostic pragmas of their own are the caller's to keep out
(`reads_like_a_session`).

Where a session cannot take a unit (busy with another thread's, its clang gone, no
``/dev/fd``), `run` returns None and the caller runs clang once, as without sessions. When
this process ends, the pipes' write ends close: clang reads empty inputs and exits. An
idle session holds its clang (some 65 MB) until its units are used up, a third set of
flags ends it, or this process ends.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import secrets
import select
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from .toolchain import front_end_command

__all__ = ["SIZE", "close_sessions", "reads_like_a_session", "run"]

SIZE = 32  # units per clang process
_LIVE = 2  # sessions kept at once (one per set of flags; a third ends the oldest)
_FIRST_OUTPUT_SECONDS = 30.0  # a new session must print its first marker by then
_DIAGNOSTIC_PRAGMA = re.compile(r"#\s*pragma\s+(?:clang|GCC)\s+diagnostic")
_FD_FOLDER = Path("/dev/fd")


def reads_like_a_session(texts: Sequence[str]) -> bool:
    """Whether a unit made of `texts` may go to a session: none of them sets diagnostic
    state by pragma (one left pushed would outlive the unit)."""
    return not any(_DIAGNOSTIC_PRAGMA.search(t) for t in texts)


def _identity(path: Path) -> tuple[int, ...] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class _Session:
    """One clang front end reading `SIZE` units through pipes."""

    def __init__(self, command: Sequence[str], depends: Sequence[Path]) -> None:
        self.owner = os.getpid()
        self.lock = threading.Lock()
        self.depends = {p: _identity(p) for p in depends}
        self.nonce = secrets.token_hex(6)
        self.kept: list[Path] = []
        self.next = 0
        self.buffer = b""
        pipes = [os.pipe() for _ in range(2 * SIZE + 1)]
        reads = [r for r, _ in pipes]
        self.writes = [w for _, w in pipes]
        try:
            self.process = subprocess.Popen(
                [*command, *(str(_FD_FOLDER / str(r)) for r in reads)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                pass_fds=reads)
        except OSError:
            for w in self.writes:
                os.close(w)
            raise
        finally:
            for r in reads:
                os.close(r)
        self.alive = True
        # The first input is a marker alone: clang's answer says it reads the pipes.
        if not self._send(self.writes.pop(0), self._marker(-1)) or \
                self._output(-1, _FIRST_OUTPUT_SECONDS) is None:
            self.end()

    def _marker(self, index: int) -> str:
        return f"#pragma clang __debug macro {self._name(index)}\n"

    def _name(self, index: int) -> str:
        return f"__mtw_session_{self.nonce}_{index + 1}"

    def usable(self) -> bool:
        return (self.alive and self.next < SIZE and self.owner == os.getpid()
                and all(_identity(p) == known for p, known in self.depends.items()))

    def run(self, unit: str, keep: Path) -> tuple[str | None, bool]:
        """clang's output for `unit` (None when this session can no longer say), and
        whether the session took `keep` (it did unless it ended with this unit)."""
        k = self.next
        self.next += 1
        text = f"#pragma clang diagnostic push\n{unit}\n#pragma clang diagnostic pop\n"
        if not (self._send(self.writes[2 * k], text)
                and self._send(self.writes[2 * k + 1], self._marker(k))):
            self.end()
            return None, False
        output = self._output(k, None)
        if output is None or output or self.next == SIZE:
            self.end()  # clang gone, or something found (its state may outlive the unit)
            return output, False
        self.kept.append(keep)
        return output, True

    @staticmethod
    def _send(fd: int, text: str) -> bool:
        try:
            with os.fdopen(fd, "w") as pipe:
                pipe.write(text)
            return True
        except OSError:  # clang ended: nobody reads the pipe
            return False

    def _output(self, index: int, timeout: float | None) -> str | None:
        """What clang wrote before the marker of unit `index` (None: clang ended first, or
        said nothing in `timeout` seconds)."""
        token = self._name(index).encode()
        stream = self.process.stderr
        assert stream is not None
        while True:
            at = self.buffer.find(token)
            if at >= 0 and self.buffer.find(b"\n", at) >= 0:
                start = self.buffer.rfind(b"\n", 0, at) + 1
                output = self.buffer[:start]
                self.buffer = self.buffer[self.buffer.find(b"\n", at) + 1:]
                return output.decode(errors="replace")
            ready, _, _ = select.select([stream], [], [], timeout)
            chunk = os.read(stream.fileno(), 1 << 16) if ready else b""
            if not chunk:
                return None
            self.buffer += chunk

    def end(self) -> None:
        """Stops clang and removes what its units read (the caller's folders); in a
        process forked from the session's, only forgets it."""
        if not self.alive:
            return
        self.alive = False
        if self.owner != os.getpid():
            return
        for fd in self.writes[2 * self.next:]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.writes = []
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.process.stderr is not None:
            self.process.stderr.close()
        for folder in self.kept:
            shutil.rmtree(folder, ignore_errors=True)
        self.kept = []


_sessions: dict[tuple, _Session] = {}
_registry = threading.Lock()


def run(args: Sequence[str], extra: Sequence[str], unit: str, keep: Path,
        depends: Sequence[Path] = ()) -> tuple[subprocess.CompletedProcess, bool] | None:
    """clang's front end, run with `args` and `extra` (as `toolchain.run_clang_front_end`)
    on the unit whose text is `unit`, in a session of the same flags; `depends` are files
    whose change ends the session. Returns clang's result and whether the session took
    `keep`, the folder of the files the unit reads (it then removes it when it ends; the
    caller removes it otherwise). None when no session took the unit: the caller runs
    clang itself."""
    if not _FD_FOLDER.is_dir():
        return None
    command = front_end_command(tuple(args), "unit.cpp", os.getcwd())
    if command is None:
        return None
    session = _session((*(a for a in command if a != "-disable-free"), *extra),
                       tuple(depends))
    if session is None or not session.lock.acquire(blocking=False):
        return None
    try:
        if not session.usable():
            return None
        output, taken = session.run(unit, keep)
    finally:
        session.lock.release()
    if output is None:
        return None
    return subprocess.CompletedProcess(list(args), 1 if "error:" in output else 0, "",
                                       output), taken


def _session(command: tuple[str, ...], depends: tuple[Path, ...]) -> _Session | None:
    """The session for `command`, started when there is none that can go on."""
    key = (command, depends)
    with _registry:
        session = _sessions.get(key)
        if session is not None and (session.lock.locked() or session.usable()):
            return session
        if session is not None:
            _sessions.pop(key)
            session.end()
        while len(_sessions) >= _LIVE:
            oldest = next(iter(_sessions))
            if not _sessions[oldest].lock.acquire(blocking=False):
                break
            _sessions.pop(oldest).end()
        try:
            session = _Session(command, depends)
        except OSError:
            return None
        if session.alive:
            _sessions[key] = session
        return session if session.alive else None


def close_sessions() -> None:
    """Ends every session of this process (each waits for the unit it is reading)."""
    with _registry:
        sessions = list(_sessions.values())
        _sessions.clear()
    for session in sessions:
        if session.owner == os.getpid():
            with session.lock:
                session.end()
        else:
            session.end()


atexit.register(close_sessions)

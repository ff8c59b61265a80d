"""clang, from the `ziglang` package: the C++ compiler and preprocessor mtwork runs.

The `zig` binary is called directly (not through ``python -m ziglang``, which would add
an interpreter start to every compile). zig's global cache (the C runtime it builds once)
lives beside mtwork's, so a clean cache starts clean; its local cache, where it would keep
an object file of every compile forever, is a folder removed after each run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
from functools import cache
from pathlib import Path

from .cachedir import cache_dir, work_dir
from .errors import EmulatorUnavailable

__all__ = ["builtin_headers", "clang", "front_end_command", "run_clang", "run_clang_front_end",
           "toolchain_identity"]


@cache
def clang() -> tuple[str, ...]:
    """The clang++ command line prefix; raises `EmulatorUnavailable` without ziglang."""
    try:
        import ziglang
    except ImportError as exc:
        raise EmulatorUnavailable(
            "mtwork needs clang from the `ziglang` package: pip install ziglang") from exc
    zig = Path(ziglang.__file__).with_name("zig")
    if not zig.is_file():
        raise EmulatorUnavailable(f"the ziglang package has no zig binary at {zig}; "
                                  "reinstall it: pip install --force-reinstall ziglang")
    return (str(zig), "c++")


@cache
def toolchain_identity() -> str:
    """What tells this clang from another (the zig binary's place, size and date): a
    precompiled header is only readable by the clang that wrote it."""
    zig = Path(clang()[0])
    st = zig.stat()
    return f"{zig}:{st.st_size}:{st.st_mtime_ns}"


@cache
def builtin_headers() -> Path:
    """clang's own headers (stddef.h, stdint.h, ...), which `zig clang` does not add."""
    return Path(clang()[0]).parent / "lib" / "include"


def run_clang(args: list[str], what: str, *, stdin: str | None = None, raw: bool = False
              ) -> subprocess.CompletedProcess:
    """Runs clang with `args` (after the command prefix); `what` names the job in errors.
    `raw`: clang's own driver (``zig clang``: every language clang has, C++ for OpenCL
    among them, and nothing of zig's C++ set-up)."""
    env = dict(os.environ)
    env.setdefault("ZIG_GLOBAL_CACHE_DIR", str(cache_dir() / "zig"))
    local = work_dir()
    env["ZIG_LOCAL_CACHE_DIR"] = str(local)
    start = time.perf_counter()
    try:
        prefix = (clang()[0], "clang") if raw else clang()
        return subprocess.run([*prefix, *args], capture_output=True, text=True, env=env,
                              input=stdin, check=False)
    except OSError as exc:
        raise EmulatorUnavailable(f"cannot run clang to build {what}: {exc}") from exc
    finally:
        shutil.rmtree(local, ignore_errors=True)
        _log_build(args, what, time.perf_counter() - start)


def _log_build(args: list[str], what: str, seconds: float) -> None:
    """Appends one line (JSON) about a clang run to $MTWORK_BUILD_LOG, if set: what it
    built, its output's name (kernel.so, a profiled folder's .ll, an engine's, a .pch)
    and its wall time, to see where a run's build time goes (clang is single-threaded:
    on an idle core its wall time is its CPU time)."""
    path = os.environ.get("MTWORK_BUILD_LOG")
    if not path:
        return
    output = Path(args[args.index("-o") + 1]) if "-o" in args[:-1] else None
    inputs = [Path(a) for a in args if a.endswith((".cpp", ".ll", ".h", ".metal"))]
    try:  # the same source built twice the same way shows as one digest twice
        source = hashlib.sha256(inputs[-1].read_bytes()).hexdigest()[:16]
    except (IndexError, OSError):
        source = None
    kind = _build_kind(args, inputs[-1].name if inputs else "")
    line = {"what": what, "output": output.name if output else None, "kind": kind,
            "source": source, "seconds": round(seconds, 3),
            "pid": os.getpid(), "end": round(time.time(), 3)}
    with open(path, "a", encoding="utf-8") as log:  # one short write: lines stay whole
        log.write(json.dumps(line) + "\n")


def _build_kind(args: list[str], source: str) -> str:
    """A clang run's part in a build, told from its flags and its input's name."""
    if "c++-header" in args or "-emit-pch" in args:
        return "precompiled header"
    if "-fsyntax-only" in args or "-E" in args or "-###" in args:
        return "check"
    if "-DMTW_PROFILE" in args:
        return "profiled: to IR"
    if source == "counted.ll":
        return "profiled: codegen"
    if "-DMTW_SANITIZE" in args:
        return "sanitized"
    if source.endswith(".ll") or "-emit-llvm" in args:
        return "fast engine"
    return "library"


def run_clang_front_end(args: list[str], extra: list[str], source: Path, what: str
                        ) -> subprocess.CompletedProcess:
    """Runs clang's front end alone (``-cc1``) on `source`, for one syntax-only job: what
    clang's own driver makes of `args` is asked of it once per process, sparing each later
    run the driver's start (a third of a small check's time). `extra` are flags that
    change from run to run and mean the same to the driver and the front end (``-I``,
    ``-include-pch``). Where the driver's answer cannot be read, the driver runs."""
    command = front_end_command(tuple(args), source.name, os.getcwd())
    if command is None:
        return run_clang([*args, *extra, str(source)], what, raw=True)
    start = time.perf_counter()
    try:
        return subprocess.run([*command, *extra, str(source)], capture_output=True,
                              text=True, check=False)
    except OSError as exc:
        raise EmulatorUnavailable(f"cannot run clang to check {what}: {exc}") from exc
    finally:
        _log_build(["-fsyntax-only", str(source)], what, time.perf_counter() - start)


@cache
def front_end_command(args: tuple[str, ...], name: str, cwd: str) -> tuple[str, ...] | None:
    """The front-end command the driver prints (``-###``) for `args` and an input named
    `name` (an empty file, written for the question), without that input; None unless it
    is one front-end job."""
    folder = work_dir()
    try:
        probe = folder / name
        probe.write_text("")
        shown = run_clang(["-###", *args, str(probe)], "the check's front end", raw=True)
        jobs = [shlex.split(line) for line in shown.stderr.splitlines() if '"-cc1"' in line]
    except ValueError:  # quoting shlex cannot read
        return None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if shown.returncode != 0 or len(jobs) != 1 or jobs[0][-1] != str(probe):
        return None
    return tuple(jobs[0][:-1])

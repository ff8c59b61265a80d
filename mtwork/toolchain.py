"""clang, from the `ziglang` package: the C++ compiler and preprocessor mtwork runs.

The `zig` binary is called directly (not through ``python -m ziglang``, which would add
an interpreter start to every compile). zig's global cache (the C runtime it builds once)
lives beside mtwork's, so a clean cache starts clean; its local cache, where it would keep
an object file of every compile forever, is a folder removed after each run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

from .cachedir import cache_dir, work_dir
from .errors import EmulatorUnavailable

__all__ = ["builtin_headers", "clang", "run_clang", "toolchain_identity"]


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
    try:
        prefix = (clang()[0], "clang") if raw else clang()
        return subprocess.run([*prefix, *args], capture_output=True, text=True, env=env,
                              input=stdin, check=False)
    except OSError as exc:
        raise EmulatorUnavailable(f"cannot run clang to build {what}: {exc}") from exc
    finally:
        shutil.rmtree(local, ignore_errors=True)

"""The machines mtwork runs on, and those its emulator is built for: every difference
between Linux and macOS, x86-64 and arm64 that mtwork's Python side meets, each in one
place with its reason (the emulator runtime's own are in
``backends/sim/runtime/platform.h``). Nothing else in mtwork asks which system it is on.

- **The compiler's target** (`Target`): clang's target triple and CPU per machine, and
  how a kernel library finds the runtime's symbols (ELF leaves them to the loader; Mach-O
  refuses undefined symbols unless told they are looked up when the library loads).
- **Shared memory** between mtwork and its worker process (`shared_memory_file`): Linux
  has anonymous memory files (memfd); macOS has no memfd and no ``/dev/shm``, but POSIX
  shared memory whose name (at most 31 characters there) is removed at once.
- **Pages** (`PAGE_SIZE`): 4 KiB on x86-64, 16 KiB on Apple Silicon; guard pages and a
  buffer's slack are whole pages of the system's size.
- **Memory available** (`available_memory`): Linux says what can be had without
  swapping; macOS compresses and swaps before it ends a process, and says its physical
  memory.
- **Unix socket paths** (`socket_dir`): at most 104 bytes on macOS (108 on Linux), and
  macOS's per-user temporary folder takes half of that.
- **Native libraries** (`shared_library`, `extension_link_flags`): their file names, and
  how a Python extension links (mtwork's MLX extension, `graph/build.py`).
- **Process start**: the same everywhere by design. The worker that runs kernels is a new
  interpreter (`subprocess`), never a fork: macOS starts processes by spawning, and a
  fork of a process that has used Metal is not safe there.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import mmap
import os
import platform
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HOST", "MACOS_ARM64", "MACOS_X86_64", "LINUX_ARM64", "PAGE_SIZE", "Target",
           "available_memory", "describe", "exclusive_lock", "extension_link_flags",
           "shared_library", "shared_memory_file", "socket_dir"]

PAGE_SIZE = mmap.PAGESIZE


@dataclass(frozen=True)
class Target:
    """A machine the emulator's libraries are built for: its `system` ("linux" or
    "macos"), its `cpu` ("x86_64" or "aarch64"), and the CPU clang tunes for (`model`:
    zig's name of a CPU, or "native" for this machine's own)."""

    system: str
    cpu: str
    model: str

    def __post_init__(self) -> None:
        if self.system not in ("linux", "macos"):
            raise ValueError(f"Target.system must be 'linux' or 'macos', got {self.system!r}")
        if self.cpu not in ("x86_64", "aarch64"):
            raise ValueError(f"Target.cpu must be 'x86_64' or 'aarch64', got {self.cpu!r}")

    @property
    def name(self) -> str:
        """The target as zig names it (``aarch64-macos``, ``x86_64-linux-gnu``)."""
        return f"{self.cpu}-{'macos' if self.system == 'macos' else 'linux-gnu'}"

    @property
    def is_host(self) -> bool:
        return self == HOST

    def compile_flags(self) -> tuple[str, ...]:
        """clang's flags that choose this target and its CPU.

        - x86-64: the bfloat conversion instruction of AVX-512 flushes subnormals, which
          Metal keeps: it is turned off (the shim's ``__truncsfbf2`` rounds instead).
        - Apple Silicon: Apple's M1, the instruction set every Apple GPU's Mac has: native
          half-precision arithmetic, and no bfloat conversion instruction, so bfloat
          rounds in the shim as on x86-64.
        - another target than this machine is named, with a fixed CPU.
        """
        if self.model != "native":
            cpu: tuple[str, ...] = (f"-mcpu={self.model}",)
        else:  # zig's default CPU is this machine's, but no longer once any -m flag is given
            cpu = ("-march=native",) if self.cpu == "x86_64" else ()
        if self.cpu == "x86_64":
            cpu = (*cpu, "-mno-avx512bf16")
        return cpu if self.is_host else ("-target", self.name, *cpu)

    def link_flags(self) -> tuple[str, ...]:
        """The linker's flags for a kernel library: on macOS its calls into the runtime
        (loaded first, its symbols global) are bound when the library loads, as ELF's
        loader does by default; Mach-O's linker refuses undefined symbols otherwise."""
        return ("-Wl,-undefined,dynamic_lookup",) if self.system == "macos" else ()


def _this_machine() -> Target:
    system = "macos" if sys.platform == "darwin" else "linux"
    cpu = {"arm64": "aarch64", "AMD64": "x86_64"}.get(platform.machine(), platform.machine())
    # Apple Silicon: the M1's instruction set (see Target.compile_flags), whatever the chip.
    model = "apple_m1" if (system, cpu) == ("macos", "aarch64") else "native"
    return Target(system, cpu, model)


HOST = _this_machine()
# The targets CI builds for besides this machine's: the two Macs, and arm64 Linux
# with Apple's instruction set (run under qemu: the code a Mac runs, on a Linux CI).
MACOS_ARM64 = Target("macos", "aarch64", "apple_m1")
MACOS_X86_64 = Target("macos", "x86_64", "x86_64_v3")  # a Haswell class CPU, the last Intel Macs'
LINUX_ARM64 = Target("linux", "aarch64", "apple_m1")


def describe() -> str:
    """This machine in a few words (for reports): system, CPU, page size."""
    return (f"{platform.platform(terse=True)}, {HOST.cpu}, {PAGE_SIZE // 1024} KiB pages, "
            f"Python {platform.python_version()}")


# --- memory shared with the worker process ---------------------------------------------------

_names = itertools.count()


def shared_memory_file(size: int, *, posix: bool | None = None) -> int:
    """A file descriptor of `size` bytes of memory that no other process can name (it can
    be passed over a Unix socket). Linux: an anonymous memory file (memfd). Elsewhere:
    POSIX shared memory (memory, not a disk file), its name (31 characters at most on
    macOS) removed as soon as it is open; a temporary file, also removed at once, where
    Python has no POSIX shared memory. `posix` chooses the second way on Linux too (to
    test it)."""
    if posix is None:
        posix = not hasattr(os, "memfd_create")
    if not posix:
        fd = os.memfd_create("mtwork-arena", os.MFD_CLOEXEC)
    else:
        fd = _posix_shared_memory() or _unlinked_temporary_file()
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return fd


def _posix_shared_memory() -> int | None:
    try:
        import _posixshmem  # CPython's, as multiprocessing.shared_memory uses it
    except ImportError:
        return None
    while True:
        name = f"/mtw-{os.getpid()}-{next(_names)}"  # within macOS's 31 characters
        try:
            fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except FileExistsError:
            continue
        _posixshmem.shm_unlink(name)
        return fd


def _unlinked_temporary_file() -> int:
    fd, path = tempfile.mkstemp(prefix="mtwork-arena-")
    os.unlink(path)
    return fd


# --- the machine's memory ---------------------------------------------------------------------

_MEMINFO = Path("/proc/meminfo")


def available_memory() -> float:
    """Bytes of memory this machine can still give a process: Linux's MemAvailable (what
    can be had without swapping); on macOS, which compresses and swaps memory before it
    ends a process, the physical memory; else the free physical pages, else infinity
    where the system does not say."""
    if sys.platform.startswith("linux"):
        try:
            for line in _MEMINFO.read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
    pages = "SC_PHYS_PAGES" if sys.platform == "darwin" else "SC_AVPHYS_PAGES"
    try:
        return float(os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return math.inf


# --- native libraries and extensions ------------------------------------------------------


def shared_library(stem: str) -> str:
    """The file name of shared library `stem` (``libmlx.dylib`` on macOS, ``.so`` else)."""
    return f"lib{stem}.dylib" if sys.platform == "darwin" else f"lib{stem}.so"


def extension_link_flags() -> list[str]:
    """What a Python extension's link needs besides the libraries it names: on macOS,
    Python's symbols bound when it loads (Mach-O refuses them undefined otherwise) and
    macOS 14 as the oldest system, as MLX's headers and wheels target."""
    if sys.platform == "darwin":
        return ["-Wl,-undefined,dynamic_lookup", "-mmacosx-version-min=14.0"]
    return []


# --- Unix sockets -----------------------------------------------------------------------------


def socket_dir() -> str | None:
    """Where to make a folder for Unix sockets (None: the temporary folder). A socket's
    path is at most 104 bytes on macOS, whose per-user temporary folder
    (``/var/folders/.../T/``) takes about 50 of them: /tmp there."""
    return "/tmp" if sys.platform == "darwin" and os.path.isdir("/tmp") else None


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[int | None]:
    """The file `path` (made if missing), opened and locked until the block ends: its
    descriptor. Other holders, in this process (each opens the file anew) or another,
    wait. Where files cannot be locked (no ``fcntl``), the block runs unlocked with None."""
    try:
        import fcntl
    except ImportError:
        yield None
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # releases the lock

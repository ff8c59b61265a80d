"""Linking the emulator's libraries without zig's compiler_rt, where nothing needs it.

zig links its compiler_rt (the builtins clang calls for what the target has no
instruction for: 128-bit division, half conversions without F16C, ...) into every
library, and builds it first into a new zig cache: about 4 CPU seconds, the largest part
of a first compile on a fresh machine. On x86-64 and arm64 Linux, kernels and the runtime
call none of it (of 3,000 kernel and runtime libraries in a cache shared by six
developers' test runs, none defined one of its symbols). So they link without it; a library
left with an undefined symbol that neither the C library nor the runtime gives (read from
its ELF dynamic symbol table) is linked again with it. Libraries for macOS, or for another
machine than this one, link with it (macOS's libSystem holds those builtins anyway).
"""

from __future__ import annotations

import ctypes
import re
import struct
import subprocess
from functools import cache
from pathlib import Path

from ....host import HOST, Target
from ....toolchain import run_clang

__all__ = ["run_link", "undefined_symbols"]

WITHOUT_COMPILER_RT = ("-rtlib=none",)
# What a kernel may leave to the runtime library (loaded before it, RTLD_GLOBAL): its C
# functions (the process exits kernels call among them), its C++ ones, the tracing
# callbacks, SafeStack's pointer.
_FROM_RUNTIME = re.compile(r"mtw_\w+|_Z\w+|__sanitizer_cov_\w+|__ubsan_handle_\w+|"
                           r"__safestack_pointer_address")
_SHT_DYNSYM, _STB_WEAK, _SHN_UNDEF = 11, 2, 0


def undefined_symbols(library: Path) -> set[str]:
    """The names an ELF shared library needs from elsewhere (strong references only)."""
    data = library.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{library} is not a little-endian 64-bit ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    names: set[str] = set()
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != _SHT_DYNSYM:
            continue
        strings = sections[link][4]
        for at in range(offset + entsize, offset + size, entsize):  # entry 0 is null
            name, info, _, shndx = struct.unpack_from("<IBBH", data, at)
            if shndx == _SHN_UNDEF and info >> 4 != _STB_WEAK and name:
                end = data.index(b"\0", strings + name)
                names.add(data[strings + name:end].decode())
    return names


def _given_elsewhere(name: str) -> bool:
    """Whether the runtime gives `name`, or the C library or its math library; a name
    from any other library counts as missing, which only costs a second link."""
    return bool(_FROM_RUNTIME.fullmatch(name)) or any(hasattr(lib, name)
                                                      for lib in _c_libraries())


@cache
def _c_libraries() -> tuple[ctypes.CDLL, ...]:
    found = []
    for name in ("libc.so.6", "libm.so.6"):  # glibc's
        try:
            found.append(ctypes.CDLL(name))
        except OSError:
            continue
    return tuple(found)


def run_link(args: list[str], output: Path, what: str,
             target: Target = HOST) -> subprocess.CompletedProcess:
    """Runs clang with `args` (a build that links the shared library `output` for
    `target`) without compiler_rt, and again with it if the library turns out to need it
    (on this machine, a Linux one: see above)."""
    if not (target.is_host and target.system == "linux"):
        return run_clang(args, what)
    result = run_clang([*args, *WITHOUT_COMPILER_RT], what)
    if result.returncode == 0 and not all(map(_given_elsewhere, undefined_symbols(output))):
        result = run_clang(args, what)
    return result

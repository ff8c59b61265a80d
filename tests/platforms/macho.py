"""What a Mach-O library (a macOS build of the runtime or a kernel) needs and gives: its
external symbols from the LC_SYMTAB load command, and libSystem's exports from the text
stub zig links against. A library whose every undefined symbol is given by the runtime
or libSystem is one dyld can load: a link with undefined symbols allowed proves nothing
about that by itself."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_MH_MAGIC_64 = 0xFEEDFACF
_LC_SYMTAB = 0x2
_N_STAB, _N_TYPE, _N_EXT, _N_UNDF, _N_SECT = 0xE0, 0x0E, 0x01, 0x0, 0xE
CPU_X86_64, CPU_ARM64 = 0x01000007, 0x0100000C
MH_DYLIB = 0x6


@dataclass(frozen=True)
class MachO:
    cpu: int
    filetype: int
    defined: frozenset[str]  # external symbols the library gives
    undefined: frozenset[str]  # external symbols it needs from elsewhere


def read(path: Path) -> MachO:
    data = path.read_bytes()
    magic, cpu, _, filetype, ncmds, _, _, _ = struct.unpack_from("<IiiIIIII", data, 0)
    if magic != _MH_MAGIC_64:
        raise ValueError(f"{path} is not a 64-bit Mach-O file (magic {magic:#x})")
    at, defined, undefined = 32, set(), set()
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<II", data, at)
        if cmd == _LC_SYMTAB:
            symoff, nsyms, stroff, _ = struct.unpack_from("<IIII", data, at + 8)
            for i in range(nsyms):
                strx, kind, _, _, _ = struct.unpack_from("<IBBHQ", data, symoff + 16 * i)
                if kind & _N_STAB or not kind & _N_EXT:
                    continue
                end = data.index(b"\0", stroff + strx)
                name = data[stroff + strx:end].decode()
                if kind & _N_TYPE == _N_UNDF:
                    undefined.add(name)
                elif kind & _N_TYPE == _N_SECT:
                    defined.add(name)
        at += size
    return MachO(cpu, filetype, frozenset(defined), frozenset(undefined))


@cache
def libsystem_exports() -> frozenset[str]:
    """Every symbol zig's libSystem stub (``libSystem.tbd``) lists."""
    import ziglang

    tbd = Path(ziglang.__file__).with_name("lib") / "libc" / "darwin" / "libSystem.tbd"
    text = tbd.read_text()
    names: set[str] = set()
    for block in re.findall(r"symbols:\s*\[(.*?)\]", text, re.S):
        names.update(n.strip().strip("'") for n in block.split(","))
    return frozenset(n for n in names if n)


def unresolved(library: MachO, *providers: MachO) -> set[str]:
    """The symbols `library` needs that neither `providers` nor libSystem give."""
    given = set(libsystem_exports()).union(*(p.defined for p in providers))
    return set(library.undefined) - given

"""The Python side of the platform layer (`mtwork.host`): the compiler's targets, memory
shared with the worker without memfd (macOS's way, tried here on Linux), the arena's
layout on 16 KiB pages (Apple Silicon's), and nothing else in the package asking which
system it runs on."""

from __future__ import annotations

import mmap
import os
import re
import sys
from pathlib import Path

import pytest

from mtwork import host
from mtwork.backends.sim.run.arena import ALIGN, layout
from mtwork.host import HOST, LINUX_ARM64, MACOS_ARM64, MACOS_X86_64, Target

PACKAGE = Path(host.__file__).parent


def test_targets_name_their_system_cpu_and_flags() -> None:
    assert MACOS_ARM64.compile_flags() == ("-target", "aarch64-macos", "-mcpu=apple_m1")
    assert MACOS_X86_64.compile_flags()[:2] == ("-target", "x86_64-macos")
    assert "-mno-avx512bf16" in MACOS_X86_64.compile_flags()  # AVX-512's bfloat flushes
    assert LINUX_ARM64.name == "aarch64-linux-gnu" and LINUX_ARM64.link_flags() == ()
    # Mach-O refuses undefined symbols unless told they are bound at load time.
    assert MACOS_ARM64.link_flags() == ("-Wl,-undefined,dynamic_lookup",)
    assert HOST.is_host and not MACOS_ARM64.is_host or sys.platform == "darwin"
    if HOST.cpu == "x86_64":
        assert HOST.compile_flags() == ("-march=native", "-mno-avx512bf16")


def test_a_target_refuses_what_the_emulator_does_not_run_on() -> None:
    with pytest.raises(ValueError, match="Target.system must be 'linux' or 'macos', got 'win'"):
        Target("win", "x86_64", "native")
    with pytest.raises(ValueError, match="Target.cpu must be 'x86_64' or 'aarch64', got 'rv'"):
        Target("linux", "rv", "native")


@pytest.mark.parametrize("posix", [False, True], ids=["memfd", "posix shared memory"])
def test_shared_memory_is_memory_two_mappings_share_and_no_name_is_left(posix) -> None:
    if not posix and not hasattr(os, "memfd_create"):
        pytest.skip("no memfd on this system")
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    fd = host.shared_memory_file(3 * host.PAGE_SIZE, posix=posix)
    try:
        assert os.fstat(fd).st_size >= 3 * host.PAGE_SIZE
        one, two = mmap.mmap(fd, 3 * host.PAGE_SIZE), mmap.mmap(fd, 3 * host.PAGE_SIZE)
        one[5:9] = b"mtwk"
        assert two[5:9] == b"mtwk"
        one.close()
        two.close()
    finally:
        os.close(fd)
    after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    assert not {n for n in after - before if n.startswith("mtw-")}


def test_posix_shared_memory_names_fit_macos() -> None:
    # macOS limits a POSIX shared memory name to 31 characters (PSHMNAMLEN).
    name = f"/mtw-{2**22}-{10**9}"  # the largest pid macOS gives, a billion arenas on
    assert len(name) <= 31


@pytest.mark.parametrize("page", [4096, 16384])
def test_the_arena_layout_holds_on_both_page_sizes(page) -> None:
    spans = (1, 100, page, page + 1, 3 * page - 8)
    starts, guards, size = layout(spans, page)
    assert guards[0] == 0 and size == guards[-1] + page
    for start, n, guard in zip(starts, spans, guards[1:]):
        end = start + -(-n // ALIGN) * ALIGN
        assert start % ALIGN == 0 and guard % page == 0
        assert end == guard - page  # a page of slack, then the guard page
    assert all(b - a >= 2 * page for a, b in zip(guards, guards[1:]))


def test_native_library_names_and_extension_flags_follow_the_system() -> None:
    darwin = sys.platform == "darwin"
    assert host.shared_library("mlx") == ("libmlx.dylib" if darwin else "libmlx.so")
    assert ("-Wl,-undefined,dynamic_lookup" in host.extension_link_flags()) == darwin


def test_memory_available_is_a_number_of_bytes() -> None:
    assert 0 < host.available_memory() <= os.sysconf("SC_PHYS_PAGES") * os.sysconf(
        "SC_PAGE_SIZE")


# What asks which system or CPU it is on, or calls what one system has: only host.py.
_SYSTEM_SPECIFIC = re.compile(r"sys\.platform|platform\.(?:machine|system)\(|os\.uname|"
                              r"memfd_create|/proc/|/dev/shm|mmap\.PAGESIZE|SC_AVPHYS")


def test_only_the_platform_layer_asks_which_system_it_is_on() -> None:
    found = [f"{p.relative_to(PACKAGE)}:{n}" for p in sorted(PACKAGE.rglob("*.py"))
             if p.name != "host.py"
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if _SYSTEM_SPECIFIC.search(line) and not line.lstrip().startswith("#")]
    assert not found, found


_RUNTIME_SPECIFIC = re.compile(r"#\s*include\s*<(?:link\.h|ucontext\.h|sys/mman\.h|"
                               r"mach-o/\w+\.h)>|pthread_getattr_np|dl_iterate_phdr|"
                               r"\bmmap\(|\bmprotect\(|__APPLE__|__linux__|sysconf\(")


def test_only_the_runtimes_platform_layer_makes_system_calls_that_differ() -> None:
    runtime = PACKAGE / "backends" / "sim" / "runtime"
    found = [f"{p.name}:{n}" for p in sorted(runtime.iterdir())
             if p.suffix in (".cpp", ".h") and not p.name.startswith("platform.")
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if _RUNTIME_SPECIFIC.search(line)]
    assert not found, found

"""What makes a compile fast stays correct: the precompiled header (which kernels get
one, one per header list and flags, rebuilt when damaged), linking without zig's
compiler_rt (and with it when a library needs it), the cache's running total, and the
text masks the rewrites use."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlx.core as mx
import numpy as np

import mtwork
from mtwork import cachedir
from mtwork.backends.sim.compile import compiler, linking, precompiled
from mtwork.backends.sim.compile.sources import translation_unit
from mtwork.dispatch import Program
from mtwork.msl.lexing import code_mask
from mtwork.toolchain import run_clang

UTILS = "mlx/backend/metal/kernels/utils.h"


def _program(kernel) -> Program:
    """The program a body-form kernel compiles to for float32 inputs."""
    return kernel.program(kernel.generate([mx.zeros((4,))], [mx.float32]))


def _leading(tu) -> tuple[str, ...]:
    return precompiled.leading_headers(tu, compiler.SHIM_DIR, compiler.prelude_dir())


def _scale(body: str = "o[thread_position_in_grid.x] = a[thread_position_in_grid.x] * 3.0f;"):
    return mtwork.metal_kernel(f"scale_{uuid.uuid4().hex[:8]}", ["a"], ["o"],
                               f"{body} // {uuid.uuid4()}")


def _run(kernel, n: int = 64) -> np.ndarray:
    x = mx.arange(n, dtype=mx.float32)
    return np.array(kernel(inputs=[x], grid=(n, 1, 1), threadgroup=(32, 1, 1),
                           output_shapes=[(n,)], output_dtypes=[mx.float32],
                           isolate=False)[0])


def test_the_body_form_starts_from_mlx_utils_and_a_define_stops_the_list():
    tu, _ = translation_unit(_program(_scale()))
    assert _leading(tu) == (UTILS,)
    lib = mtwork.load_metal(f'#define N 4\n#include "{UTILS}"\n[[kernel]] void k('
                            "device float* o [[buffer(0)]]) { o[0] = N; }")
    tu, _ = translation_unit(lib.kernel("k").program)
    # N could change what utils.h means.
    assert _leading(tu) == ()


def test_a_full_source_kernel_gets_the_mlx_headers_it_includes_first():
    lib = mtwork.load_metal(f'#include <metal_stdlib>\n#include <metal_simdgroup>\n// MLX\n'
                            f'#include "{UTILS}"\n'
                            "using namespace metal;\n[[kernel]] void k(device float* o "
                            "[[buffer(0)]]) { o[0] = 1; }")
    tu, _ = translation_unit(lib.kernel("k").program)
    assert _leading(tu) == (UTILS,)


def test_a_shim_header_outside_metal_stdlib_or_an_own_copy_ends_the_list(tmp_path: Path):
    kernel = "[[kernel]] void k(device float* o [[buffer(0)]]) { o[0] = 1; }"
    lib = mtwork.load_metal(f'#include <metal_tensor>\n#include "{UTILS}"\n{kernel}')
    tu, _ = translation_unit(lib.kernel("k").program)
    assert _leading(tu) == ()
    own = tmp_path / "mlx" / "backend" / "metal" / "kernels" / "utils.h"
    own.parent.mkdir(parents=True)
    own.write_text("#pragma once\n#include <metal_stdlib>\n")
    main = tmp_path / "k.metal"
    main.write_text(f'#include "{UTILS}"\n{kernel}')
    tu, _ = translation_unit(mtwork.load_metal(main).kernel("k").program)
    assert _leading(tu) == ()  # its own utils.h


def test_only_headers_included_once_go_in():
    # MLX's sort.h has no #pragma once: in the precompiled header, the author's include of
    # it would define its kernels a second time.
    lib = mtwork.load_metal(f'#include "{UTILS}"\n#include "mlx/backend/metal/kernels/'
                            'sort.h"\n[[kernel]] void k(device float* o [[buffer(0)]]) '
                            "{ o[0] = 1; }")
    tu, _ = translation_unit(lib.kernel("k").program)
    assert _leading(tu) == (UTILS,)


def test_function_constants_stop_the_list_at_the_first_header_that_names_one():
    # Their values come before the file; the headers that never name one do not see them.
    gemm = "mlx/backend/metal/kernels/steel/gemm/"
    lib = mtwork.load_metal(f'#include "{UTILS}"\n#include "{gemm}gemm.h"\n'
                            f'#include "{gemm}kernels/steel_gemm_fused.h"\n')
    program = lib.kernel("gemm", template=("float", 32, 32, 16, 2, 2, False, False)).program
    assert "#define __mtw_fc_align_M" in program.defines
    tu, _ = translation_unit(program)
    assert _leading(tu) == (UTILS, f"{gemm}gemm.h")
    # The fused kernels name them (their rewritten function constants).
    assert "__mtw_fc_" in (compiler.prelude_dir() / gemm / "kernels/steel_gemm_fused.h"
                           ).read_text()


def test_kernels_share_one_precompiled_header_per_flags():
    first, second = _scale(), _scale()
    tu, _ = translation_unit(_program(first))
    before = set((cachedir.cache_dir() / "pch").glob("*.pch"))
    for kernel in (first, second):  # the first one's header serves the second
        assert np.array_equal(_run(kernel), 3 * np.arange(64))
    assert len(set((cachedir.cache_dir() / "pch").glob("*.pch")) - before) <= 1
    plain = compiler.precompiled_prelude(tu, compiler.kernel_flags("safe"))
    sanitized = compiler.precompiled_prelude(tu, compiler.kernel_flags("safe", sanitize=True))
    fast = compiler.precompiled_prelude(tu, compiler.kernel_flags("fast"))
    assert None not in (plain, sanitized, fast) and len({plain, sanitized, fast}) == 3


def test_a_damaged_precompiled_header_is_rebuilt_or_passed_over(tmp_path: Path):
    kernel = _scale()
    tu, _ = translation_unit(_program(kernel))
    flags = [*compiler.kernel_flags("safe"), f"-DMTW_TEST_{uuid.uuid4().hex}"]
    pch = compiler.precompiled_prelude(tu, flags)
    assert pch is not None
    pch.write_bytes(pch.read_bytes()[:1000])  # cut short: its seal no longer matches
    rebuilt = compiler.precompiled_prelude(tu, flags)
    assert rebuilt == pch and cachedir.is_sealed(pch) and pch.stat().st_size > 1000
    # Sealed but unreadable to clang (as from another clang): the compile goes on without.
    pch.write_bytes(b"not a precompiled header")
    cachedir.seal(pch)
    precompiled._checked.clear()
    source = tmp_path / "unit.cpp"
    source.write_text("float twice(float x) { return 2 * x; }\n")
    done = precompiled.run_from(pch, [*flags, *compiler.kernel_includes(), "-S", "-emit-llvm",
                                      str(source), "-o", str(tmp_path / "unit.ll")],
                                lambda args: run_clang(args, "test"))
    assert done.returncode == 0, done.stderr
    assert not pch.exists()  # removed, to be built again


def test_libraries_link_without_compiler_rt_unless_they_need_it():
    plain = _scale()
    assert np.array_equal(_run(plain), 3 * np.arange(64))
    # 128-bit division is a compiler_rt call (__udivti3): linked again with it, the
    # library loads and runs.
    wide = _scale("unsigned __int128 big = (unsigned __int128)(thread_position_in_grid.x + 1)"
                  " << 70; unsigned __int128 by = (unsigned __int128)(uint)(a[1] + 2.0f) << 68;"
                  " o[thread_position_in_grid.x] = float(big / by);")  # a[1] + 2 is 3
    assert np.array_equal(_run(wide), np.floor((np.arange(64) + 1) * 4 / 3))
    for kernel in (plain, wide):
        tu, tree = translation_unit(_program(kernel))
        path = compiler.compile_kernel(tu, "safe", kernel.name, include_dirs=tree.include_dirs)
        needs = linking.undefined_symbols(path)
        assert not [name for name in needs if name.startswith("__udiv")], needs
        if kernel is wide:  # compiler_rt's division is in the library itself
            assert b"__udivti3" in path.read_bytes()


def test_undefined_symbols_reads_what_a_library_needs(tmp_path: Path):
    source = tmp_path / "needs.cpp"
    source.write_text('extern "C" int mtw_test_elsewhere(int);\n'
                      'extern "C" int f(int x) { return mtw_test_elsewhere(x) + 1; }\n')
    out = tmp_path / "needs.so"
    done = run_clang(["-shared", "-fPIC", "-O2", "-nostdlib++", "-rtlib=none",
                              str(source), "-o", str(out)], "test")
    assert done.returncode == 0, done.stderr
    assert "mtw_test_elsewhere" in linking.undefined_symbols(out)
    assert "f" not in linking.undefined_symbols(out)


def test_the_running_total_grows_with_each_publish_and_spares_the_walk(monkeypatch):
    root = cachedir.cache_dir()
    cachedir.evict()  # counts (or trusts a recent count)
    folder = cachedir.work_dir()
    artefact = folder / "kernel.so"
    artefact.write_bytes(b"x" * 12345)
    with cachedir._usage_file() as fd:
        before = cachedir._read_usage(fd)
    target = root / "kernels" / f"test-{uuid.uuid4().hex}.so"
    try:
        cachedir.publish(artefact, target)
        with cachedir._usage_file() as fd:
            after = cachedir._read_usage(fd)
        if before is not None:
            assert after[0] - before[0] == 12345
        walked = []
        monkeypatch.setattr(cachedir, "_artefacts", lambda r: walked.append(r) or [])
        cachedir.evict(limit=max(2 * after[0], 1 << 40))
        assert walked == []  # under the limit: no walk over the cache
        cachedir.evict(limit=0)
        assert walked == [root]  # over it: counted
    finally:
        cachedir.discard(target)
        folder.rmdir()


def _reference_mask(text: str) -> str:
    """Comments and literal contents blanked, one character at a time (the C rules as the
    rewrites need them: a literal ends at its quote, an unescaped line break or the end)."""
    out, i, n = list(text), 0, len(text)
    while i < n:
        if text.startswith("//", i) or text.startswith("/*", i):
            end = text.find("\n" if text[i + 1] == "/" else "*/", i + 2)
            end = n if end < 0 else end + (0 if text[i + 1] == "/" else 2)
            span = range(i, end)
        elif text[i] in "\"'":
            end = i + 1
            while end < n and text[end] not in (text[i], "\n"):
                end += 2 if text[end] == "\\" else 1
            span = range(i + 1, min(end, n))
            end += 1
        else:
            i += 1
            continue
        for k in span:
            if out[k] != "\n":
                out[k] = " "
        i = end
    return "".join(out)


def test_code_mask_blanks_comments_and_literals_as_the_c_rules_say():
    rng = random.Random(7)
    pieces = ['"', "'", "\\", "\n", "/", "*", "//", "/*", "*/", "a", " ", "x1"]
    for _ in range(20000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 16)))
        assert code_mask(text) == _reference_mask(text), repr(text)
    assert code_mask('f("a/*b", \'c\'); // d\n/* e\n */ g') == \
        'f("    ", \' \');     \n    \n    g'


def test_threads_compiling_one_program_at_once_build_it_once(monkeypatch) -> None:
    import threading
    import time

    from mtwork.backends.sim import SimBackend

    program = _program(_scale())
    builds = []
    real = compiler.compile_kernel

    def slow_build(*args, **kwargs):
        builds.append(kwargs.get("profile", False))
        time.sleep(0.2)  # long enough for every thread to ask while it builds
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "compile_kernel", slow_build)
    backend = SimBackend()
    got = []
    threads = [threading.Thread(target=lambda p=p: got.append(backend.compile(program, profile=p)))
               for p in (False, False, False, True, True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(builds) == [False, True] and len(got) == 5
    assert len({id(c) for c in got}) == 2  # every thread holds the one build of its variant


def test_concurrent_builders_of_one_library_build_it_once(monkeypatch, tmp_path: Path):
    log = tmp_path / "builds.log"
    monkeypatch.setenv("MTWORK_BUILD_LOG", str(log))
    kernel = _scale()
    tu, tree = translation_unit(_program(kernel))
    compiler.runtime_library()  # built already: only the kernel is built below
    start = threading.Barrier(3)

    def build(_: int) -> Path:
        start.wait()
        return compiler.compile_kernel(tu, "safe", kernel.name, include_dirs=tree.include_dirs)

    with ThreadPoolExecutor(max_workers=3) as pool:
        paths = list(pool.map(build, range(3)))
    assert len(set(paths)) == 1 and cachedir.is_sealed(paths[0])
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [run["kind"] for run in runs if run["what"] == kernel.name] == ["library"]


def test_a_build_lock_held_by_another_process_is_waited_for(tmp_path: Path):
    artefact = cachedir.cache_dir() / "kernels" / f"{uuid.uuid4().hex}.so"
    marker = tmp_path / "released"
    holder = (
        "import time\nfrom pathlib import Path\nfrom mtwork import cachedir\n"
        f"with cachedir.build_lock(Path({str(artefact)!r})):\n"
        "    print('held', flush=True)\n    time.sleep(1.0)\n"
        f"    Path({str(marker)!r}).write_text('done')\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    process = subprocess.Popen([sys.executable, "-c", holder], stdout=subprocess.PIPE,
                               text=True, env=env)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "held"
        with cachedir.build_lock(artefact):
            assert marker.read_text() == "done"  # the holder finished before we got it
    finally:
        process.wait(timeout=60)
    assert process.returncode == 0

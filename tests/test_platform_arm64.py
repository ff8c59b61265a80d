"""The emulator run for real on arm64, under Debian's qemu-user: what a call did on sim
here is built for arm64 Linux with Apple Silicon's instruction set (the M1's: native
half-precision arithmetic, no bfloat instructions) and run there by a small driver, then
compared byte for byte with the same plan run by this machine's build.

Covered: fiber switches and barriers, SIMD-group functions, `simdgroup_matrix`, atomics,
half and bfloat arithmetic, MLX's kernels and the families', on each engine sim runs them
with (fibers; plain loops or the fast engine), and a guard-page fault, a stack overflow
and exit() in kernel code caught as faults. The default run takes a representative
subset; ``-m slow`` runs the whole self-test corpus.

Needs ``qemu-user`` and ``libc6-arm64-cross`` (Debian); CI installs them (.ci/run), and
there a machine without them fails the test rather than skipping it.
"""

from __future__ import annotations

import os
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.backends.sim.compile import compiler
from mtwork.host import HOST, LINUX_ARM64
from tests.platforms import foreign
from tests.platforms.programs import corpus, record, recording

MTW_OK, MTW_FAULT, MTW_KERNEL_ERROR = 0, 2, 6  # runtime.h's mtw_status
DEFAULT = ("half arithmetic", "bfloat arithmetic", "tree sum", "SIMD-group functions",
           "simdgroup_matrix", "atomics", "MLX softmax_single_row")


@pytest.fixture(scope="module")
def arm64(tmp_path_factory) -> Path:
    missing = foreign.qemu_missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the arm64 proof: {missing}")
        pytest.skip(missing)
    return tmp_path_factory.mktemp("arm64")


@pytest.fixture(scope="module")
def recorder():
    with recording() as r:
        yield r


def _compare_case(name: str, recorder, folder: Path) -> None:
    runtimes = {t: compiler.runtime_library(t) for t in (HOST, LINUX_ARM64)}
    calls = record(recorder, corpus()[name])
    for i, call in enumerate(calls):
        here = {v.engine: v for v in foreign.variants(call.program, HOST)}
        there = {v.engine: v for v in foreign.variants(call.program, LINUX_ARM64)}
        assert set(here) == set(there)
        for engine, variant in here.items():
            plan = foreign.write_plan(call.program, call.call, variant,
                                      folder / f"{name.replace(' ', '_')}-{i}-{engine}")
            a = foreign.run(HOST, folder, runtimes[HOST], variant, plan)
            b = foreign.run(LINUX_ARM64, folder, runtimes[LINUX_ARM64], there[engine], plan)
            assert (a.status, a.message) == (b.status, b.message), (engine, a, b)
            assert not foreign.differing(a, b), (engine, foreign.differing(a, b))
            if engine == "fibers":  # the driver did what mtwork's dispatch did
                assert a.status == MTW_OK, a.message
                for index, array in call.completion.buffers.items():
                    assert a.buffers[index] == np.ascontiguousarray(array).tobytes(), index


@pytest.mark.parametrize("name", DEFAULT)
def test_outputs_on_arm64_are_bitwise_those_here(arm64, recorder, name) -> None:
    _compare_case(name, recorder, arm64)


@pytest.mark.slow
def test_the_whole_corpus_on_arm64_is_bitwise_what_it_is_here(arm64, recorder) -> None:
    for name in corpus():
        _compare_case(name, recorder, arm64)


FAULTS = {
    # 64 KiB past a 256-byte output: past its page of slack, into its guard page.
    "guard page": ("for (uint j = 0; j < 16384; ++j) out[j] = 1.0f;",
                   MTW_FAULT, "segmentation fault (invalid memory access) at address"),
    # The runtime's exit() fails the dispatch as kernel code's own error.
    "exit": ("if (thread_position_in_grid.x == 9) exit(3); out[0] = 1;",
             MTW_KERNEL_ERROR, "exit(3) called in kernel code"),
    "stack overflow": ("threadgroup float buf[64]; uint t = thread_position_in_threadgroup.x;"
                       "buf[t] = 0; threadgroup_barrier(mem_flags::mem_threadgroup);"
                       "if (t == 5) buf[t] = big_helper<70000>(t);"
                       "threadgroup_barrier(mem_flags::mem_threadgroup); out[t] = buf[t];",
                       MTW_FAULT, "stack overflow in"),
}
HEADER = """#include <stdlib.h>
template <int N> float big_helper(uint t) {
    float scratch[N];
    for (int i = 0; i < N; ++i) scratch[i] = float(i + t);
    float s = 0;
    for (int i = 0; i < N; i += 97) s += scratch[i];
    return s;
}
"""


@pytest.mark.parametrize("kind", list(FAULTS))
def test_faults_and_exit_are_caught_on_arm64(arm64, recorder, kind) -> None:
    body, status, said = FAULTS[kind]
    kernel = mtwork.metal_kernel(f"fault_{kind.replace(' ', '_')}", ["a"], ["out"], body,
                                 header=HEADER)
    recorder.calls.clear()
    with pytest.raises(mtwork.KernelFault):
        mx.eval(kernel(inputs=[mx.zeros((1,))], grid=(64, 1, 1), threadgroup=(64, 1, 1),
                       output_shapes=[(64,)], output_dtypes=[mx.float32], backend="recorded"))
    call = recorder.calls[0]
    [variant] = [v for v in foreign.variants(call.program, LINUX_ARM64) if v.engine == "fibers"]
    folder = arm64 / f"fault-{kind.replace(' ', '_')}"
    plan = foreign.write_plan(call.program, call.call, variant, folder)
    ran = foreign.run(LINUX_ARM64, arm64, compiler.runtime_library(LINUX_ARM64), variant, plan)
    assert ran.status == status and said in ran.message, ran

"""The worker reuses what it was sent: kernels and call plans by id, guard pages left
in place while a plan repeats. What it keeps follows what mtwork keeps, whatever the
order of calls, and a plan reused after the arena grew runs on the new memory."""

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork.backends import get
from mtwork.backends.sim.run.isolation import Isolated
from mtwork.dispatch import Bound, Dispatch, Fresh, Geometry, Options


def _plus(k: int) -> mtwork.MetalKernel:
    return mtwork.metal_kernel(f"plus_{k}", ["inp"], ["out"],
                               f"uint i = thread_position_in_grid.x; out[i] = inp[i] + {k}.0f;")


def _program_and_call(kernel, x, n):
    program = kernel.program(kernel.generate([x], [mx.float32]))
    get("sim").compile(program)
    call = Dispatch({0: Bound(x, mx.float32), 1: Fresh((n,), mx.float32)},
                    Geometry((n, 1, 1), (32, 1, 1)), Options(isolate=True))
    return program, call


@pytest.fixture
def isolated():
    worker = Isolated(programs_kept=2, plans_kept=3)
    yield worker
    worker.close()


def test_kernels_and_plans_past_what_is_kept_still_run_right(isolated):
    kernels = [_plus(k) for k in range(4)]
    pid = None
    for _ in range(3):  # each round sends again what the last one let go
        for k, kernel in enumerate(kernels):
            for n in (32, 96, 64 * 1024):
                x = mx.arange(n, dtype=mx.float32)
                done = isolated.dispatch(*_program_and_call(kernel, x, n))
                np.testing.assert_array_equal(done.buffers[1], np.arange(n) + k)
                pid = pid or isolated.pid
                assert isolated.pid == pid, "the worker was restarted"


def test_a_repeated_plan_after_the_arena_grew_runs_on_the_new_memory(isolated):
    kernel = _plus(1)
    small = mx.arange(64, dtype=mx.float32)
    big = mx.arange(1 << 20, dtype=mx.float32)  # 4 MiB: more than the first arena
    for x in (small, big, small, big):
        n = x.size
        done = isolated.dispatch(*_program_and_call(kernel, x, n))
        np.testing.assert_array_equal(done.buffers[1], np.arange(n) + 1)


def test_each_call_of_a_plan_sees_its_own_inputs_and_fresh_outputs(isolated):
    # Same plan, other values: nothing of the last call's inputs or outputs is reused.
    kernel = mtwork.metal_kernel("half_the_threads", ["inp"], ["out"],
                                 "uint i = thread_position_in_grid.x;\n"
                                 "if (i % 2 == 0) out[i] = inp[i];")
    for value in (1.0, 2.0, 3.0):
        x = mx.full((64,), value, dtype=mx.float32)
        out = isolated.dispatch(*_program_and_call(kernel, x, 64)).buffers[1]
        np.testing.assert_array_equal(out[::2], np.full(32, value, np.float32))
        assert np.isnan(out[1::2]).all(), "odd elements should keep the poison of a new output"


def test_guard_pages_stay_in_place_while_a_plan_repeats(isolated):
    # The first call writes in bounds; the second, of the same plan, 8 KiB past the end
    # of its output: its guard page must still be there.
    kernel = mtwork.metal_kernel("far_when_asked", ["inp"], ["out"],
                                 "uint i = thread_position_in_grid.x;\n"
                                 "out[i] = 1.0f;\n"
                                 "if (inp[0] > 0.0f) out[2048 + i] = 2.0f;")
    done = isolated.dispatch(*_program_and_call(kernel, mx.zeros((64,)), 64))
    np.testing.assert_array_equal(done.buffers[1], np.ones(64, np.float32))
    pid = isolated.pid
    with pytest.raises(mtwork.KernelFault) as caught:
        isolated.dispatch(*_program_and_call(kernel, mx.ones((64,)), 64))
    assert "segmentation fault" in str(caught.value), caught.value
    assert isolated.pid == pid, "the fault should be caught in the worker, not end it"


ALIASED = """
#include <metal_stdlib>
[[kernel]] void through_both(device float* a [[buffer(0)]], device float* b [[buffer(1)]],
                             uint i [[thread_position_in_grid]]) {
    a[i] = 5.0f;
    b[i] = b[i] + a[i];
}
"""


def test_one_array_bound_twice_is_one_buffer_whatever_came_before():
    # Two arrays, then one array at both indices, then two again: the same shapes, but
    # the second call's buffers are one memory (a write through `a` is seen through `b`).
    kernel = mtwork.load_metal(ALIASED).kernel("through_both")
    for _ in range(2):
        a, b = np.zeros(64, np.float32), np.ones(64, np.float32)
        kernel(buffers=[a, b], grid=64, threads_per_threadgroup=32, isolate=True)
        np.testing.assert_array_equal(b, np.full(64, 6.0, np.float32))
        same = np.ones(64, np.float32)
        kernel(buffers=[same, same], grid=64, threads_per_threadgroup=32, isolate=True)
        np.testing.assert_array_equal(same, np.full(64, 10.0, np.float32))

"""Outputs of isolated kernels are memory the worker shares with mtwork: the worker writes
an MLX output where MLX reads it, a later kernel reads it where it is (a chain copies
nothing), the memory stays valid whatever happens to the worker, goes back when MLX frees
the array, and no kernel can write into another array's memory."""

from __future__ import annotations

import ctypes
import os
import signal
import time

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork import graph
from mtwork.backends import get
from mtwork.backends.sim.run.shared import heap
from tests.reliability.child import run_snippet

pytestmark = pytest.mark.skipif(not graph.available(),
                                reason=f"no MLX extension: {graph.unavailable_reason()}")

N = 4096
EXP = "uint i = thread_position_in_grid.x; out[i] = metal::exp(inp[i]);"
RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def exp_kernel():
    return mtwork.metal_kernel("shared_exp", ["inp"], ["out"], EXP)


def _call(kernel, x, **options):
    return kernel(inputs=[x], grid=(x.size, 1, 1), threadgroup=(256, 1, 1),
                  output_shapes=[x.shape], output_dtypes=[mx.float32], isolate=True,
                  **options)[0]


def _address(a: mx.array) -> int:
    return np.array(a, copy=False).ctypes.data


@pytest.fixture
def allocations(monkeypatch):
    """The sizes `heap().allocate` is asked for."""
    asked: list[int] = []
    shared = heap()
    real = shared.allocate

    def spy(nbytes: int):
        asked.append(nbytes)
        return real(nbytes)

    monkeypatch.setattr(shared, "allocate", spy)
    return asked


def test_a_chain_of_kernels_copies_nothing(exp_kernel, allocations) -> None:
    x = mx.array(RNG.standard_normal(N).astype(np.float32) * 0.1)
    a = _call(exp_kernel, x)
    mx.eval(a)
    # The output's block, and a staging block for x (MLX's own memory).
    assert sorted(allocations) == [4 * N, 4 * N]
    assert heap().find(_address(a), 4 * N) is not None, "the output is shared memory"
    allocations.clear()
    b = _call(exp_kernel, a)
    mx.eval(b)
    assert allocations == [4 * N], "a, an earlier output, should be read where it is"
    np.testing.assert_allclose(np.array(b), np.exp(np.exp(np.array(x))), rtol=1e-6)


def test_outputs_stay_valid_when_the_worker_dies(exp_kernel) -> None:
    x = mx.array(RNG.standard_normal(N).astype(np.float32))
    a = _call(exp_kernel, x)
    mx.eval(a)
    expected = np.exp(np.array(x))
    pid = get("sim").worker_pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while get("sim").worker_pid == pid and time.monotonic() < deadline:
        time.sleep(0.01)
    np.testing.assert_allclose(np.array(a), expected, rtol=1e-6)
    # The next worker maps the memory again: the old output is an input of a new call.
    b = _call(exp_kernel, a * 0.01)
    c = _call(exp_kernel, a)
    mx.eval(b, c)
    assert get("sim").worker_pid not in (None, pid)
    np.testing.assert_allclose(np.array(c), np.exp(expected), rtol=1e-5)


def test_memory_goes_back_when_mlx_frees_the_array(exp_kernel) -> None:
    x = mx.array(RNG.standard_normal(N).astype(np.float32))
    graph.give_back_freed()
    before = heap().in_use
    a = _call(exp_kernel, x)
    doubled = _call(exp_kernel, x) * 2  # MLX may give the output's memory to the product
    mx.eval(a, doubled)
    assert heap().in_use > before
    np.testing.assert_allclose(np.array(doubled), 2 * np.exp(np.array(x)), rtol=1e-6)
    del a, doubled
    graph.give_back_freed()
    assert heap().in_use == before


def test_in_process_calls_use_mlx_memory(exp_kernel, allocations) -> None:
    x = mx.array(RNG.standard_normal(N).astype(np.float32))
    out = exp_kernel(inputs=[x], grid=(N, 1, 1), threadgroup=(256, 1, 1),
                     output_shapes=[(N,)], output_dtypes=[mx.float32], isolate=False)[0]
    mx.eval(out)
    assert allocations == []
    assert heap().find(_address(out), 4 * N) is None


# Writes 99.0 at a byte offset from its input: into another array, given the distance.
WILD = """
uint i = thread_position_in_grid.x;
out[i] = inp[i];
if (i == 0) *(device float*)((const device char*)inp + delta[0]) = 99.0f;
"""


def test_a_kernel_cannot_write_into_another_arrays_memory(exp_kernel) -> None:
    # a and c are blocks of one segment; the wild kernel gets a, and the distance from a
    # to c: the worker must keep c's block closed while it runs.
    x = mx.array(RNG.standard_normal(64).astype(np.float32))
    a, c = _call(exp_kernel, x), _call(exp_kernel, x + 1)
    mx.eval(a, c)
    (block_a, _), (block_c, _) = (heap().find(_address(v), 256) for v in (a, c))
    assert block_a.segment is block_c.segment
    kept = np.array(c)
    wild = mtwork.metal_kernel("wild", ["inp", "delta"], ["out"], WILD)
    delta = mx.array([_address(c) - _address(a)], dtype=mx.int64)
    with pytest.raises(mtwork.KernelFault):
        mx.eval(wild(inputs=[a, delta], grid=(64, 1, 1), threadgroup=(64, 1, 1),
                     output_shapes=[(64,)], output_dtypes=[mx.float32], isolate=True))
    np.testing.assert_array_equal(np.array(c), kept)


def test_sanitized_reads_past_a_shared_input_are_reported_not_faults(exp_kernel) -> None:
    x = mx.array(RNG.standard_normal(N).astype(np.float32))
    a = _call(exp_kernel, x)
    mx.eval(a)
    past = mtwork.metal_kernel("one_past", ["inp"], ["out"],
                               "uint i = thread_position_in_grid.x; out[i] = inp[i + 1];")
    out = past(inputs=[a], grid=(N, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(N,)],
               output_dtypes=[mx.float32], isolate=True, sanitize="report")[0]
    mx.eval(out)
    assert past.last_sanitizer_report.of_kind("out-of-bounds access")
    np.testing.assert_array_equal(np.array(out)[:-1], np.array(a)[1:])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_does_not_share_the_parents_arrays(exp_kernel) -> None:
    x = mx.array(RNG.standard_normal(N).astype(np.float32))
    a = _call(exp_kernel, x)
    mx.eval(a)
    kept, address = np.array(a), _address(a)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no MLX here (its threads are not forked), memory only
        try:
            same = ctypes.string_at(address, 4 * N) == kept.tobytes()
            ctypes.memset(address, 0, 4 * N)  # its own copy, not the parent's array
            own = heap().find(address, 4 * N) is None and heap().allocate(4 * N) is not None
            os.write(write, b"1" if same and own else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"1", "the child should see the array's values and a heap of its own"
    np.testing.assert_array_equal(np.array(a), kept)


def test_outputs_are_shared_memory_whatever_mlx_allocated_before() -> None:
    # How MLX holds memory it did not allocate is decided once, from a buffer of MLX's
    # own: one its cache gives back, larger than asked, must not change the answer.
    done = run_snippet("""
        import mlx.core as mx, numpy as np, mtwork
        from mtwork.backends.sim.run.shared import heap
        for _ in range(50):
            a = mx.ones((24,))
            mx.eval(a)
            del a
        k = mtwork.metal_kernel("inc", ["inp"], ["out"],
                                "out[thread_position_in_grid.x] = 1.0f;")
        out = k(inputs=[mx.zeros((1,))], grid=(4096, 1, 1), threadgroup=(256, 1, 1),
                output_shapes=[(4096,)], output_dtypes=[mx.float32], isolate=True)[0]
        mx.eval(out)
        print(heap().find(np.array(out, copy=False).ctypes.data, 16384) is not None)
        """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "True", done.stdout

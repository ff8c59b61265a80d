"""Kernel calls are operations of MLX's graph: lazy, inside `mx.compile` (the same bytes
as outside it), under `mx.custom_function` with the author's vjp and jvp, with `stream=`
and `mx.async_eval`; on both forms, both engines, isolated and in this process, and on
the metal backend's path (with `mtwork.metal_kernel` on sim standing in for MLX's)."""

from __future__ import annotations

import math
import time

import mlx.core as mx
import numpy as np
import pytest

import mtwork
from mtwork import graph
from mtwork.backends import cancel, get
from tests.conformance.metal_path import registered

pytestmark = pytest.mark.skipif(not graph.available(),
                                reason=f"no MLX extension: {graph.unavailable_reason()}")

N = 256
RNG = np.random.default_rng(21)

# A tree sum per threadgroup: barriers, so the engine (fast or fibers) matters.
TREE_SUM_BODY = """
    threadgroup float partial[64];
    uint t = thread_position_in_threadgroup.x;
    partial[t] = inp[thread_position_in_grid.x] * 1.5f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 32; s > 0; s >>= 1) {
        if (t < s) partial[t] += partial[t + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (t == 0) out[threadgroup_position_in_grid.x] = partial[0];
"""

TREE_SUM_LIBRARY = """
#include <metal_stdlib>
using namespace metal;
kernel void tree_sum(device const float* inp [[buffer(0)]], device float* out [[buffer(1)]],
                     uint t [[thread_position_in_threadgroup]],
                     uint g [[threadgroup_position_in_grid]],
                     uint i [[thread_position_in_grid]]) {
    threadgroup float partial[64];
    partial[t] = inp[i] * 1.5f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 32; s > 0; s >>= 1) {
        if (t < s) partial[t] += partial[t + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (t == 0) out[g] = partial[0];
}
kernel void scale_in_place(device float* x [[buffer(0)]], constant float& by [[buffer(1)]],
                           uint i [[thread_position_in_grid]]) {
    x[i] = x[i] * by + 1.0f;
}
"""


def body_form(**options):
    kernel = mtwork.metal_kernel("tree_sum", ["inp"], ["out"], TREE_SUM_BODY)

    def run(x):
        return kernel(inputs=[x], grid=(N, 1, 1), threadgroup=(64, 1, 1),
                      output_shapes=[(N // 64,)], output_dtypes=[mx.float32], **options)[0]

    return kernel, run


def full_source(**options):
    kernel = mtwork.load_metal(TREE_SUM_LIBRARY).kernel("tree_sum")

    def run(x):
        return kernel(buffers={"inp": x, "out": mtwork.new_buffer(N // 64)}, grid=N,
                      threads_per_threadgroup=64, **options).mx("out")

    return kernel, run


def reference(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float64) * 1.5).reshape(-1, 64).sum(axis=1)


@pytest.fixture
def engine(monkeypatch):
    """Sets $MTWORK_SIM_ENGINE; the worker process, which keeps the environment it
    started with, is ended so that the next call starts one that reads it."""

    def restart() -> None:
        cancel("sim")
        deadline = time.monotonic() + 10
        while get("sim").worker_pid is not None and time.monotonic() < deadline:
            time.sleep(0.01)  # ended: the next call starts a worker, not the dying one

    def use(mode: str) -> None:
        monkeypatch.setenv("MTWORK_SIM_ENGINE", mode)
        restart()

    yield use
    restart()


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "in-process"])
@pytest.mark.parametrize("mode", ["fast", "fibers"])
@pytest.mark.parametrize("form", [body_form, full_source], ids=["metal_kernel", "load_metal"])
def test_a_kernel_inside_mx_compile_gives_the_bytes_it_gives_outside(form, mode, isolate,
                                                                     engine) -> None:
    engine(mode)
    kernel, run = form(backend="sim", isolate=isolate)
    x = mx.array(RNG.standard_normal(N).astype(np.float32))
    outside = np.array(run(x))
    assert kernel.last_engine is not None and kernel.last_engine.name == mode
    compiled = mx.compile(lambda a: run(a * 2) - 1)
    inside = np.array(compiled(x))
    assert inside.tobytes() == np.array(run(x * 2) - 1).tobytes()
    np.testing.assert_allclose(outside, reference(np.array(x)), rtol=1e-5)
    # The compiled function's replay runs the kernel again, on new values.
    y = mx.array(RNG.standard_normal(N).astype(np.float32))
    again = np.array(compiled(y))
    assert again.tobytes() == np.array(run(y * 2) - 1).tobytes()


@pytest.mark.parametrize("form", [body_form, full_source], ids=["metal_kernel", "load_metal"])
def test_the_metal_backends_path_is_lazy_inside_mx_compile_too(form) -> None:
    # The metal backend hands MLX the kernel (its wrapper for a full-source one); a
    # stand-in backend runs exactly that with mtwork.metal_kernel on sim in MLX's place.
    _, on_metal = form(backend=registered())
    _, on_sim = form(backend="sim")
    x = mx.array(RNG.standard_normal(N).astype(np.float32))
    inside = mx.compile(lambda a: on_metal(a + 1))(x)
    assert np.array(inside).tobytes() == np.array(on_sim(x + 1)).tobytes()


def test_a_call_runs_when_mlx_evaluates_it_not_before() -> None:
    kernel, run = body_form(backend="sim")
    x = mx.array(RNG.standard_normal(N).astype(np.float32))
    out = run(x)
    assert kernel.last_engine is None, "nothing should have run before evaluation"
    mx.eval(out)
    assert kernel.last_engine is not None
    np.testing.assert_allclose(np.array(out), reference(np.array(x)), rtol=1e-5)


def test_async_eval_and_a_stream() -> None:
    kernel = mtwork.metal_kernel("twice", ["a"], ["out"],
                                 "uint i = thread_position_in_grid.x; out[i] = 2 * a[i];")
    x = mx.arange(64, dtype=mx.float32)
    call = dict(grid=(64, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(64,)],
                output_dtypes=[mx.float32])
    out = kernel(inputs=[x], stream=mx.gpu, **call)[0] + 1
    mx.async_eval(out)
    np.testing.assert_array_equal(np.array(out), 2 * np.arange(64) + 1)
    with pytest.raises(ValueError, match="Only supports the GPU"):
        kernel(inputs=[x], stream=mx.cpu, **call)
    with mtwork.interpose():  # mx.gpu is where the kernels run: its streams are taken
        stream = mx.new_stream(mx.gpu)
        out = kernel(inputs=[x], stream=stream, **call)[0]
        later = kernel(inputs=[out], stream=mx.Device(mx.gpu), **call)[0]
        mx.async_eval(later)
        np.testing.assert_array_equal(np.array(later), 4 * np.arange(64))


def test_load_metal_calls_take_a_stream_and_async_eval() -> None:
    kernel = mtwork.load_metal(TREE_SUM_LIBRARY).kernel("tree_sum")
    x = mx.array(RNG.standard_normal(N).astype(np.float32))
    outputs = kernel(buffers={"inp": x, "out": mtwork.new_buffer(N // 64)}, grid=N,
                     threads_per_threadgroup=64, stream=mx.gpu)
    assert kernel.last_engine is None, "a call given a stream is an operation: lazy"
    total = outputs.mx("out") * 2
    mx.async_eval(total)
    np.testing.assert_allclose(np.array(total), 2 * reference(np.array(x)), rtol=1e-5)
    assert kernel.last_engine is not None
    with pytest.raises(ValueError, match="`stream` must be the GPU's"):
        kernel(buffers={"inp": x, "out": mtwork.new_buffer(N // 64)}, grid=N,
               threads_per_threadgroup=64, stream=mx.cpu)
    with pytest.raises(TypeError, match="given stream="):
        kernel(buffers={"inp": x, "out": np.zeros(N // 64, np.float32)}, grid=N,
               threads_per_threadgroup=64, stream=mx.gpu)
    with mtwork.interpose():
        stream = mx.new_stream(mx.gpu)
        again = kernel(buffers={"inp": x, "out": mtwork.new_buffer(N // 64)}, grid=N,
                       threads_per_threadgroup=64, stream=stream).mx("out")
        mx.async_eval(again)
        np.testing.assert_allclose(np.array(again), reference(np.array(x)), rtol=1e-5)


SQUARE = "uint i = thread_position_in_grid.x; out[i] = a[i] * a[i];"
SCALED = "uint i = thread_position_in_grid.x; out[i] = 2.0f * a[i] * g[i];"


def _square(x):
    kernel = mtwork.metal_kernel("square", ["a"], ["out"], SQUARE)
    return kernel(inputs=[x], grid=(x.size, 1, 1), threadgroup=(32, 1, 1),
                  output_shapes=[x.shape], output_dtypes=[x.dtype])[0]


def _two_a_g(a, g):
    kernel = mtwork.metal_kernel("two_a_g", ["a", "g"], ["out"], SCALED)
    return kernel(inputs=[a, g], grid=(a.size, 1, 1), threadgroup=(32, 1, 1),
                  output_shapes=[a.shape], output_dtypes=[a.dtype])[0]


def test_custom_function_with_the_authors_vjp_inside_grad_and_compile() -> None:
    @mx.custom_function
    def square(x):
        return _square(x)

    # With one argument, MLX passes it (and its cotangent) as it is, not in a tuple.
    @square.vjp
    def square_vjp(primal, cotangent, output):
        return _two_a_g(primal, cotangent)  # a kernel in the backward pass too

    x = mx.arange(64, dtype=mx.float32) / 8
    grad = mx.grad(lambda a: square(a).sum())
    np.testing.assert_array_equal(np.array(grad(x)), 2 * np.array(x))
    np.testing.assert_array_equal(np.array(mx.compile(grad)(x)), 2 * np.array(x))


def test_custom_function_with_the_authors_jvp_fails_as_with_mlx_kernels() -> None:
    # mx.jvp computes the tangent of every operation between the inputs and the outputs,
    # those inside a custom function too, before it uses the author's jvp: MLX's
    # CustomKernel has no jvp, so MLX's own kernels fail here, and ours fail alike.
    @mx.custom_function
    def square(x):
        return _square(x)

    @square.jvp
    def square_jvp(primal, tangent):
        return _two_a_g(primal, tangent)

    x = mx.arange(64, dtype=mx.float32) / 8
    with pytest.raises(ValueError, match=r"\[Primitive::jvp\] Not implemented for "
                                         r"CustomKernel"):
        mx.jvp(square, [x], [mx.ones_like(x)])
    # The author's jvp is a graph of kernels like any other: it runs.
    tangent = _two_a_g(x, mx.ones_like(x))
    np.testing.assert_array_equal(np.array(tangent), 2 * np.array(x))


def test_what_mlx_custom_kernels_cannot_do_ours_cannot_either() -> None:
    # MLX's CustomKernel has no vjp, no vmap and no output shapes for shapeless
    # compilation: the same transformations fail the same way on sim.
    x = mx.arange(64, dtype=mx.float32)
    with pytest.raises(ValueError, match="CustomKernel"):
        mx.grad(lambda a: _square(a).sum())(x)
    with pytest.raises(ValueError, match="CustomKernel"):
        mx.vmap(_square)(x.reshape(2, 32))
    with pytest.raises(ValueError, match="CustomKernel cannot infer output shapes"):
        mx.compile(_square, shapeless=True)(x)


def test_load_metal_kernel_updates_an_mx_array_buffer_inside_compile() -> None:
    kernel = mtwork.load_metal(TREE_SUM_LIBRARY).kernel("scale_in_place")

    def scaled(x):
        return kernel(buffers={"x": x, "by": 3.0}, grid=x.size,
                      threads_per_threadgroup=32).mx("x")

    x = mx.arange(64, dtype=mx.float32)
    inside = mx.compile(lambda a: scaled(a * 2))(x)
    np.testing.assert_array_equal(np.array(inside), np.arange(64) * 6 + 1)
    np.testing.assert_array_equal(np.array(x), np.arange(64)), "the input keeps its values"
    tree_sum = mtwork.load_metal(TREE_SUM_LIBRARY).kernel("tree_sum")
    written = np.zeros(N // 64, np.float32)
    with pytest.raises(TypeError, match="numpy array.*inside mx.compile"):
        mx.compile(lambda a: tree_sum(buffers={"inp": a, "out": written}, grid=N,
                                      threads_per_threadgroup=64).mx("out"))(
            mx.zeros(N))


# --- init_value: every float MLX takes --------------------------------------------------


def test_init_value_minus_infinity_starts_a_max_reduction() -> None:
    kernel = mtwork.metal_kernel("running_max", ["a"], ["out"], """
        for (uint i = 0; i < a_shape[0]; ++i) out[0] = max(out[0], a[i]);
    """)
    x = -mx.arange(1, 17, dtype=mx.float32) * 1e30
    out = kernel(inputs=[x], grid=(1, 1, 1), threadgroup=(1, 1, 1), output_shapes=[(1,)],
                 output_dtypes=[mx.float32], init_value=-float("inf"))[0]
    assert out.item() == np.float32(-1e30)
    empty = kernel(inputs=[x[:0]], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                   output_shapes=[(1,)], output_dtypes=[mx.float32], init_value=-math.inf)[0]
    assert empty.item() == -math.inf


@pytest.mark.parametrize("fill", [math.inf, -math.inf, math.nan])
def test_init_value_fills_unwritten_outputs_as_mlx_converts_it(fill) -> None:
    kinds = [mx.float32, mx.float16, mx.bfloat16, mx.int32, mx.uint32, mx.uint8, mx.bool_]
    kernel = mtwork.metal_kernel("untouched", ["a"], [f"o{i}" for i in range(len(kinds))],
                                 "")
    outs = kernel(inputs=[mx.zeros(1)], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                  output_shapes=[(4,)] * len(kinds), output_dtypes=kinds, init_value=fill)
    as_float = [np.array(o.astype(mx.float32)) for o in outs[:3]]
    for got in as_float:  # floats keep the value: inf stays inf, NaN stays NaN
        np.testing.assert_array_equal(got, np.full(4, fill, np.float32))
    # Integers as on Apple silicon: saturated toward the value, NaN as 0; a narrow type
    # keeps the low byte of the 32-bit conversion; bool is fill != 0.
    int32 = {math.inf: 2**31 - 1, -math.inf: -(2**31)}.get(fill, 0)
    uint32 = {math.inf: 2**32 - 1}.get(fill, 0)
    uint8 = int32 & 0xFF
    expected = [int32, uint32, uint8, True]
    for out, value in zip(outs[3:], expected):
        assert np.array(out).tolist() == [value] * 4, (out.dtype, fill)
    assert np.array(outs[1].view(mx.uint16)).tolist()[0] in ((0x7C00, 0xFC00) if
                                                              not math.isnan(fill) else
                                                              (0x7E00,))
    if math.isnan(fill):
        assert np.array(outs[2].view(mx.uint16)).tolist() == [0x7FC0] * 4

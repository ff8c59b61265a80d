"""What sim does as Metal does, where it did not: the author's headers before MLX's, the
parts of Metal's library older public sources use (assert, a matrix divided by a scalar,
os_log_default), buffers a kernel never reads left unbound, kernel names Metal can
compile."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mtwork

HEAD = "#include <metal_stdlib>\nusing namespace metal;\n"


def run_full(source: str, n: int = 4, **load) -> np.ndarray:
    lib = mtwork.load_metal(source, **load)
    return lib.kernel("k")(buffers={"out": np.zeros(n, np.float32)}, grid=(n,),
                           threads_per_threadgroup=(n,))["out"]


def test_a_header_of_the_authors_named_like_one_of_mlxs_is_the_authors(tmp_path) -> None:
    # load_metal's documentation: the including file's folder, then include_dirs, then
    # MLX's headers. The wheel's utils.h has no local_marker: compiling it would fail.
    kernels = tmp_path / "mlx" / "backend" / "metal" / "kernels"
    kernels.mkdir(parents=True)
    (kernels / "utils.h").write_text("#pragma once\n#include <metal_stdlib>\n"
                                     "inline float local_marker() { return 7.0f; }\n")
    source = ('#include "mlx/backend/metal/kernels/utils.h"\n'
              "kernel void k(device float* out [[buffer(0)]], uint i "
              "[[thread_position_in_grid]]) { out[i] = local_marker(); }\n")
    assert run_full(source, include_dirs=[tmp_path]).tolist() == [7.0] * 4
    beside = tmp_path / "kernel.metal"
    beside.write_text(source)
    assert run_full(beside).tolist() == [7.0] * 4  # found from the file's own folder


def test_metals_assert_compiles_and_checks_nothing() -> None:
    out = run_full(HEAD + "kernel void k(device float* out [[buffer(0)]], uint i "
                          "[[thread_position_in_grid]]) {\n  assert(i < 2);\n"
                          "  out[i] = float(i);\n}\n")
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_matrix_divides_by_a_scalar_element_by_element() -> None:
    # llama.cpp's late-2024 flash attention writes `(float4x4) sr4x4[i]/S`.
    out = run_full(HEAD + "kernel void k(device float* out [[buffer(0)]], uint i "
                          "[[thread_position_in_grid]]) {\n"
                          "  float4x4 m = float4x4(float4(1, 2, 3, 4), float4(5, 6, 7, 8),\n"
                          "      float4(9, 10, 11, 12), float4(13, 14, 15, 16));\n"
                          "  const float s = 2.0f;\n  float4x4 d = m / s;\n  d /= 2.0f;\n"
                          "  out[i] = d[i][i];\n}\n")
    assert out.tolist() == [0.25, 1.5, 2.75, 4.0]


def test_os_log_default_is_declared() -> None:
    out = run_full(HEAD + "kernel void k(device float* out [[buffer(0)]], uint i "
                          "[[thread_position_in_grid]]) {\n"
                          "  os_log_default.log(\"thread %u\", i);\n  out[i] = 1.0f;\n}\n")
    assert out.tolist() == [1.0] * 4


BATCHED = HEAD + """template <bool batched>
kernel void scaled(device float* out [[buffer(0)]], const constant int& n [[buffer(1)]],
                   const device int* batch_strides [[buffer(7)]],
                   uint i [[thread_position_in_grid]]) {
  int offset = batched ? batch_strides[0] : 0;
  out[i] = float(n) * float(i) + float(offset);
}
template [[host_name("scaled_batch_0")]] kernel void scaled<false>(
    device float*, const constant int&, const device int*, uint);
template [[host_name("scaled_batch_1")]] kernel void scaled<true>(
    device float*, const constant int&, const device int*, uint);
"""


@pytest.mark.parametrize("isolate", [True, False])
def test_a_buffer_the_kernel_never_reads_may_stay_unbound(isolate: bool) -> None:
    # MLX's host leaves x_batch_ndims and friends unset for its batch-0 quantized kernels.
    lib = mtwork.load_metal(BATCHED)
    out = lib["scaled_batch_0"](buffers={"out": np.zeros(4, np.float32), "n": 2}, grid=(4,),
                                threads_per_threadgroup=(4,), isolate=isolate)["out"]
    assert out.tolist() == [0.0, 2.0, 4.0, 6.0]


@pytest.mark.parametrize("options", [{"isolate": True}, {"isolate": False},
                                     {"sanitize": True}], ids=["worker", "here", "sanitized"])
def test_a_buffer_the_kernel_reads_must_be_bound_and_is_named(options: dict) -> None:
    lib = mtwork.load_metal(BATCHED)
    with pytest.raises(TypeError, match=r"kernel `scaled_batch_1`: no binding for buffer\(7\) "
                                        r"`batch_strides`, which the kernel reads"):
        lib["scaled_batch_1"](buffers={"out": np.zeros(4, np.float32), "n": 2}, grid=(4,),
                              threads_per_threadgroup=(4,), **options)
    bound = lib["scaled_batch_1"](buffers={"out": np.zeros(4, np.float32), "n": 2,
                                           "batch_strides": np.array([5], np.int32)},
                                  grid=(4,), threads_per_threadgroup=(4,))["out"]
    assert bound.tolist() == [5.0, 7.0, 9.0, 11.0]


@pytest.mark.parametrize("name", ["my-kernel", "k.1", "", "δ", 3])
def test_a_kernel_name_metal_cannot_compile_is_refused_up_front(name) -> None:
    with pytest.raises(ValueError, match=r"`name` must be letters, digits and _ only: it "
                                         r"becomes part of the kernel function's name"):
        mtwork.metal_kernel(name, ["a"], ["out"], "out[0] = a[0];")


def test_names_of_letters_digits_and_underscores_compile() -> None:
    kernel = mtwork.metal_kernel("2x_scale", ["a"], ["out"],
                                 "out[thread_position_in_grid.x] = 2.0f * "
                                 "a[thread_position_in_grid.x];")
    out = kernel(inputs=[mx.arange(4, dtype=mx.float32)], output_shapes=[(4,)],
                 output_dtypes=[mx.float32], grid=(4, 1, 1), threadgroup=(4, 1, 1))[0]
    assert out.tolist() == [0.0, 2.0, 4.0, 6.0]

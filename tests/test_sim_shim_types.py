"""metal::array, metal::uniform, `constant` tables, simdgroup_matrix operators and the
headers the emulator does not have, on the emulator."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mtwork

X = np.array([1.5, -2.0, 4.25, 8.0, -0.5, 3.0, 6.0, 10.0], dtype=np.float32)


def run(body: str, n_out: int, header: str = "", x: np.ndarray = X, threads: int = 1,
        dtype: mx.Dtype = mx.float32) -> np.ndarray:
    kernel = mtwork.metal_kernel("types", ["x"], ["out"], body, header=header, backend="sim")
    out = kernel(inputs=[mx.array(x)], grid=(threads, 1, 1), threadgroup=(threads, 1, 1),
                 output_shapes=[(n_out,)], output_dtypes=[dtype])
    return np.array(out[0].astype(mx.float32))


def test_metal_array_brace_init_index_size_and_iteration() -> None:
    header = """
        template <typename T>
        metal::array<T, 2> divmod(T x, T y) { return {metal::floor(x / y), metal::fmod(x, y)}; }
    """
    body = """
        metal::array<float, 3> a = {x[0], x[1], x[2]};
        a[1] *= 2.0f;
        float total = 0;
        for (float v : a) total += v;
        metal::array<float, 2> dm = divmod(x[3], x[2]);
        const metal::array<int, 4> c = {1, 2, 3, 4};
        int csum = 0;
        for (const int* p = c.begin(); p != c.end(); ++p) csum += *p;
        out[0] = total; out[1] = float(a.size()); out[2] = dm[0]; out[3] = dm[1];
        out[4] = float(csum); out[5] = float(sizeof(metal::array<half, 3>));
    """
    out = run(body, 6, header)
    want = [X[0] + 2 * X[1] + X[2], 3, np.floor(X[3] / X[2]), np.fmod(X[3], X[2]), 10, 6]
    np.testing.assert_array_equal(out, np.array(want, dtype=np.float32))


def test_uniform_values_compute_convert_and_loop_like_mlx_gemv() -> None:
    # MLX's gemv.h: a constexpr uniform stride, uniform quotients and products, ordinary
    # values compared with uniform ones.
    header = """
        template <int block>
        float blocked_sum(const device float* v, int n) {
          constexpr const uniform<int> stride = make_uniform(block);
          const uniform<int> size = make_uniform(n);
          const uniform<int> iterations = size / stride;
          const uniform<int> leftover = size - stride * iterations;
          float s = 0;
          for (int i = 0; i < iterations; ++i)
            for (int k = 0; k < block; ++k) s += v[i * block + k];
          if (leftover > 0)
            for (int k = size - leftover; k < size; ++k) s += v[k];
          return s;
        }
    """
    body = """
        out[0] = blocked_sum<3>(x, 8);
        uniform<float> scale = make_uniform(x[0]) * make_uniform(2.0f);
        float mixed = scale * x[1];                 // uniform with ordinary: ordinary
        uniform<bool> big = scale > make_uniform(1.0f);
        uniform<const device float*> p = make_uniform(x + 2);
        uniform<int> n = make_uniform(5);
        n += make_uniform(2);
        out[1] = mixed; out[2] = big ? 1.0f : 0.0f; out[3] = p[1] + *p; out[4] = float(n);
    """
    out = run(body, 5, header)
    want = [X.sum(), X[0] * 2 * X[1], 1.0, X[3] + X[2], 7]
    np.testing.assert_allclose(out, np.array(want, dtype=np.float32), rtol=1e-6)


def test_an_ordinary_value_does_not_become_uniform_implicitly() -> None:
    kernel = mtwork.metal_kernel("not_uniform", ["x"], ["out"],
                                 "uniform<float> u = x[0]; out[0] = u;", backend="sim")
    with pytest.raises(mtwork.CompileError, match="uniform"):
        kernel(inputs=[mx.array(X)], grid=(1, 1, 1), threadgroup=(1, 1, 1),
               output_shapes=[(1,)], output_dtypes=[mx.float32])


def test_constexpr_constant_tables_pass_to_constant_pointers() -> None:
    # llama.cpp's common.h: a `constexpr constant` table searched through `constant float*`.
    header = """
        constexpr constant static float table[8] = {-8.f, -4.f, -2.f, -1.f, 1.f, 2.f, 4.f, 8.f};
        static inline int nearest(int n, constant float* val, float v) {
          int best = 0;
          for (int i = 1; i < n; ++i)
            if (metal::fabs(v - val[i]) < metal::fabs(v - val[best])) best = i;
          return best;
        }
        float first(const constant float& f) { return f; }
    """
    body = """
        uint i = thread_position_in_grid.x;
        out[i] = table[nearest(8, table, x[i])] + 0.0f * first(table[0]);
    """
    out = run(body, 8, header, threads=8)
    table = np.array([-8, -4, -2, -1, 1, 2, 4, 8], dtype=np.float64)
    want = table[np.argmin(np.abs(X[:, None] - table[None, :]), axis=1)]
    np.testing.assert_array_equal(out, want.astype(np.float32))


def test_simdgroup_matrix_sum_difference_and_product() -> None:
    rng = np.random.default_rng(3)
    mats = rng.standard_normal((3, 8, 8)).astype(np.float32)
    body = """
        simdgroup_float8x8 a, b, c;
        simdgroup_load(a, x, 8);
        simdgroup_load(b, x + 64, 8);
        simdgroup_load(c, x + 128, 8);
        simdgroup_float8x8 d = (a * b) * c + a - b;     // as MLX's winograd transform writes
        simdgroup_store(d, out, 8);
    """
    out = run(body, 64, x=mats.ravel(), threads=32).reshape(8, 8)
    a, b, c = mats.astype(np.float64)
    np.testing.assert_allclose(out, (a @ b) @ c + a - b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("include", "feature"), [
    ("<metal_tensor>", "Metal 4 tensor APIs (metal_tensor)"),
    ("<MetalPerformancePrimitives/MetalPerformancePrimitives.h>", "Metal 4 tensor APIs"),
    ("<metal_texture>", "Metal textures (metal_texture)"),
    ("<metal_raytracing>", "Metal ray tracing (metal_raytracing)"),
])
def test_unsupported_headers_stop_with_one_clear_error(include: str, feature: str) -> None:
    header = f"#include {include}\nusing namespace metal;\n"
    body = "tensor<device half, dextents<int32_t, 2>> t(nullptr); out[0] = 1;"
    kernel = mtwork.metal_kernel("unsupported", ["x"], ["out"], body, header=header,
                                 backend="sim")
    with pytest.raises(mtwork.CompileError) as info:
        kernel(inputs=[mx.array(X)], grid=(1, 1, 1), threadgroup=(1, 1, 1),
               output_shapes=[(1,)], output_dtypes=[mx.float32])
    message = str(info.value)
    assert f"{feature}" in message and "not supported by the mtwork emulator" in message
    assert message.count("error:") == 1  # the one fatal message, no cascade

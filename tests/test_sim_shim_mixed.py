"""Standard-library calls mixing vectors and scalars (`fmax(0, v)`, `clamp(v, lo, hi)`,
`mix(a, b, t)`, `step(edge, v)`, `select(0.0f, v, mask)`, ...), as Metal's function tables
allow, against numpy in float64; scalars of mixed types resolve to their common type."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

import mtwork

X = np.array([-2.5, -0.25, 0.0, 0.75, 1.5, 3.0, -7.0, 0.5], dtype=np.float32)


def run(body: str, n_out: int, dtype: mx.Dtype = mx.float32, x: np.ndarray = X) -> np.ndarray:
    kernel = mtwork.metal_kernel("mixed", ["x"], ["out"], body, backend="sim")
    out = kernel(inputs=[mx.array(x)], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                 output_shapes=[(n_out,)], output_dtypes=[dtype])
    return np.array(out[0].astype(mx.float32))


def smoothstep(e0: float, e1: float, v: np.ndarray) -> np.ndarray:
    t = np.clip((v - e0) / (e1 - e0), 0, 1)
    return t * t * (3 - 2 * t)


def test_float_functions_take_scalars_in_any_place() -> None:
    body = """
        float4 a = float4(x[0], x[1], x[2], x[3]), b = float4(x[4], x[5], x[6], x[7]);
        float4 r[] = {fmax(0, a), fmin(1, b), fmax(a, 0.5f), fmin(b, 2), clamp(b, -1, 2),
                      mix(a, b, 0.25f), step(0.5f, b), step(a, 0.0f), smoothstep(0, 2, b),
                      fmax(0, fmin(1, b / 6 + 0.5f)), pow(b * b, 0.5f), fma(a, 2, b),
                      fmax3(a, 0, b), copysign(1, a), nextafter(a, 0),
                      float4(isordered(a, 0.0f)) + float4(isunordered(NAN, b))};
        int k = 0;
        for (int i = 0; i < 16; ++i) for (int c = 0; c < 4; ++c) out[k++] = r[i][c];
    """
    out = run(body, 64).reshape(16, 4)
    a, b = X[:4].astype(np.float64), X[4:].astype(np.float64)
    want = [np.maximum(0, a), np.minimum(1, b), np.maximum(a, 0.5), np.minimum(b, 2),
            np.clip(b, -1, 2), a + (b - a) * 0.25, np.where(b < 0.5, 0.0, 1.0),
            np.where(a > 0.0, 0.0, 1.0), smoothstep(0, 2, b),
            np.maximum(0, np.minimum(1, b / 6 + 0.5)), np.abs(b), a * 2 + b,
            np.maximum(np.maximum(a, 0), b), np.copysign(1, a),
            np.nextafter(X[:4], np.float32(0)), np.full(4, 2.0)]
    np.testing.assert_allclose(out, np.array(want), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(out[14], want[14])  # one ulp towards zero, exactly


def test_half_vectors_with_float_and_int_scalars_stay_half() -> None:
    body = """
        half4 h = half4(x[0], x[1], x[2], x[3]);
        half4 r[] = {clamp(h, 0, 1), max(h, half(0)), min(0, h), fmax(h, 0.5f),
                     mix(h, h * 2, 0.5f)};
        int k = 0;
        for (int i = 0; i < 5; ++i) for (int c = 0; c < 4; ++c) out[k++] = r[i][c];
        half s = x[4];
        out[k++] = clamp(s, 0, 1);        // half with int literals: a half
        out[k++] = fmax(0, s);
        out[k++] = max(s, 2.0f);          // half with a float: a float
    """
    out = run(body, 23, dtype=mx.float16)
    h = X[:4].astype(np.float16).astype(np.float64)
    s = np.float64(np.float16(X[4]))
    want = np.concatenate([np.clip(h, 0, 1), np.maximum(h, 0), np.minimum(0, h),
                           np.maximum(h, 0.5), h + (2 * h - h) * 0.5,
                           [np.clip(s, 0, 1), max(0, s), max(s, 2.0)]])
    np.testing.assert_array_equal(out, want.astype(np.float16).astype(np.float32))


def test_integer_functions_take_scalars_in_any_place() -> None:
    body = """
        int4 i = int4(float4(x[0], x[4], x[5], x[6]) * 2);     // -5, 3, 6, -14
        uint4 u = uint4(3, 8, 200, 7);
        int4 r[] = {clamp(i, -4, 4), max(i, 0), min(1, i), absdiff(i, 2), abs(i),
                    int4(max(u, 5u)), int4(min(u, 9)), int4(addsat(u, 1)), int4(hadd(u, 1))};
        int k = 0;
        for (int j = 0; j < 9; ++j) for (int c = 0; c < 4; ++c) out[k++] = float(r[j][c]);
    """
    out = run(body, 36).reshape(9, 4)
    i = np.trunc(np.array([X[0], X[4], X[5], X[6]], dtype=np.float64) * 2)
    u = np.array([3, 8, 200, 7], dtype=np.float64)
    want = [np.clip(i, -4, 4), np.maximum(i, 0), np.minimum(1, i), np.abs(i - 2), np.abs(i),
            np.maximum(u, 5), np.minimum(u, 9), u + 1, np.floor((u + 1) / 2)]
    np.testing.assert_array_equal(out, np.array(want))


def test_select_takes_a_scalar_for_either_value() -> None:
    body = """
        float4 a = float4(x[0], x[1], x[2], x[3]);
        bool4 m = a > 0.0f;
        float4 r[] = {select(0.0f, a, m), select(a, -1, m), select(a, 2.0f, true),
                      select(a, a * 10, m)};
        int k = 0;
        for (int i = 0; i < 4; ++i) for (int c = 0; c < 4; ++c) out[k++] = r[i][c];
        out[k++] = select(x[4], 0, x[4] > 1.0f);
    """
    out = run(body, 17)
    a = X[:4].astype(np.float64)
    m = a > 0
    want = np.concatenate([np.where(m, a, 0), np.where(m, -1, a), np.full(4, 2.0),
                           np.where(m, a * 10, a), [0.0 if X[4] > 1 else X[4]]])
    np.testing.assert_array_equal(out, want.astype(np.float32))


def test_mixed_calls_that_metal_rejects_do_not_compile() -> None:
    # An int vector has no fmax, and a half vector does not take a float vector.
    for body in ("int4 i = int4(1); out[0] = float(fmax(i, 0)[0]);",
                 "half4 h = half4(1); float4 f = float4(2); out[0] = fmax(h, f)[0];"):
        kernel = mtwork.metal_kernel("rejected", ["x"], ["out"], body, backend="sim")
        try:
            kernel(inputs=[mx.array(X)], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                   output_shapes=[(1,)], output_dtypes=[mx.float32])
        except mtwork.CompileError as exc:
            assert "fmax" in str(exc)
        else:
            raise AssertionError(f"compiled: {body}")

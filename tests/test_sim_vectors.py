"""Metal vector types on the emulator: construction, swizzles, arithmetic, conversions,
packed types, and the `half`/`bfloat16_t` scalar types."""

import mlx.core as mx
import numpy as np

import mtwork

CALL = dict(grid=(1, 1, 1), threadgroup=(1, 1, 1))


def run(source, n_out, dtype=mx.float32, header=""):
    kernel = mtwork.metal_kernel("vectors", ["a"], ["out"], source, header=header)
    return np.array(kernel(inputs=[mx.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])],
                           output_shapes=[(n_out,)], output_dtypes=[dtype], **CALL)[0])


def test_constructors_and_swizzles():
    out = run("""
        float4 v = float4(a[0], a[1], a[2], a[3]);          // 1 2 3 4
        float4 w = float4(v.zw, 9.0f, v.x);                // 3 4 9 1
        float3 s = v.wzy;                                  // 4 3 2
        float2 r = w.rg + s.xy;                            // 7 7
        float4 splat = float4(0.5f);
        v.xy = v.yx;                                       // 2 1 3 4
        v.w += 10.0f;                                      // 2 1 3 14
        int k = 0;
        for (int i = 0; i < 4; ++i) out[k++] = v[i];
        for (int i = 0; i < 4; ++i) out[k++] = w[i];
        for (int i = 0; i < 3; ++i) out[k++] = s[i];
        out[k++] = r.x; out[k++] = r.y; out[k++] = splat.w;
        out[k++] = float(sizeof(float3)); out[k++] = float(sizeof(packed_float3));
        out[k++] = float(sizeof(half3)); out[k++] = float(alignof(float4));
    """, 20)
    expected = [2, 1, 3, 14, 3, 4, 9, 1, 4, 3, 2, 7, 7, 0.5, 16, 12, 8, 16]
    np.testing.assert_array_equal(out[:18], expected)


def test_arithmetic_comparisons_and_select():
    out = run("""
        float4 v = float4(a[0], a[1], a[2], a[3]);
        float4 p = v * 2.0f + 1.0f;                        // 3 5 7 9
        float4 q = 10.0f - v / 2.0f;                       // 9.5 9 8.5 8
        bool4 lt = p < q;                                  // 1 1 1 0
        float4 sel = select(p, q, lt);                     // 9.5 9 8.5 9
        int4 i = int4(v) << 2;                             // 4 8 12 16
        uint4 m = uint4(7u) % uint4(2, 3, 4, 5);           // 1 1 3 2
        int k = 0;
        for (int j = 0; j < 4; ++j) out[k++] = sel[j];
        for (int j = 0; j < 4; ++j) out[k++] = float(i[j]);
        for (int j = 0; j < 4; ++j) out[k++] = float(m[j]);
        out[k++] = all(lt) ? 1.0f : 0.0f;
        out[k++] = any(lt) ? 1.0f : 0.0f;
        out[k++] = dot(v, v);
        out[k++] = length(float2(3.0f, 4.0f));
    """, 16)
    expected = [9.5, 9, 8.5, 9, 4, 8, 12, 16, 1, 1, 3, 2, 0, 1, 30, 5]
    np.testing.assert_array_equal(out, expected)


def test_conversions_are_elementwise_not_bit_casts():
    out = run("""
        float4 f = float4(a[0] + 0.75f, -a[1] - 0.25f, 300.0f, 0.0f);
        int4 i = int4(f);                                  // 1 -2 300 0 (truncation)
        uchar4 c = uchar4(i & 255);                        // 1 254 44 0
        bool4 b = bool4(f);                                // 1 1 1 0
        float4 back = float4(i);
        uint bits = as_type<uint>(1.0f);
        int k = 0;
        for (int j = 0; j < 4; ++j) out[k++] = float(i[j]);
        for (int j = 0; j < 4; ++j) out[k++] = float(c[j]);
        for (int j = 0; j < 4; ++j) out[k++] = b[j] ? 1.0f : 0.0f;
        for (int j = 0; j < 4; ++j) out[k++] = back[j];
        out[k++] = float(bits >> 16);
    """, 17)
    expected = [1, -2, 300, 0, 1, 254, 44, 0, 1, 1, 1, 0, 1, -2, 300, 0, 0x3F80]
    np.testing.assert_array_equal(out, expected)


def test_half_rounds_after_every_operation():
    out = run("""
        half x = half(a[0]) / half(3.0f);                  // 1/3 in half
        half y = x * half(3.0f) - half(1.0f);              // rounding error kept in half
        float z = float(a[0]) / 3.0f * 3.0f - 1.0f;        // float path
        out[0] = float(x);
        out[1] = float(y);
        out[2] = z;
        half4 h = half4(1.5h, 2.5h, a[2], a[3]);
        out[3] = float(h.x + h.y);
    """, 4)
    third = np.float16(1) / np.float16(3)
    assert out[0] == np.float32(third)
    assert out[1] == np.float32(third * np.float16(3) - np.float16(1))
    assert out[3] == 4.0


def test_bfloat16_from_mlx_prelude():
    out = run("""
        bfloat16_t b = bfloat16_t(a[2]) / bfloat16_t(7.0f);
        out[0] = float(b);
        out[1] = float(metal::exp(bfloat16_t(a[0])));
        out[2] = float(uint16_to_bfloat16(bfloat16_to_uint16(b)));
    """, 3)
    b = (mx.array(3.0, dtype=mx.bfloat16) / mx.array(7.0, dtype=mx.bfloat16)).item()
    assert out[0] == np.float32(b)
    assert out[1] == np.float32(mx.exp(mx.array(1.0, dtype=mx.bfloat16)).item())
    assert out[2] == out[0]


def test_mlx_prelude_complex_limits_and_helpers():
    kernel = mtwork.metal_kernel("prelude", ["z"], ["out", "lim"], """
        uint i = thread_position_in_grid.x;
        complex64_t w = z[i] * z[i] + complex64_t(1.0f, -1.0f);
        out[i] = w;
        if (i == 0) {
            lim[0] = Limits<float>::max;
            lim[1] = Limits<float>::finite_min;
            lim[2] = float(Limits<int32_t>::max);
            lim[3] = float(ceildiv(7, 2));
        }
    """)
    z = np.array([1 + 2j, -0.5 + 0.25j, 3 - 1j], dtype=np.complex64)
    out, lim = kernel(inputs=[z], grid=(3, 1, 1), threadgroup=(4, 1, 1),
                      output_shapes=[(3,), (4,)], output_dtypes=[mx.complex64, mx.float32])
    np.testing.assert_allclose(np.array(out), z * z + (1 - 1j), rtol=1e-6)
    lim = np.array(lim)
    assert lim[0] == np.inf and lim[1] == -np.finfo(np.float32).max
    assert lim[2] == np.float32(2**31 - 1) and lim[3] == 4

"""Conversions among half, bfloat and float on the emulator, scalar and vector, bitwise
against MLX's `astype` (round to nearest even through float, subnormals kept); packed
vectors across element types; vector constructors and short braced lists."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mtwork

ALL_16_BIT = np.arange(1 << 16, dtype=np.uint16)


def sim_kernel(name: str, inputs: list[str], outputs: list[str], body: str):
    return mtwork.metal_kernel(name, inputs, outputs, body, backend="sim")


def run_bits(kernel, bits: np.ndarray, out_dtype: mx.Dtype) -> np.ndarray:
    out = kernel(inputs=[mx.array(bits)], grid=(bits.size // 4, 1, 1), threadgroup=(256, 1, 1),
                 output_shapes=[bits.shape, bits.shape], output_dtypes=[out_dtype, out_dtype])
    return np.array(out[0]), np.array(out[1])


# Each thread converts four elements: one at a time as scalars, and together as a vector.
HALF_TO_BFLOAT = """
    uint i = thread_position_in_grid.x * 4;
    half4 h = half4(as_type<half>(x[i]), as_type<half>(x[i + 1]),
                    as_type<half>(x[i + 2]), as_type<half>(x[i + 3]));
    for (int k = 0; k < 4; ++k) scalar[i + k] = as_type<ushort>(static_cast<bfloat>(h[k]));
    bfloat4 b = bfloat4(h);
    for (int k = 0; k < 4; ++k) vector[i + k] = as_type<ushort>(b[k]);
"""
BFLOAT_TO_HALF = """
    uint i = thread_position_in_grid.x * 4;
    bfloat4 b = bfloat4(as_type<bfloat>(x[i]), as_type<bfloat>(x[i + 1]),
                        as_type<bfloat>(x[i + 2]), as_type<bfloat>(x[i + 3]));
    for (int k = 0; k < 4; ++k) scalar[i + k] = as_type<ushort>(half(b[k]));
    half4 h = half4(b);
    for (int k = 0; k < 4; ++k) vector[i + k] = as_type<ushort>(h[k]);
"""


def test_half_to_bfloat_every_bit_pattern() -> None:
    kernel = sim_kernel("half_to_bfloat", ["x"], ["scalar", "vector"], HALF_TO_BFLOAT)
    scalar, vector = run_bits(kernel, ALL_16_BIT, mx.uint16)
    halves = mx.array(ALL_16_BIT).view(mx.float16)
    want = np.array(halves.astype(mx.bfloat16).view(mx.uint16))
    is_nan = np.isnan(ALL_16_BIT.view(np.float16))
    for got in (scalar, vector):
        np.testing.assert_array_equal(got[~is_nan], want[~is_nan])
        assert np.all((got[is_nan] & 0x7F80) == 0x7F80) and np.all(got[is_nan] & 0x7F)


def test_bfloat_to_half_every_bit_pattern() -> None:
    kernel = sim_kernel("bfloat_to_half", ["x"], ["scalar", "vector"], BFLOAT_TO_HALF)
    scalar, vector = run_bits(kernel, ALL_16_BIT, mx.uint16)
    bfloats = mx.array(ALL_16_BIT).view(mx.bfloat16)
    want = np.array(bfloats.astype(mx.float16).view(mx.uint16))
    is_nan = np.isnan(np.array(bfloats.astype(mx.float32)))
    assert np.count_nonzero((want[~is_nan] & 0x7C00) == 0) > 1000  # half subnormals too
    for got in (scalar, vector):
        np.testing.assert_array_equal(got[~is_nan], want[~is_nan])
        assert np.all(np.isnan(got[is_nan].view(np.float16)))


@pytest.mark.parametrize("target", ["bfloat", "half"])
def test_float_to_16_bit_types_round_to_nearest_even(target: str) -> None:
    # Ties, subnormals of both formats, overflow, signed zeros, infinities and random values.
    rng = np.random.default_rng(0)
    special = np.array([0x3F808000, 0x3F818000, 0x00000001, 0x00400000, 0x80012345, 0x33800000,
                        0x33000001, 0x477FF000, 0x7F7FFFFF, 0x80000000, 0x7F800000, 0xFF800000,
                        0x387FE000, 0x38800000], dtype=np.uint32)
    bits = np.concatenate([special, rng.integers(0, 1 << 32, 4082, dtype=np.uint32)])
    floats = bits.view(np.float32)
    floats = floats[~np.isnan(floats)]
    floats = floats[: floats.size // 4 * 4]
    kernel = sim_kernel(f"float_to_{target}", ["x"], ["scalar", "vector"], f"""
        uint i = thread_position_in_grid.x * 4;
        float4 f = float4(x[i], x[i + 1], x[i + 2], x[i + 3]);
        for (int k = 0; k < 4; ++k) scalar[i + k] = as_type<ushort>(static_cast<{target}>(f[k]));
        {target}4 v = {target}4(f);
        for (int k = 0; k < 4; ++k) vector[i + k] = as_type<ushort>(v[k]);
    """)
    out = kernel(inputs=[mx.array(floats)], grid=(floats.size // 4, 1, 1),
                 threadgroup=(256, 1, 1), output_shapes=[floats.shape, floats.shape],
                 output_dtypes=[mx.uint16, mx.uint16])
    dtype = mx.bfloat16 if target == "bfloat" else mx.float16
    want = np.array(mx.array(floats).astype(dtype).view(mx.uint16))
    np.testing.assert_array_equal(np.array(out[0]), want)
    np.testing.assert_array_equal(np.array(out[1]), want)


def test_bfloat_widens_to_float_exactly_and_mixes_as_float() -> None:
    kernel = sim_kernel("bfloat_to_float", ["x"], ["scalar", "vector"], """
        uint i = thread_position_in_grid.x * 4;
        bfloat4 b = bfloat4(as_type<bfloat>(x[i]), as_type<bfloat>(x[i + 1]),
                            as_type<bfloat>(x[i + 2]), as_type<bfloat>(x[i + 3]));
        for (int k = 0; k < 4; ++k) {
          float f = b[k];                      // implicit, as MSL allows
          scalar[i + k] = f * b[k] / b[k];     // bfloat * float is float
        }
        float4 v = float4(b);
        for (int k = 0; k < 4; ++k) vector[i + k] = v[k];
    """)
    scalar, vector = run_bits(kernel, ALL_16_BIT, mx.float32)
    want = (ALL_16_BIT.astype(np.uint32) << 16).view(np.float32)
    is_nan = np.isnan(want)
    np.testing.assert_array_equal(vector.view(np.uint32)[~is_nan], want.view(np.uint32)[~is_nan])
    assert np.all(np.isnan(vector[is_nan]))
    # f * b / b in float: exact where the square is a finite normal float.
    with np.errstate(over="ignore"):
        square = np.where(is_nan, 0, want).astype(np.float64) ** 2
    ok = (square >= np.finfo(np.float32).tiny) & (square <= np.finfo(np.float32).max)
    np.testing.assert_array_equal(scalar[ok], want[ok])


def test_bfloat_arithmetic_rounds_once_per_operation_and_integers_convert_first() -> None:
    kernel = sim_kernel("bfloat_arith", ["a", "b"], ["out"], """
        uint i = thread_position_in_grid.x;
        bfloat x = a[i], y = b[i];
        out[4 * i + 0] = x * y + x;          // two roundings to bfloat
        out[4 * i + 1] = x + 257;             // 257 becomes bfloat (256) first
        bfloat z = true ? x : 0;              // a bfloat, as with a built-in type
        out[4 * i + 2] = z / y;
        out[4 * i + 3] = bfloat(int(x)) - bfloat(half(y));
    """)
    rng = np.random.default_rng(1)
    a = mx.array(rng.standard_normal(64) * 300).astype(mx.bfloat16)
    b = mx.array(rng.standard_normal(64) + 3).astype(mx.bfloat16)
    out = np.array(kernel(inputs=[a, b], grid=(64, 1, 1), threadgroup=(64, 1, 1),
                          output_shapes=[(256,)], output_dtypes=[mx.bfloat16])[0]
                   .astype(mx.float32)).reshape(64, 4)
    bf = mx.bfloat16
    want = np.stack([
        np.array((a * b + a).astype(mx.float32)),
        np.array((a + mx.array(257).astype(bf)).astype(mx.float32)),
        np.array((a / b).astype(mx.float32)),
        np.array((a.astype(mx.int32).astype(bf) - b.astype(mx.float16).astype(bf))
                 .astype(mx.float32)),
    ], axis=1)
    np.testing.assert_array_equal(out, want)


def test_packed_vectors_convert_across_element_types() -> None:
    kernel = sim_kernel("packed_conversions", ["c"], ["out"], """
        device const packed_char4* q = (device const packed_char4*)c;
        float4 f = float4(q[0]) * 0.5f;                // packed char4 -> float4
        packed_half4 ph = packed_half4(f);             // float4 -> packed half4
        packed_float3 pf = packed_float3(int3(q[1][0], q[1][1], q[1][2])) + 1.0f;
        int4 back = int4(packed_half4(ph));
        uchar4 u = uchar4(packed_ushort4(q[1]) & ushort(0xFF));
        for (int k = 0; k < 4; ++k) out[k] = f[k];
        for (int k = 0; k < 4; ++k) out[4 + k] = float(ph[k]);
        for (int k = 0; k < 3; ++k) out[8 + k] = pf[k];
        for (int k = 0; k < 4; ++k) out[11 + k] = float(back[k]);
        for (int k = 0; k < 4; ++k) out[15 + k] = float(u[k]);
        out[19] = float(sizeof(packed_float3));
    """)
    c = np.array([-128, -3, 7, 127, -1, 2, -9, 100], dtype=np.int8)
    out = np.array(kernel(inputs=[mx.array(c)], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                          output_shapes=[(20,)], output_dtypes=[mx.float32])[0])
    f = c[:4].astype(np.float64) * 0.5
    np.testing.assert_array_equal(out[:4], f)
    np.testing.assert_array_equal(out[4:8], f.astype(np.float16))
    np.testing.assert_array_equal(out[8:11], c[4:7] + 1.0)
    np.testing.assert_array_equal(out[11:15], np.trunc(f.astype(np.float16)))
    np.testing.assert_array_equal(out[15:19], c[4:].astype(np.uint16) & 0xFF)
    assert out[19] == 12


def test_vector_constructors_of_every_form_and_short_braced_lists() -> None:
    kernel = sim_kernel("vector_constructors", ["x"], ["out"], """
        float2 f2 = float2(x[0], x[1]);
        float3 f3 = float3(x[2], f2);
        float4 v[] = {float4(f2, 0, 1), float4(1, f3), float4(f2, f2), float4(x[3]),
                      float4(x[0], f2, x[3]), float4(f3.zyx, 9)};
        uint4 ks = {uint(x[0]), uint(x[1]), uint(x[2])};   // the last lane is zero
        float4 one = {x[3]};
        int k = 0;
        for (int j = 0; j < 6; ++j) for (int c = 0; c < 4; ++c) out[k++] = v[j][c];
        for (int c = 0; c < 4; ++c) out[k++] = float(ks[c]);
        for (int c = 0; c < 4; ++c) out[k++] = one[c];
    """)
    x = np.array([2.0, 3.0, 5.0, 7.0], dtype=np.float32)
    out = np.array(kernel(inputs=[mx.array(x)], grid=(1, 1, 1), threadgroup=(1, 1, 1),
                          output_shapes=[(32,)], output_dtypes=[mx.float32])[0])
    a, b, c, d = x
    want = [a, b, 0, 1, 1, c, a, b, a, b, a, b, d, d, d, d, a, a, b, d, b, a, c, 9,
            a, b, c, 0, d, 0, 0, 0]
    np.testing.assert_array_equal(out, np.array(want, dtype=np.float32))

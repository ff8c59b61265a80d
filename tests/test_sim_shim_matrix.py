"""Metal's matrix types on the emulator (MSL specification, 2.3 "Matrix Data Types" and the
matrix functions): constructors, column and element access, arithmetic, products with
vectors and matrices, transpose and determinant, against numpy in float64."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import mtwork

SHAPES = [(c, r) for c in (2, 3, 4) for r in (2, 3, 4)]  # (columns, rows)


def run(body: str, inputs: dict[str, np.ndarray], n_out: int,
        dtype: mx.Dtype = mx.float32) -> np.ndarray:
    kernel = mtwork.metal_kernel("matrix", list(inputs), ["out"], body, backend="sim")
    out = kernel(inputs=[mx.array(v) for v in inputs.values()], grid=(1, 1, 1),
                 threadgroup=(1, 1, 1), output_shapes=[(n_out,)], output_dtypes=[dtype])
    return np.array(out[0].astype(mx.float32))


def load_matrix(name: str, cols: int, rows: int, src: str, offset: int = 0) -> str:
    """MSL declaring `name` as floatCxR from `rows x cols` row-major floats at src[offset]."""
    columns = ", ".join(
        f"float{rows}({', '.join(f'{src}[{offset + r * cols + c}]' for r in range(rows))})"
        for c in range(cols))
    return f"float{cols}x{rows} {name} = float{cols}x{rows}({columns});"


def store_matrix(name: str, cols: int, rows: int, offset: int) -> str:
    """MSL writing matrix `name` row-major to out[offset:]."""
    return (f"for (int r = 0; r < {rows}; ++r) for (int c = 0; c < {cols}; ++c) "
            f"out[{offset} + r * {cols} + c] = {name}[c][r];")


@pytest.mark.parametrize(("cols", "rows"), SHAPES)
def test_products_sums_and_transpose_match_numpy(cols: int, rows: int) -> None:
    rng = np.random.default_rng(cols * 10 + rows)
    a = rng.standard_normal((rows, cols)).astype(np.float32)
    b = rng.standard_normal((rows, cols)).astype(np.float32)
    k = rng.standard_normal((cols, 3)).astype(np.float32)   # cols x 3 (3 columns)
    v = rng.standard_normal(cols).astype(np.float32)
    w = rng.standard_normal(rows).astype(np.float32)
    s = np.float32(1.5)
    n = rows * cols
    body = "\n".join([
        load_matrix("A", cols, rows, "a"), load_matrix("B", cols, rows, "b"),
        load_matrix("K", 3, cols, "k"),
        f"float{cols} v = float{cols}({', '.join(f'x[{i}]' for i in range(cols))});",
        f"float{rows} w = float{rows}({', '.join(f'y[{i}]' for i in range(rows))});",
        f"float{cols}x{rows} S = A + B * 2.0f - {s}f * B;",
        f"float{cols}x{rows} N = -A;",
        "N += B; N -= A * 0.5f;",
        f"float{rows} Av = A * v;",
        f"float{cols} wA = w * A;",
        f"float3x{rows} AK = A * K;",
        f"float{rows}x{cols} T = transpose(A);",
        store_matrix("S", cols, rows, 0), store_matrix("N", cols, rows, n),
        f"for (int i = 0; i < {rows}; ++i) out[{2 * n} + i] = Av[i];",
        f"for (int i = 0; i < {cols}; ++i) out[{2 * n + rows} + i] = wA[i];",
        store_matrix("AK", 3, rows, 2 * n + rows + cols),
        store_matrix("T", rows, cols, 2 * n + rows + cols + 3 * rows),
        f"out[{3 * n + rows + cols + 3 * rows}] = A[{cols - 1}][{rows - 1}];",
    ])
    size = 3 * n + rows + cols + 3 * rows + 1
    out = run(body, {"a": a.ravel(), "b": b.ravel(), "k": k.ravel(), "x": v, "y": w}, size)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = np.concatenate([
        (a64 + b64 * 2 - 1.5 * b64).ravel(), (-a64 + b64 - a64 * 0.5).ravel(),
        a64 @ v, w @ a64, (a64 @ k).ravel(), a64.T.ravel(), [a64[rows - 1, cols - 1]],
    ])
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=2e-6)


def test_constructors_diagonal_columns_scalars_and_conversion() -> None:
    x = np.arange(1, 13, dtype=np.float32) / 3
    body = """
        float3x2 d = float3x2(x[0]);                         // diagonal, zero elsewhere
        float2x2 c = float2x2(float2(x[0], x[1]), float2(x[2], x[3]));
        float2x3 s = float2x3(x[0], x[1], x[2], x[3], x[4], x[5]);   // column-major
        float2x2 braced = float2x2({x[4], x[5]}, {x[6], x[7]});
        half2x3 h = half2x3(s);                              // per element, rounded
        float4x4 id = float4x4(1);
        int k = 0;
        for (int i = 0; i < 3; ++i) for (int j = 0; j < 2; ++j) out[k++] = d[i][j];
        for (int i = 0; i < 2; ++i) for (int j = 0; j < 2; ++j) out[k++] = c[i][j];
        for (int i = 0; i < 2; ++i) for (int j = 0; j < 3; ++j) out[k++] = s[i][j];
        for (int i = 0; i < 2; ++i) for (int j = 0; j < 2; ++j) out[k++] = braced[i][j];
        for (int i = 0; i < 2; ++i) for (int j = 0; j < 3; ++j) out[k++] = float(h[i][j]);
        for (int i = 0; i < 4; ++i) out[k++] = id[i][i] + id[i][(i + 1) % 4];
        out[k++] = float(sizeof(float2x3));
        out[k++] = float(sizeof(half3x2));
        out[k++] = float(alignof(float3x3));
        out[k++] = float(sizeof(float4x4));
    """
    out = run(body, {"x": x}, 34)
    want = np.concatenate([
        [x[0], 0, 0, x[0], 0, 0], x[:4], x[:6], x[4:8],
        x[:6].astype(np.float16).astype(np.float64), [1, 1, 1, 1], [32, 12, 16, 64],
    ])
    np.testing.assert_array_equal(out, want.astype(np.float32))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_determinant_matches_numpy(n: int) -> None:
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, n)).astype(np.float32)
    body = load_matrix("A", n, n, "a") + """
        out[0] = determinant(A);
        out[1] = determinant(transpose(A));
        out[2] = determinant(A * 2.0f);
    """
    out = run(body, {"a": a.ravel()}, 3)
    det = np.linalg.det(a.astype(np.float64))
    np.testing.assert_allclose(out, [det, det, det * 2.0**n], rtol=1e-5)


def test_half_matrices_round_every_operation_to_half() -> None:
    rng = np.random.default_rng(7)
    a = rng.standard_normal((4, 4)).astype(np.float16)
    v = rng.standard_normal(4).astype(np.float16)
    body = """
        half4x4 A;
        for (int c = 0; c < 4; ++c) for (int r = 0; r < 4; ++r) A[c][r] = a[r * 4 + c];
        half4 v = half4(x[0], x[1], x[2], x[3]);
        half4 Av = A * v;
        for (int i = 0; i < 4; ++i) out[i] = Av[i];
    """
    out = run(body, {"a": a.ravel(), "x": v}, 4, dtype=mx.float16)
    # Column by column, each product and each sum rounded to half.
    acc = a[:, 0] * v[0]
    for c in range(1, 4):
        acc = (acc + (a[:, c] * v[c]).astype(np.float16)).astype(np.float16)
    np.testing.assert_array_equal(out, acc.astype(np.float32))


def test_llama_style_bfloat_matrix_typedef_and_cast() -> None:
    x = np.linspace(-3, 3, 16, dtype=np.float32)
    body = """
        typedef matrix<bfloat, 4, 4> bfloat4x4;
        float4x4 f;
        for (int i = 0; i < 16; ++i) f[i / 4][i % 4] = x[i];
        bfloat4x4 b = (bfloat4x4) f;
        for (int i = 0; i < 16; ++i) out[i] = b[i / 4][i % 4];
    """
    out = run(body, {"x": x}, 16, dtype=mx.bfloat16)
    np.testing.assert_array_equal(out, np.array(mx.array(x).astype(mx.bfloat16)
                                                 .astype(mx.float32)))

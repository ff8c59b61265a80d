"""simdgroup_matrix on the emulator: Apple's per-lane fragment layout, loads and stores with
origins, strides and transposition, products in mixed precision, tiled GEMMs."""

import mlx.core as mx
import numpy as np
import pytest

import mtwork

EPS32 = float(np.finfo(np.float32).eps)
EPS16 = float(np.finfo(np.float16).eps)
TYPE_NAMES = {mx.float32: "float", mx.float16: "half", mx.bfloat16: "bfloat"}


def lane_coordinates(lane: int) -> tuple[int, int]:
    """(row, first column) of the two elements lane `lane` holds (MLX steel mma.h)."""
    qid = lane // 4
    return (qid & 4) + (lane // 2) % 4, (qid & 2) * 2 + (lane % 2) * 2


def as_mx(x: np.ndarray, dtype: mx.Dtype = mx.float32) -> mx.array:
    return mx.array(x.astype(np.float32)).astype(dtype)


def as_np(x: mx.array) -> np.ndarray:
    """Exact float64 values of an array of any float dtype."""
    return np.array(x.astype(mx.float32)).astype(np.float64)


def run(kernel, inputs, grid, threadgroup, shapes, dtypes, **kwargs) -> list[np.ndarray]:
    outs = kernel(
        inputs=[x if isinstance(x, mx.array) else mx.array(x) for x in inputs],
        grid=grid,
        threadgroup=threadgroup,
        output_shapes=shapes,
        output_dtypes=dtypes,
        backend="sim",
        **kwargs,
    )
    return [as_np(o) for o in outs]


def random(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --- layout -------------------------------------------------------------------------------


def test_thread_elements_follow_apples_lane_layout() -> None:
    kernel = mtwork.metal_kernel(
        "lane_layout",
        ["matrix"],
        ["stored", "held"],
        """
        ushort lane = thread_index_in_simdgroup;
        simdgroup_float8x8 m;
        m.thread_elements() = float2(2 * lane, 2 * lane + 1);
        simdgroup_store(m, stored);
        simdgroup_float8x8 loaded;
        simdgroup_load(loaded, matrix);
        held[2 * lane] = loaded.thread_elements()[0];
        held[2 * lane + 1] = loaded.thread_elements()[1];
        """,
    )
    index = np.arange(64, dtype=np.float32).reshape(8, 8)  # element (r, c) holds r * 8 + c
    stored, held = run(kernel, [index], (32, 1, 1), (32, 1, 1), [(8, 8), (64,)],
                       [mx.float32, mx.float32])
    expected_stored = np.zeros((8, 8))
    expected_held = np.zeros(64)
    for lane in range(32):
        row, col = lane_coordinates(lane)
        for j in range(2):
            expected_stored[row, col + j] = 2 * lane + j
            expected_held[2 * lane + j] = row * 8 + col + j
    np.testing.assert_array_equal(stored, expected_stored)
    np.testing.assert_array_equal(held, expected_held)


def test_fragments_written_and_read_by_hand() -> None:
    # As MLX's steel mma.h does: each lane moves its own two elements between memory and
    # thread_elements(), and only the product goes through the SIMD-group matrix.
    kernel = mtwork.metal_kernel(
        "by_hand",
        ["a", "b"],
        ["d"],
        """
        ushort lane = thread_index_in_simdgroup;
        short qid = lane / 4;
        short row = (qid & 4) + (lane / 2) % 4;
        short col = (qid & 2) * 2 + (lane % 2) * 2;
        simdgroup_float8x8 ma, mb;
        ma.thread_elements() = float2(a[row * 8 + col], a[row * 8 + col + 1]);
        mb.thread_elements()[0] = b[row * 8 + col];
        mb.thread_elements()[1] = b[row * 8 + col + 1];
        simdgroup_float8x8 md = make_filled_simdgroup_matrix<float, 8, 8>(0.5f);
        simdgroup_multiply_accumulate(md, ma, mb, md);
        thread float2& out = md.thread_elements();
        d[row * 8 + col] = out.x;
        d[row * 8 + col + 1] = out.y;
        """,
    )
    a, b = random((8, 8), 1), random((8, 8), 2)
    (d,) = run(kernel, [a, b], (32, 1, 1), (32, 1, 1), [(8, 8)], [mx.float32])
    exact = a.astype(np.float64) @ b + 0.5
    bound = 9 * EPS32 * (np.abs(a) @ np.abs(b) + 0.5)
    assert np.all(np.abs(d - exact) <= bound)


# --- construction -------------------------------------------------------------------------


def test_filled_and_diagonal_matrices() -> None:
    kernel = mtwork.metal_kernel(
        "constructors",
        ["dummy"],
        ["filled", "diagonal", "fresh"],
        """
        simdgroup_store(make_filled_simdgroup_matrix<half, 8>(2.5h), filled);
        simdgroup_store(simdgroup_float8x8(3.0f), diagonal);
        simdgroup_float8x8 never_written;
        simdgroup_store(never_written, fresh);
        """,
    )
    filled, diagonal, fresh = run(kernel, [np.zeros(1, np.float32)], (32, 1, 1), (32, 1, 1),
                                  [(8, 8)] * 3, [mx.float16, mx.float32, mx.float32])
    np.testing.assert_array_equal(filled, np.full((8, 8), 2.5))
    np.testing.assert_array_equal(diagonal, 3 * np.eye(8))
    # Uninitialised on the GPU; the emulator's poison shows a read of it.
    assert np.isnan(fresh).all()


# --- loads and stores ---------------------------------------------------------------------


def test_origin_and_stride_address_a_block_of_a_larger_matrix() -> None:
    kernel = mtwork.metal_kernel(
        "blocks",
        ["src"],
        ["from_device", "from_threadgroup"],
        """
        threadgroup float staged[16 * 24];
        for (uint i = thread_index_in_threadgroup; i < 16 * 24; i += 32) staged[i] = src[i];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        simdgroup_float8x8 m, n;
        simdgroup_load(m, src, 24, ulong2(16, 8));     // columns 16..23 of rows 8..15
        simdgroup_load(n, staged, 24, ulong2(3, 5));  // columns 3..10 of rows 5..12
        simdgroup_store(m, from_device, 32, ulong2(8, 16));
        simdgroup_store(n, from_threadgroup, 32, ulong2(0, 1));
        """,
    )
    src = random((16, 24), 3)
    from_device, from_threadgroup = run(kernel, [src], (32, 1, 1), (32, 1, 1),
                                        [(24, 32)] * 2, [mx.float32] * 2, init_value=-7)
    expected = np.full((24, 32), -7.0)
    expected[16:24, 8:16] = src[8:16, 16:24]
    np.testing.assert_array_equal(from_device, expected)
    expected = np.full((24, 32), -7.0)
    expected[1:9, 0:8] = src[5:13, 3:11]
    np.testing.assert_array_equal(from_threadgroup, expected)


def test_transposed_loads_and_stores() -> None:
    kernel = mtwork.metal_kernel(
        "transposes",
        ["src"],
        ["loaded_t", "stored_t", "both_t"],
        """
        simdgroup_float8x8 t, m;
        simdgroup_load(t, src, 24, ulong2(8, 4), true);  // the block at rows 4.., cols 8..
        simdgroup_store(t, loaded_t);
        simdgroup_load(m, src, 24, ulong2(8, 4));
        simdgroup_store(m, stored_t, 16, ulong2(8, 0), true);
        simdgroup_store(t, both_t, 8, 0, true);
        """,
    )
    src = random((16, 24), 4)
    block = src[4:12, 8:16]
    loaded_t, stored_t, both_t = run(kernel, [src], (32, 1, 1), (32, 1, 1),
                                     [(8, 8), (8, 16), (8, 8)], [mx.float32] * 3,
                                     init_value=0)
    np.testing.assert_array_equal(loaded_t, block.T)
    expected = np.zeros((8, 16))
    expected[:, 8:] = block.T
    np.testing.assert_array_equal(stored_t, expected)
    np.testing.assert_array_equal(both_t, block)


def test_in_place_transpose_sees_the_group_move_in_lockstep() -> None:
    # Every lane loads before any lane stores, as on the GPU, or the tile would be mangled.
    kernel = mtwork.metal_kernel(
        "in_place",
        ["src"],
        ["out"],
        """
        threadgroup float tile[64];
        uint lane = thread_index_in_simdgroup;
        tile[lane] = src[lane];
        tile[lane + 32] = src[lane + 32];
        threadgroup_barrier(mem_flags::mem_threadgroup);
        simdgroup_float8x8 m;
        simdgroup_load(m, tile);
        simdgroup_store(m, tile, 8, 0, true);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[lane] = tile[lane];
        out[lane + 32] = tile[lane + 32];
        """,
    )
    src = random((8, 8), 5)
    (out,) = run(kernel, [src], (32, 1, 1), (32, 1, 1), [(8, 8)], [mx.float32])
    np.testing.assert_array_equal(out, src.T)


# --- products -----------------------------------------------------------------------------

PRODUCT = """
simdgroup_matrix<TA, 8, 8> ma;
simdgroup_matrix<TB, 8, 8> mb;
simdgroup_matrix<TC, 8, 8> mc;
simdgroup_load(ma, a);
simdgroup_load(mb, b);
simdgroup_load(mc, c);
simdgroup_multiply_accumulate(mc, ma, mb, mc);
simdgroup_store(mc, d);
"""


@pytest.mark.parametrize(
    ("ta", "tb", "tc"),
    [
        (mx.float32, mx.float32, mx.float32),
        (mx.float16, mx.float16, mx.float32),
        (mx.bfloat16, mx.bfloat16, mx.float32),
        (mx.float16, mx.float32, mx.float32),  # llama.cpp's half x float tiles
        (mx.float16, mx.float16, mx.float16),
        (mx.bfloat16, mx.bfloat16, mx.bfloat16),
    ],
    ids=lambda t: TYPE_NAMES[t],
)
def test_multiply_accumulate_8x8(ta: mx.Dtype, tb: mx.Dtype, tc: mx.Dtype) -> None:
    kernel = mtwork.metal_kernel("mma8", ["a", "b", "c"], ["d"], PRODUCT)
    a, b, c = as_mx(random((8, 8), 6), ta), as_mx(random((8, 8), 7), tb), as_mx(
        random((8, 8), 8), tc)
    (d,) = run(kernel, [a, b, c], (32, 1, 1), (32, 1, 1), [(8, 8)], [tc],
               template=[("TA", ta), ("TB", tb), ("TC", tc)])
    exact = as_np(a) @ as_np(b) + as_np(c)
    # Float arithmetic inside (nine roundings at most), then one rounding to the result.
    magnitude = np.abs(as_np(a)) @ np.abs(as_np(b)) + np.abs(as_np(c))
    result_eps = {mx.float32: EPS32, mx.float16: EPS16, mx.bfloat16: 2.0**-7}[tc]
    bound = 9 * EPS32 * magnitude + result_eps / 2 * np.abs(exact) * 1.01
    assert np.all(np.abs(d - exact) <= bound)


def test_products_may_alias_their_operands() -> None:
    kernel = mtwork.metal_kernel(
        "aliasing",
        ["p"],
        ["squared", "sum"],
        """
        simdgroup_float8x8 m, acc;
        simdgroup_load(m, p);
        simdgroup_load(acc, p);
        simdgroup_multiply_accumulate(acc, m, m, acc);  // p p + p
        simdgroup_multiply(m, m, m);                    // p p, in place
        simdgroup_store(m, squared);
        simdgroup_store(acc, sum);
        """,
    )
    p = random((8, 8), 9)
    squared, total = run(kernel, [p], (32, 1, 1), (32, 1, 1), [(8, 8)] * 2, [mx.float32] * 2)
    exact = p.astype(np.float64) @ p
    bound = 9 * EPS32 * (np.abs(p) @ np.abs(p) + np.abs(p))
    assert np.all(np.abs(squared - exact) <= bound)
    assert np.all(np.abs(total - (exact + p)) <= bound)


def test_product_is_a_fused_chain_over_increasing_k() -> None:
    # The emulator's defined arithmetic (Apple's is undocumented): element (r, c) is
    # fma(a[r][7], b[7][c], ... fma(a[r][0], b[0][c], c[r][c])) in float.
    kernel = mtwork.metal_kernel("mma8", ["a", "b", "c"], ["d"], PRODUCT)
    a, b, c = np.zeros((8, 8), np.float32), np.zeros((8, 8), np.float32), np.zeros(
        (8, 8), np.float32)
    b[0, 0] = b[1, 0] = b[0, 1] = 1.0
    # Row 0, column 0: 1 + 2^24 rounds to 2^24, then - 2^24 leaves 0. Summed from k = 7
    # down, or with the products first, the 1 survives.
    c[0, 0], a[0, 0], a[0, 1] = 1.0, 2.0**24, -(2.0**24)
    # Row 1, column 1: (1 + 2^-12)^2 - (1 + 2^-11) is 2^-24 only if the product is not
    # rounded before the addition.
    a[1, 0] = b[0, 1] = 1 + 2.0**-12
    c[1, 1] = -(1 + 2.0**-11)
    (d,) = run(kernel, [a, b, c], (32, 1, 1), (32, 1, 1), [(8, 8)], [mx.float32],
               template=[("TA", mx.float32), ("TB", mx.float32), ("TC", mx.float32)])
    assert d[0, 0] == 0.0
    assert d[1, 1] == 2.0**-24


# --- GEMMs --------------------------------------------------------------------------------

# C = A B with 32x32 output tiles per threadgroup: four SIMD-groups in a 2x2 layout, each
# owning 16x16 (2x2 fragments); A and B pass through threadgroup memory 8 columns of K at a
# time, read back with origins and strides; results are stored straight to device memory.
TILED_GEMM = """
constexpr int BM = 32, BN = 32, BK = 8, THREADS = 128;
threadgroup T a_tile[BM * BK];
threadgroup T b_tile[BK * BN];
const int K = a_shape[1], N = b_shape[1];
const uint t = thread_index_in_threadgroup;
const int row0 = threadgroup_position_in_grid.y * BM;
const int col0 = threadgroup_position_in_grid.x * BN;
const int sg_row = (simdgroup_index_in_threadgroup / 2) * 16;
const int sg_col = (simdgroup_index_in_threadgroup % 2) * 16;
simdgroup_float8x8 acc[2][2];
for (int i = 0; i < 2; ++i)
  for (int j = 0; j < 2; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
for (int k0 = 0; k0 < K; k0 += BK) {
  for (uint e = t; e < BM * BK; e += THREADS)
    a_tile[e] = a[(row0 + e / BK) * K + k0 + e % BK];
  for (uint e = t; e < BK * BN; e += THREADS)
    b_tile[e] = b[(k0 + e / BN) * N + col0 + e % BN];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  simdgroup_matrix<T, 8, 8> fa[2], fb[2];
  for (int i = 0; i < 2; ++i) simdgroup_load(fa[i], a_tile, BK, ulong2(0, sg_row + 8 * i));
  for (int j = 0; j < 2; ++j) simdgroup_load(fb[j], b_tile, BN, ulong2(sg_col + 8 * j, 0));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) simdgroup_multiply_accumulate(acc[i][j], fa[i], fb[j], acc[i][j]);
  threadgroup_barrier(mem_flags::mem_threadgroup);
}
for (int i = 0; i < 2; ++i)
  for (int j = 0; j < 2; ++j)
    simdgroup_store(acc[i][j], c, N, ulong2(col0 + sg_col + 8 * j, row0 + sg_row + 8 * i));
"""


def tiled_gemm() -> mtwork.MetalKernel:
    return mtwork.metal_kernel("tiled_gemm", ["a", "b"], ["c"], TILED_GEMM)


def run_tiled_gemm(a: mx.array, b: mx.array) -> np.ndarray:
    m, n = a.shape[0], b.shape[1]
    (c,) = run(tiled_gemm(), [a, b], (n // 32 * 128, m // 32, 1), (128, 1, 1), [(m, n)],
               [mx.float32], template=[("T", a.dtype)])
    return c


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=TYPE_NAMES.get)
@pytest.mark.parametrize(("m", "n", "k"), [(32, 32, 32), (64, 96, 48)])
def test_tiled_gemm(dtype: mx.Dtype, m: int, n: int, k: int) -> None:
    a, b = as_mx(random((m, k), 10), dtype), as_mx(random((k, n), 11), dtype)
    c = run_tiled_gemm(a, b)
    exact = as_np(a) @ as_np(b)
    bound = k * EPS32 * (np.abs(as_np(a)) @ np.abs(as_np(b)))
    assert np.all(np.abs(c - exact) <= bound)

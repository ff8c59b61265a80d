// Helpers for 8x8 simdgroup_matrix fragments whose elements a kernel touches by hand.
//
// Lane l of a SIMD-group holds two neighbouring elements of one row of every 8x8
// fragment: row (q & 4) + (l / 2) % 4, columns c and c + 1 with c = (q & 2) * 2 + (l % 2) * 2,
// q = l / 4 (Apple's layout, as read by MLX's steel/gemm/mma.h). In lane bits: the row is
// bits 1, 2 and 4, the column bits 0 and 3, so the four lanes that share a row differ by
// xor 1 and xor 8.

#include <metal_simdgroup_matrix>

// The row of every fragment that `lane` holds elements of.
inline int fa_fragment_row(uint lane) {
  return int(((lane / 4) & 4) + (lane / 2) % 4);
}

// The first of the two columns that `lane` holds.
inline int fa_fragment_col(uint lane) {
  return int(((lane / 4) & 2) * 2 + (lane % 2) * 2);
}

// The maximum of `x` over the four lanes that hold one fragment row.
inline float fa_row_max(float x) {
  x = metal::max(x, simd_shuffle_xor(x, ushort(1)));
  return metal::max(x, simd_shuffle_xor(x, ushort(8)));
}

// The sum of `x` over the four lanes that hold one fragment row.
inline float fa_row_sum(float x) {
  x += simd_shuffle_xor(x, ushort(1));
  return x + simd_shuffle_xor(x, ushort(8));
}

// Loads the 8x8 fragment at (row0, col0) of a row-major threadgroup tile of element type
// T with `stride` elements a row (transposed: the fragment's (r, c) is the tile's
// (row0 + c, col0 + r)), widened to float so products accumulate in float whatever T is.
template <typename T>
inline simdgroup_float8x8 fa_load_as_float(const threadgroup T* tile, int stride, int row0,
                                           int col0, bool transpose) {
  simdgroup_matrix<T, 8, 8> narrow;
  simdgroup_load(narrow, tile + row0 * stride + col0, ulong(stride), ulong2(0, 0), transpose);
  simdgroup_float8x8 wide;
  wide.thread_elements() = float2(narrow.thread_elements());
  return wide;
}

// Gated DeltaNet helpers shared by the sequential, packed and chunked (WY) kernels.
//
// Reductions over a SIMD-group associate as an xor butterfly over lane offsets 1, 2, 4,
// 8, 16. Apple's compiler lowers `simd_sum` that way (mlx-lm's packed gated-delta kernel
// is bitwise equal on the GPU to one that spells the butterfly out), and it is the order
// the packed layout reproduces: see gd_packed_row_sum.

// Sum over the 32 lanes of a SIMD-group, the butterfly written out with simd_shuffle_xor:
// a comparator whose association order is a property of this source, not of the
// compiler's lowering of simd_sum.
inline float gd_xor_tree_sum(float x) {
  x += simd_shuffle_xor(x, 1);
  x += simd_shuffle_xor(x, 2);
  x += simd_shuffle_xor(x, 4);
  x += simd_shuffle_xor(x, 8);
  x += simd_shuffle_xor(x, 16);
  return x;
}

// Sum of one value row in the packed layout, where four lanes (lane_in_row 0..3) share a
// row and each lane holds the eight partial sums the sequential layout spreads over lanes
// 8 * lane_in_row + 0..7. Butterfly levels 1, 2, 4 pair partials that now live in one
// lane: the local tree below adds them in the same association (IEEE addition is
// commutative, so `a + b` in one lane has the bits of `b + a` in the other). Levels 8
// and 16 pair lanes of the row group: lane offsets 1 and 2 in the packed SIMD-group.
inline float gd_packed_row_sum(thread const float* part) {
  float x = ((part[0] + part[1]) + (part[2] + part[3])) +
            ((part[4] + part[5]) + (part[6] + part[7]));
  x += simd_shuffle_xor(x, 1);
  x += simd_shuffle_xor(x, 2);
  return x;
}

// simdgroup_matrix fragments, read and written element by element (gated_delta_wy_mma):
// lane l holds two neighbouring elements of one row of every 8x8 fragment, row
// (q & 4) + (l / 2) % 4, columns c and c + 1 with c = (q & 2) * 2 + (l % 2) * 2, q = l / 4
// (Apple's layout, as MLX's steel/gemm/mma.h reads it).
#include <metal_simdgroup_matrix>

inline int gd_fragment_row(uint lane) {
  return int(((lane / 4) & 4) + (lane / 2) % 4);
}

inline int gd_fragment_col(uint lane) {
  return int(((lane / 4) & 2) * 2 + (lane % 2) * 2);
}

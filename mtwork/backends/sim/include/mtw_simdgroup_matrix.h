// SIMD-group matrices: 8x8 tiles held jointly by the 32 lanes of a SIMD-group.
//
// Each lane holds two neighbouring elements of one row, exposed by thread_elements():
// lane l holds row (qid & 4) + (l / 2) % 4, columns c and c + 1 with
// c = (qid & 2) * 2 + (l % 2) * 2 and qid = l / 4. This is the layout MLX's
// steel/gemm/mma.h (BaseMMAFrag::get_coord) and tinygrad's Metal tensor-core map read
// fragments with, so kernels that touch fragment elements by hand work as on the GPU.
//
// Loads, stores and products are SIMD-group collectives: the lanes meet, then one combine
// call does the work of all of them. A product needs every lane's elements; loads and
// stores go through the same meeting point because the group moves in lockstep on the
// GPU: a load sees what every lane wrote just before it, and
// `simdgroup_load(m, p); simdgroup_store(m, p, 8, 0, true);` transposes a tile in place,
// which only works if no lane stores before every lane has loaded.
#pragma once

#include "mtw_profile.h"
#include "mtw_simd.h"

namespace mtw_sgmatrix {

constexpr int kSize = 8;

MTW_INLINE constexpr int row_of(int lane) { return ((lane / 4) & 4) + (lane / 2) % 4; }
MTW_INLINE constexpr int col_of(int lane) { return ((lane / 4) & 2) * 2 + (lane % 2) * 2; }

template <typename T>
constexpr bool is_element = metal::is_same_v<T, float> || metal::is_same_v<T, half> ||
                            metal::is_same_v<T, bfloat>;

// Where a matrix lies in memory. The origin (x, y) is a column and row of the memory
// layout: matrix element (0, 0) is at y * stride + x, with or without transposition.
struct Place {
  ulong stride;
  metal::vec<ulong, 2> origin;
  bool transpose;
  MTW_INLINE ulong offset(int row, int col) const {
    ulong x = transpose ? row : col, y = transpose ? col : row;
    return (origin.y + y) * stride + origin.x + x;
  }
};

template <typename T>
struct LoadArg {
  const T* src;
  Place place;
};

template <typename T>
struct StoreArg {
  T* dst;
  Place place;
  metal::vec<T, 2> values;
};

// Operands of a product, widened to float in the lane that hands them in.
struct ProductArg {
  float a[2], b[2], c[2];
};

template <typename T>
MTW_INLINE void widen(float (&out)[2], const metal::vec<T, 2>& elements) {
  out[0] = float(elements[0]);
  out[1] = float(elements[1]);
}

// Loads and stores for the lanes of `mask`, all of them when `full` (every lane's row and
// column then known when compiling). Every lane reads before any lane writes. The loop over
// the lanes stays a loop: sanitized and profiled builds report each memory access by the
// instruction that made it, one instruction for the SIMD-group's access; in plain builds,
// unrolled, it took a quarter of a flash-attention kernel's compile (about 80 of 300 ms)
// to make its calls 2-5% faster, and a sweep compiles each setting to call it a few times.
#define MTW_OVER_LANES _Pragma("clang loop unroll(disable)")
template <typename T, bool full>
MTW_INLINE void load_lanes(const void* const* ins, void* const* outs, uint32_t mask) {
  T got[mtw_simd::kWidth][2];
MTW_OVER_LANES
  for (int l = 0; l < mtw_simd::kWidth; ++l) {
    if (!full && !mtw_simd::active(mask, l)) continue;
    const LoadArg<T>& in = *static_cast<const LoadArg<T>*>(ins[l]);
    for (int j = 0; j < 2; ++j) got[l][j] = in.src[in.place.offset(row_of(l), col_of(l) + j)];
  }
MTW_OVER_LANES
  for (int l = 0; l < mtw_simd::kWidth; ++l)
    if (full || mtw_simd::active(mask, l))
      *static_cast<metal::vec<T, 2>*>(outs[l]) = metal::vec<T, 2>(got[l][0], got[l][1]);
}

// One lane's part: its two elements.
template <typename T>
MTW_INLINE void load_lane(const void* in, void* out, int lane) {
  const LoadArg<T>& arg = *static_cast<const LoadArg<T>*>(in);
  const int row = row_of(lane), col = col_of(lane);
  *static_cast<metal::vec<T, 2>*>(out) = metal::vec<T, 2>(
      arg.src[arg.place.offset(row, col)], arg.src[arg.place.offset(row, col + 1)]);
}

// The fast engine runs a load lane by lane where that reads the same values
// (engine/separable.py names this function); it then sees one lane at a time.
template <typename T>
void load(const void* const* ins, void* const* outs, uint32_t mask) {
  mtw_profile::GroupAccess access(ins, mask);  // one SIMD-group access
  if (mask == 0xFFFFFFFFu) load_lanes<T, true>(ins, outs, mask);
  else if (mask && !(mask & (mask - 1)))
    load_lane<T>(ins[__builtin_ctz(mask)], outs[__builtin_ctz(mask)], __builtin_ctz(mask));
  else load_lanes<T, false>(ins, outs, mask);
}

template <typename T, bool full>
MTW_INLINE void store_lanes(const void* const* ins, uint32_t mask) {
MTW_OVER_LANES
  for (int l = 0; l < mtw_simd::kWidth; ++l) {
    if (!full && !mtw_simd::active(mask, l)) continue;
    const StoreArg<T>& in = *static_cast<const StoreArg<T>*>(ins[l]);
    for (int j = 0; j < 2; ++j) in.dst[in.place.offset(row_of(l), col_of(l) + j)] = in.values[j];
  }
}

template <typename T>
void store(const void* const* ins, void* const*, uint32_t mask) {
  mtw_profile::GroupAccess access(ins, mask);  // one SIMD-group access
  if (mask == 0xFFFFFFFFu) store_lanes<T, true>(ins, mask);
  else store_lanes<T, false>(ins, mask);
}

// The lane holding element (row, col) of a matrix, col even: row_of and col_of inverted.
MTW_INLINE constexpr int lane_at(int row, int col) {
  return (row & 4) << 2 | (col & 4) << 1 | (row & 3) << 1 | (col & 2) >> 1;
}
constexpr bool lane_at_inverts_the_layout() {
  for (int l = 0; l < 32; ++l)
    if (lane_at(row_of(l), col_of(l)) != l) return false;
  return true;
}
static_assert(lane_at_inverts_the_layout());

// A lane's two elements, and a row of a tile: the product works on whole rows, eight
// lanes of a vector register.
typedef float Pair __attribute__((ext_vector_type(2)));
typedef float Row __attribute__((ext_vector_type(kSize)));

// Row r of the tile whose elements the lanes hold in `pairs`.
MTW_INLINE Row row_from(const Pair* pairs, int r) {
  const Pair p0 = pairs[lane_at(r, 0)], p2 = pairs[lane_at(r, 2)];
  const Pair p4 = pairs[lane_at(r, 4)], p6 = pairs[lane_at(r, 6)];
  return __builtin_shufflevector(__builtin_shufflevector(p0, p2, 0, 1, 2, 3),
                                 __builtin_shufflevector(p4, p6, 0, 1, 2, 3), 0, 1, 2, 3, 4,
                                 5, 6, 7);
}

// D = A B (+ C) for the lanes of `mask`, all of them when `full` (every index then known
// when compiling). A lane that is not there contributes NaN: on the GPU its registers hold
// garbage.
template <typename TD, bool accumulate, bool full>
MTW_INLINE void product(const void* const* ins, void* const* outs, uint32_t mask) {
  Pair a[mtw_simd::kWidth], b[mtw_simd::kWidth], c[mtw_simd::kWidth];
#pragma clang loop unroll(full)
  for (int l = 0; l < mtw_simd::kWidth; ++l) {
    if (!full && !mtw_simd::active(mask, l)) {
      a[l] = b[l] = c[l] = Pair(__builtin_nanf(""));
      continue;
    }
    const ProductArg& in = *static_cast<const ProductArg*>(ins[l]);
    a[l] = Pair{in.a[0], in.a[1]};
    b[l] = Pair{in.b[0], in.b[1]};
    if (accumulate) c[l] = Pair{in.c[0], in.c[1]};
  }
  Row d[kSize], rows_b[kSize];
#pragma clang loop unroll(full)
  for (int k = 0; k < kSize; ++k) rows_b[k] = row_from(b, k);
#pragma clang loop unroll(full)
  for (int r = 0; r < kSize; ++r)
    d[r] = accumulate ? row_from(c, r) : Row(a[lane_at(r, 0)][0]) * rows_b[0];
#pragma clang loop unroll(full)
  for (int k = accumulate ? 0 : 1; k < kSize; ++k)
#pragma clang loop unroll(full)
    for (int r = 0; r < kSize; ++r)
      d[r] = __builtin_elementwise_fma(Row(a[lane_at(r, k & 6)][k & 1]), rows_b[k], d[r]);
#pragma clang loop unroll(full)
  for (int l = 0; l < mtw_simd::kWidth; ++l) {
    if (!full && !mtw_simd::active(mask, l)) continue;
    const int r = row_of(l), col = col_of(l);
    *static_cast<metal::vec<TD, 2>*>(outs[l]) =
        metal::vec<TD, 2>(TD(d[r][col]), TD(d[r][col + 1]));
  }
}

// D = A B (+ C) in float, whatever the element types; each lane's two elements of D are
// rounded to D's type once and written to the lane's matrix (`outs`), after every lane's
// operands were read, so D may alias any operand. Apple does not document the rounding
// inside the operation; the hardware runs it on the FP32 FMA pipelines, so each element
// here is a chain of fused multiply-adds over k = 0..7 in increasing order, starting from
// C (or from the product A[r][0] B[0][c] without C, which keeps the sign of a zero product
// as a plain multiply would). Computed a row of D at a time, one chain per vector element,
// the eight rows' chains interleaved.
template <typename TD, bool accumulate>
void multiply(const void* const* ins, void* const* outs, uint32_t mask) {
  if (mask == 0xFFFFFFFFu) product<TD, accumulate, true>(ins, outs, mask);
  else product<TD, accumulate, false>(ins, outs, mask);
}

}  // namespace mtw_sgmatrix

namespace metal {

template <typename T, int Cols, int Rows = Cols>
struct simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "Metal's SIMD-group matrices are 8x8");
  static_assert(mtw_sgmatrix::is_element<T>,
                "Metal's SIMD-group matrices hold float, half or bfloat");

  vec<T, 2> __elements;

  // Uninitialised on the GPU; NaN here, so reading a matrix that was never written shows.
  constexpr simdgroup_matrix() : __elements(numeric_limits<T>::quiet_NaN()) {}

  // The diagonal matrix with `value` on its diagonal.
  simdgroup_matrix(T value) {
    int lane = __metal_get_thread_index_in_simdgroup(0);
    int row = mtw_sgmatrix::row_of(lane), col = mtw_sgmatrix::col_of(lane);
    __elements = vec<T, 2>(row == col ? value : T(0), row == col + 1 ? value : T(0));
  }

  MTW_INLINE vec<T, 2>& thread_elements() { return __elements; }
  MTW_INLINE const vec<T, 2>& thread_elements() const { return __elements; }
};

typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <typename T, int Cols, int Rows = Cols>
MTW_INLINE simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(const T value) {
  simdgroup_matrix<T, Cols, Rows> m;
  m.thread_elements() = vec<T, 2>(value);
  return m;
}

// Loads the matrix whose element (row, col) is src[(y + row) * elements_per_row + x + col]
// for matrix_origin (x, y), or src[(y + col) * elements_per_row + x + row] transposed.
template <typename T, int Cols, int Rows>
MTW_INLINE void simdgroup_load(thread simdgroup_matrix<T, Cols, Rows>& d, const T* src,
                               ulong elements_per_row = Cols, ulong2 matrix_origin = 0,
                               bool transpose_matrix = false) {
  mtw_sgmatrix::LoadArg<T> in{src, {elements_per_row, matrix_origin, transpose_matrix}};
  mtw_simd_collective(&in, &d.thread_elements(), &mtw_sgmatrix::load<T>);
}

// Stores to the places simdgroup_load reads from.
template <typename T, int Cols, int Rows>
MTW_INLINE void simdgroup_store(const thread simdgroup_matrix<T, Cols, Rows>& a, T* dst,
                                ulong elements_per_row = Cols, ulong2 matrix_origin = 0,
                                bool transpose_matrix = false) {
  mtw_sgmatrix::StoreArg<T> in{dst, {elements_per_row, matrix_origin, transpose_matrix},
                               a.thread_elements()};
  mtw_simd_collective(&in, &in, &mtw_sgmatrix::store<T>);  // no result: `out` unused
}

// d = a b + c. The operands may differ in element type (half inputs, float accumulator);
// d may alias any of them. See mtw_sgmatrix::multiply for the arithmetic.
template <typename TD, typename TA, typename TB, typename TC, int Cols, int Rows, int K>
MTW_INLINE void simdgroup_multiply_accumulate(thread simdgroup_matrix<TD, Cols, Rows>& d,
                                              const thread simdgroup_matrix<TA, K, Rows>& a,
                                              const thread simdgroup_matrix<TB, Cols, K>& b,
                                              const thread simdgroup_matrix<TC, Cols, Rows>& c) {
  mtw_sgmatrix::ProductArg in;
  mtw_sgmatrix::widen(in.a, a.thread_elements());
  mtw_sgmatrix::widen(in.b, b.thread_elements());
  mtw_sgmatrix::widen(in.c, c.thread_elements());
  mtw_simd_collective(&in, &d.thread_elements(), &mtw_sgmatrix::multiply<TD, true>);
}

// d = a b.
template <typename TD, typename TA, typename TB, int Cols, int Rows, int K>
MTW_INLINE void simdgroup_multiply(thread simdgroup_matrix<TD, Cols, Rows>& d,
                                   const thread simdgroup_matrix<TA, K, Rows>& a,
                                   const thread simdgroup_matrix<TB, Cols, K>& b) {
  mtw_sgmatrix::ProductArg in;
  mtw_sgmatrix::widen(in.a, a.thread_elements());
  mtw_sgmatrix::widen(in.b, b.thread_elements());
  mtw_simd_collective(&in, &d.thread_elements(), &mtw_sgmatrix::multiply<TD, false>);
}

// Operators on SIMD-group matrices of one element type: `+` and `-` per element (each lane
// adds its own elements, rounded to T), `*` the matrix product, as simdgroup_multiply.
template <typename T, int Cols, int Rows>
using __sgm = simdgroup_matrix<T, Cols, Rows>;
template <typename T, int Cols, int Rows>
MTW_INLINE __sgm<T, Cols, Rows> operator+(const thread __sgm<T, Cols, Rows>& a,
                                          const thread __sgm<T, Cols, Rows>& b) {
  __sgm<T, Cols, Rows> d;
  d.thread_elements() = a.thread_elements() + b.thread_elements();
  return d;
}
template <typename T, int Cols, int Rows>
MTW_INLINE __sgm<T, Cols, Rows> operator-(const thread __sgm<T, Cols, Rows>& a,
                                          const thread __sgm<T, Cols, Rows>& b) {
  __sgm<T, Cols, Rows> d;
  d.thread_elements() = a.thread_elements() - b.thread_elements();
  return d;
}
template <typename T, int Cols, int Rows, int K>
MTW_INLINE __sgm<T, Cols, Rows> operator*(const thread __sgm<T, K, Rows>& a,
                                          const thread __sgm<T, Cols, K>& b) {
  __sgm<T, Cols, Rows> d;
  simdgroup_multiply(d, a, b);
  return d;
}

}  // namespace metal

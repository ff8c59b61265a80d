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

template <typename T>
void load(const void* const* ins, void* const* outs, uint32_t mask) {
  mtw_profile::GroupAccess access(ins, mask);  // one SIMD-group access
  for (int l = 0; l < mtw_simd::kWidth; ++l) {
    if (!mtw_simd::active(mask, l)) continue;
    const LoadArg<T>& in = *static_cast<const LoadArg<T>*>(ins[l]);
    metal::vec<T, 2>& out = *static_cast<metal::vec<T, 2>*>(outs[l]);
    for (int j = 0; j < 2; ++j) out[j] = in.src[in.place.offset(row_of(l), col_of(l) + j)];
  }
}

template <typename T>
void store(const void* const* ins, void* const*, uint32_t mask) {
  mtw_profile::GroupAccess access(ins, mask);  // one SIMD-group access
  for (int l = 0; l < mtw_simd::kWidth; ++l) {
    if (!mtw_simd::active(mask, l)) continue;
    const StoreArg<T>& in = *static_cast<const StoreArg<T>*>(ins[l]);
    for (int j = 0; j < 2; ++j) in.dst[in.place.offset(row_of(l), col_of(l) + j)] = in.values[j];
  }
}

// A row of a tile: the product works on whole rows, eight lanes of a vector register.
typedef float Row __attribute__((ext_vector_type(kSize)));

// A tile gathered from the lanes' elements, or to be handed back to them, row by row.
struct Tile {
  alignas(32) float at[kSize][kSize];
  MTW_INLINE Row row(int r) const {
    Row v;
    __builtin_memcpy(&v, at[r], sizeof v);
    return v;
  }
  MTW_INLINE void set_row(int r, Row v) { __builtin_memcpy(at[r], &v, sizeof v); }
  MTW_INLINE void put(int lane, const float (&pair)[2]) {
    __builtin_memcpy(&at[row_of(lane)][col_of(lane)], pair, sizeof pair);
  }
};

// The three operands of a product, gathered from the lanes. A lane that is not there
// contributes NaN: on the GPU its registers hold garbage.
template <bool accumulate>
struct Operands {
  Tile a, b, c;

  MTW_INLINE void gather(const void* const* ins, uint32_t mask) {
    if (mask == 0xFFFFFFFFu) {
#pragma clang loop unroll(full)
      for (int l = 0; l < mtw_simd::kWidth; ++l) take(l, ins[l]);
      return;
    }
    for (int r = 0; r < kSize; ++r)
      a.set_row(r, Row(__builtin_nanf(""))), b.set_row(r, a.row(r)), c.set_row(r, a.row(r));
    for (int l = 0; l < mtw_simd::kWidth; ++l)
      if (mtw_simd::active(mask, l)) take(l, ins[l]);
  }

  MTW_INLINE void take(int lane, const void* in) {
    const ProductArg& arg = *static_cast<const ProductArg*>(in);
    a.put(lane, arg.a);
    b.put(lane, arg.b);
    if (accumulate) c.put(lane, arg.c);
  }
};

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
  Operands<accumulate> m;
  m.gather(ins, mask);
  Row d[kSize];
  const Row b0 = m.b.row(0);
  for (int r = 0; r < kSize; ++r) d[r] = accumulate ? m.c.row(r) : Row(m.a.at[r][0]) * b0;
  for (int k = accumulate ? 0 : 1; k < kSize; ++k) {
    const Row bk = m.b.row(k);
    for (int r = 0; r < kSize; ++r) d[r] = __builtin_elementwise_fma(Row(m.a.at[r][k]), bk, d[r]);
  }
  Tile out;
  for (int r = 0; r < kSize; ++r) out.set_row(r, d[r]);
#pragma clang loop unroll(full)
  for (int l = 0; l < mtw_simd::kWidth; ++l) {
    if (!mtw_simd::active(mask, l)) continue;
    const float* pair = &out.at[row_of(l)][col_of(l)];
    *static_cast<metal::vec<TD, 2>*>(outs[l]) = metal::vec<TD, 2>(TD(pair[0]), TD(pair[1]));
  }
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

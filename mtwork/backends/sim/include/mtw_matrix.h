// Metal's matrix types (MSL specification, 2.3 "Matrix Data Types", and the matrix
// functions of "Matrix Functions" in the standard library chapter).
//
// `matrix<T, Cols, Rows>` holds Cols column vectors of Rows components: `float2x3` is two
// float3 columns (32 bytes, as Metal lays it out), `m[i]` is column i and `m[i][j]` the
// element in column i, row j. Arithmetic follows linear algebra: `+` and `-` per element,
// `*` with a scalar per element, and matrix-vector, vector-matrix and matrix-matrix
// products, each sum accumulated left to right in T (every operation rounded to T).
#pragma once

#include "mtw_vec.h"

namespace metal {

template <typename T, int Cols, int Rows>
struct matrix {
  static_assert(Cols >= 2 && Cols <= 4 && Rows >= 2 && Rows <= 4,
                "Metal's matrices have 2, 3 or 4 columns and rows");
  static_assert(is_same_v<T, float> || is_same_v<T, half> || is_same_v<T, bfloat>,
                "Metal's matrices hold float, half or bfloat");
  using column_type = vec<T, Rows>;

  column_type columns[Cols];

  matrix() = default;

  // The diagonal matrix with `d` on its diagonal, zero elsewhere (MSL 2.3.2).
  explicit constexpr MTW_INLINE matrix(T d) {
    for (int c = 0; c < Cols; ++c) {
      columns[c] = column_type(T(0));
      if (c < Rows) columns[c][c] = d;
    }
  }
  // From Cols column vectors (braced lists work: `float2x2({1, 2}, {3, 4})`).
  template <int C = Cols, enable_if_t<C == 2, int> = 0>
  constexpr MTW_INLINE matrix(column_type c0, column_type c1) : columns{c0, c1} {}
  template <int C = Cols, enable_if_t<C == 3, int> = 0>
  constexpr MTW_INLINE matrix(column_type c0, column_type c1, column_type c2)
      : columns{c0, c1, c2} {}
  template <int C = Cols, enable_if_t<C == 4, int> = 0>
  constexpr MTW_INLINE matrix(column_type c0, column_type c1, column_type c2, column_type c3)
      : columns{c0, c1, c2, c3} {}
  // From Cols * Rows scalars in column-major order (Metal 2 and later).
  template <typename... S, enable_if_t<sizeof...(S) == Cols * Rows && Cols * Rows != 1 &&
                                           (__is_scalar_v<S> && ...), int> = 0>
  MTW_INLINE matrix(S... s) {
    const T values[] = {T(s)...};
    for (int c = 0; c < Cols; ++c)
      for (int r = 0; r < Rows; ++r) columns[c][r] = values[c * Rows + r];
  }
  // From a matrix of the same size and another element type, element by element.
  template <typename U, typename = enable_if_t<!is_same_v<U, T>>>
  explicit MTW_INLINE matrix(const matrix<U, Cols, Rows>& m) {
    for (int c = 0; c < Cols; ++c) columns[c] = column_type(m[c]);
  }

  MTW_INLINE column_type& operator[](int c) { return columns[c]; }
  MTW_INLINE const column_type& operator[](int c) const { return columns[c]; }

  template <typename F>
  MTW_INLINE matrix __map(F f) const {
    matrix r;
    for (int c = 0; c < Cols; ++c) r.columns[c] = f(columns[c], c);
    return r;
  }

  friend MTW_INLINE matrix operator+(const matrix& a, const matrix& b) {
    return a.__map([&](column_type x, int c) { return x + b[c]; });
  }
  friend MTW_INLINE matrix operator-(const matrix& a, const matrix& b) {
    return a.__map([&](column_type x, int c) { return x - b[c]; });
  }
  friend MTW_INLINE matrix operator-(const matrix& a) {
    return a.__map([](column_type x, int) { return -x; });
  }
  friend MTW_INLINE matrix operator+(const matrix& a) { return a; }
  template <typename S, enable_if_t<__is_scalar_v<S>, int> = 0>
  friend MTW_INLINE matrix operator*(const matrix& a, S s) {
    return a.__map([&](column_type x, int) { return x * T(s); });
  }
  template <typename S, enable_if_t<__is_scalar_v<S>, int> = 0>
  friend MTW_INLINE matrix operator*(S s, const matrix& a) {
    return a.__map([&](column_type x, int) { return T(s) * x; });
  }
  // Per element, as a matrix times a scalar (llama.cpp divides its score tiles so).
  template <typename S, enable_if_t<__is_scalar_v<S>, int> = 0>
  friend MTW_INLINE matrix operator/(const matrix& a, S s) {
    return a.__map([&](column_type x, int) { return x / T(s); });
  }
  // The column combination sum_c m[c] * v[c].
  friend MTW_INLINE column_type operator*(const matrix& m, vec<T, Cols> v) {
    column_type r = m[0] * v[0];
    for (int c = 1; c < Cols; ++c) r = r + m[c] * v[c];
    return r;
  }
  // The row of dot products: component c is sum_r v[r] * m[c][r].
  friend MTW_INLINE vec<T, Cols> operator*(column_type v, const matrix& m) {
    vec<T, Cols> r;
    for (int c = 0; c < Cols; ++c) {
      T s = v[0] * m[c][0];
      for (int i = 1; i < Rows; ++i) s = s + v[i] * m[c][i];
      r[c] = s;
    }
    return r;
  }

  MTW_INLINE matrix& operator+=(const matrix& b) { return *this = *this + b; }
  MTW_INLINE matrix& operator-=(const matrix& b) { return *this = *this - b; }
  template <typename S, enable_if_t<__is_scalar_v<S>, int> = 0>
  MTW_INLINE matrix& operator*=(S s) {
    return *this = *this * s;
  }
  template <typename S, enable_if_t<__is_scalar_v<S>, int> = 0>
  MTW_INLINE matrix& operator/=(S s) {
    return *this = *this / s;
  }
  template <int C = Cols, enable_if_t<C == Rows, int> = 0>
  MTW_INLINE matrix& operator*=(const matrix& b) {
    return *this = *this * b;
  }
};

// (Rows x K) times (K x Cols): column c of the product is a times column c of b.
template <typename T, int K, int Rows, int Cols>
MTW_INLINE matrix<T, Cols, Rows> operator*(const matrix<T, K, Rows>& a,
                                           const matrix<T, Cols, K>& b) {
  matrix<T, Cols, Rows> r;
  for (int c = 0; c < Cols; ++c) r[c] = a * b[c];
  return r;
}

template <typename T, int Cols, int Rows>
MTW_INLINE matrix<T, Rows, Cols> transpose(const matrix<T, Cols, Rows>& m) {
  matrix<T, Rows, Cols> r;
  for (int c = 0; c < Cols; ++c)
    for (int i = 0; i < Rows; ++i) r[i][c] = m[c][i];
  return r;
}

// Determinants of square matrices by cofactor expansion along the first column, in T.
template <typename T>
MTW_INLINE T determinant(const matrix<T, 2, 2>& m) {
  return m[0][0] * m[1][1] - m[1][0] * m[0][1];
}
template <typename T>
MTW_INLINE T __minor3(const matrix<T, 3, 3>& m, int row) {
  int r0 = row == 0 ? 1 : 0, r1 = row == 2 ? 1 : 2;
  return m[1][r0] * m[2][r1] - m[2][r0] * m[1][r1];
}
template <typename T>
MTW_INLINE T determinant(const matrix<T, 3, 3>& m) {
  return m[0][0] * __minor3(m, 0) - m[0][1] * __minor3(m, 1) + m[0][2] * __minor3(m, 2);
}
template <typename T>
MTW_INLINE T determinant(const matrix<T, 4, 4>& m) {
  T det = T(0);
  for (int row = 0; row < 4; ++row) {
    matrix<T, 3, 3> minor;
    for (int c = 1; c < 4; ++c)
      for (int r = 0, k = 0; r < 4; ++r)
        if (r != row) minor[c - 1][k++] = m[c][r];
    T term = m[0][row] * determinant(minor);
    det = row % 2 == 0 ? det + term : det - term;
  }
  return det;
}

}  // namespace metal

#define MTW_MATRIX_NAMES(T, name, C)           \
  typedef metal::matrix<T, C, 2> name##C##x2; \
  typedef metal::matrix<T, C, 3> name##C##x3; \
  typedef metal::matrix<T, C, 4> name##C##x4; \
  namespace metal {                            \
  using ::name##C##x2;                         \
  using ::name##C##x3;                         \
  using ::name##C##x4;                         \
  }
MTW_MATRIX_NAMES(float, float, 2)
MTW_MATRIX_NAMES(float, float, 3)
MTW_MATRIX_NAMES(float, float, 4)
MTW_MATRIX_NAMES(half, half, 2)
MTW_MATRIX_NAMES(half, half, 3)
MTW_MATRIX_NAMES(half, half, 4)
#undef MTW_MATRIX_NAMES

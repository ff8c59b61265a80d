// metal:: relational and geometric functions (MSL specification, "Relational Functions"
// and "Geometric Functions").
#pragma once

#include "mtw_common.h"

namespace metal {

// ---- relational -------------------------------------------------------------------------
#define MTW_FLOAT_PREDICATE(name, expr)                              \
  MTW_INLINE bool name(float x) { return expr; }                     \
  MTW_INLINE bool name(half x) { return name(float(x)); }            \
  MTW_INLINE bool name(bfloat x) { return name(float(x)); }
MTW_FLOAT_PREDICATE(isnan, __builtin_isnan(x))
MTW_FLOAT_PREDICATE(isinf, __builtin_isinf(x))
MTW_FLOAT_PREDICATE(isfinite, __builtin_isfinite(x))
MTW_FLOAT_PREDICATE(signbit, __builtin_signbit(x))
#undef MTW_FLOAT_PREDICATE
// Normal in the argument's own format: half's smallest normal is 2^-14, bfloat's 2^-126.
MTW_INLINE bool isnormal(float x) { return __builtin_isnormal(x); }
MTW_INLINE bool isnormal(half x) { return __builtin_isnormal(x); }
MTW_INLINE bool isnormal(bfloat x) { return __builtin_isnormal(float(x)); }
template <typename T, typename = enable_if_t<is_floating_point_v<T>>>
MTW_INLINE bool isordered(T x, T y) {
  return x == x && y == y;
}
template <typename T, typename = enable_if_t<is_floating_point_v<T>>>
MTW_INLINE bool isunordered(T x, T y) {
  return !(x == x && y == y);
}
#define MTW_VEC_PREDICATE(name)                                      \
  template <typename T, int N>                                       \
  MTW_INLINE vec<bool, N> name(vec<T, N> x) {                        \
    vec<bool, N> r;                                                  \
    for (int i = 0; i < N; ++i) r[i] = name(x[i]);                   \
    return r;                                                        \
  }
MTW_VEC_PREDICATE(isnan)
MTW_VEC_PREDICATE(isinf)
MTW_VEC_PREDICATE(isfinite)
MTW_VEC_PREDICATE(isnormal)
MTW_VEC_PREDICATE(signbit)
#undef MTW_VEC_PREDICATE
template <typename T, int N>
MTW_INLINE vec<bool, N> isordered(vec<T, N> x, vec<T, N> y) {
  vec<bool, N> r;
  for (int i = 0; i < N; ++i) r[i] = isordered(x[i], y[i]);
  return r;
}
template <typename T, int N>
MTW_INLINE vec<bool, N> isunordered(vec<T, N> x, vec<T, N> y) {
  vec<bool, N> r;
  for (int i = 0; i < N; ++i) r[i] = isunordered(x[i], y[i]);
  return r;
}
template <typename A, typename B, typename V = __float_vector_call_t<A, B>>
MTW_INLINE auto isordered(A x, B y) {
  return isordered(V(x), V(y));
}
template <typename A, typename B, typename V = __float_vector_call_t<A, B>>
MTW_INLINE auto isunordered(A x, B y) {
  return isunordered(V(x), V(y));
}

MTW_INLINE bool all(bool x) { return x; }
MTW_INLINE bool any(bool x) { return x; }
template <int N>
MTW_INLINE bool all(vec<bool, N> x) {
  for (int i = 0; i < N; ++i)
    if (!x[i]) return false;
  return true;
}
template <int N>
MTW_INLINE bool any(vec<bool, N> x) {
  for (int i = 0; i < N; ++i)
    if (x[i]) return true;
  return false;
}
// select(a, b, c): c ? b : a, per component; a scalar a or b takes the vector's type.
template <typename T, typename = enable_if_t<!__is_vec_v<T>>>
MTW_INLINE T select(T a, T b, bool c) {
  return c ? b : a;
}
template <typename T, int N>
MTW_INLINE vec<T, N> select(vec<T, N> a, vec<T, N> b, vec<bool, N> c) {
  vec<T, N> r;
  for (int i = 0; i < N; ++i) r[i] = c[i] ? b[i] : a[i];
  return r;
}
template <typename T, int N>
MTW_INLINE vec<T, N> select(vec<T, N> a, vec<T, N> b, bool c) {
  return c ? b : a;
}
template <typename A, typename B, typename = enable_if_t<__mixed_scalars_v<A, B>>>
MTW_INLINE auto select(A a, B b, bool c) {
  using R = decltype(a + b);
  return c ? R(b) : R(a);
}
template <typename A, typename B, typename C, typename V = __vector_call_t<A, B>,
          typename = enable_if_t<is_same_v<C, bool> ||
                                 is_same_v<C, vec<bool, __vec_traits<V>::size>>>>
MTW_INLINE V select(A a, B b, C c) {
  return select(V(a), V(b), c);
}

// ---- geometric --------------------------------------------------------------------------
// Products and sums in the element type, left to right, each rounded.
template <typename T, int N>
MTW_INLINE T dot(vec<T, N> a, vec<T, N> b) {
  T s = a[0] * b[0];
  for (int i = 1; i < N; ++i) s += a[i] * b[i];
  return s;
}
template <typename T, int N>
MTW_INLINE T length_squared(vec<T, N> a) { return dot(a, a); }
template <typename T, int N>
MTW_INLINE T length(vec<T, N> a) { return sqrt(dot(a, a)); }
template <typename T, int N>
MTW_INLINE T distance_squared(vec<T, N> a, vec<T, N> b) { return length_squared(a - b); }
template <typename T, int N>
MTW_INLINE T distance(vec<T, N> a, vec<T, N> b) { return length(a - b); }
template <typename T, int N>
MTW_INLINE vec<T, N> normalize(vec<T, N> a) { return a * rsqrt(dot(a, a)); }
template <typename T>
MTW_INLINE vec<T, 3> cross(vec<T, 3> a, vec<T, 3> b) {
  return vec<T, 3>(a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x);
}
// n facing against i (dot(nref, i) < 0 keeps n).
template <typename T, int N>
MTW_INLINE vec<T, N> faceforward(vec<T, N> n, vec<T, N> i, vec<T, N> nref) {
  return dot(nref, i) < T(0) ? n : -n;
}
// i reflected in the plane of unit normal n.
template <typename T, int N>
MTW_INLINE vec<T, N> reflect(vec<T, N> i, vec<T, N> n) {
  return i - T(2) * dot(n, i) * n;
}
// i refracted at unit normal n with index ratio eta; zero on total internal reflection.
template <typename T, int N>
MTW_INLINE vec<T, N> refract(vec<T, N> i, vec<T, N> n, T eta) {
  T d = dot(n, i);
  T k = T(1) - eta * eta * (T(1) - d * d);
  if (k < T(0)) return vec<T, N>(T(0));
  return eta * i - (eta * d + sqrt(k)) * n;
}

namespace fast {
using metal::distance;
using metal::length;
using metal::normalize;
}  // namespace fast
namespace precise {
using metal::distance;
using metal::length;
using metal::normalize;
}  // namespace precise

}  // namespace metal

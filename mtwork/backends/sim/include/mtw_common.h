// metal:: common functions shared by floats and integers (max, min, clamp, abs, ...) and
// the integer functions (MSL specification, "Common Functions" and "Integer Functions").
#pragma once

#include "mtw_math.h"

namespace metal {

// ---- common and integer functions shared by floats and integers ------------------------
template <typename T, typename = enable_if_t<is_arithmetic_v<T>>>
MTW_INLINE T __scalar_max(T a, T b) {
  if constexpr (is_floating_point_v<T>) return T(mtw_math::fmax(float(a), float(b)));
  else return a < b ? b : a;
}
template <typename T, typename = enable_if_t<is_arithmetic_v<T>>>
MTW_INLINE T __scalar_min(T a, T b) {
  if constexpr (is_floating_point_v<T>) return T(mtw_math::fmin(float(a), float(b)));
  else return b < a ? b : a;
}
template <typename T, typename = enable_if_t<is_arithmetic_v<T>>>
MTW_INLINE T __scalar_abs(T a) {
  if constexpr (is_floating_point_v<T>) return T(__builtin_fabsf(float(a)));
  else if constexpr (is_signed_v<T>) return a < 0 ? T(0 - make_unsigned_t<T>(a)) : a;
  else return a;
}

#define MTW_SCALAR_INT_AND_FLOAT(T)                                                    \
  MTW_INLINE T max(T a, T b) { return __scalar_max<T>(a, b); }                         \
  MTW_INLINE T min(T a, T b) { return __scalar_min<T>(a, b); }                         \
  MTW_INLINE T max3(T a, T b, T c) { return max(max(a, b), c); }                       \
  MTW_INLINE T min3(T a, T b, T c) { return min(min(a, b), c); }                       \
  MTW_INLINE T median3(T a, T b, T c) { return max(min(a, b), min(max(a, b), c)); }    \
  MTW_INLINE T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }                  \
  MTW_INLINE T abs(T a) { return __scalar_abs<T>(a); }
MTW_SCALAR_INT_AND_FLOAT(float)
MTW_SCALAR_INT_AND_FLOAT(half)
MTW_SCALAR_INT_AND_FLOAT(char)
MTW_SCALAR_INT_AND_FLOAT(uchar)
MTW_SCALAR_INT_AND_FLOAT(short)
MTW_SCALAR_INT_AND_FLOAT(ushort)
MTW_SCALAR_INT_AND_FLOAT(int)
MTW_SCALAR_INT_AND_FLOAT(uint)
MTW_SCALAR_INT_AND_FLOAT(long)
MTW_SCALAR_INT_AND_FLOAT(ulong)
#undef MTW_SCALAR_INT_AND_FLOAT
// bfloat, which converts to both float and unsigned integers, gets its own (as templates,
// so that MLX's bf16_math.h overloads of the same functions take precedence).
#define MTW_BFLOAT_AS_FLOAT(name, ...)                                                    \
  template <typename T, typename = enable_if_t<is_same_v<T, bfloat>>>                    \
  MTW_INLINE T name(__VA_ARGS__)
MTW_BFLOAT_AS_FLOAT(max, T a, T b) { return T(max(float(a), float(b))); }
MTW_BFLOAT_AS_FLOAT(min, T a, T b) { return T(min(float(a), float(b))); }
MTW_BFLOAT_AS_FLOAT(max3, T a, T b, T c) { return T(max3(float(a), float(b), float(c))); }
MTW_BFLOAT_AS_FLOAT(min3, T a, T b, T c) { return T(min3(float(a), float(b), float(c))); }
MTW_BFLOAT_AS_FLOAT(median3, T a, T b, T c) {
  return T(median3(float(a), float(b), float(c)));
}
MTW_BFLOAT_AS_FLOAT(clamp, T x, T lo, T hi) { return T(clamp(float(x), float(lo), float(hi))); }
MTW_BFLOAT_AS_FLOAT(abs, T a) { return T(abs(float(a))); }
#undef MTW_BFLOAT_AS_FLOAT
// Scalars of mixed types (max(x, 0) with float x, clamp(h, 0, 1) with half h) resolve as
// Metal does: to their common arithmetic type.
template <typename... A>
constexpr bool __mixed_scalars_v =
    (is_arithmetic_v<A> && ...) && !(is_same_v<A, __first_t<A...>> && ...);
#define MTW_MIXED_SCALARS2(name)                                                           \
  template <typename A, typename B, typename = enable_if_t<__mixed_scalars_v<A, B>>>     \
  MTW_INLINE auto name(A a, B b) {                                                         \
    using R = decltype(a + b);                                                             \
    return name(R(a), R(b));                                                               \
  }
#define MTW_MIXED_SCALARS3(name)                                                           \
  template <typename A, typename B, typename C,                                            \
            typename = enable_if_t<__mixed_scalars_v<A, B, C>>>                           \
  MTW_INLINE auto name(A a, B b, C c) {                                                    \
    using R = decltype(a + b + c);                                                         \
    return name(R(a), R(b), R(c));                                                         \
  }
MTW_MIXED_SCALARS2(max)
MTW_MIXED_SCALARS2(min)
MTW_MIXED_SCALARS3(max3)
MTW_MIXED_SCALARS3(min3)
MTW_MIXED_SCALARS3(median3)
MTW_MIXED_SCALARS3(clamp)
#undef MTW_MIXED_SCALARS2
#undef MTW_MIXED_SCALARS3

// Per-component versions of scalar functions. Vectors mix with scalars in any places
// (`clamp(v, lo, hi)`, `max(v, 0)`, `max(0, v)`): the scalars convert to the vector's type.
#define MTW_VEC_MAP1(name)                                           \
  template <typename T, int N>                                       \
  MTW_INLINE vec<T, N> name(vec<T, N> a) {                           \
    for (int i = 0; i < N; ++i) a[i] = T(name(a[i]));                \
    return a;                                                        \
  }
#define MTW_VEC_MAP2(name)                                           \
  template <typename T, int N>                                       \
  MTW_INLINE vec<T, N> name(vec<T, N> a, vec<T, N> b) {              \
    for (int i = 0; i < N; ++i) a[i] = T(name(a[i], b[i]));          \
    return a;                                                        \
  }                                                                  \
  template <typename A, typename B, typename V = __vector_call_t<A, B>> \
  MTW_INLINE V name(A a, B b) {                                      \
    return name(V(a), V(b));                                         \
  }
#define MTW_VEC_MAP3(name)                                           \
  template <typename T, int N>                                       \
  MTW_INLINE vec<T, N> name(vec<T, N> a, vec<T, N> b, vec<T, N> c) { \
    for (int i = 0; i < N; ++i) a[i] = T(name(a[i], b[i], c[i]));    \
    return a;                                                        \
  }                                                                  \
  template <typename A, typename B, typename C,                      \
            typename V = __vector_call_t<A, B, C>>                   \
  MTW_INLINE V name(A a, B b, C c) {                                 \
    return name(V(a), V(b), V(c));                                   \
  }
MTW_VEC_MAP1(abs)
MTW_VEC_MAP2(max)
MTW_VEC_MAP2(min)
MTW_VEC_MAP3(max3)
MTW_VEC_MAP3(min3)
MTW_VEC_MAP3(median3)
MTW_VEC_MAP3(clamp)

// ---- integer functions ------------------------------------------------------------------
#define MTW_INTEGER(T) template <typename T, typename = enable_if_t<is_integral_v<T>>>
MTW_INTEGER(T) MTW_INLINE T popcount(T x) {
  return T(__builtin_popcountll((unsigned long long)(make_unsigned_t<T>)x));
}
MTW_INTEGER(T) MTW_INLINE T clz(T x) {
  auto u = (make_unsigned_t<T>)x;
  return u == 0 ? T(__bits<T>) : T(__builtin_clzll((unsigned long long)u) - (64 - __bits<T>));
}
MTW_INTEGER(T) MTW_INLINE T ctz(T x) {
  auto u = (make_unsigned_t<T>)x;
  return u == 0 ? T(__bits<T>) : T(__builtin_ctzll((unsigned long long)u));
}
// The high half of the full product.
MTW_INTEGER(T) MTW_INLINE T mulhi(T a, T b) {
  if constexpr (sizeof(T) == 8) {
    using W = conditional_t<is_signed_v<T>, __int128, unsigned __int128>;
    return T((W(a) * W(b)) >> 64);
  } else {
    using W = conditional_t<is_signed_v<T>, long, ulong>;
    return T((W(a) * W(b)) >> __bits<T>);
  }
}
MTW_INTEGER(T) MTW_INLINE T madhi(T a, T b, T c) { return T(mulhi(a, b) + c); }
// |a - b| without overflow: the bits of the unsigned difference.
MTW_INTEGER(T) MTW_INLINE T absdiff(T a, T b) {
  using U = make_unsigned_t<T>;
  return a > b ? T(U(U(a) - U(b))) : T(U(U(b) - U(a)));
}
MTW_INTEGER(T) MTW_INLINE T addsat(T a, T b) {
  T r;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b > 0 ? numeric_limits<T>::max() : numeric_limits<T>::min();
}
MTW_INTEGER(T) MTW_INLINE T subsat(T a, T b) {
  T r;
  if (!__builtin_sub_overflow(a, b, &r)) return r;
  return b < 0 ? numeric_limits<T>::max() : numeric_limits<T>::min();
}
// a * b + c, saturated: computed exactly in a wider type, then clamped.
MTW_INTEGER(T) MTW_INLINE T madsat(T a, T b, T c) {
  using W = conditional_t<is_signed_v<T>, __int128, unsigned __int128>;
  W r = W(a) * W(b);
  if constexpr (sizeof(T) == 8) {  // 128 bits hold the product, not always the sum
    W s;
    if (__builtin_add_overflow(r, W(c), &s))
      return c > 0 ? numeric_limits<T>::max() : numeric_limits<T>::min();
    r = s;
  } else {
    r += W(c);
  }
  if (r > W(numeric_limits<T>::max())) return numeric_limits<T>::max();
  if (r < W(numeric_limits<T>::min())) return numeric_limits<T>::min();
  return T(r);
}
// (a + b) >> 1 and (a + b + 1) >> 1 without overflow.
MTW_INTEGER(T) MTW_INLINE T hadd(T a, T b) { return T((a >> 1) + (b >> 1) + (a & b & 1)); }
MTW_INTEGER(T) MTW_INLINE T rhadd(T a, T b) {
  return T((a >> 1) + (b >> 1) + ((a | b) & 1));
}
// Metal's 24-bit multiplies take the low 24 bits of 32-bit operands; results of operands
// outside that range are undefined, here they are the full product's low bits.
MTW_INTEGER(T) MTW_INLINE T mul24(T a, T b) {
  using U = make_unsigned_t<T>;
  return T(ulong(U(a)) * ulong(U(b)));
}
MTW_INTEGER(T) MTW_INLINE T mad24(T a, T b, T c) {
  using U = make_unsigned_t<T>;
  return T(ulong(U(a)) * ulong(U(b)) + ulong(U(c)));
}
// Rotate left by i modulo the width.
MTW_INTEGER(T) MTW_INLINE T rotate(T v, T i) {
  using U = make_unsigned_t<T>;
  unsigned s = unsigned(i) & (__bits<T> - 1);
  return s == 0 ? v : T(U(U(v) << s) | U(U(v) >> (__bits<T> - s)));
}
MTW_INTEGER(T) MTW_INLINE T reverse_bits(T x) {
  using U = make_unsigned_t<T>;
  U u = U(x), r = 0;
  for (int i = 0; i < __bits<T>; ++i) r = U((r << 1) | ((u >> i) & 1));
  return T(r);
}
// Bits [offset, offset + bits) of x, sign-extended for signed types.
MTW_INTEGER(T) MTW_INLINE T extract_bits(T x, uint offset, uint bits) {
  using U = make_unsigned_t<T>;
  if (bits == 0) return 0;
  U field = U(U(x) >> offset) & U(bits >= __bits<T> ? U(~U(0)) : U((U(1) << bits) - 1));
  if constexpr (is_signed_v<T>) {
    if (bits < __bits<T> && (field >> (bits - 1)) & 1) field |= U(~U(0)) << bits;
  }
  return T(field);
}
MTW_INTEGER(T) MTW_INLINE T insert_bits(T base, T insert, uint offset, uint bits) {
  using U = make_unsigned_t<T>;
  U mask = bits >= __bits<T> ? U(~U(0)) : U(U((U(1) << bits) - 1) << offset);
  return T((U(base) & ~mask) | (U(U(insert) << offset) & mask));
}
#undef MTW_INTEGER
MTW_VEC_MAP1(popcount)
MTW_VEC_MAP1(clz)
MTW_VEC_MAP1(ctz)
MTW_VEC_MAP1(reverse_bits)
MTW_VEC_MAP2(mulhi)
MTW_VEC_MAP2(absdiff)
MTW_VEC_MAP2(addsat)
MTW_VEC_MAP2(subsat)
MTW_VEC_MAP2(hadd)
MTW_VEC_MAP2(rhadd)
MTW_VEC_MAP2(mul24)
MTW_VEC_MAP2(rotate)
MTW_VEC_MAP3(madhi)
MTW_VEC_MAP3(madsat)
MTW_VEC_MAP3(mad24)
template <typename T, int N>
MTW_INLINE vec<T, N> extract_bits(vec<T, N> x, uint offset, uint bits) {
  for (int i = 0; i < N; ++i) x[i] = extract_bits(x[i], offset, bits);
  return x;
}
template <typename T, int N>
MTW_INLINE vec<T, N> insert_bits(vec<T, N> base, vec<T, N> insert, uint offset, uint bits) {
  for (int i = 0; i < N; ++i) base[i] = insert_bits(base[i], insert[i], offset, bits);
  return base;
}

#undef MTW_VEC_MAP1
#undef MTW_VEC_MAP2
#undef MTW_VEC_MAP3

namespace fast {
using metal::abs;
using metal::clamp;
using metal::max;
using metal::max3;
using metal::median3;
using metal::min;
using metal::min3;
}  // namespace fast
namespace precise {
using metal::abs;
using metal::clamp;
using metal::max;
using metal::max3;
using metal::median3;
using metal::min;
using metal::min3;
}  // namespace precise

}  // namespace metal

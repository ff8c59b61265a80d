// metal:: math functions, and the arithmetic rules of the emulator. The common, integer,
// relational and geometric functions are in mtw_common.h and mtw_relational.h.
//
// Precision. Each float function is first defined as a `__metal_name(x, mode)` builtin, the
// layer MLX's bf16_math.h builds its bfloat overloads on; `metal::`, `metal::fast::` and
// `metal::precise::` call it with their precision mode. The exponentials, logarithms,
// hyperbolic functions (mtw_elementary.h), trigonometric functions, their inverses and pow
// (mtw_trig.h) are the shim's own inline code: vectorizable, the same bits in every
// engine; the other float functions use the host's libm (or double precision where libm
// has no float version). All are within Metal's precise ulp
// bounds (MSL specification, section 8.4, table 8.1) and so within the fast ones too;
// half functions compute in float and round once. bfloat has no overloads here,
// like Apple's stdlib: MLX's prelude adds them (computing in float and rounding).
//
// Arithmetic rules, chosen where MSL leaves things undefined:
// - float, half and bfloat `+ - * /` round after each operation: in Metal's default (and
//   MLX's) math mode "safe" the GPU does not fuse `a * b + c` into one rounding, so
//   compiler.py compiles "safe" with -ffp-contract=off; "relaxed" and "fast" fuse.
// - Integer arithmetic wraps (two's complement) at run time; signed overflow stays
//   undefined to the optimizer, as it is to Apple's compiler (both are C++ compilers).
// - Integer division or remainder by zero (and INT_MIN / -1) is undefined in MSL and does
//   not trap on the GPU; here it stops the kernel with a KernelFault ("arithmetic trap").
// - Shifts: MSL masks a vector shift count to the element width (mtw_vec.h); a scalar
//   shift follows C++: the operand is promoted to int, and a count >= the promoted width
//   is undefined (x86 masks a run-time count to 5 or 6 bits).
// - float to integer conversion rounds toward zero (MSL section 2.14). Out-of-range values
//   and NaN are undefined in MSL; GPU conversion instructions saturate to the integer's
//   range and turn NaN into 0, which the emulator follows where clang does (scalars with
//   -fno-strict-float-cast-overflow).
#pragma once

#include "mtw_trig.h"
#include "mtw_vec.h"

#define MTW_ELEMENTWISE1(name)                                                \
  template <typename T, int N>                                                \
  MTW_INLINE metal::vec<T, N> __metal_##name(metal::vec<T, N> x, int m = 0) { \
    metal::vec<T, N> r;                                                       \
    for (int i = 0; i < N; ++i) r[i] = T(__metal_##name(x[i], m));            \
    return r;                                                                 \
  }
#define MTW_ELEMENTWISE2(name)                                                      \
  template <typename T, int N>                                                      \
  MTW_INLINE metal::vec<T, N> __metal_##name(metal::vec<T, N> x, metal::vec<T, N> y, \
                                             int m = 0) {                           \
    metal::vec<T, N> r;                                                             \
    for (int i = 0; i < N; ++i) r[i] = T(__metal_##name(x[i], y[i], m));            \
    return r;                                                                       \
  }
#define MTW_ELEMENTWISE3(name)                                                      \
  template <typename T, int N>                                                      \
  MTW_INLINE metal::vec<T, N> __metal_##name(metal::vec<T, N> x, metal::vec<T, N> y, \
                                             metal::vec<T, N> z, int m = 0) {       \
    metal::vec<T, N> r;                                                             \
    for (int i = 0; i < N; ++i) r[i] = T(__metal_##name(x[i], y[i], z[i], m));      \
    return r;                                                                       \
  }

#define MTW_BUILTIN1(name, expr)                                                      \
  MTW_INLINE float __metal_##name(float x, int = 0) { return expr; }                  \
  MTW_INLINE half __metal_##name(half x, int m = 0) {                                 \
    return (half)__metal_##name((float)x, m);                                         \
  }                                                                                   \
  MTW_ELEMENTWISE1(name)
#define MTW_BUILTIN2(name, expr)                                                      \
  MTW_INLINE float __metal_##name(float x, float y, int = 0) { return expr; }         \
  MTW_INLINE half __metal_##name(half x, half y, int m = 0) {                         \
    return (half)__metal_##name((float)x, (float)y, m);                               \
  }                                                                                   \
  MTW_ELEMENTWISE2(name)
#define MTW_BUILTIN3(name, expr)                                                      \
  MTW_INLINE float __metal_##name(float x, float y, float z, int = 0) { return expr; } \
  MTW_INLINE half __metal_##name(half x, half y, half z, int m = 0) {                 \
    return (half)__metal_##name((float)x, (float)y, (float)z, m);                     \
  }                                                                                   \
  MTW_ELEMENTWISE3(name)

namespace mtw_math {

// fmax and fmin of IEEE 754 (maximumNumber, minimumNumber): a NaN loses to a number, and
// +0 is above -0, whichever way round the arguments come.
MTW_INLINE float fmax(float x, float y) {
  if (x != x) return y;
  if (y != y || x > y) return x;
  return x == y && __builtin_signbit(y) ? x : y;
}
MTW_INLINE float fmin(float x, float y) {
  if (x != x) return y;
  if (y != y || x < y) return x;
  return x == y && !__builtin_signbit(y) ? x : y;
}

// x - floor(x), kept below 1 in the result's format (`below_one` is its largest value < 1).
MTW_INLINE float fract(float x, float below_one) {
  if (__builtin_isnan(x)) return x;
  if (__builtin_isinf(x)) return __builtin_copysignf(0.0f, x);
  return fmin(x - __builtin_floorf(x), below_one);
}

}  // namespace mtw_math

MTW_BUILTIN1(acos, mtw_math::acos(x))
MTW_BUILTIN1(acosh, __builtin_acoshf(x))
MTW_BUILTIN1(asin, mtw_math::asin(x))
MTW_BUILTIN1(asinh, __builtin_asinhf(x))
MTW_BUILTIN1(atan, mtw_math::atan(x))
MTW_BUILTIN1(atanh, __builtin_atanhf(x))
MTW_BUILTIN1(cbrt, __builtin_cbrtf(x))
MTW_BUILTIN1(ceil, __builtin_ceilf(x))
MTW_BUILTIN1(cos, mtw_math::cos(x))
MTW_BUILTIN1(cosh, mtw_math::cosh(x))
MTW_BUILTIN1(cospi, mtw_math::cospi(x))
MTW_BUILTIN1(exp, mtw_math::exp(x))
MTW_BUILTIN1(exp2, mtw_math::exp2(x))
MTW_BUILTIN1(exp10, mtw_math::exp10(x))
MTW_BUILTIN1(fabs, __builtin_fabsf(x))
MTW_BUILTIN1(floor, __builtin_floorf(x))
MTW_BUILTIN1(log, mtw_math::log(x))
MTW_BUILTIN1(log10, mtw_math::log10(x))
MTW_BUILTIN1(log2, mtw_math::log2(x))
MTW_BUILTIN1(rint, __builtin_rintf(x))
MTW_BUILTIN1(round, __builtin_roundf(x))
MTW_BUILTIN1(rsqrt, float(1.0 / __builtin_sqrt(double(x))))
MTW_BUILTIN1(sin, mtw_math::sin(x))
MTW_BUILTIN1(sinh, mtw_math::sinh(x))
MTW_BUILTIN1(sinpi, mtw_math::sinpi(x))
MTW_BUILTIN1(sqrt, __builtin_sqrtf(x))
MTW_BUILTIN1(tan, mtw_math::tan(x))
MTW_BUILTIN1(tanh, mtw_math::tanh(x))
MTW_BUILTIN1(tanpi, mtw_math::tanpi(x))
MTW_BUILTIN1(trunc, __builtin_truncf(x))
MTW_BUILTIN1(saturate, mtw_math::fmin(mtw_math::fmax(x, 0.0f), 1.0f))
MTW_BUILTIN1(sign, x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x == x ? x : 0.0f)))
MTW_BUILTIN2(atan2, mtw_math::atan2(x, y))
MTW_BUILTIN2(copysign, __builtin_copysignf(x, y))
MTW_BUILTIN2(divide, x / y)
MTW_BUILTIN2(fdim, __builtin_fdimf(x, y))
MTW_BUILTIN2(fmax, mtw_math::fmax(x, y))
MTW_BUILTIN2(fmin, mtw_math::fmin(x, y))
MTW_BUILTIN2(fmod, __builtin_fmodf(x, y))
MTW_BUILTIN2(pow, mtw_math::pow(x, y))
MTW_BUILTIN2(powr, mtw_math::powr(x, y))
MTW_BUILTIN2(step, y < x ? 0.0f : 1.0f)
MTW_BUILTIN3(fma, __builtin_fmaf(x, y, z))
MTW_BUILTIN3(fmax3, mtw_math::fmax(mtw_math::fmax(x, y), z))
MTW_BUILTIN3(fmin3, mtw_math::fmin(mtw_math::fmin(x, y), z))
MTW_BUILTIN3(fmedian3, mtw_math::fmax(mtw_math::fmin(x, y),
                                      mtw_math::fmin(mtw_math::fmax(x, y), z)))
MTW_BUILTIN3(mix, x + (y - x) * z)
MTW_BUILTIN3(smoothstep, ([&] {
               float t = mtw_math::fmin(mtw_math::fmax((z - x) / (y - x), 0.0f), 1.0f);
               return t * t * (3.0f - 2.0f * t);
             })())

MTW_INLINE float __metal_fract(float x, int = 0) { return mtw_math::fract(x, 0x1.fffffep-1f); }
MTW_INLINE half __metal_fract(half x, int = 0) {
  return (half)mtw_math::fract(float(x), 0x1.ffcp-1f);
}
MTW_ELEMENTWISE1(fract)
MTW_INLINE float __metal_nextafter(float x, float y) { return __builtin_nextafterf(x, y); }
MTW_INLINE half __metal_nextafter(half x, half y) {
  if (x != x || y != y) return x + y;
  if (x == y) return y;
  uint16_t bits = __builtin_bit_cast(uint16_t, x);
  if ((bits & 0x7fff) == 0) return __builtin_bit_cast(half, uint16_t(y > x ? 1 : 0x8001));
  bool away = (y > x) == !(bits & 0x8000);
  return __builtin_bit_cast(half, uint16_t(away ? bits + 1 : bits - 1));
}
MTW_INLINE float __metal_frexp(float x, int* e) { return __builtin_frexpf(x, e); }
MTW_INLINE half __metal_frexp(half x, int* e) { return (half)__builtin_frexpf((float)x, e); }
MTW_INLINE float __metal_ldexp(float x, int k, int = 0) { return __builtin_ldexpf(x, k); }
MTW_INLINE half __metal_ldexp(half x, int k, int = 0) { return (half)__builtin_ldexpf(x, k); }

namespace metal {

// Scalar/vector front ends in one precision mode. Integer and double arguments pick the
// float overload, which is what Metal's implicit conversions do.
template <typename... A>
constexpr bool __int_or_double_v = ((is_integral_v<A> || is_same_v<A, double>) && ...);
#define MTW_FRONT1(name, mode)                                                            \
  MTW_INLINE float name(float x) { return __metal_##name(x, mode); }                      \
  MTW_INLINE half name(half x) { return __metal_##name(x, mode); }                        \
  template <typename T, int N>                                                            \
  MTW_INLINE vec<T, N> name(vec<T, N> x) {                                                \
    return __metal_##name(x, mode);                                                       \
  }                                                                                       \
  template <typename S, typename = enable_if_t<is_integral_v<S> || is_same_v<S, double>>> \
  MTW_INLINE float name(S x) {                                                            \
    return __metal_##name(float(x), mode);                                                \
  }
// Two- and three-argument functions also take a vector with scalars, in any places
// (`fmax(0, v)`, `mix(a, b, t)`, `step(edge, v)`, `smoothstep(e0, e1, v)`; MSL specification,
// "Math Functions" and "Common Functions"): the scalars convert to the vector's type.
#define MTW_FRONT2(name, mode)                                                          \
  MTW_INLINE float name(float x, float y) { return __metal_##name(x, y, mode); }        \
  MTW_INLINE half name(half x, half y) { return __metal_##name(x, y, mode); }           \
  template <typename A, typename B, typename = enable_if_t<__int_or_double_v<A, B>>>    \
  MTW_INLINE float name(A x, B y) {                                                     \
    return __metal_##name(float(x), float(y), mode);                                    \
  }                                                                                     \
  template <typename A, typename B, typename V = __float_vector_call_t<A, B>>           \
  MTW_INLINE V name(A x, B y) {                                                         \
    return __metal_##name(V(x), V(y), mode);                                            \
  }
#define MTW_FRONT3(name, mode)                                                               \
  MTW_INLINE float name(float x, float y, float z) { return __metal_##name(x, y, z, mode); } \
  MTW_INLINE half name(half x, half y, half z) { return __metal_##name(x, y, z, mode); }     \
  template <typename A, typename B, typename C,                                              \
            typename = enable_if_t<__int_or_double_v<A, B, C>>>                              \
  MTW_INLINE float name(A x, B y, C z) {                                                     \
    return __metal_##name(float(x), float(y), float(z), mode);                               \
  }                                                                                          \
  template <typename A, typename B, typename C, typename V = __float_vector_call_t<A, B, C>> \
  MTW_INLINE V name(A x, B y, C z) {                                                         \
    return __metal_##name(V(x), V(y), V(z), mode);                                           \
  }

// Functions with an integer part (ldexp, frexp, ilogb, modf, sincos), per component.
#define MTW_SPLIT_FUNCTIONS(mode)                                                         \
  MTW_INLINE float ldexp(float x, int k) { return __metal_ldexp(x, k, mode); }            \
  MTW_INLINE half ldexp(half x, int k) { return __metal_ldexp(x, k, mode); }              \
  template <typename T, int N>                                                            \
  MTW_INLINE vec<T, N> ldexp(vec<T, N> x, vec<int, N> k) {                                \
    for (int i = 0; i < N; ++i) x[i] = __metal_ldexp(x[i], k[i], mode);                   \
    return x;                                                                             \
  }                                                                                       \
  MTW_INLINE float frexp(float x, thread int& e) { return __metal_frexp(x, &e); }         \
  MTW_INLINE half frexp(half x, thread int& e) { return __metal_frexp(x, &e); }           \
  template <typename T, int N>                                                            \
  MTW_INLINE vec<T, N> frexp(vec<T, N> x, thread vec<int, N>& e) {                        \
    for (int i = 0; i < N; ++i) x[i] = __metal_frexp(x[i], &e[i]);                        \
    return x;                                                                             \
  }                                                                                       \
  MTW_INLINE int ilogb(float x) { return __builtin_ilogbf(x); }                           \
  MTW_INLINE int ilogb(half x) { return __builtin_ilogbf(float(x)); }                     \
  template <typename T, int N>                                                            \
  MTW_INLINE vec<int, N> ilogb(vec<T, N> x) {                                             \
    vec<int, N> r;                                                                        \
    for (int i = 0; i < N; ++i) r[i] = ilogb(x[i]);                                       \
    return r;                                                                             \
  }                                                                                       \
  template <typename T, typename = enable_if_t<is_same_v<T, float> || is_same_v<T, half>>> \
  MTW_INLINE T modf(T x, thread T& whole) {                                               \
    whole = T(__builtin_truncf(float(x)));                                                \
    return T(__builtin_copysignf(__builtin_isinf(float(x)) ? 0.0f : float(x - whole),     \
                                 float(x)));                                              \
  }                                                                                       \
  template <typename T, int N>                                                            \
  MTW_INLINE vec<T, N> modf(vec<T, N> x, thread vec<T, N>& whole) {                       \
    for (int i = 0; i < N; ++i) x[i] = modf(x[i], whole[i]);                              \
    return x;                                                                             \
  }                                                                                       \
  template <typename T, typename = enable_if_t<is_same_v<T, float> || is_same_v<T, half> || \
                                               __is_vec_v<T>>>                            \
  MTW_INLINE T sincos(T x, thread T& cosine) {                                            \
    cosine = __metal_cos(x, mode);                                                        \
    return __metal_sin(x, mode);                                                          \
  }

#define MTW_MATH_FUNCTIONS(mode)                                                            \
  MTW_FRONT1(acos, mode) MTW_FRONT1(acosh, mode) MTW_FRONT1(asin, mode)                    \
  MTW_FRONT1(asinh, mode) MTW_FRONT1(atan, mode) MTW_FRONT1(atanh, mode)                   \
  MTW_FRONT1(cbrt, mode) MTW_FRONT1(ceil, mode) MTW_FRONT1(cos, mode)                      \
  MTW_FRONT1(cosh, mode) MTW_FRONT1(cospi, mode) MTW_FRONT1(exp, mode)                     \
  MTW_FRONT1(exp2, mode) MTW_FRONT1(exp10, mode) MTW_FRONT1(fabs, mode)                    \
  MTW_FRONT1(floor, mode) MTW_FRONT1(fract, mode) MTW_FRONT1(log, mode)                    \
  MTW_FRONT1(log10, mode) MTW_FRONT1(log2, mode) MTW_FRONT1(rint, mode)                    \
  MTW_FRONT1(round, mode) MTW_FRONT1(rsqrt, mode) MTW_FRONT1(sin, mode)                    \
  MTW_FRONT1(sinh, mode) MTW_FRONT1(sinpi, mode) MTW_FRONT1(sqrt, mode)                    \
  MTW_FRONT1(tan, mode) MTW_FRONT1(tanh, mode) MTW_FRONT1(tanpi, mode)                     \
  MTW_FRONT1(trunc, mode) MTW_FRONT1(saturate, mode) MTW_FRONT1(sign, mode)               \
  MTW_FRONT2(atan2, mode) MTW_FRONT2(copysign, mode) MTW_FRONT2(divide, mode)              \
  MTW_FRONT2(fdim, mode) MTW_FRONT2(fmax, mode) MTW_FRONT2(fmin, mode)                     \
  MTW_FRONT2(fmod, mode) MTW_FRONT2(pow, mode) MTW_FRONT2(powr, mode)                      \
  MTW_FRONT2(step, mode) MTW_FRONT3(fma, mode) MTW_FRONT3(fmax3, mode)                     \
  MTW_FRONT3(fmin3, mode) MTW_FRONT3(fmedian3, mode) MTW_FRONT3(mix, mode)                 \
  MTW_FRONT3(smoothstep, mode)                                                              \
  MTW_SPLIT_FUNCTIONS(mode)                                                                 \
  MTW_INLINE float nextafter(float x, float y) { return __metal_nextafter(x, y); }         \
  MTW_INLINE half nextafter(half x, half y) { return __metal_nextafter(x, y); }            \
  template <typename T, int N>                                                              \
  MTW_INLINE vec<T, N> nextafter(vec<T, N> x, vec<T, N> y) {                                \
    for (int i = 0; i < N; ++i) x[i] = __metal_nextafter(x[i], y[i]);                       \
    return x;                                                                               \
  }                                                                                         \
  template <typename A, typename B, typename V = __float_vector_call_t<A, B>>               \
  MTW_INLINE V nextafter(A x, B y) {                                                        \
    return nextafter(V(x), V(y));                                                           \
  }

MTW_MATH_FUNCTIONS(__METAL_MAYBE_FAST_MATH__)
namespace fast {
MTW_MATH_FUNCTIONS(__METAL_FAST_MATH__)
}
namespace precise {
MTW_MATH_FUNCTIONS(__METAL_PRECISE_MATH__)
}
#undef MTW_MATH_FUNCTIONS
#undef MTW_SPLIT_FUNCTIONS

}  // namespace metal

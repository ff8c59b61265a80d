// Metal's bfloat scalar type.
//
// MSL (3.1 and later, "Scalar Data Types" and "Implicit Type Conversions") makes bfloat an
// extended floating-point type that converts implicitly only to a type of greater floating
// rank: bfloat goes to float without a cast, while float and half need an explicit
// conversion to bfloat, and bfloat one to half. clang's own __bf16 refuses any conversion
// to or from _Float16, even an explicit one, which MSL allows (MLX's fp8.h casts half to
// bfloat), so bfloat is a class around a __bf16 that implements MSL's rules:
// - explicit construction from float, half and double; implicit from integers, which
//   convert to bfloat when mixed with one (C++'s usual arithmetic conversions);
// - implicit conversion to float, bool and unsigned integers, so `bfloat + float` is a
//   float; explicit ones to half and signed integers (through float, which holds every
//   bfloat exactly). MSL converts bfloat to signed integers implicitly too, which a class
//   cannot do without making `c ? b : 0` ambiguous: such code needs a cast here; and
//   bfloat with half needs one, as in MSL;
// - bfloat with bfloat, or with an integer, computes in float and rounds once to bfloat
//   (clang's __bf16 arithmetic without excess precision, and Apple's ALU), ties to even,
//   subnormals kept (__truncsfbf2 below).
#pragma once

#include <stdint.h>

// float -> bfloat bits, rounding to nearest even and keeping subnormals (as MLX does), in
// integer operations.
constexpr __attribute__((always_inline)) inline uint16_t __mtw_bf16_bits(float x) {
  uint32_t u = __builtin_bit_cast(uint32_t, x);
  return (u & 0x7fffffffu) > 0x7f800000u
             ? uint16_t((u >> 16) | 0x40)  // NaN stays NaN (quiet)
             : uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// What clang calls for a float -> bfloat conversion it does not inline (its own version,
// and x86's instruction, turned off by the driver, flush subnormals to zero).
extern "C" __attribute__((visibility("hidden"))) __bf16 __truncsfbf2(float x) {
  return __builtin_bit_cast(__bf16, __mtw_bf16_bits(x));
}

#ifndef MTW_PROFILE
// Every rounding of the shim's bfloat is written in integer operations rather than left to
// the compiler's float -> bfloat conversion: arm64's code generator (LLVM, for a CPU
// without bfloat instructions, such as Apple's M1) rounds a vectorized
// `bfloat(float(a) + float(b))` of bfloat operands with the wrong lane's tie bit, so a loop
// over threads rounded ties differently from the same code run one thread at a time.
constexpr __attribute__((always_inline)) inline __bf16 __mtw_round_bf16(float x) {
  return __builtin_bit_cast(__bf16, __mtw_bf16_bits(x));
}

// The same for each component of a float vector.
template <int N>
constexpr __attribute__((always_inline)) inline __bf16 __attribute__((ext_vector_type(N)))
__mtw_round_bf16(float __attribute__((ext_vector_type(N))) x) {
  typedef uint32_t wide __attribute__((ext_vector_type(N)));
  typedef uint16_t narrow __attribute__((ext_vector_type(N)));
  typedef __bf16 result __attribute__((ext_vector_type(N)));
  wide u = __builtin_bit_cast(wide, x);
  wide nan = (wide)((u & 0x7fffffffu) > 0x7f800000u);  // all ones where x is a NaN
  wide r = (((u >> 16) | 0x40u) & nan) | (((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) & ~nan);
  return __builtin_bit_cast(result, __builtin_convertvector(r, narrow));
}

// bfloat `a op b`: in float, rounded once.
#define MTW_BF_OPERATION(a, op, b) __mtw_round_bf16(float(a) op float(b))
#else
// Profiled builds keep clang's own bfloat operations and conversions, which the profiler
// counts as bfloat arithmetic (as an Apple GPU runs it); they are never vectorized
// (compiler.PROFILE_FLAGS), so each of their roundings is __truncsfbf2's, above.
constexpr __attribute__((always_inline)) inline __bf16 __mtw_round_bf16(float x) {
  return __bf16(x);
}
template <int N>
constexpr __attribute__((always_inline)) inline __bf16 __attribute__((ext_vector_type(N)))
__mtw_round_bf16(float __attribute__((ext_vector_type(N))) x) {
  return __builtin_convertvector(x, __bf16 __attribute__((ext_vector_type(N))));
}
#define MTW_BF_OPERATION(a, op, b) ((a)op(b))
#endif

template <bool c>
struct __mtw_bf_if {};
template <>
struct __mtw_bf_if<true> {
  using type = int;
};
template <typename T>
T&& __mtw_bf_declval();
// A class with a conversion to bool (MLX's _NoMask), probed without overload resolution.
template <typename U>
using __mtw_bf_to_bool = decltype((void)__mtw_bf_declval<const U&>().operator bool());
template <typename U, typename = void>
constexpr bool __mtw_bf_boolish = false;
template <typename U>
constexpr bool __mtw_bf_boolish<U, __mtw_bf_to_bool<U>> = true;
template <typename A>
constexpr bool __mtw_bf_implicit_target =
    __is_same(A, float) || (__is_integral(A) && __is_unsigned(A));  // bool is unsigned
// Overloads for integer operands, and constructors from floating-point ones.
#define MTW_BF_INTEGER(T) typename __mtw_bf_if<__is_integral(T)>::type = 0
// float and double, which a bfloat operand widens to (bfloat + float is a float).
#define MTW_BF_WIDER(T)                                                                    \
  typename __mtw_bf_if<__is_same(T, float) || __is_same(T, double)>::type = 0
#define MTW_BF_FLOATING(T)                                                                 \
  typename __mtw_bf_if<__is_floating_point(T) || __is_same(T, __bf16)>::type = 0

#define MTW_BF_FN constexpr __attribute__((always_inline))

struct __mtw_bfloat {
  __bf16 __value;

  __mtw_bfloat() = default;
  template <typename F, MTW_BF_FLOATING(F)>
  explicit MTW_BF_FN __mtw_bfloat(F x)
      : __value(__mtw_round_bf16(float(x))) {}
  // Through float, as clang's own conversion does (an integer above 2^24 rounds twice).
  template <typename I, MTW_BF_INTEGER(I)>
  MTW_BF_FN __mtw_bfloat(I x) : __value(__mtw_round_bf16(float(x))) {}
  // A class converting to a number converts on as that number would: implicitly from a
  // bool, explicitly from anything else that converts to float.
  template <typename U, typename __mtw_bf_if<__mtw_bf_boolish<U>>::type = 0>
  MTW_BF_FN __mtw_bfloat(const U& u)
      : __value(__mtw_round_bf16(float(bool(u)))) {}
  template <typename U, typename __mtw_bf_if<__is_class(U) && !__mtw_bf_boolish<U> &&
                                             __is_convertible(U, float)>::type = 0>
  explicit MTW_BF_FN __mtw_bfloat(const U& u)
      : __value(__mtw_round_bf16(float(u))) {}

  // Implicitly to float, bool and the unsigned integers (MLX's sort.h stores a bfloat into
  // a uint), explicitly to half and the signed integers: were bfloat -> int implicit like
  // int -> bfloat, `c ? b : 0` would be ambiguous instead of a bfloat. (Templates: a
  // conversion template yields exactly its target, so no conversion goes on from float.)
  template <typename A, typename __mtw_bf_if<__mtw_bf_implicit_target<A>>::type = 0>
  MTW_BF_FN operator A() const {
    return A(float(__value));
  }
  template <typename A, typename __mtw_bf_if<__is_arithmetic(A) &&
                                             !__mtw_bf_implicit_target<A>>::type = 0>
  explicit MTW_BF_FN operator A() const {
    return A(float(__value));
  }

  static MTW_BF_FN __mtw_bfloat from(__bf16 v) {
    __mtw_bfloat r;
    r.__value = v;
    return r;
  }

#define MTW_BF_ARITHMETIC(op)                                                              \
  friend MTW_BF_FN __mtw_bfloat operator op(__mtw_bfloat a,                                \
                                                                           __mtw_bfloat b) { \
    return from(MTW_BF_OPERATION(a.__value, op, b.__value));                               \
  }                                                                                        \
  template <typename I, MTW_BF_INTEGER(I)>                                                 \
  friend MTW_BF_FN __mtw_bfloat operator op(__mtw_bfloat a,                                \
                                                                           I b) {          \
    return a op __mtw_bfloat(b);                                                           \
  }                                                                                        \
  template <typename I, MTW_BF_INTEGER(I)>                                                 \
  friend MTW_BF_FN __mtw_bfloat operator op(I a,                                           \
                                                                           __mtw_bfloat b) { \
    return __mtw_bfloat(a) op b;                                                           \
  }                                                                                        \
  template <typename F, MTW_BF_WIDER(F)>                                                   \
  friend MTW_BF_FN F operator op(__mtw_bfloat a, F b) {                                    \
    return F(float(a)) op b;                                                               \
  }                                                                                        \
  template <typename F, MTW_BF_WIDER(F)>                                                   \
  friend MTW_BF_FN F operator op(F a, __mtw_bfloat b) {                                    \
    return a op F(float(b));                                                               \
  }                                                                                        \
  template <typename U>                                                                    \
  MTW_BF_FN __mtw_bfloat& operator op##=(U b) {                                            \
    return *this = __mtw_bfloat(*this op b);                                               \
  }                                                                                        \
  /* `x op= b` for a float or integer x, computed as `x op b` is. */                       \
  template <typename F, MTW_BF_WIDER(F)>                                                   \
  friend MTW_BF_FN F& operator op##=(F & a, __mtw_bfloat b) {                              \
    return a = a op b;                                                                     \
  }                                                                                        \
  template <typename I, MTW_BF_INTEGER(I)>                                                 \
  friend MTW_BF_FN I& operator op##=(I & a, __mtw_bfloat b) {                              \
    return a = I(a op b);                                                                  \
  }
  MTW_BF_ARITHMETIC(+)
  MTW_BF_ARITHMETIC(-)
  MTW_BF_ARITHMETIC(*)
  MTW_BF_ARITHMETIC(/)
#undef MTW_BF_ARITHMETIC
#undef MTW_BF_OPERATION

  // Comparisons: with an integer, which converts to bfloat first, or as floats.
#define MTW_BF_COMPARE(op)                                                                 \
  friend MTW_BF_FN bool operator op(__mtw_bfloat a,                                        \
                                                                   __mtw_bfloat b) {       \
    return float(a) op float(b);                                                           \
  }                                                                                        \
  template <typename I, MTW_BF_INTEGER(I)>                                                 \
  friend MTW_BF_FN bool operator op(__mtw_bfloat a, I b) {                                 \
    return float(a) op float(__mtw_bfloat(b));                                             \
  }                                                                                        \
  template <typename I, MTW_BF_INTEGER(I)>                                                 \
  friend MTW_BF_FN bool operator op(I a, __mtw_bfloat b) {                                 \
    return float(__mtw_bfloat(a)) op float(b);                                             \
  }                                                                                        \
  template <typename F, MTW_BF_WIDER(F)>                                                   \
  friend MTW_BF_FN bool operator op(__mtw_bfloat a, F b) {                                 \
    return F(float(a)) op b;                                                               \
  }                                                                                        \
  template <typename F, MTW_BF_WIDER(F)>                                                   \
  friend MTW_BF_FN bool operator op(F a, __mtw_bfloat b) {                                 \
    return a op F(float(b));                                                               \
  }
  MTW_BF_COMPARE(==)
  MTW_BF_COMPARE(!=)
  MTW_BF_COMPARE(<)
  MTW_BF_COMPARE(<=)
  MTW_BF_COMPARE(>)
  MTW_BF_COMPARE(>=)
#undef MTW_BF_COMPARE

  friend MTW_BF_FN __mtw_bfloat operator-(__mtw_bfloat a) {
    return from(-a.__value);
  }
  friend MTW_BF_FN __mtw_bfloat operator+(__mtw_bfloat a) {
    return a;
  }
  MTW_BF_FN __mtw_bfloat& operator++() {
    return *this = *this + 1;
  }
  MTW_BF_FN __mtw_bfloat& operator--() {
    return *this = *this - 1;
  }
  MTW_BF_FN __mtw_bfloat operator++(int) {
    __mtw_bfloat old = *this;
    ++*this;
    return old;
  }
  MTW_BF_FN __mtw_bfloat operator--(int) {
    __mtw_bfloat old = *this;
    --*this;
    return old;
  }
};
#undef MTW_BF_FN
#undef MTW_BF_INTEGER
#undef MTW_BF_FLOATING
#undef MTW_BF_WIDER
static_assert(sizeof(__mtw_bfloat) == 2 && alignof(__mtw_bfloat) == 2, "bfloat is 2 bytes");

typedef __mtw_bfloat bfloat;

// Language-level pieces of MSL on a C++ compiler: address spaces, function qualifiers,
// scalar type names, type traits and numeric limits.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "mtw_abi.h"
#include "mtw_bfloat.h"

// Address spaces. Declarations of threadgroup variables are rewritten before compilation
// (see mtwork/backends/sim/compile/rewrite.py) to live in the threadgroup's shared memory; the words
// left over are qualifiers on pointers and references, which need no code on a CPU.
// `constant` memory is read-only (MSL specification, "constant Address Space"), so the word
// is `const`: a `constexpr constant float t[16]` table then passes to a `constant float*`
// parameter. `const constant T&` repeats the const, which clang accepts (warning off).
#pragma clang diagnostic ignored "-Wduplicate-decl-specifier"
#ifdef __OPENCL_CPP_VERSION__
// The address-space check (mtwork/backends/sim/compile/address_spaces.py) parses kernels as
// C++ for OpenCL, whose address spaces are real: a conversion between two of them is an
// error, as in Metal. Local variables are OpenCL's __private (Metal's thread), so the three
// named spaces take the other three; before MSL 4.1 the check turns OpenCL's generic space
// off, so an unqualified pointer is __private too, as it is thread in Metal.
#define device __global
#define constant __constant
#define thread
#define threadgroup __local
#else
#define device
#define constant const
#define thread
#define threadgroup
#endif
#define threadgroup_imageblock
#define ray_data
#define object_data
// Memory coherence (`volatile coherent(system) device T*`): CPU memory is coherent already.
#define coherent(scope)
// Function qualifiers: a kernel is an ordinary function here (the launcher calls it).
#define kernel

// MSL's assert: it checks nothing here (as a C++ assert under NDEBUG), but its condition
// must still compile.
#ifndef assert
#define assert(condition) ((void)sizeof((condition) ? 1 : 0))
#endif

#define METAL_FUNC inline __attribute__((always_inline))
#define METAL_INTERNAL
#define METAL_ASM
#define MTW_INLINE inline __attribute__((always_inline))

// Math precision selectors taken by the __metal_* builtins (as in MLX's bf16_math.h).
#define __METAL_PRECISE_MATH__ 0
#define __METAL_FAST_MATH__ 1
#ifdef __FAST_MATH__
#define __METAL_MAYBE_FAST_MATH__ 1
#else
#define __METAL_MAYBE_FAST_MATH__ 0
#endif

// What the compiler builds for a braced list (`uint4 ks = {a, b, c};`); laid out as clang
// requires (a pointer and a length). Metal code uses no C++ library, so nothing else
// defines it.
namespace std {
template <typename E>
class initializer_list {
  const E* __begin;
  size_t __size;
  constexpr initializer_list(const E* b, size_t n) : __begin(b), __size(n) {}

 public:
  constexpr initializer_list() : __begin(nullptr), __size(0) {}
  constexpr size_t size() const { return __size; }
  constexpr const E* begin() const { return __begin; }
  constexpr const E* end() const { return __begin + __size; }
};
}  // namespace std

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;

namespace metal {

// ---- type traits -------------------------------------------------------------------------
template <typename T, T v>
struct integral_constant {
  static constexpr T value = v;
  using value_type = T;
  constexpr operator T() const { return v; }
};
template <bool b>
using bool_constant = integral_constant<bool, b>;
using true_type = bool_constant<true>;
using false_type = bool_constant<false>;

template <typename A, typename B>
struct is_same : false_type {};
template <typename A>
struct is_same<A, A> : true_type {};
template <typename A, typename B>
constexpr bool is_same_v = is_same<A, B>::value;

template <bool c, typename T = void>
struct enable_if {};
template <typename T>
struct enable_if<true, T> {
  using type = T;
};
template <bool c, typename T = void>
using enable_if_t = typename enable_if<c, T>::type;

template <bool c, typename A, typename B>
struct conditional {
  using type = A;
};
template <typename A, typename B>
struct conditional<false, A, B> {
  using type = B;
};
template <bool c, typename A, typename B>
using conditional_t = typename conditional<c, A, B>::type;

template <typename T> struct remove_const { using type = T; };
template <typename T> struct remove_const<const T> { using type = T; };
template <typename T> struct remove_volatile { using type = T; };
template <typename T> struct remove_volatile<volatile T> { using type = T; };
template <typename T> struct remove_cv {
  using type = typename remove_volatile<typename remove_const<T>::type>::type;
};
template <typename T> using remove_cv_t = typename remove_cv<T>::type;
template <typename T> struct remove_reference { using type = T; };
template <typename T> struct remove_reference<T&> { using type = T; };
template <typename T> struct remove_reference<T&&> { using type = T; };
template <typename T> using remove_reference_t = typename remove_reference<T>::type;
template <typename T> struct remove_pointer { using type = T; };
template <typename T> struct remove_pointer<T*> { using type = T; };
template <typename T> using remove_pointer_t = typename remove_pointer<T>::type;
// Address spaces do not exist here, so removing one is the identity.
template <typename T> struct remove_addrspace { using type = T; };
template <typename T> using remove_addrspace_t = typename remove_addrspace<T>::type;
template <typename T> using remove_cvref_t = remove_cv_t<remove_reference_t<T>>;
template <typename T> struct decay { using type = remove_cv_t<remove_reference_t<T>>; };
template <typename T> using decay_t = typename decay<T>::type;

template <typename T> struct __is_integral_base : false_type {};
#define MTW_INTEGRAL(T) template <> struct __is_integral_base<T> : true_type {};
MTW_INTEGRAL(bool)
MTW_INTEGRAL(char)
MTW_INTEGRAL(signed char)
MTW_INTEGRAL(unsigned char)
MTW_INTEGRAL(short)
MTW_INTEGRAL(unsigned short)
MTW_INTEGRAL(int)
MTW_INTEGRAL(unsigned int)
MTW_INTEGRAL(long)
MTW_INTEGRAL(unsigned long)
MTW_INTEGRAL(long long)
MTW_INTEGRAL(unsigned long long)
#undef MTW_INTEGRAL
template <typename T> struct is_integral : __is_integral_base<remove_cv_t<T>> {};
template <typename T> constexpr bool is_integral_v = is_integral<T>::value;

template <typename T> struct __is_float_base : false_type {};
template <> struct __is_float_base<half> : true_type {};
template <> struct __is_float_base<bfloat> : true_type {};
template <> struct __is_float_base<__bf16> : true_type {};  // bfloat's storage
template <> struct __is_float_base<float> : true_type {};
template <> struct __is_float_base<double> : true_type {};
template <typename T> struct is_floating_point : __is_float_base<remove_cv_t<T>> {};
template <typename T> constexpr bool is_floating_point_v = is_floating_point<T>::value;

template <typename T>
struct is_arithmetic : bool_constant<is_integral_v<T> || is_floating_point_v<T>> {};
template <typename T> constexpr bool is_arithmetic_v = is_arithmetic<T>::value;
template <typename T>
struct is_signed : bool_constant<is_arithmetic_v<T> && (T(-1) < T(0))> {};
template <typename T> constexpr bool is_signed_v = is_signed<T>::value;
template <typename T>
struct is_unsigned : bool_constant<is_integral_v<T> && !(T(-1) < T(0))> {};
template <typename T> constexpr bool is_unsigned_v = is_unsigned<T>::value;
template <typename T> struct is_pointer : false_type {};
template <typename T> struct is_pointer<T*> : true_type {};
template <typename T> constexpr bool is_pointer_v = is_pointer<T>::value;
template <typename T> struct is_const : false_type {};
template <typename T> struct is_const<const T> : true_type {};
template <typename T> constexpr bool is_const_v = is_const<T>::value;
template <typename A, typename B>
struct is_convertible : bool_constant<__is_convertible_to(A, B)> {};
template <typename A, typename B> constexpr bool is_convertible_v = is_convertible<A, B>::value;

template <typename T> struct make_unsigned;
template <> struct make_unsigned<char> { using type = uchar; };
template <> struct make_unsigned<signed char> { using type = uchar; };
template <> struct make_unsigned<uchar> { using type = uchar; };
template <> struct make_unsigned<short> { using type = ushort; };
template <> struct make_unsigned<ushort> { using type = ushort; };
template <> struct make_unsigned<int> { using type = uint; };
template <> struct make_unsigned<uint> { using type = uint; };
template <> struct make_unsigned<long> { using type = ulong; };
template <> struct make_unsigned<ulong> { using type = ulong; };
template <typename T> using make_unsigned_t = typename make_unsigned<T>::type;
template <typename T> struct make_signed;
template <> struct make_signed<char> { using type = signed char; };
template <> struct make_signed<signed char> { using type = signed char; };
template <> struct make_signed<uchar> { using type = signed char; };
template <> struct make_signed<short> { using type = short; };
template <> struct make_signed<ushort> { using type = short; };
template <> struct make_signed<int> { using type = int; };
template <> struct make_signed<uint> { using type = int; };
template <> struct make_signed<long> { using type = long; };
template <> struct make_signed<ulong> { using type = long; };
template <typename T> using make_signed_t = typename make_signed<T>::type;

template <typename T> T&& __declval();
template <typename T, typename...> struct __first { using type = T; };
template <typename... T> using __first_t = typename __first<T...>::type;
template <typename T> struct is_void : is_same<remove_cv_t<T>, void> {};
template <typename T> constexpr bool is_void_v = is_void<T>::value;

// ---- numeric limits ----------------------------------------------------------------------
template <typename T>
struct numeric_limits {
  static constexpr bool is_specialized = false;
};

template <typename T, T lo, T hi, int bits>
struct __integer_limits {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = lo != 0;
  static constexpr bool is_integer = true;
  static constexpr bool is_exact = true;
  static constexpr bool has_infinity = false;
  static constexpr bool has_quiet_NaN = false;
  static constexpr int digits = bits - (lo != 0 ? 1 : 0);
  static constexpr T min() { return lo; }
  static constexpr T max() { return hi; }
  static constexpr T lowest() { return lo; }
  static constexpr T epsilon() { return 0; }
  static constexpr T infinity() { return 0; }
  static constexpr T quiet_NaN() { return 0; }
};
template <> struct numeric_limits<bool> : __integer_limits<bool, false, true, 1> {};
template <> struct numeric_limits<char> : __integer_limits<char, -128, 127, 8> {};
template <> struct numeric_limits<signed char> : __integer_limits<signed char, -128, 127, 8> {};
template <> struct numeric_limits<uchar> : __integer_limits<uchar, 0, 255, 8> {};
template <> struct numeric_limits<short> : __integer_limits<short, -32768, 32767, 16> {};
template <> struct numeric_limits<ushort> : __integer_limits<ushort, 0, 65535, 16> {};
template <>
struct numeric_limits<int> : __integer_limits<int, -2147483647 - 1, 2147483647, 32> {};
template <> struct numeric_limits<uint> : __integer_limits<uint, 0, 4294967295u, 32> {};
template <>
struct numeric_limits<long>
    : __integer_limits<long, -9223372036854775807L - 1, 9223372036854775807L, 64> {};
template <>
struct numeric_limits<ulong> : __integer_limits<ulong, 0, 18446744073709551615ul, 64> {};
template <>
struct numeric_limits<long long>
    : __integer_limits<long long, -9223372036854775807LL - 1, 9223372036854775807LL, 64> {};
template <>
struct numeric_limits<unsigned long long>
    : __integer_limits<unsigned long long, 0, 18446744073709551615ull, 64> {};

template <typename T, typename Bits, Bits min_bits, Bits max_bits, Bits eps_bits, Bits inf_bits,
          Bits nan_bits, Bits snan_bits, Bits denorm_bits, int mantissa, int exp_min, int exp_max>
struct __float_limits {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr int digits = mantissa;
  static constexpr int min_exponent = exp_min;
  static constexpr int max_exponent = exp_max;
  static constexpr T min() { return __builtin_bit_cast(T, min_bits); }
  static constexpr T max() { return __builtin_bit_cast(T, max_bits); }
  static constexpr T lowest() { return -max(); }
  static constexpr T epsilon() { return __builtin_bit_cast(T, eps_bits); }
  static constexpr T infinity() { return __builtin_bit_cast(T, inf_bits); }
  static constexpr T quiet_NaN() { return __builtin_bit_cast(T, nan_bits); }
  static constexpr T signaling_NaN() { return __builtin_bit_cast(T, snan_bits); }
  static constexpr T denorm_min() { return __builtin_bit_cast(T, denorm_bits); }
  static constexpr T round_error() { return T(0.5f); }
};
template <>
struct numeric_limits<float>
    : __float_limits<float, uint32_t, 0x00800000u, 0x7f7fffffu, 0x34000000u, 0x7f800000u,
                     0x7fc00000u, 0x7fa00000u, 0x00000001u, 24, -125, 128> {};
template <>
struct numeric_limits<half>
    : __float_limits<half, uint16_t, 0x0400, 0x7bff, 0x1400, 0x7c00, 0x7e00, 0x7d00, 0x0001, 11,
                     -13, 16> {};
template <>
struct numeric_limits<bfloat>
    : __float_limits<bfloat, uint16_t, 0x0080, 0x7f7f, 0x3c00, 0x7f80, 0x7fc0, 0x7fa0, 0x0001, 8,
                     -125, 128> {};
template <>
struct numeric_limits<double>
    : __float_limits<double, uint64_t, 0x0010000000000000ull, 0x7fefffffffffffffull,
                     0x3cb0000000000000ull, 0x7ff0000000000000ull, 0x7ff8000000000000ull,
                     0x7ff4000000000000ull, 1ull, 53, -1021, 1024> {};
template <typename T> struct numeric_limits<const T> : numeric_limits<T> {};

}  // namespace metal

// Constants of Apple's <metal_math> and <metal_limits> (MSL specification, section 6).
#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#define HUGE_VALF __builtin_huge_valf()
#define MAXFLOAT 0x1.fffffep+127f
#define FLT_MAX 0x1.fffffep+127f
#define FLT_MIN 0x1p-126f
#define FLT_EPSILON 0x1p-23f
#define FLT_MANT_DIG 24
#define FLT_DIG 6
#define HALF_MAX ((half)65504.0f)
#define HALF_MIN ((half)0x1p-14f)
#define HALF_EPSILON ((half)0x1p-10f)
#define MAXHALF HALF_MAX
#define HUGE_VALH ((half)__builtin_huge_valf())
#define CHAR_BIT 8
#define SCHAR_MAX 127
#define SCHAR_MIN (-128)
#define UCHAR_MAX 255
#define SHRT_MAX 32767
#define SHRT_MIN (-32768)
#define USHRT_MAX 65535
#define INT_MAX 2147483647
#define INT_MIN (-2147483647 - 1)
#define UINT_MAX 4294967295u
#define LONG_MAX 9223372036854775807L
#define LONG_MIN (-9223372036854775807L - 1)
#define ULONG_MAX 18446744073709551615ul
#define M_E_F 2.71828182845904523536028747135266250f
#define M_LOG2E_F 1.44269504088896340735992468100189214f
#define M_LOG10E_F 0.434294481903251827651128918916605082f
#define M_LN2_F 0.693147180559945309417232121458176568f
#define M_LN10_F 2.30258509299404568401799145468436421f
#define M_PI_F 3.14159265358979323846264338327950288f
#define M_PI_2_F 1.57079632679489661923132169163975144f
#define M_PI_4_F 0.785398163397448309615660845819875721f
#define M_1_PI_F 0.318309886183790671537767526745028724f
#define M_2_PI_F 0.636619772367581343075535053490057448f
#define M_2_SQRTPI_F 1.12837916709551257389615890312154517f
#define M_SQRT2_F 1.41421356237309504880168872420969808f
#define M_SQRT1_2_F 0.707106781186547524400844362104849039f
#define M_E_H ((half)M_E_F)
#define M_LOG2E_H ((half)M_LOG2E_F)
#define M_LOG10E_H ((half)M_LOG10E_F)
#define M_LN2_H ((half)M_LN2_F)
#define M_LN10_H ((half)M_LN10_F)
#define M_PI_H ((half)M_PI_F)
#define M_PI_2_H ((half)M_PI_2_F)
#define M_PI_4_H ((half)M_PI_4_F)
#define M_1_PI_H ((half)M_1_PI_F)
#define M_2_PI_H ((half)M_2_PI_F)
#define M_2_SQRTPI_H ((half)M_2_SQRTPI_F)
#define M_SQRT2_H ((half)M_SQRT2_F)
#define M_SQRT1_2_H ((half)M_SQRT1_2_F)

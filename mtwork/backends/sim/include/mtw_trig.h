// Float trigonometric functions, their inverses and pow as inline code: computed in
// double and rounded to float once, branch-free, so that a loop over threads that calls
// them vectorizes (a call to libm's sinf keeps it scalar). The only memory they read is
// the table of 2/pi below, indexed by a float's exponent (a gather).
//
// Accuracy: the double results are within 2^-47 (relative) of the true value for sin,
// cos, tan and their pi forms, 2^-44 for the inverse functions and 2^-39 for pow (whose
// exponential is mtw_elementary.h's), so the float result is the correctly rounded one
// except where the true value lies within 2^-23 ulp (2^-20, 2^-15) of a rounding
// boundary: just over 0.5 ulp at worst, inside Metal's precise bounds (MSL specification,
// table 8.1: sin, cos, sinpi, cospi, asin, acos 4 ulp, atan 5, tan, tanpi, atan2 6, pow and
// powr 16) and its fast ones (table 8.2). tests/test_sim_elementary.py checks 1 ulp on a
// sweep of a million floats and of half a million pairs; all were correctly rounded.
//
// Polynomials: fitted in double by Lawson's iteratively reweighted least squares for
// minimax relative error on Chebyshev points, their error measured with mpmath at
// 200 bits on 20001 points of the interval.
//
// Special values: C's (C17 annex F) for sin, cos, tan, asin, acos, atan, atan2 and pow;
// IEEE 754's (section 9.2.1) for the signs of sinpi, cospi and tanpi's zeros and
// infinities; powr of a negative x is NaN (MSL: powr is pow for x >= 0).
#pragma once

#include "mtw_elementary.h"

#pragma float_control(precise, on, push)
#pragma clang fp contract(off)

namespace mtw_math {

constexpr double kPi = 0x1.921fb54442d18p1;
constexpr double kPiOver2 = 0x1.921fb54442d18p0;
constexpr double kPiOver4 = 0x1.921fb54442d18p-1;
// Adding 1.5 * 2^52 to a double below 2^51 in magnitude rounds it to an integer held in the
// sum's low bits: a quadrant without a float-to-int conversion (which is saturating, and
// slower, under the emulator's -fno-strict-float-cast-overflow).
constexpr double kShifter = 0x1.8p52;

// --- argument reduction ------------------------------------------------------------------

// The first 224 bits of 2/pi (its binary expansion after the point).
constexpr uint32_t kTwoOverPiWords[7] = {0xa2f9836e, 0x4e441529, 0xfc2757d1, 0xf534ddc0,
                                         0xdb629599, 0x3c439041, 0xfe5163ab};

// Bits first..last of 2/pi as an integer (bit j weighs 2^-j; bits before 1 are zero).
constexpr uint64_t two_over_pi_bits(int first, int last) {
  uint64_t v = 0;
  for (int j = first; j <= last; ++j) {
    uint64_t bit = j < 1 ? 0 : (kTwoOverPiWords[(j - 1) / 32] >> (31 - (j - 1) % 32)) & 1;
    v = 2 * v + bit;
  }
  return v;
}

constexpr double power_of_two(int e) {
  double p = 1.0;
  for (; e > 0; --e) p *= 2.0;
  for (; e < 0; ++e) p *= 0.5;
  return p;
}

// A float x = m 2^E (m a 24-bit integer) times 2/pi, modulo 4, is m (2^E 2/pi mod 4) mod 4,
// since m is an integer: per exponent field, 2^E 2/pi mod 4 (bits E-1 on of 2/pi, at
// weight 2^(E-j)) in three parts: c0 the bits of weight >= 2^-24 and c1 those >= 2^-50
// (26 bits each, so m c0 and m c1 are exact in double), c2 the next 53 (bits 1 to 53 where
// the first two are empty, for |x| < 2^-76). (The Payne and Hanek reduction, the window of
// 2/pi chosen by the exponent.)
struct TwoOverPiByExponent {
  double c0[256], c1[256], c2[256];
};
constexpr TwoOverPiByExponent two_over_pi_by_exponent() {
  TwoOverPiByExponent t{};
  for (int field = 0; field < 256; ++field) {
    int e = (field > 1 ? field : 1) - 150;  // subnormals share the exponent of field 1
    t.c0[field] = double(two_over_pi_bits(e - 1, e + 24)) * power_of_two(-24);
    t.c1[field] = double(two_over_pi_bits(e + 25, e + 50)) * power_of_two(-50);
    int first = e + 51 > 1 ? e + 51 : 1;  // for tiny x, the first 53 bits of 2/pi
    t.c2[field] = double(two_over_pi_bits(first, first + 52)) * power_of_two(e - first - 52);
  }
  return t;
}
inline constexpr TwoOverPiByExponent kTwoOverPi = two_over_pi_by_exponent();

// |x| = (4n + quadrant + f) pi/2 with |f| <= 1/2 (to 2^-79 absolute in f), for every
// finite float: returns f pi/2 in double. q = rint(m c0 + m c1); m c0 - q is exact
// (multiples of 2^-24 below 2^26), adding m c1 is exact (multiples of 2^-50 below 2), so
// the only roundings are those of m c2 and of the last sum, relative to f itself. The
// smallest |f| of a float >= 1 is 2^-29.8, at 0x1.f37c8ap+95 (an exhaustive search): f
// is within 2^-49 (relative) everywhere.
MTW_INLINE double reduce_half_pi(float x, int& quadrant) {
  uint32_t bits = __builtin_bit_cast(uint32_t, x) & 0x7fffffffu;
  uint32_t field = bits >> 23;
  uint32_t mantissa = (bits & 0x7fffffu) | (field != 0 ? 0x800000u : 0u);
  double m = double(int32_t(mantissa));
  double p0 = m * kTwoOverPi.c0[field];
  double p1 = m * kTwoOverPi.c1[field];
  double p2 = m * kTwoOverPi.c2[field];
  double shifted = (p0 + p1) + kShifter;  // < 2^26: rounded to an integer in the low bits
  double q = shifted - kShifter;
  quadrant = int(__builtin_bit_cast(uint64_t, shifted) & 3);
  return (((p0 - q) + p1) + p2) * kPiOver2;
}

// sin r = r + r z S(z) and cos r = 1 + z C(z), z = r^2, for |r| <= pi/4 (1.0001 times):
// relative error 2^-47.5 and 2^-50.9.
MTW_INLINE double sin_near_zero(double r) {
  double z = r * r;
  double s = -0x1.a9615d5c8e98ep-26;
  s = madd(s, z, 0x1.71d76c5c3f46ap-19);
  s = madd(s, z, -0x1.a019f9380d235p-13);
  s = madd(s, z, 0x1.1111110c86356p-7);
  s = madd(s, z, -0x1.555555555222cp-3);
  return madd(r * z, s, r);
}
MTW_INLINE double cos_near_zero(double r) {
  double z = r * r;
  double c = 0x1.1b2a75da20c8dp-29;
  c = madd(c, z, -0x1.27ddf585bfc40p-22);
  c = madd(c, z, 0x1.a019f4cc5bf70p-16);
  c = madd(c, z, -0x1.6c16c1605c1bbp-10);
  c = madd(c, z, 0x1.555555554b979p-5);
  c = madd(c, z, -0x1.fffffffffff5cp-2);
  return madd(z, c, 1.0);
}

// sin(r + q pi/2) and cos(r + q pi/2) from the quadrant q.
MTW_INLINE double sin_in_quadrant(double s, double c, int q) {
  double v = (q & 1) ? c : s;
  return (q & 2) ? -v : v;
}
MTW_INLINE double cos_in_quadrant(double s, double c, int q) {
  double v = (q & 1) ? s : c;
  return ((q + 1) & 2) ? -v : v;
}

MTW_INLINE float sin(float x) {
  int q;
  double r = reduce_half_pi(x, q);
  double v = sin_in_quadrant(sin_near_zero(r), cos_near_zero(r), q);
  float y = __builtin_copysignf(1.0f, x) * float(v);  // sin is odd; sin(-0) is -0
  return __builtin_isfinite(x) ? y : x - x;
}

MTW_INLINE float cos(float x) {
  int q;
  double r = reduce_half_pi(x, q);
  float y = float(cos_in_quadrant(sin_near_zero(r), cos_near_zero(r), q));
  return __builtin_isfinite(x) ? y : x - x;
}

MTW_INLINE float tan(float x) {
  int q;
  double r = reduce_half_pi(x, q);
  double s = sin_near_zero(r), c = cos_near_zero(r);
  double v = (q & 1) ? -c / s : s / c;  // s is 0 only for x = 0, in quadrant 0
  float y = __builtin_copysignf(1.0f, x) * float(v);
  return __builtin_isfinite(x) ? y : x - x;
}

// sin(pi x), cos(pi x), tan(pi x): x = h/2 + f with h = rint(2x) and |f| <= 1/4 exactly in
// double (h mod 4 is the quadrant, 0 from 2^24 on), so integers and half-integers give
// exact zeros and infinities.
MTW_INLINE double reduce_half_turns(float x, int& quadrant) {
  double h = __builtin_rint(2.0 * double(x));
  double h_mod_4 = h - 4.0 * __builtin_floor(0.25 * h);  // exact
  quadrant = int(__builtin_bit_cast(uint64_t, h_mod_4 + kShifter) & 3);
  return double(x) - 0.5 * h;
}

MTW_INLINE float sinpi(float x) {
  int q;
  double r = kPi * reduce_half_turns(x, q);
  float y = float(sin_in_quadrant(sin_near_zero(r), cos_near_zero(r), q));
  y = y == 0.0f ? __builtin_copysignf(0.0f, x) : y;  // sinpi(n) is 0 with the sign of n
  return __builtin_isfinite(x) ? y : x - x;
}

MTW_INLINE float cospi(float x) {
  int q;
  double r = kPi * reduce_half_turns(x, q);
  float y = float(cos_in_quadrant(sin_near_zero(r), cos_near_zero(r), q));
  y = y == 0.0f ? 0.0f : y;  // cospi(n + 1/2) is +0
  return __builtin_isfinite(x) ? y : x - x;
}

MTW_INLINE float tanpi(float x) {
  int q;
  double f = reduce_half_turns(x, q);
  double s = sin_near_zero(kPi * f), c = cos_near_zero(kPi * f);
  float y = float((q & 1) ? -c / s : s / c);
  // tanpi(n) is +0 for even n >= 0 and odd n < 0, -0 otherwise; tanpi(n + 1/2) is +inf
  // for even n, -inf for odd n.
  float zero = __builtin_copysignf(0.0f, (q & 2) ? -x : x);
  float pole = (q & 2) ? -__builtin_inff() : __builtin_inff();
  y = f == 0.0 ? ((q & 1) ? pole : zero) : y;
  return __builtin_isfinite(x) ? y : x - x;
}

// --- inverse functions -------------------------------------------------------------------

// atan t = t + t z A(z), z = t^2, for |t| <= tan(pi/8) (1.0001 times): relative error 2^-45.
MTW_INLINE double atan_near_zero(double t) {
  double z = t * t;
  double a = 0x1.f9a712b78abacp-6;
  a = madd(a, z, -0x1.e26aebed2b371p-5);
  a = madd(a, z, 0x1.35fba99c89b78p-4);
  a = madd(a, z, -0x1.73e0c6237b72fp-4);
  a = madd(a, z, 0x1.c71571703dd27p-4);
  a = madd(a, z, -0x1.24922d01918a1p-3);
  a = madd(a, z, 0x1.9999992bb8decp-3);
  a = madd(a, z, -0x1.555555550bc8ap-2);
  return madd(t * z, a, t);
}

// The angle of (b, a) for a, b >= 0, in [0, pi/2]: atan(a/b) below tan(pi/8), pi/4 +
// atan((a - b)/(a + b)) up to tan(3pi/8), pi/2 - atan(b/a) above, so that the polynomial's
// argument stays within tan(pi/8). From floats a and b, a - b and a + b are exact in the
// middle range (their exponents differ by at most 2).
MTW_INLINE double angle_in_double(double a, double b) {
  bool low = a <= b * 0x1.a827999fcef32p-2;   // tan(pi/8)
  bool high = a >= b * 0x1.3504f333f9de6p1;   // tan(3pi/8)
  double num = low ? a : high ? -b : a - b;
  double den = low ? b : high ? a : a + b;
  double base = low ? 0.0 : high ? kPiOver2 : kPiOver4;
  double t = a == 0.0 ? 0.0 : num / den;  // (0, 0) has angle 0
  double angle = base + atan_near_zero(t);
  bool both_infinite = a == __builtin_inf() && b == __builtin_inf();
  return both_infinite ? kPiOver4 : angle;
}

MTW_INLINE float atan(float x) {
  float y = float(angle_in_double(__builtin_fabs(double(x)), 1.0));
  return x != x ? x : __builtin_copysignf(y, x);
}

MTW_INLINE float atan2(float y, float x) {
  double angle = angle_in_double(__builtin_fabs(double(y)), __builtin_fabs(double(x)));
  angle = __builtin_signbit(x) ? kPi - angle : angle;  // x < 0 or x = -0
  float r = __builtin_copysignf(float(angle), y);
  return x != x || y != y ? x + y : r;
}

// sqrt(1 - x^2) in double; NaN for |x| > 1. x^2 is exact, and so is 1 - x^2 where it
// cancels. (__builtin_sqrt would be a call to libm, which may set errno.)
MTW_INLINE double cosine_of_asin(float x) {
  return __builtin_elementwise_sqrt(1.0 - double(x) * double(x));
}

MTW_INLINE float asin(float x) {
  float y = float(angle_in_double(__builtin_fabs(double(x)), cosine_of_asin(x)));
  return __builtin_copysignf(y, x);  // NaN for |x| > 1 and NaN
}

MTW_INLINE float acos(float x) {
  double angle = angle_in_double(cosine_of_asin(x), __builtin_fabs(double(x)));
  return float(__builtin_signbit(x) ? kPi - angle : angle);
}

// --- powers ------------------------------------------------------------------------------

// log2 a for a finite a > 0, in double to 2^-51 (relative): a = m 2^e with m in
// [sqrt(1/2), sqrt(2)), log2 m = s (2 / ln 2 + z R(z)), s = (m - 1)/(m + 1), z = s^2 <=
// 0.0295, R fitted to relative error 2^-52.1 of the whole.
MTW_INLINE double log2_in_double(float a) {
  int32_t e;
  double m = octave_split(a, e);
  double s = (m - 1.0) / (m + 1.0);
  double z = s * s;
  double r = 0x1.f0f4abefa430bp-3;
  r = madd(r, z, 0x1.0bbe9c46dfc24p-2);
  r = madd(r, z, 0x1.484f6bc78856ap-2);
  r = madd(r, z, 0x1.a617579787cedp-2);
  r = madd(r, z, 0x1.2776c51570ff6p-1);
  r = madd(r, z, 0x1.ec709dc39dbc5p-1);
  return madd(s, madd(z, r, 2.0 * kLog2E), double(e));
}

// x^y = 2^(y log2 |x|), the sign from x when y is an odd integer. y log2 |x| is within
// 2^-44 (absolute) of the true value where the result is a finite float (|y log2 |x|| <
// 150). Special values as C's pow: x^0 and 1^y are 1 (NaN or not); |x| = 0 or infinity and
// |x| < 1 or > 1 with y infinite follow from log2 |x| = -inf, +inf, < 0 or > 0; the power
// is 1 for (-1)^(+-inf); a finite x < 0 with a non-integer y gives NaN, and a NaN x or y
// one quiet NaN (the product's would be one operand's or the other's, as the vectorized
// and the scalar code order them). Every value is computed and then selected, so that
// the code is one basic block, which the loop over threads vectorizes.
MTW_INLINE float pow(float x, float y) {
  float a = __builtin_fabsf(x);
  double log2_a = log2_in_double(a);
  log2_a = a < __builtin_inff() ? log2_a : double(a);  // inf, NaN
  log2_a = a == 0.0f ? -__builtin_inf() : log2_a;
  double t = double(y) * log2_a;
  t = y == 0.0f || a == 1.0f ? 0.0 : t;
  double magnitude = exp2_in_double(exponent_range(t));
  magnitude = t != t ? __builtin_nan("") : magnitude;  // NaN x or y
  bool integer = y == __builtin_rintf(y);  // infinities count as even integers
  bool odd = integer && 0.5f * y != __builtin_rintf(0.5f * y);
  float r = float(magnitude);
  r = odd ? __builtin_copysignf(r, x) : r;
  // x finite and < 0, from its bits (a float comparison pair becomes an fpclass test,
  // which the loop vectorizer does not take)
  bool negative_base = __builtin_bit_cast(uint32_t, x) - 0x80000001u < 0x7f7fffffu;
  return negative_base && !integer ? __builtin_nanf("") : r;
}

MTW_INLINE float powr(float x, float y) {
  float r = pow(x, y);  // then selected, not branched around (see pow)
  return x < 0.0f ? __builtin_nanf("") : r;
}

}  // namespace mtw_math

#pragma float_control(pop)

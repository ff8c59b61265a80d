// Float exponentials, logarithms and hyperbolic functions as inline code: computed in
// double and rounded to float once, with no table and no branch, so that a loop over
// threads that calls them vectorizes (a call to libm's expf keeps it scalar).
//
// Accuracy: the double approximations are within 2^-37 (relative) of the true value
// (2^-33 for the hyperbolic functions), so the float result is the correctly rounded one
// but where the true value lies within 2^-13 (2^-9) ulp of a rounding boundary: a worst
// case just over 0.5 ulp (0.500027 on the sweep of tests/test_sim_elementary.py), inside
// Metal's precise bounds (MSL specification, table 8.1: 4 ulp for exp and log, 5 for
// tanh) and its fast ones (table 8.2). Special values follow IEEE 754: NaN in, NaN out; overflow to
// infinity, underflow through the subnormals to zero; log of 0 is -inf, of a negative
// number NaN.
//
// mtw_trig.h builds the trigonometric functions and pow on the same pieces.
//
// Every engine inlines the same code and every operation is rounded as written, in
// every math mode (`float_control(precise)`, no contraction): a vectorized loop and a
// scalar call give the same bits.
#pragma once

#include "mtw_base.h"

#pragma float_control(precise, on, push)
#pragma clang fp contract(off)

namespace mtw_math {

// a * b + c: one rounding where the target has fused multiply-add, two elsewhere; the
// same in every engine of one machine.
MTW_INLINE double madd(double a, double b, double c) {
#if defined(__FMA__) || defined(__aarch64__)
  return __builtin_fma(a, b, c);
#else
  return a * b + c;
#endif
}

constexpr double kLn2 = 0x1.62e42fefa39efp-1;
constexpr double kLog2E = 0x1.71547652b82fep0;
constexpr double kLog2Of10 = 0x1.a934f0979a371p1;
constexpr double kLog10Of2 = 0x1.34413509f79ffp-2;
constexpr double kLog10E = 0x1.bcb7b1526e50ep-2;

// 2^t for |t| <= 200 (beyond the float range both ways): t = k + r with k = rint(t),
// |r| <= 1/2; 2^r = 1 + r P(r), P fitted (near minimax, relative error 2^-40) on
// [-1/2, 1/2]; 2^k from the exponent bits. Adding 1.5 * 2^52 rounds t to an integer
// that sits in the low bits of the sum (no float-to-int64 conversion, which x86 has no
// vector instruction for before AVX-512).
MTW_INLINE double exp2_in_double(double t) {
  const double shifter = 0x1.8p52;
  double shifted = t + shifter;
  double k = shifted - shifter;
  double r = t - k;
  double p = 0x1.61c4ec9471bc8p-20;
  p = madd(p, r, 0x1.00d853c37165ep-16);
  p = madd(p, r, 0x1.430aa8884319cp-13);
  p = madd(p, r, 0x1.5d874d0624b50p-10);
  p = madd(p, r, 0x1.3b2ab5ed6b4c7p-7);
  p = madd(p, r, 0x1.c6b08dced425bp-5);
  p = madd(p, r, 0x1.ebfbdff8edeb9p-3);
  p = madd(p, r, 0x1.62e42fef89d16p-1);
  uint64_t bits = (__builtin_bit_cast(uint64_t, shifted) + 1023) << 52;
  return madd(r, p, 1.0) * __builtin_bit_cast(double, bits);
}

// t clamped to [-200, 200], NaN to -200 (the caller puts the NaN back).
MTW_INLINE double exponent_range(double t) {
  t = t >= -200.0 ? t : -200.0;
  return t <= 200.0 ? t : 200.0;
}

MTW_INLINE float exp_of_base(float x, double log2_of_base) {
  float y = float(exp2_in_double(exponent_range(double(x) * log2_of_base)));
  return x != x ? x : y;
}
MTW_INLINE float exp(float x) { return exp_of_base(x, kLog2E); }
MTW_INLINE float exp2(float x) { return exp_of_base(x, 1.0); }
MTW_INLINE float exp10(float x) { return exp_of_base(x, kLog2Of10); }

// x = m 2^e for a finite x > 0: m in [sqrt(1/2), sqrt(2)) (returned, exact) and e.
MTW_INLINE double octave_split(float x, int32_t& e) {
  bool subnormal = x < 0x1p-126f;
  float scaled = subnormal ? x * 0x1p24f : x;  // exact
  uint32_t bits = __builtin_bit_cast(uint32_t, scaled);
  e = int32_t(bits >> 23) - 127 - (subnormal ? 24 : 0);
  uint32_t mantissa = (bits & 0x7fffffu) | 0x3f800000u;  // m in [1, 2)
  bool high = mantissa > 0x3fb504f3u;                     // m > sqrt(2): halve it
  mantissa -= high ? 0x00800000u : 0u;
  e += high ? 1 : 0;
  return double(__builtin_bit_cast(float, mantissa));
}

// log(x) = e ln 2 + log(m), log(m) = 2 atanh(s) with s = (m - 1) / (m + 1), |s| <= 0.172:
// 2s + s z Q(z), z = s^2, Q fitted (relative error of the sum 2^-37) on [0, 0.0295]. The
// base is in the two factors: the result is e * per_octave + log(m) * per_nat.
MTW_INLINE float log_in_base(float x, double per_octave, double per_nat) {
  int32_t e;
  double m = octave_split(x, e);
  double s = (m - 1.0) / (m + 1.0);
  double z = s * s;
  double q = 0x1.e2f66bb3895c8p-3;
  q = madd(q, z, 0x1.2438d75b4dd57p-2);
  q = madd(q, z, 0x1.999a7a8bedfaap-2);
  q = madd(q, z, 0x1.555554fd9c0acp-1);
  double log_m = madd(s * z, q, 2.0 * s);
  float y = float(madd(double(e), per_octave, log_m * per_nat));
  y = x == __builtin_inff() ? x : y;
  y = x == 0.0f ? -__builtin_inff() : y;
  return x > 0.0f || x == 0.0f ? y : __builtin_nanf("");  // negative or NaN
}
MTW_INLINE float log(float x) { return log_in_base(x, kLn2, 1.0); }
MTW_INLINE float log2(float x) { return log_in_base(x, 1.0, kLog2E); }
MTW_INLINE float log10(float x) { return log_in_base(x, kLog10Of2, kLog10E); }

// Hyperbolic functions of a = |x| from e^a, where cancellation costs at most a factor 16
// of the accuracy of e^a (a >= 1/8); below 1/8, their Taylor series to a^11 (relative
// error under 2^-40).
MTW_INLINE double odd_series(double a, double c3, double c5, double c7, double c9,
                             double c11) {
  double z = a * a;
  double p = madd(madd(madd(madd(c11, z, c9), z, c7), z, c5), z, c3);
  return madd(a * z, p, a);
}

MTW_INLINE float tanh(float x) {
  double a = __builtin_fabs(double(x));
  a = a <= 20.0 ? a : 20.0;  // tanh(20) rounds to 1; NaN goes to 20, put back below
  double e2a = exp2_in_double(2.0 * a * kLog2E);
  double big = 1.0 - 2.0 / (e2a + 1.0);
  double small = odd_series(a, -1.0 / 3, 2.0 / 15, -17.0 / 315, 62.0 / 2835,
                            -1382.0 / 155925);
  float y = __builtin_copysignf(float(a < 0.125 ? small : big), x);
  return x != x ? x : y;
}

MTW_INLINE float sinh(float x) {
  double a = __builtin_fabs(double(x));
  double ea = exp2_in_double(exponent_range(a * kLog2E));
  double big = 0.5 * (ea - 1.0 / ea);
  double small = odd_series(a, 1.0 / 6, 1.0 / 120, 1.0 / 5040, 1.0 / 362880,
                            1.0 / 39916800);
  float y = __builtin_copysignf(float(a < 0.125 ? small : big), x);
  return x != x ? x : y;
}

MTW_INLINE float cosh(float x) {
  double a = __builtin_fabs(double(x));
  double ea = exp2_in_double(exponent_range(a * kLog2E));
  float y = float(0.5 * (ea + 1.0 / ea));
  return x != x ? x : y;
}

}  // namespace mtw_math

#pragma float_control(pop)

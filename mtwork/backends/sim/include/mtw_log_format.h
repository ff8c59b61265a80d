// The format strings of Metal's logging functions (MSL 3.2 specification, section 6.19
// "Logging Functions"): C's printf conversions, and OpenCL C's vector specifier for
// Metal's vectors (`%v4f`, `%v3u`, `%v2hd`: the components printed with the conversion,
// separated by commas). One reading of a conversion, used twice: by the shim, which checks
// a call's format against its arguments while the kernel compiles (include/mtw_logging.h),
// and by the runtime, which prints the message (runtime/logging.cpp).
//
//   %[flags][width][.precision][vN][length]conversion
//
// flags: - + space # 0; width and precision: digits or `*` (an int argument); vN: N of
// 2, 3 or 4; length: hh h l ll j z t, and hl (a vector of 32-bit components);
// conversions: d i o u x X (integers), f F e E g G a A (floats), c, s (a string literal),
// p (a pointer), and %% for a percent sign.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace mtw_log {

// The argument a conversion takes (and the class of an argument, the same words).
enum Takes : uint8_t {
  kNothing = 0,  // %%
  kInteger,      // d i o u x X c; bool and enums count as integers
  kFloat,        // f F e E g G a A: float, half, bfloat
  kString,       // s: a pointer to characters
  kPointer,      // p: any pointer
  kUnsupported,  // an argument of a type the logging functions cannot print
};

enum Length : uint8_t { kNone = 0, kHH, kH, kHL, kL, kLL, kJ, kZ, kT };

struct Spec {
  size_t end = 0;             // one past the conversion's last character
  bool width_star = false;    // the width is an int argument, before the value
  bool precision_star = false;
  uint8_t vector = 0;         // components of a vector specifier; 0: a scalar
  Length length = kNone;
  char conversion = 0;
  Takes takes = kNothing;
  const char* problem = nullptr;  // why Metal's logging does not take it; null when it does
};

constexpr bool is_digit(char c) { return c >= '0' && c <= '9'; }

constexpr Takes takes_of(char c) {
  switch (c) {
    case 'd': case 'i': case 'o': case 'u': case 'x': case 'X': case 'c':
      return kInteger;
    case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': case 'a': case 'A':
      return kFloat;
    case 's':
      return kString;
    case 'p':
      return kPointer;
    default:
      return kUnsupported;
  }
}

// Why conversion character `c` is refused (it is not one of the conversions above).
constexpr const char* refusal_of(char c) {
  switch (c) {
    case 'n':
      return "%n is not supported: it writes the count of characters printed through a "
             "pointer";
    case '@':
      return "%@ prints an Objective-C object, which a kernel does not have";
    case 'C': case 'S':
      return "wide characters (%C, %S, %lc, %ls) have no Metal type";
    case 'm':
      return "%m (the system's error text) has no meaning in a kernel";
    case '\0':
      return "the format ends inside a conversion";
    default:
      return "not a conversion of the logging functions (d i o u x X c f F e E g G a A s "
             "p %)";
  }
}

// Reads the length modifier at f[i]; returns its size in characters (0: none).
constexpr size_t read_length(const char* f, size_t i, Length& length) {
  if (f[i] == 'h' && f[i + 1] == 'h') return length = kHH, 2;
  if (f[i] == 'h' && f[i + 1] == 'l') return length = kHL, 2;
  if (f[i] == 'l' && f[i + 1] == 'l') return length = kLL, 2;
  switch (f[i]) {
    case 'h': return length = kH, 1;
    case 'l': return length = kL, 1;
    case 'j': return length = kJ, 1;
    case 'z': return length = kZ, 1;
    case 't': return length = kT, 1;
    default: return 0;
  }
}

// The conversion whose '%' is at f[at] (the format is null-terminated).
constexpr Spec parse(const char* f, size_t at) {
  Spec s;
  size_t i = at + 1;
  while (f[i] == '-' || f[i] == '+' || f[i] == ' ' || f[i] == '#' || f[i] == '0') ++i;
  if (f[i] == '*') {
    s.width_star = true;
    ++i;
  } else {
    while (is_digit(f[i])) ++i;
  }
  if (f[i] == '.') {
    ++i;
    if (f[i] == '*') {
      s.precision_star = true;
      ++i;
    } else {
      while (is_digit(f[i])) ++i;
    }
  }
  if (f[i] == 'v') {
    ++i;
    while (is_digit(f[i])) s.vector = uint8_t(s.vector * 10 + (f[i++] - '0'));
    if (s.vector < 2 || s.vector > 4) {
      s.problem = "a vector specifier takes 2, 3 or 4 components, as Metal's vectors have "
                  "(%v2f, %v3u, %v4d)";
    }
  }
  i += read_length(f, i, s.length);
  if (f[i] == 'L' || f[i] == 'q') {
    s.problem = "long double has no Metal type (the L length modifier)";
    ++i;
  }
  s.conversion = f[i];
  s.end = f[i] ? i + 1 : i;
  if (f[i] == '%' && i == at + 1) {
    s.takes = kNothing;
    return s;
  }
  s.takes = takes_of(f[i]);
  if (s.problem) return s;  // the vector's size or the length modifier, above
  if (s.takes == kUnsupported) {
    s.problem = refusal_of(f[i]);
  } else if (s.length == kL && (f[i] == 'c' || f[i] == 's')) {
    s.problem = refusal_of('S');
  } else if (s.length == kHL && !s.vector) {
    s.problem = "hl is a vector's length modifier (32-bit components: %v4hlf, %v2hld)";
  } else if (s.vector && (s.takes == kString || s.takes == kPointer || f[i] == 'c')) {
    s.problem = "a vector specifier prints numbers: %c, %s and %p take no vector";
  }
  return s;
}

}  // namespace mtw_log

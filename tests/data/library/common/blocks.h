// Helpers for kernels.metal, included from a subfolder. The emulator must rewrite this
// file like the main one: a member function overloaded on address spaces, a float literal.
#pragma once

#include <metal_stdlib>

template <int N>
struct Block {
  static_assert(N > 0, "a block holds at least one element");
  static constant constexpr int size = N;
};

struct Sum {
  float value;
  void add(float x) thread { value += x; }
  void add(float x) threadgroup { value += x; }
};

// What block_sum does with a finished sum: scaled when asked, by 2 when no scale is set.
inline float finish(float s, bool use_scale, bool has_scale, float scale) {
  return use_scale ? s * (has_scale ? scale : 2.0) : s;
}

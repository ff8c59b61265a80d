// SIMD-group and quad-group functions.
//
// Each lane hands the runtime a pointer to its argument and to its result slot; once the
// lanes of its SIMD-group are there (lanes that returned or wait elsewhere are inactive),
// one combine function computes every lane's result. Reductions associate as an xor
// butterfly over lane offsets 1, 2, 4, 8, 16, as Apple's compiler lowers simd_sum (the
// bitwise A/B of mlx-lm's packed gated-delta kernel relies on it), so kernel variants
// that are bitwise equal on the GPU are bitwise equal here.
#pragma once

#include "mtw_math.h"

namespace metal {

using simd_vote_t = ulong;

struct simd_vote {
  using vote_t = ulong;
  vote_t bits;
  constexpr explicit simd_vote(vote_t v = 0) : bits(v) {}
  constexpr explicit operator vote_t() const { return bits; }
  constexpr bool all() const { return bits == 0xFFFFFFFFul; }
  constexpr bool any() const { return bits != 0; }
};

struct quad_vote {
  using vote_t = ushort;
  vote_t bits;
  constexpr explicit quad_vote(vote_t v = 0) : bits(v) {}
  constexpr explicit operator vote_t() const { return bits; }
  constexpr bool all() const { return bits == 0xF; }
  constexpr bool any() const { return bits != 0; }
};

}  // namespace metal

namespace mtw_simd {

constexpr int kWidth = MTW_SIMD_WIDTH;

MTW_INLINE bool active(uint32_t mask, int lane) { return (mask >> lane) & 1u; }

// What a lane hands in: its value plus the per-lane operand of shuffles.
template <typename T>
struct Arg {
  T value;
  T fill;
  uint32_t operand;
  uint32_t modulo;
};

template <typename T>
MTW_INLINE const Arg<T>& arg(const void* const* ins, int lane) {
  return *static_cast<const Arg<T>*>(ins[lane]);
}
template <typename T>
MTW_INLINE void put(void* const* outs, int lane, T v) {
  *static_cast<T*>(outs[lane]) = v;
}

struct Add { template <typename T> static T apply(T a, T b) { return a + b; } };
struct Mul { template <typename T> static T apply(T a, T b) { return a * b; } };
struct Min { template <typename T> static T apply(T a, T b) { return metal::min(a, b); } };
struct Max { template <typename T> static T apply(T a, T b) { return metal::max(a, b); } };
// Bitwise reductions of floats (MLX's bfloat overloads reach them) act on the bits.
template <typename T, typename F>
MTW_INLINE T bitwise(T a, T b, F f) {
  if constexpr (metal::is_floating_point_v<T>) {
    using U = metal::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>;
    return __builtin_bit_cast(T, U(f(__builtin_bit_cast(U, a), __builtin_bit_cast(U, b))));
  } else {
    return f(a, b);
  }
}
struct And {
  template <typename T> static T apply(T a, T b) {
    return bitwise(a, b, [](auto x, auto y) { return x & y; });
  }
};
struct Or {
  template <typename T> static T apply(T a, T b) {
    return bitwise(a, b, [](auto x, auto y) { return x | y; });
  }
};
struct Xor {
  template <typename T> static T apply(T a, T b) {
    return bitwise(a, b, [](auto x, auto y) { return x ^ y; });
  }
};

// Butterfly reduction within groups of `width` lanes (32 for SIMD, 4 for quad functions).
template <typename T, typename Op, int width>
void reduce(const void* const* ins, void* const* outs, uint32_t mask) {
  T v[kWidth];
  bool has[kWidth];
  for (int l = 0; l < kWidth; ++l) {
    has[l] = active(mask, l);
    if (has[l]) v[l] = arg<T>(ins, l).value;
  }
  for (int offset = 1; offset < width; offset <<= 1) {
    T next[kWidth];
    bool next_has[kWidth];
    for (int l = 0; l < kWidth; ++l) {
      int p = l ^ offset;
      next_has[l] = has[l] || has[p];
      if (has[l] && has[p]) next[l] = Op::apply(v[l], v[p]);
      else if (has[l]) next[l] = v[l];
      else if (has[p]) next[l] = v[p];
    }
    for (int l = 0; l < kWidth; ++l) {
      has[l] = next_has[l];
      if (has[l]) v[l] = next[l];
    }
  }
  for (int l = 0; l < kWidth; ++l)
    if (active(mask, l)) put(outs, l, v[l]);
}

// Prefix scans over the active lanes of each group of `width`, lowest lane first, in
// log-step (Hillis-Steele) order.
template <typename T, typename Op, int width, bool inclusive>
void scan(const void* const* ins, void* const* outs, uint32_t mask) {
  T v[kWidth];
  bool has[kWidth];
  for (int l = 0; l < kWidth; ++l) {
    has[l] = active(mask, l);
    if (has[l]) v[l] = arg<T>(ins, l).value;
  }
  for (int offset = 1; offset < width; offset <<= 1) {
    T next[kWidth];
    bool next_has[kWidth];
    for (int l = 0; l < kWidth; ++l) {
      int p = l - offset;
      bool same_group = p >= 0 && (p / width) == (l / width);
      bool ph = same_group && has[p];
      next_has[l] = has[l] || ph;
      if (has[l] && ph) next[l] = Op::apply(v[p], v[l]);
      else if (has[l]) next[l] = v[l];
      else if (ph) next[l] = v[p];
    }
    for (int l = 0; l < kWidth; ++l) {
      has[l] = next_has[l];
      if (has[l]) v[l] = next[l];
    }
  }
  for (int l = 0; l < kWidth; ++l) {
    if (!active(mask, l)) continue;
    if (inclusive) {
      put(outs, l, v[l]);
    } else {
      // The exclusive result is the inclusive one of the previous active lane in the group.
      int p = l - 1;
      while (p >= 0 && (p / width) == (l / width) && !active(mask, p)) --p;
      bool first = p < 0 || (p / width) != (l / width);
      T identity = metal::is_same_v<Op, Mul> ? T(1) : T(0);
      put(outs, l, first ? identity : v[p]);
    }
  }
}

enum class Move { index, up, down, xor_, rotate_up, rotate_down, fill_up, fill_down, bcast };

// Data movement: lane l reads the value of a source lane within its group of `width`.
// A source lane that is inactive or outside the group leaves the lane's own value.
template <typename T, Move how, int width>
void move(const void* const* ins, void* const* outs, uint32_t mask) {
  for (int l = 0; l < kWidth; ++l) {
    if (!active(mask, l)) continue;
    const Arg<T>& a = arg<T>(ins, l);
    int base = (l / width) * width, idx = l - base, src = -1;
    int d = int(a.operand);
    switch (how) {
      case Move::index: src = base + (d % width); break;
      case Move::bcast: src = base + (d % width); break;
      case Move::up: src = idx - d >= 0 ? l - d : -1; break;
      case Move::down: src = idx + d < width ? l + d : -1; break;
      case Move::xor_: src = base + ((idx ^ d) % width); break;
      case Move::rotate_up: src = base + ((idx - d % width + width) % width); break;
      case Move::rotate_down: src = base + ((idx + d) % width); break;
      case Move::fill_up: {
        int m = int(a.modulo), seg = (idx / m) * m, i = idx - seg;
        if (i >= d) {
          src = l - d;
        } else {
          int f = base + seg + i - d + m;
          put(outs, l, active(mask, f) ? arg<T>(ins, f).fill : a.value);
          continue;
        }
        break;
      }
      case Move::fill_down: {
        int m = int(a.modulo), seg = (idx / m) * m, i = idx - seg;
        if (i + d < m) {
          src = l + d;
        } else {
          int f = base + seg + i + d - m;
          put(outs, l, active(mask, f) ? arg<T>(ins, f).fill : a.value);
          continue;
        }
        break;
      }
    }
    put(outs, l, (src >= 0 && active(mask, src)) ? arg<T>(ins, src).value : a.value);
  }
}

template <typename T>
void broadcast_first(const void* const* ins, void* const* outs, uint32_t mask) {
  int first = __builtin_ctz(mask);
  for (int l = 0; l < kWidth; ++l)
    if (active(mask, l)) put(outs, l, arg<T>(ins, first).value);
}

template <int width>
void ballot(const void* const* ins, void* const* outs, uint32_t mask) {
  for (int l = 0; l < kWidth; ++l) {
    if (!active(mask, l)) continue;
    int base = (l / width) * width;
    ulong bits = 0;
    for (int k = 0; k < width; ++k)
      if (active(mask, base + k) && arg<bool>(ins, base + k).value) bits |= 1ul << k;
    put(outs, l, bits);
  }
}

template <int width>
void active_mask(const void* const*, void* const* outs, uint32_t mask) {
  for (int l = 0; l < kWidth; ++l) {
    if (!active(mask, l)) continue;
    int base = (l / width) * width;
    put(outs, l, ulong((mask >> base) & (width == 32 ? 0xFFFFFFFFu : ((1u << width) - 1))));
  }
}

template <int width>
void is_first(const void* const*, void* const* outs, uint32_t mask) {
  for (int l = 0; l < kWidth; ++l) {
    if (!active(mask, l)) continue;
    int base = (l / width) * width;
    uint32_t group = (mask >> base) & (width == 32 ? 0xFFFFFFFFu : ((1u << width) - 1));
    put(outs, l, base + __builtin_ctz(group) == l);
  }
}

inline void nothing(const void* const*, void* const*, uint32_t) {}

template <typename R, typename T>
MTW_INLINE R collective(mtw_combine_fn fn, T value, uint32_t operand = 0, T fill = T(),
                        uint32_t modulo = kWidth) {
  Arg<T> in{value, fill, operand, modulo};
  R out;
  mtw_simd_collective(&in, &out, fn);
  return out;
}

// Apple's SIMD functions take scalars and vectors of 32-bit or narrower elements; wider
// ones (64-bit, bool) come from MLX's utils.h overloads, as on the GPU.
template <typename T>
constexpr bool allowed =
    metal::is_arithmetic_v<metal::__elem_t<T>> && sizeof(metal::__elem_t<T>) <= 4 &&
    !metal::is_same_v<metal::__elem_t<T>, bool> && !metal::is_same_v<metal::__elem_t<T>, bfloat>;
template <typename T>
using if_allowed = metal::enable_if_t<allowed<T>, T>;

}  // namespace mtw_simd

// The __metal_simd_* layer (used by MLX's bfloat overloads) and metal:: front ends.
#define MTW_SIMD_REDUCTION(name, Op, width)                                                     \
  template <typename T>                                                                         \
  MTW_INLINE T __metal_##name(T x) {                                                            \
    return mtw_simd::collective<T>(&mtw_simd::reduce<T, mtw_simd::Op, width>, x);               \
  }                                                                                             \
  namespace metal {                                                                             \
  template <typename T>                                                                         \
  MTW_INLINE mtw_simd::if_allowed<T> name(T x) {                                                \
    return __metal_##name(x);                                                                   \
  }                                                                                             \
  }
MTW_SIMD_REDUCTION(simd_sum, Add, 32)
MTW_SIMD_REDUCTION(simd_product, Mul, 32)
MTW_SIMD_REDUCTION(simd_min, Min, 32)
MTW_SIMD_REDUCTION(simd_max, Max, 32)
MTW_SIMD_REDUCTION(simd_and, And, 32)
MTW_SIMD_REDUCTION(simd_or, Or, 32)
MTW_SIMD_REDUCTION(simd_xor, Xor, 32)
MTW_SIMD_REDUCTION(quad_sum, Add, 4)
MTW_SIMD_REDUCTION(quad_product, Mul, 4)
MTW_SIMD_REDUCTION(quad_min, Min, 4)
MTW_SIMD_REDUCTION(quad_max, Max, 4)
MTW_SIMD_REDUCTION(quad_and, And, 4)
MTW_SIMD_REDUCTION(quad_or, Or, 4)
MTW_SIMD_REDUCTION(quad_xor, Xor, 4)
#undef MTW_SIMD_REDUCTION

#define MTW_SIMD_SCAN(name, Op, width, inclusive)                                               \
  template <typename T>                                                                         \
  MTW_INLINE T __metal_##name(T x) {                                                            \
    return mtw_simd::collective<T>(&mtw_simd::scan<T, mtw_simd::Op, width, inclusive>, x);      \
  }                                                                                             \
  namespace metal {                                                                             \
  template <typename T>                                                                         \
  MTW_INLINE mtw_simd::if_allowed<T> name(T x) {                                                \
    return __metal_##name(x);                                                                   \
  }                                                                                             \
  }
MTW_SIMD_SCAN(simd_prefix_inclusive_sum, Add, 32, true)
MTW_SIMD_SCAN(simd_prefix_exclusive_sum, Add, 32, false)
MTW_SIMD_SCAN(simd_prefix_inclusive_product, Mul, 32, true)
MTW_SIMD_SCAN(simd_prefix_exclusive_product, Mul, 32, false)
MTW_SIMD_SCAN(quad_prefix_inclusive_sum, Add, 4, true)
MTW_SIMD_SCAN(quad_prefix_exclusive_sum, Add, 4, false)
MTW_SIMD_SCAN(quad_prefix_inclusive_product, Mul, 4, true)
MTW_SIMD_SCAN(quad_prefix_exclusive_product, Mul, 4, false)
#undef MTW_SIMD_SCAN

#define MTW_SIMD_MOVE(name, how, width)                                                         \
  template <typename T>                                                                         \
  MTW_INLINE T __metal_##name(T x, ushort operand) {                                            \
    return mtw_simd::collective<T>(&mtw_simd::move<T, mtw_simd::Move::how, width>, x, operand); \
  }                                                                                             \
  namespace metal {                                                                             \
  template <typename T>                                                                         \
  MTW_INLINE mtw_simd::if_allowed<T> name(T x, ushort operand) {                                \
    return __metal_##name(x, operand);                                                          \
  }                                                                                             \
  }
MTW_SIMD_MOVE(simd_shuffle, index, 32)
MTW_SIMD_MOVE(simd_shuffle_up, up, 32)
MTW_SIMD_MOVE(simd_shuffle_down, down, 32)
MTW_SIMD_MOVE(simd_shuffle_xor, xor_, 32)
MTW_SIMD_MOVE(simd_shuffle_rotate_up, rotate_up, 32)
MTW_SIMD_MOVE(simd_shuffle_rotate_down, rotate_down, 32)
MTW_SIMD_MOVE(simd_broadcast, bcast, 32)
MTW_SIMD_MOVE(quad_shuffle, index, 4)
MTW_SIMD_MOVE(quad_shuffle_up, up, 4)
MTW_SIMD_MOVE(quad_shuffle_down, down, 4)
MTW_SIMD_MOVE(quad_shuffle_xor, xor_, 4)
MTW_SIMD_MOVE(quad_shuffle_rotate_up, rotate_up, 4)
MTW_SIMD_MOVE(quad_shuffle_rotate_down, rotate_down, 4)
MTW_SIMD_MOVE(quad_broadcast, bcast, 4)
#undef MTW_SIMD_MOVE

#define MTW_SIMD_FILL(name, how, width)                                                          \
  template <typename T>                                                                          \
  MTW_INLINE T __metal_##name(T x, T fill, ushort delta, ushort modulo) {                        \
    return mtw_simd::collective<T>(&mtw_simd::move<T, mtw_simd::Move::how, width>, x, delta,     \
                                   fill, modulo);                                                \
  }                                                                                              \
  namespace metal {                                                                              \
  template <typename T>                                                                          \
  MTW_INLINE mtw_simd::if_allowed<T> name(T x, T fill, ushort delta, ushort modulo) {            \
    return __metal_##name(x, fill, delta, modulo);                                               \
  }                                                                                              \
  template <typename T>                                                                          \
  MTW_INLINE mtw_simd::if_allowed<T> name(T x, T fill, ushort delta) {                           \
    return __metal_##name(x, fill, delta, ushort(width));                                        \
  }                                                                                              \
  }
MTW_SIMD_FILL(simd_shuffle_and_fill_up, fill_up, 32)
MTW_SIMD_FILL(simd_shuffle_and_fill_down, fill_down, 32)
MTW_SIMD_FILL(quad_shuffle_and_fill_up, fill_up, 4)
MTW_SIMD_FILL(quad_shuffle_and_fill_down, fill_down, 4)
#undef MTW_SIMD_FILL

MTW_INLINE ushort __metal_get_simdgroup_size(ushort) { return MTW_SIMD_WIDTH; }
extern "C" uint32_t mtw_thread_index_in_threadgroup(void);
MTW_INLINE ushort __metal_get_thread_index_in_simdgroup(ushort) {
  return ushort(mtw_thread_index_in_threadgroup() % MTW_SIMD_WIDTH);
}

namespace metal {

template <typename T>
MTW_INLINE mtw_simd::if_allowed<T> simd_broadcast_first(T x) {
  return mtw_simd::collective<T>(&mtw_simd::broadcast_first<T>, x);
}
MTW_INLINE simd_vote simd_ballot(bool pred) {
  return simd_vote(mtw_simd::collective<ulong>(&mtw_simd::ballot<32>, pred));
}
MTW_INLINE quad_vote quad_ballot(bool pred) {
  return quad_vote(ushort(mtw_simd::collective<ulong>(&mtw_simd::ballot<4>, pred)));
}
MTW_INLINE simd_vote simd_active_threads_mask() {
  return simd_vote(mtw_simd::collective<ulong>(&mtw_simd::active_mask<32>, false));
}
MTW_INLINE quad_vote quad_active_threads_mask() {
  return quad_vote(ushort(mtw_simd::collective<ulong>(&mtw_simd::active_mask<4>, false)));
}
MTW_INLINE bool simd_all(bool pred) {
  ulong votes = mtw_simd::collective<ulong>(&mtw_simd::ballot<32>, pred);
  ulong live = mtw_simd::collective<ulong>(&mtw_simd::active_mask<32>, false);
  return votes == live;
}
MTW_INLINE bool simd_any(bool pred) { return simd_ballot(pred).any(); }
MTW_INLINE bool quad_all(bool pred) {
  ulong votes = mtw_simd::collective<ulong>(&mtw_simd::ballot<4>, pred);
  ulong live = mtw_simd::collective<ulong>(&mtw_simd::active_mask<4>, false);
  return votes == live;
}
MTW_INLINE bool quad_any(bool pred) { return quad_ballot(pred).any(); }
MTW_INLINE bool simd_is_first() {
  return mtw_simd::collective<bool>(&mtw_simd::is_first<32>, false);
}
MTW_INLINE bool quad_is_first() {
  return mtw_simd::collective<bool>(&mtw_simd::is_first<4>, false);
}
MTW_INLINE void simdgroup_barrier(mem_flags) {
  mtw_simd::collective<bool>(&mtw_simd::nothing, false);
}

}  // namespace metal

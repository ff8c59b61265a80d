// SIMD-group and quad-group functions (MSL specification, section 6.9).
//
// Each lane hands the runtime a pointer to its argument and to its result slot; once the
// lanes of its SIMD-group are there, one combine function computes every lane's result.
//
// Active lanes. Lanes that returned, that wait at a threadgroup barrier, that wait at
// another call site (divergent code, released by the runtime's policy) or that do not
// exist (a partial SIMD-group at the edge of a threadgroup) are inactive, as on the GPU.
// (Lanes waiting at a barrier earlier in the code than the function, in a branch the
// others skipped, go through the barrier first and then take part; see convergence.cpp.)
// - reductions, scans, votes, simd_broadcast_first and simd_is_first take only the
//   active lanes of the SIMD-group (or of the quad);
// - a shuffle or broadcast whose source lane is inactive is undefined in Metal; here the
//   caller gets its own value back, the same rule as for shuffle_up/down past the edge,
//   and sanitize builds report it.
//
// Order of operations. Reductions associate as an xor butterfly over lane offsets 1, 2,
// 4, 8, 16 (1, 2 for quads), as Apple's compiler lowers simd_sum: mlx-lm's packed
// gated-delta kernel is bitwise equal on the GPU to one that spells the butterfly out with
// simd_shuffle_xor, so kernel variants that are bitwise equal on the GPU are bitwise equal
// here. An inactive lane contributes nothing (x op nothing = x), and both partners of a
// butterfly step compute the same value, so every lane gets the same bits. Scans combine
// in log steps (Hillis-Steele); Apple does not document their order.
#pragma once

#include "mtw_math.h"

namespace metal {

// simd_ballot's result: bit l is lane l's vote (0 for inactive lanes).
struct simd_vote {
  using vote_t = ulong;
  vote_t bits;
  constexpr explicit simd_vote(vote_t v = 0) : bits(v) {}
  constexpr explicit operator vote_t() const { return bits; }
  // True when the bit of every lane of the SIMD-group is set (inactive lanes vote 0).
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

MTW_INLINE bool active(uint32_t mask, int lane) {
  return lane >= 0 && lane < kWidth && ((mask >> lane) & 1u);
}
// The active lanes of lane l's group of `width` lanes, as bits counted from the group's
// first lane.
template <int width>
MTW_INLINE uint32_t group_bits(uint32_t mask, int l) {
  constexpr uint32_t all = width == 32 ? 0xFFFFFFFFu : (1u << width) - 1;
  return (mask >> (l / width * width)) & all;
}

// What a lane hands in: its value plus the per-lane operands of shuffles.
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

// Apply a scalar operation to each component of a vector.
template <typename T, typename F>
MTW_INLINE T per_component(T a, T b, F f) {
  if constexpr (metal::__is_vec_v<T>) {
    T r;
    for (int i = 0; i < metal::__vec_traits<T>::size; ++i) r[i] = f(a[i], b[i]);
    return r;
  } else {
    return f(a, b);
  }
}

// min and max that do not depend on the order of their arguments, so both partners of a
// butterfly step get the same bits: NaN loses to a number, -0 is below +0 (as fmin/fmax).
template <typename S>
MTW_INLINE S ordered_min(S a, S b) {
  if constexpr (metal::is_floating_point_v<S>) return S(mtw_math::fmin(float(a), float(b)));
  else return b < a ? b : a;
}
template <typename S>
MTW_INLINE S ordered_max(S a, S b) {
  if constexpr (metal::is_floating_point_v<S>) return S(mtw_math::fmax(float(a), float(b)));
  else return a < b ? b : a;
}

// Bitwise reductions of floats (MLX's bfloat overloads reach __metal_simd_xor(float))
// act on the bits.
template <typename S>
using bits_of = metal::conditional_t<sizeof(S) == 8, uint64_t,
                metal::conditional_t<sizeof(S) == 4, uint32_t,
                metal::conditional_t<sizeof(S) == 2, uint16_t, uint8_t>>>;
template <typename S, typename F>
MTW_INLINE S on_bits(S a, S b, F f) {
  if constexpr (metal::is_floating_point_v<S>) {
    using U = bits_of<S>;
    return __builtin_bit_cast(S, U(f(__builtin_bit_cast(U, a), __builtin_bit_cast(U, b))));
  } else {
    return S(f(a, b));
  }
}

struct Add {
  template <typename T> static T apply(T a, T b) { return a + b; }
  template <typename T> static T identity() { return T(0); }
};
struct Mul {
  template <typename T> static T apply(T a, T b) { return a * b; }
  template <typename T> static T identity() { return T(1); }
};
struct Min {
  template <typename T> static T apply(T a, T b) {
    return per_component(a, b, [](auto x, auto y) { return ordered_min(x, y); });
  }
};
struct Max {
  template <typename T> static T apply(T a, T b) {
    return per_component(a, b, [](auto x, auto y) { return ordered_max(x, y); });
  }
};
struct And {
  template <typename T> static T apply(T a, T b) {
    return per_component(a, b, [](auto x, auto y) {
      return on_bits(x, y, [](auto u, auto v) { return u & v; });
    });
  }
};
struct Or {
  template <typename T> static T apply(T a, T b) {
    return per_component(a, b, [](auto x, auto y) {
      return on_bits(x, y, [](auto u, auto v) { return u | v; });
    });
  }
};
struct Xor {
  template <typename T> static T apply(T a, T b) {
    return per_component(a, b, [](auto x, auto y) {
      return on_bits(x, y, [](auto u, auto v) { return u ^ v; });
    });
  }
};

// Butterfly reduction within groups of `width` lanes (32 for SIMD, 4 for quad functions).
// `has[l]` says whether slot l holds a partial result of some active lane.
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
// log steps. The exclusive result of a lane is the inclusive one of the active lane below
// it, or the identity (0 for sums, 1 for products) for the first active lane.
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
      bool below = p >= 0 && p / width == l / width && has[p];
      next_has[l] = has[l] || below;
      if (has[l] && below) next[l] = Op::apply(v[p], v[l]);
      else if (has[l]) next[l] = v[l];
      else if (below) next[l] = v[p];
    }
    for (int l = 0; l < kWidth; ++l) {
      has[l] = next_has[l];
      if (has[l]) v[l] = next[l];
    }
  }
  for (int l = 0; l < kWidth; ++l) {
    if (!active(mask, l)) continue;
    if constexpr (inclusive) {
      put(outs, l, v[l]);
    } else {
      uint32_t below = group_bits<width>(mask, l) & ((1u << (l % width)) - 1);
      int p = l / width * width + (31 - __builtin_clz(below | 1u));
      put(outs, l, below ? v[p] : Op::template identity<T>());
    }
  }
}

enum class Move { index, up, down, xor_, rotate_up, rotate_down, fill_up, fill_down };

#ifdef MTW_SANITIZE
// The sanitizer's report of a source lane that is inactive (runtime/sanitizer_findings.cpp).
extern "C" void mtw_sanitizer_inactive_lane(const void* const* ins, uint32_t lane,
                                            uint32_t source);
#endif

// Data movement: lane l reads the value (or, for shuffle_and_fill, the filling value) of
// a source lane within its group of `width`; an inactive source gives the caller's own
// value (a source past the group's edge, for shuffle_up and shuffle_down, is defined to;
// an inactive one is undefined in Metal, and the sanitizer reports it). shuffle_and_fill splits the group into vectors of `modulo` lanes: lanes shifted
// out of a vector are refilled from the other end of the filling data.
template <typename T, Move how, int width>
void move(const void* const* ins, void* const* outs, uint32_t mask) {
  for (int l = 0; l < kWidth; ++l) {
    if (!active(mask, l)) continue;
    const Arg<T>& a = arg<T>(ins, l);
    const int base = l / width * width, idx = l - base, d = int(a.operand);
    int src = -1;
    bool filling = false;
    switch (how) {
      case Move::index: src = base + d % width; break;
      case Move::up: src = idx - d >= 0 ? l - d : -1; break;
      case Move::down: src = idx + d < width ? l + d : -1; break;
      case Move::xor_: src = base + (idx ^ d) % width; break;
      case Move::rotate_up: src = base + (idx + width - d % width) % width; break;
      case Move::rotate_down: src = base + (idx + d) % width; break;
      case Move::fill_up:
      case Move::fill_down: {
        const int m = int(a.modulo) > 0 && int(a.modulo) <= width ? int(a.modulo) : width;
        const int vec = base + idx / m * m, i = idx % m;
        const int shifted = how == Move::fill_up ? i - d : i + d;
        filling = shifted < 0 || shifted >= m;
        const int j = filling ? (how == Move::fill_up ? shifted + m : shifted - m) : shifted;
        src = j >= 0 && j < m ? vec + j : -1;
        break;
      }
    }
    if (active(mask, src)) {
      put(outs, l, filling ? arg<T>(ins, src).fill : arg<T>(ins, src).value);
      continue;
    }
#ifdef MTW_SANITIZE
    if (src >= 0) mtw_sanitizer_inactive_lane(ins, uint32_t(l), uint32_t(src));
#endif
    put(outs, l, a.value);
  }
}

template <typename T, int width>
void broadcast_first(const void* const* ins, void* const* outs, uint32_t mask) {
  for (int l = 0; l < kWidth; ++l) {
    if (!active(mask, l)) continue;
    int first = l / width * width + __builtin_ctz(group_bits<width>(mask, l));
    put(outs, l, arg<T>(ins, first).value);
  }
}

enum class Vote { ballot, active_mask, all, any, is_first };

// Votes over the active lanes of each group; ballot and active_mask give bit k for the
// group's lane k.
template <Vote what, int width>
void vote(const void* const* ins, void* const* outs, uint32_t mask) {
  for (int l = 0; l < kWidth; ++l) {
    if (!active(mask, l)) continue;
    const int base = l / width * width;
    const uint32_t live = group_bits<width>(mask, l);
    uint32_t yes = 0;
    for (int k = 0; k < width; ++k)
      if (((live >> k) & 1u) && arg<bool>(ins, base + k).value) yes |= 1u << k;
    if constexpr (what == Vote::ballot) put(outs, l, ulong(yes));
    if constexpr (what == Vote::active_mask) put(outs, l, ulong(live));
    if constexpr (what == Vote::all) put(outs, l, yes == live);
    if constexpr (what == Vote::any) put(outs, l, yes != 0);
    if constexpr (what == Vote::is_first) put(outs, l, base + __builtin_ctz(live) == l);
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

template <Vote what, int width>
MTW_INLINE auto vote_call(bool pred) {
  constexpr bool mask = what == Vote::ballot || what == Vote::active_mask;
  return collective<metal::conditional_t<mask, ulong, bool>>(&vote<what, width>, pred);
}

// Apple's SIMD functions take scalars and vectors of 32-bit or narrower elements; 64-bit
// and bool shuffles come from MLX's utils.h overloads (through uint2 and uint), as on the
// GPU, and bfloat ones from MLX's bf16_math.h. The bitwise reductions take integers only.
template <typename T>
constexpr bool allowed =
    metal::is_arithmetic_v<metal::__elem_t<T>> && sizeof(metal::__elem_t<T>) <= 4 &&
    !metal::is_same_v<metal::__elem_t<T>, bool> && !metal::is_same_v<metal::__elem_t<T>, bfloat>;
template <typename T>
constexpr bool allowed_bitwise = allowed<T> && metal::is_integral_v<metal::__elem_t<T>>;
template <typename T>
using if_allowed = metal::enable_if_t<allowed<T>, T>;
template <typename T>
using if_allowed_bitwise = metal::enable_if_t<allowed_bitwise<T>, T>;

}  // namespace mtw_simd

// The __metal_simd_* layer (which MLX's bfloat overloads call) and the metal:: front ends.
#define MTW_SIMD_REDUCTION(name, Op, width, guard)                                      \
  template <typename T>                                                                 \
  MTW_INLINE T __metal_##name(T x) {                                                    \
    return mtw_simd::collective<T>(&mtw_simd::reduce<T, mtw_simd::Op, width>, x);       \
  }                                                                                     \
  namespace metal {                                                                     \
  template <typename T>                                                                 \
  MTW_INLINE mtw_simd::guard<T> name(T x) {                                             \
    return __metal_##name(x);                                                           \
  }                                                                                     \
  }
MTW_SIMD_REDUCTION(simd_sum, Add, 32, if_allowed)
MTW_SIMD_REDUCTION(simd_product, Mul, 32, if_allowed)
MTW_SIMD_REDUCTION(simd_min, Min, 32, if_allowed)
MTW_SIMD_REDUCTION(simd_max, Max, 32, if_allowed)
MTW_SIMD_REDUCTION(simd_and, And, 32, if_allowed_bitwise)
MTW_SIMD_REDUCTION(simd_or, Or, 32, if_allowed_bitwise)
MTW_SIMD_REDUCTION(simd_xor, Xor, 32, if_allowed_bitwise)
MTW_SIMD_REDUCTION(quad_sum, Add, 4, if_allowed)
MTW_SIMD_REDUCTION(quad_product, Mul, 4, if_allowed)
MTW_SIMD_REDUCTION(quad_min, Min, 4, if_allowed)
MTW_SIMD_REDUCTION(quad_max, Max, 4, if_allowed)
MTW_SIMD_REDUCTION(quad_and, And, 4, if_allowed_bitwise)
MTW_SIMD_REDUCTION(quad_or, Or, 4, if_allowed_bitwise)
MTW_SIMD_REDUCTION(quad_xor, Xor, 4, if_allowed_bitwise)
#undef MTW_SIMD_REDUCTION

#define MTW_SIMD_SCAN(name, Op, width, inclusive)                                          \
  template <typename T>                                                                    \
  MTW_INLINE T __metal_##name(T x) {                                                       \
    return mtw_simd::collective<T>(&mtw_simd::scan<T, mtw_simd::Op, width, inclusive>, x); \
  }                                                                                        \
  namespace metal {                                                                        \
  template <typename T>                                                                    \
  MTW_INLINE mtw_simd::if_allowed<T> name(T x) {                                           \
    return __metal_##name(x);                                                              \
  }                                                                                        \
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
MTW_SIMD_MOVE(simd_broadcast, index, 32)
MTW_SIMD_MOVE(quad_shuffle, index, 4)
MTW_SIMD_MOVE(quad_shuffle_up, up, 4)
MTW_SIMD_MOVE(quad_shuffle_down, down, 4)
MTW_SIMD_MOVE(quad_shuffle_xor, xor_, 4)
MTW_SIMD_MOVE(quad_shuffle_rotate_up, rotate_up, 4)
MTW_SIMD_MOVE(quad_shuffle_rotate_down, rotate_down, 4)
MTW_SIMD_MOVE(quad_broadcast, index, 4)
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
  return mtw_simd::collective<T>(&mtw_simd::broadcast_first<T, 32>, x);
}
template <typename T>
MTW_INLINE mtw_simd::if_allowed<T> quad_broadcast_first(T x) {
  return mtw_simd::collective<T>(&mtw_simd::broadcast_first<T, 4>, x);
}

MTW_INLINE simd_vote simd_ballot(bool pred) {
  return simd_vote(mtw_simd::vote_call<mtw_simd::Vote::ballot, 32>(pred));
}
MTW_INLINE quad_vote quad_ballot(bool pred) {
  return quad_vote(ushort(mtw_simd::vote_call<mtw_simd::Vote::ballot, 4>(pred)));
}
MTW_INLINE simd_vote simd_active_threads_mask() {
  return simd_vote(mtw_simd::vote_call<mtw_simd::Vote::active_mask, 32>(false));
}
MTW_INLINE quad_vote quad_active_threads_mask() {
  return quad_vote(ushort(mtw_simd::vote_call<mtw_simd::Vote::active_mask, 4>(false)));
}
MTW_INLINE bool simd_all(bool pred) {
  return mtw_simd::vote_call<mtw_simd::Vote::all, 32>(pred);
}
MTW_INLINE bool simd_any(bool pred) {
  return mtw_simd::vote_call<mtw_simd::Vote::any, 32>(pred);
}
MTW_INLINE bool quad_all(bool pred) {
  return mtw_simd::vote_call<mtw_simd::Vote::all, 4>(pred);
}
MTW_INLINE bool quad_any(bool pred) {
  return mtw_simd::vote_call<mtw_simd::Vote::any, 4>(pred);
}
MTW_INLINE bool simd_is_first() {
  return mtw_simd::vote_call<mtw_simd::Vote::is_first, 32>(false);
}
MTW_INLINE bool quad_is_first() {
  return mtw_simd::vote_call<mtw_simd::Vote::is_first, 4>(false);
}
// Helper threads exist only in fragment functions.
MTW_INLINE bool simd_is_helper_thread() { return false; }
MTW_INLINE bool quad_is_helper_thread() { return false; }

// All active lanes of the SIMD-group arrive before any goes on. Memory needs no fence: a
// threadgroup's threads share one OS thread.
MTW_INLINE void simdgroup_barrier(mem_flags) {
  mtw_simd::collective<bool>(&mtw_simd::nothing, false);
}

}  // namespace metal

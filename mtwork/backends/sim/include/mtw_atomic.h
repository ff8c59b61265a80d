// Metal's atomic types and functions.
//
// Threadgroups run in parallel on different OS threads and share device memory, so every
// operation is a real hardware atomic (clang's __atomic builtins), also on threadgroup
// memory where it costs little. `atomic<T>` holds nothing but its T, with T's size and
// alignment and no constructor that runs: MLX's `atomic_outputs=True` views plain output
// buffers as `device atomic<T>*`, and a `threadgroup atomic_int x[4];` declaration becomes
// a reference into the threadgroup arena (see rewrite.py).
//
// The value arguments are not deduced, so `atomic_fetch_add_explicit(&hist[i], 1, ...)` on
// an `atomic_uint` converts the 1 as Metal does. Memory orders are honoured as far as each
// operation allows (Metal itself offers relaxed for most of them).
#pragma once

#include "mtw_compute.h"
#include "mtw_profile.h"

namespace metal {

// Metal's own type trait, used by MLX's atomic.h (`is_metal_atomic`).
template <typename... B>
struct _disjunction : false_type {};
template <typename B, typename... Rest>
struct _disjunction<B, Rest...> : conditional_t<bool(B::value), B, _disjunction<Rest...>> {};
template <typename... B>
struct _conjunction : true_type {};
template <typename B, typename... Rest>
struct _conjunction<B, Rest...> : conditional_t<bool(B::value), _conjunction<Rest...>, B> {};

template <typename T>
struct atomic {
  static_assert(is_same_v<T, int> || is_same_v<T, uint> || is_same_v<T, bool> ||
                    is_same_v<T, ulong> || is_same_v<T, float>,
                "Metal has atomic<T> for int, uint, bool, ulong and float only");
  T __value;
  atomic() = default;
  atomic(const atomic&) = delete;
  atomic& operator=(const atomic&) = delete;
};

using atomic_int = atomic<int>;
using atomic_uint = atomic<uint>;
using atomic_bool = atomic<bool>;
using atomic_ulong = atomic<ulong>;
using atomic_float = atomic<float>;

}  // namespace metal

namespace mtw_atomic {

using metal::memory_order;

template <typename T>
struct identity {
  using type = T;
};
// A parameter of this type takes part in no deduction: the atomic's T decides.
template <typename T>
using value_t = typename identity<T>::type;

template <typename T>
constexpr bool is_integer = metal::is_integral_v<T> && !metal::is_same_v<T, bool>;
template <typename T>
constexpr bool is_arithmetic = is_integer<T> || metal::is_same_v<T, float>;

MTW_INLINE constexpr int rmw_order(memory_order order) {
  switch (order) {
    case memory_order::memory_order_relaxed: return __ATOMIC_RELAXED;
    case memory_order::memory_order_acquire: return __ATOMIC_ACQUIRE;
    case memory_order::memory_order_release: return __ATOMIC_RELEASE;
    case memory_order::memory_order_acq_rel: return __ATOMIC_ACQ_REL;
    case memory_order::memory_order_seq_cst: return __ATOMIC_SEQ_CST;
  }
  return __ATOMIC_SEQ_CST;
}
// A load cannot release and a store cannot acquire: drop the half that does not apply.
MTW_INLINE constexpr int load_order(memory_order order) {
  int o = rmw_order(order);
  return o == __ATOMIC_RELEASE ? __ATOMIC_RELAXED : o == __ATOMIC_ACQ_REL ? __ATOMIC_ACQUIRE : o;
}
MTW_INLINE constexpr int store_order(memory_order order) {
  int o = rmw_order(order);
  return o == __ATOMIC_ACQUIRE ? __ATOMIC_RELAXED : o == __ATOMIC_ACQ_REL ? __ATOMIC_RELEASE : o;
}

// Floats travel through their bits: the builtins' _n forms take integers only.
template <typename T>
using bits_t = metal::conditional_t<metal::is_same_v<T, float>, uint32_t, T>;

template <typename T>
MTW_INLINE volatile bits_t<T>* bits(const volatile metal::atomic<T>* object) {
  return reinterpret_cast<volatile bits_t<T>*>(const_cast<volatile T*>(&object->__value));
}

template <typename T>
MTW_INLINE bits_t<T> to_bits(T value) {
  return __builtin_bit_cast(bits_t<T>, value);
}
template <typename T>
MTW_INLINE T from_bits(bits_t<T> value) {
  return __builtin_bit_cast(T, value);
}

// Read-modify-write by compare-exchange, for float arithmetic (the hardware has no
// floating-point fetch-add). The exchange compares bits, so it ends even with NaN stored.
template <typename T, typename F>
MTW_INLINE T update(volatile metal::atomic<T>* object, F f, memory_order order) {
  volatile bits_t<T>* p = bits(object);
  bits_t<T> old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(p, &old, to_bits<T>(f(from_bits<T>(old))), true,
                                      rmw_order(order), __ATOMIC_RELAXED)) {
  }
  return from_bits<T>(old);
}

// In sanitizer builds, accesses inside an atomic operation are not reported as races.
struct SanitizerScope {
#ifdef MTW_SANITIZE
  SanitizerScope() { mtw_sanitizer_atomic(1); }
  ~SanitizerScope() { mtw_sanitizer_atomic(0); }
#endif
};

}  // namespace mtw_atomic

namespace metal {

template <typename T>
MTW_INLINE T atomic_load_explicit(const volatile atomic<T>* object, memory_order order) {
  mtw_atomic::SanitizerScope scope;
  mtw_profile::Atomic counted(object);
  return mtw_atomic::from_bits<T>(
      __atomic_load_n(mtw_atomic::bits(object), mtw_atomic::load_order(order)));
}

template <typename T>
MTW_INLINE void atomic_store_explicit(volatile atomic<T>* object, mtw_atomic::value_t<T> desired,
                                      memory_order order) {
  mtw_atomic::SanitizerScope scope;
  mtw_profile::Atomic counted(object);
  __atomic_store_n(mtw_atomic::bits(object), mtw_atomic::to_bits<T>(desired),
                   mtw_atomic::store_order(order));
}

template <typename T>
MTW_INLINE T atomic_exchange_explicit(volatile atomic<T>* object,
                                      mtw_atomic::value_t<T> desired, memory_order order) {
  mtw_atomic::SanitizerScope scope;
  mtw_profile::Atomic counted(object);
  return mtw_atomic::from_bits<T>(__atomic_exchange_n(
      mtw_atomic::bits(object), mtw_atomic::to_bits<T>(desired), mtw_atomic::rmw_order(order)));
}

// On failure `*expected` receives the value found. Apple compares floats by value, not by
// bits (MLX's atomic.h: with NaN stored the exchange never succeeds, so a retry loop spins
// forever); so does this, and +0 matches -0.
template <typename T>
MTW_INLINE bool atomic_compare_exchange_weak_explicit(volatile atomic<T>* object,
                                                      mtw_atomic::value_t<T>* expected,
                                                      mtw_atomic::value_t<T> desired,
                                                      memory_order success,
                                                      memory_order failure) {
  mtw_atomic::SanitizerScope scope;
  mtw_profile::Atomic counted(object);
  auto* p = mtw_atomic::bits(object);
  int on_success = mtw_atomic::rmw_order(success), on_failure = mtw_atomic::load_order(failure);
  if constexpr (is_same_v<T, float>) {
    uint32_t found = __atomic_load_n(p, on_failure);
    for (;;) {
      float value = mtw_atomic::from_bits<float>(found);
      if (!(value == *expected)) {
        *expected = value;
        return false;
      }
      if (__atomic_compare_exchange_n(p, &found, mtw_atomic::to_bits<float>(desired), false,
                                      on_success, on_failure))
        return true;
    }
  } else {
    return __atomic_compare_exchange_n(p, expected, desired, true, on_success, on_failure);
  }
}

template <typename T>
MTW_INLINE enable_if_t<mtw_atomic::is_arithmetic<T>, T> atomic_fetch_add_explicit(
    volatile atomic<T>* object, mtw_atomic::value_t<T> operand, memory_order order) {
  mtw_atomic::SanitizerScope scope;
  mtw_profile::Atomic counted(object);
  if constexpr (is_same_v<T, float>)
    return mtw_atomic::update(object, [=](float v) { return v + operand; }, order);
  else
    return __atomic_fetch_add(&object->__value, operand, mtw_atomic::rmw_order(order));
}

template <typename T>
MTW_INLINE enable_if_t<mtw_atomic::is_arithmetic<T>, T> atomic_fetch_sub_explicit(
    volatile atomic<T>* object, mtw_atomic::value_t<T> operand, memory_order order) {
  mtw_atomic::SanitizerScope scope;
  mtw_profile::Atomic counted(object);
  if constexpr (is_same_v<T, float>)
    return mtw_atomic::update(object, [=](float v) { return v - operand; }, order);
  else
    return __atomic_fetch_sub(&object->__value, operand, mtw_atomic::rmw_order(order));
}

#define MTW_ATOMIC_INTEGER_OP(name, builtin)                                                    \
  template <typename T>                                                                         \
  MTW_INLINE enable_if_t<mtw_atomic::is_integer<T>, T> name(                                    \
      volatile atomic<T>* object, mtw_atomic::value_t<T> operand, memory_order order) {         \
    mtw_atomic::SanitizerScope scope;                                                           \
    mtw_profile::Atomic counted(object);                                                        \
    return builtin(&object->__value, operand, mtw_atomic::rmw_order(order));                    \
  }
MTW_ATOMIC_INTEGER_OP(atomic_fetch_and_explicit, __atomic_fetch_and)
MTW_ATOMIC_INTEGER_OP(atomic_fetch_or_explicit, __atomic_fetch_or)
MTW_ATOMIC_INTEGER_OP(atomic_fetch_xor_explicit, __atomic_fetch_xor)
MTW_ATOMIC_INTEGER_OP(atomic_fetch_min_explicit, __atomic_fetch_min)
MTW_ATOMIC_INTEGER_OP(atomic_fetch_max_explicit, __atomic_fetch_max)
#undef MTW_ATOMIC_INTEGER_OP

// The 64-bit min and max of Metal 2.4+ (`atomic_ulong`) return nothing.
template <typename T>
MTW_INLINE enable_if_t<mtw_atomic::is_integer<T>> atomic_min_explicit(
    volatile atomic<T>* object, mtw_atomic::value_t<T> operand, memory_order order) {
  mtw_atomic::SanitizerScope scope;
  mtw_profile::Atomic counted(object);
  __atomic_fetch_min(&object->__value, operand, mtw_atomic::rmw_order(order));
}
template <typename T>
MTW_INLINE enable_if_t<mtw_atomic::is_integer<T>> atomic_max_explicit(
    volatile atomic<T>* object, mtw_atomic::value_t<T> operand, memory_order order) {
  mtw_atomic::SanitizerScope scope;
  mtw_profile::Atomic counted(object);
  __atomic_fetch_max(&object->__value, operand, mtw_atomic::rmw_order(order));
}

}  // namespace metal

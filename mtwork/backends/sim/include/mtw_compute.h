// Threadgroup memory and barriers.
#pragma once

#include "mtw_base.h"

namespace metal {

enum class mem_flags : uint32_t {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
  mem_object_data = 16,
};
MTW_INLINE constexpr mem_flags operator|(mem_flags a, mem_flags b) {
  return mem_flags(uint32_t(a) | uint32_t(b));
}
MTW_INLINE constexpr mem_flags operator&(mem_flags a, mem_flags b) {
  return mem_flags(uint32_t(a) & uint32_t(b));
}

enum class memory_order { memory_order_relaxed, memory_order_acquire, memory_order_release,
                          memory_order_acq_rel, memory_order_seq_cst };
constexpr memory_order memory_order_relaxed = memory_order::memory_order_relaxed;
constexpr memory_order memory_order_acquire = memory_order::memory_order_acquire;
constexpr memory_order memory_order_release = memory_order::memory_order_release;
constexpr memory_order memory_order_acq_rel = memory_order::memory_order_acq_rel;
constexpr memory_order memory_order_seq_cst = memory_order::memory_order_seq_cst;

enum class thread_scope { thread_scope_thread, thread_scope_simdgroup,
                          thread_scope_threadgroup, thread_scope_device };
constexpr thread_scope thread_scope_thread = thread_scope::thread_scope_thread;
constexpr thread_scope thread_scope_simdgroup = thread_scope::thread_scope_simdgroup;
constexpr thread_scope thread_scope_threadgroup = thread_scope::thread_scope_threadgroup;
constexpr thread_scope thread_scope_device = thread_scope::thread_scope_device;

// Every thread of the threadgroup must arrive before any goes on. Always inlined so each
// barrier in the source is a distinct call site, which is how divergence is detected.
MTW_INLINE void threadgroup_barrier(mem_flags flags) {
  mtw_threadgroup_barrier(uint32_t(flags));
}

// A threadgroup's threads share one OS thread, so threadgroup fences need no code; device
// memory is shared with threadgroups running on other cores.
MTW_INLINE void atomic_thread_fence(mem_flags flags, memory_order,
                                    thread_scope = thread_scope_device) {
  if ((flags & mem_flags::mem_device) != mem_flags::mem_none) __atomic_thread_fence(5);
}

}  // namespace metal

template <typename T> struct __mtw_element { using type = T; };
template <typename T, size_t N> struct __mtw_element<T[N]> {
  using type = typename __mtw_element<T>::type;
};

// A threadgroup variable declared in a kernel: each thread walks the same declarations in
// the same order, so a per-thread bump cursor gives every thread the same address.
#ifdef __OPENCL_CPP_VERSION__
// The address-space check: a threadgroup variable is threadgroup memory (declared only).
template <typename T>
__local T& __mtw_threadgroup_var(const __constant char* name);
#else
template <typename T>
MTW_INLINE T& __mtw_threadgroup_var(const char* name) {
  return *static_cast<T*>(mtw_threadgroup_alloc(sizeof(T), alignof(T) < 16 ? 16 : alignof(T),
                                                name,
                                                sizeof(typename __mtw_element<T>::type)));
}
#endif


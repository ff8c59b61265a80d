// Hooks of profiled builds (compiler.py defines MTW_PROFILE): what the runtime's profiler
// (runtime/profiler.cpp) cannot tell from memory accesses alone. Other builds get scopes
// that do nothing.
#pragma once

#include "mtw_base.h"

#ifdef __cplusplus
extern "C" {
#endif
// An atomic operation on `object` begins (inside = 1) or ends (0): it counts once, and the
// accesses it makes are part of it.
void mtw_profile_atomic(const volatile void* object, int inside);
// A simdgroup_matrix load or store for the lanes in `mask` (`ins`: their arguments) begins
// (1) or ends (0): the accesses between are one SIMD-group access.
void mtw_profile_group_access(const void* const* ins, uint32_t mask, int inside);
#ifdef __cplusplus
}
#endif

namespace mtw_profile {

struct Atomic {
#ifdef MTW_PROFILE
  MTW_INLINE explicit Atomic(const volatile void* object) { mtw_profile_atomic(object, 1); }
  MTW_INLINE ~Atomic() { mtw_profile_atomic(nullptr, 0); }
#else
  MTW_INLINE explicit Atomic(const volatile void*) {}
#endif
};

struct GroupAccess {
#ifdef MTW_PROFILE
  MTW_INLINE GroupAccess(const void* const* ins, uint32_t mask) : ins_(ins), mask_(mask) {
    mtw_profile_group_access(ins, mask, 1);
  }
  MTW_INLINE ~GroupAccess() { mtw_profile_group_access(ins_, mask_, 0); }

 private:
  const void* const* ins_;
  uint32_t mask_;
#else
  MTW_INLINE GroupAccess(const void* const*, uint32_t) {}
#endif
};

}  // namespace mtw_profile

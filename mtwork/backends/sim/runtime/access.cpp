// The memory accesses of instrumented kernels: clang's -fsanitize-coverage=trace-loads,
// trace-stores calls one of these before each load and store. Sanitized launches check
// them (sanitizer.cpp); profiled ones count them (profiler.cpp); in lockstep kernels
// (compiler.LOCKSTEP_FLAGS) each threadgroup-memory access is a step of the SIMD-group
// (convergence.cpp).
#include <stdint.h>

#include "profiler.h"

namespace mtw {

// sanitizer.cpp: checks one access (it returns at once unless the launch is sanitized).
void sanitizer_access(const void* p, uint32_t size, bool write, const void* pc);

namespace {

// A lockstep kernel's access: threadgroup memory (not the accesses of a combine function,
// which the runtime runs for the SIMD-group) is a step of the SIMD-group.
inline void lockstep_access(Worker* w, const void* p, const void* pc) {
  uintptr_t at = reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(w->tg_memory);
  if (at < kTgMemoryCapacity && !w->combining && !w->group.barrier_free) simd_step(w, pc);
}

inline void on_access(const void* p, uint32_t size, bool write, const void* pc,
                      uint32_t pieces = 1) {
  // A thread's own stacks (its private arrays): no mode looks at them.
  if (in_fiber_stacks(reinterpret_cast<uintptr_t>(p))) return;
  Worker* w = calling_worker();
  if (!w || !w->in_kernel || !w->dispatch) return;
  if (w->dispatch->launch.lockstep) lockstep_access(w, p, pc);
  if (profiler_armed() && profiling(w)) {
    profiler_access(w, p, size, write, pc, pieces);
    return;
  }
  sanitizer_access(p, size, write, pc);
}

}  // namespace
}  // namespace mtw

#define MTW_TRACE(bits, bytes)                                            \
  extern "C" void __sanitizer_cov_load##bytes(uint##bits##_t* p) {        \
    mtw::on_access(p, bytes, false, __builtin_return_address(0));         \
  }                                                                       \
  extern "C" void __sanitizer_cov_store##bytes(uint##bits##_t* p) {       \
    mtw::on_access(p, bytes, true, __builtin_return_address(0));          \
  }
MTW_TRACE(8, 1)
MTW_TRACE(16, 2)
MTW_TRACE(32, 4)
MTW_TRACE(64, 8)
#undef MTW_TRACE
extern "C" void __sanitizer_cov_load16(void* p) {
  mtw::on_access(p, 16, false, __builtin_return_address(0));
}
extern "C" void __sanitizer_cov_store16(void* p) {
  mtw::on_access(p, 16, true, __builtin_return_address(0));
}
// The profiler's wide accesses: a thread's adjacent accesses merged into the wide ones
// Apple's compiler issues (count/wide_access.py): `size` bytes in `pieces` instructions
// the SIMD-group issues together.
extern "C" void mtw_profile_load(void* p, uint32_t size, uint32_t pieces) {
  mtw::on_access(p, size, false, __builtin_return_address(0), pieces);
}
extern "C" void mtw_profile_store(void* p, uint32_t size, uint32_t pieces) {
  mtw::on_access(p, size, true, __builtin_return_address(0), pieces);
}

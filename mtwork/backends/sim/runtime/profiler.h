// The profiler's side of the memory-access callbacks (access.cpp).
#pragma once

#include <stdint.h>

#include "scheduler.h"

namespace mtw {

// The entry of the launch the profiler is armed for (null: not armed).
extern mtw_entry_fn profiled_entry __attribute__((visibility("hidden")));

inline bool profiler_armed() { return __atomic_load_n(&profiled_entry, __ATOMIC_RELAXED); }

// Whether the profiler counts the launch `w` runs: the one it was armed for.
inline bool profiling(const Worker* w) {
  mtw_entry_fn entry = __atomic_load_n(&profiled_entry, __ATOMIC_RELAXED);
  return entry && w->dispatch && w->dispatch->launch.entry == entry;
}

// Whether `address` lies in a fiber's stacks (a thread's own memory).
inline bool in_fiber_stacks(uintptr_t address) {
  return fiber_arena && address - reinterpret_cast<uintptr_t>(fiber_arena) <
                            (fiber_regions << kFiberRegionShift);
}

// The worker whose kernel code calls this (on a fiber, usually; else found the slow way).
inline Worker* calling_worker() {
  uintptr_t sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  return in_fiber_stacks(sp) ? fiber_headers[region_of(sp)].worker : worker_here();
}

// One load or store of `size` bytes at `p` by the thread running on `w`, made at `pc`.
// `pieces`: the instructions the access stands for (1 unless merged: count/wide_access.py).
void profiler_access(Worker* w, const void* p, uint32_t size, bool write, const void* pc,
                     uint32_t pieces = 1);

}  // namespace mtw

// The profiler's side of the memory-access callbacks (access.cpp).
#pragma once

#include <stdint.h>

namespace mtw {

struct Worker;

// Whether a profiler is armed at all (one load; profiling() says for which launch).
extern int profiler_is_armed __attribute__((visibility("hidden")));
inline bool profiler_armed() { return __atomic_load_n(&profiler_is_armed, __ATOMIC_RELAXED); }
// Whether the profiler counts the launch `w` runs: the armed profile's.
bool profiling(const Worker* w);
// One load or store of `size` bytes at `p` by the thread running on `w`, made at `pc`.
void profiler_access(Worker* w, const void* p, uint32_t size, bool write, const void* pc);

}  // namespace mtw

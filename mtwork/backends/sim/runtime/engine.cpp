// The runtime's part of the fast engine (mtwork/backends/sim/engine, include/mtw_engine.h):
// memory for the context in which a kernel library keeps each thread's values across
// barriers, one block per worker, reused from threadgroup to threadgroup; and the way
// back to the fiber engine, when a kernel run by the fast engine finds that the threads
// of a group did not reach the same barrier.
#include <stdlib.h>

#include "scheduler.h"

using namespace mtw;

namespace {

struct Scratch {
  char* memory;
  uint64_t bytes;
};

// One per worker of the pool (which is fixed once made); made by the first call.
Scratch* scratch_of = nullptr;

Scratch* table(Worker* w) {
  Scratch* t = __atomic_load_n(&scratch_of, __ATOMIC_ACQUIRE);
  if (t) return t;
  Scratch* fresh = static_cast<Scratch*>(calloc(size_t(pool_size), sizeof(Scratch)));
  if (!fresh) fail(w, MTW_SYSTEM, "out of memory for the fast engine's context");
  if (__atomic_compare_exchange_n(&scratch_of, &t, fresh, false, __ATOMIC_ACQ_REL,
                                  __ATOMIC_ACQUIRE))
    return fresh;
  free(fresh);
  return t;
}

}  // namespace

extern "C" void* mtw_engine_scratch(uint64_t bytes) {
  Worker* w = worker_here();
  Scratch& s = table(w)[w->index];
  if (s.bytes < bytes) {
    free(s.memory);
    const uint64_t size = (bytes + 4095) & ~uint64_t(4095);
    s.memory = static_cast<char*>(aligned_alloc(64, size));
    s.bytes = s.memory ? size : 0;
    if (!s.memory) fail(w, MTW_SYSTEM, "out of memory for the fast engine's context");
  }
  return s.memory;
}

extern "C" void mtw_engine_fallback(const char* reason) {
  fail(worker_here(), MTW_NEEDS_FIBERS, reason);
}

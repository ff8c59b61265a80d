// Fibers: one stack per suspended GPU thread, switched by hand-written assembly.
//
// Each fiber stack is a power-of-two sized, equally aligned region whose first page holds
// the Fiber header, so code running on the fiber finds its header from the stack pointer
// alone (no thread-local lookups on the hot path). A guard page below the stack turns a
// stack overflow into a fault the runtime reports.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace mtw {

struct Worker;

constexpr size_t kFiberRegion = size_t(1) << 18;  // 256 KiB per fiber, header included
constexpr size_t kPage = 4096;

struct Fiber {
  Worker* worker;
  void* sp;          // saved stack pointer while suspended
  uint32_t thread;   // linear thread index this fiber is running
  uint32_t state;    // FiberState
  Fiber* next_free;
};

enum FiberState : uint32_t { kFiberFree = 0, kFiberRunning, kFiberBlocked, kFiberFinished };

extern "C" void mtw_switch(void** save_sp, void* new_sp);

inline Fiber* current_fiber() {
  return reinterpret_cast<Fiber*>(reinterpret_cast<uintptr_t>(__builtin_frame_address(0)) &
                                  ~(uintptr_t)(kFiberRegion - 1));
}

// Reserves address space for `count` fiber regions, contiguous and region-aligned, so
// "is this address on one of our fiber stacks" is one range check. Null on failure.
char* fiber_arena_reserve(uint32_t count);
// Makes region `index` of `arena` a fiber (header page, guard page, stack).
Fiber* fiber_create(Worker* worker, char* arena, uint32_t index);
// Prepares `fiber` to start at `start` the next time it is switched to.
void fiber_prepare(Fiber* fiber, void (*start)());

}  // namespace mtw

// Fibers: one stack per suspended GPU thread, switched by hand-written assembly.
//
// All fiber stacks live in one arena reserved at start-up. Each fiber owns a region of
// kFiberRegion bytes: a guard below its stack, the stack, a guard above. Guards are
// never mapped, so a frame too big for the stack (kernels are built with stack probes,
// which touch every page a frame takes, in order) or a private array indexed far outside
// its bounds faults in the thread's own guard instead of reaching another fiber's stack.
// The Fiber headers sit outside the arena, in a table indexed by region, so no write
// relative to a stack can reach the runtime's bookkeeping; a fiber finds its header from
// the stack pointer with one subtraction and one shift.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace mtw {

struct Worker;

constexpr size_t kPage = 4096;
constexpr size_t kFiberStack = size_t(256) << 10;       // usable stack of one GPU thread
constexpr size_t kGuardBelow = size_t(512) << 10;       // faults: overflow, negative indices
constexpr size_t kGuardAbove = size_t(256) << 10;       // faults: indices past a frame's top
constexpr int kFiberRegionShift = 20;
constexpr size_t kFiberRegion = size_t(1) << kFiberRegionShift;
static_assert(kGuardBelow + kFiberStack + kGuardAbove == kFiberRegion, "region layout");
// Fibers per worker: one per thread of the largest threadgroup, plus the one that starts
// the next thread while all others wait.
constexpr uint32_t kFibersPerWorker = 1024 + 1;

struct Fiber {
  Worker* worker;
  void* sp;          // saved stack pointer while suspended
  uint32_t thread;   // linear thread index this fiber is running
  uint32_t state;    // FiberState
  Fiber* next_free;
};

enum FiberState : uint32_t { kFiberFree = 0, kFiberRunning, kFiberBlocked, kFiberFinished };

// Where an address lies relative to a fiber's stack.
enum StackPlace { kNotInArena = 0, kInStack, kBelowStack, kAboveStack };

extern "C" void mtw_switch(void** save_sp, void* new_sp);

// The arena (null until fiber_arena_init) and the header of each of its regions.
extern char* fiber_arena;
extern Fiber* fiber_headers;
extern size_t fiber_regions;

inline size_t region_of(uintptr_t address) {
  return (address - reinterpret_cast<uintptr_t>(fiber_arena)) >> kFiberRegionShift;
}

inline Fiber* current_fiber() {
  return &fiber_headers[region_of(reinterpret_cast<uintptr_t>(__builtin_frame_address(0)))];
}

// Reserves address space for `workers` workers' fibers (nothing is mapped yet).
bool fiber_arena_init(uint32_t workers);
// Maps the stack of fiber `index` of worker `worker_index` and returns its header.
Fiber* fiber_create(Worker* worker, uint32_t worker_index, uint32_t index);
// Prepares `fiber` to start at `start` the next time it is switched to.
void fiber_prepare(Fiber* fiber, void (*start)());
// Where `address` lies relative to `fiber`'s stack (null: the stack of the region it is
// in); kNotInArena outside every fiber region.
StackPlace stack_place(uintptr_t address, const Fiber* fiber = nullptr);

}  // namespace mtw

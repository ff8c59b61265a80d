// Fibers: one stack per suspended GPU thread, switched by hand-written assembly.
//
// All fiber stacks live in one arena reserved at start-up. Each fiber owns a region of
// kFiberRegion bytes, from low to high addresses: a guard, its call stack (frames,
// spills, return addresses), a guard, its private stack, a guard. Kernels are built with
// clang's SafeStack, which puts every array a kernel indexes (its thread-private arrays)
// on the private stack, and with stack probes, which make a frame touch each of its pages
// in order. So a private array indexed outside its bounds writes the thread's own scratch
// (as on the GPU) and never a return address; indexed far outside, or too big, it faults
// in the thread's own guards instead of reaching another fiber. Guards are never mapped.
// The Fiber headers sit outside the arena, in a table indexed by region, so no write
// relative to a stack can reach the runtime's bookkeeping; a fiber finds its header from
// the stack pointer with one subtraction and one shift.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "platform.h"

namespace mtw {

struct Worker;

constexpr size_t kKiB = 1024;
constexpr size_t kGuardBelow = 192 * kKiB;    // faults: frames overflowing the call stack
constexpr size_t kFiberStack = 256 * kKiB;    // frames, spills, return addresses, and
                                              // arrays SafeStack proves indexed in bounds
constexpr size_t kGuardBetween = 128 * kKiB;  // faults: private arrays too big, or indexed
                                              // far below their start
constexpr size_t kPrivateStack = 256 * kKiB;  // thread-private arrays
constexpr size_t kGuardAbove = 192 * kKiB;    // faults: private arrays indexed far past
                                              // their end
constexpr int kFiberRegionShift = 20;
constexpr size_t kFiberRegion = size_t(1) << kFiberRegionShift;
static_assert(kGuardBelow + kFiberStack + kGuardBetween + kPrivateStack + kGuardAbove ==
                  kFiberRegion,
              "region layout");
static_assert((kGuardBelow | kFiberStack | kGuardBetween | kPrivateStack) %
                      platform::kLargestPage == 0,
              "guards and stacks are whole pages on every host");
// Fibers per worker: one per thread of the largest threadgroup, plus the one that starts
// the next thread while all others wait.
constexpr uint32_t kFibersPerWorker = 1024 + 1;

// One cache line, so the table lookup is a shift and neighbours do not share lines.
struct alignas(64) Fiber {
  Worker* worker;
  void* sp;          // saved stack pointer while suspended
  void* private_sp;  // SafeStack's stack pointer for the private stack
  uint32_t thread;   // linear thread index this fiber is running
  uint32_t state;    // FiberState
  Fiber* next_free;
};

enum FiberState : uint32_t { kFiberFree = 0, kFiberRunning, kFiberBlocked, kFiberFinished };

// Where an address lies relative to a fiber's stacks.
enum StackPlace { kNotInArena = 0, kInStack, kBelowStack, kBelowPrivate, kAboveStack };

// The arena (null until fiber_arena_init) and the header of each of its regions. Hidden:
// read on every barrier and SIMD-group function, PC-relative rather than through the GOT.
#define MTW_HIDDEN __attribute__((visibility("hidden")))
extern char* fiber_arena MTW_HIDDEN;
extern Fiber* fiber_headers MTW_HIDDEN;
extern size_t fiber_regions MTW_HIDDEN;

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

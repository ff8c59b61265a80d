#include "fiber.h"

#include <string.h>

#include "platform.h"

namespace mtw {

char* fiber_arena = nullptr;
Fiber* fiber_headers = nullptr;
size_t fiber_regions = 0;

bool fiber_arena_init(uint32_t workers) {
  // Guards are protected page by page: the layout must be made of whole pages.
  if ((kGuardBelow | kFiberStack | kGuardBetween | kPrivateStack) % platform::page_size())
    return false;
  size_t regions = size_t(workers) * kFibersPerWorker;
  void* raw = platform::reserve(regions * kFiberRegion);
  if (!raw) return false;
  void* headers = platform::map_zeroed(regions * sizeof(Fiber));
  if (!headers) {
    platform::unmap(raw, regions * kFiberRegion);
    return false;
  }
  fiber_headers = static_cast<Fiber*>(headers);
  fiber_regions = regions;
  fiber_arena = static_cast<char*>(raw);
  return true;
}

constexpr size_t kStackColours = 64, kColourStep = 208;  // 13 cache lines' worth of 16

static char* stack_bottom(size_t region) {
  return fiber_arena + region * kFiberRegion + kGuardBelow;
}

static char* private_bottom(size_t region) {
  return stack_bottom(region) + kFiberStack + kGuardBetween;
}

Fiber* fiber_create(Worker* worker, uint32_t worker_index, uint32_t index) {
  size_t region = size_t(worker_index) * kFibersPerWorker + index;
  if (!platform::commit(stack_bottom(region), kFiberStack) ||
      !platform::commit(private_bottom(region), kPrivateStack))
    return nullptr;
  Fiber* fiber = &fiber_headers[region];
  memset(fiber, 0, sizeof(Fiber));
  fiber->worker = worker;
  return fiber;
}

void fiber_prepare(Fiber* fiber, void (*start)()) {
  // Stacks start at different offsets within a page (a multiple of 16 bytes, as the ABI
  // wants): their tops, touched on every switch, would otherwise all fall into the same
  // cache sets, since the regions are a power of two apart.
  size_t region = size_t(fiber - fiber_headers);
  uintptr_t top = reinterpret_cast<uintptr_t>(stack_bottom(region)) + kFiberStack -
                  (region % kStackColours) * kColourStep;
  fiber->private_sp = private_bottom(region) + kPrivateStack -
                      (region % kStackColours) * kColourStep;
  fiber->sp = platform::fiber_first_frame(top, start);
}

StackPlace stack_place(uintptr_t address, const Fiber* fiber) {
  uintptr_t base = reinterpret_cast<uintptr_t>(fiber_arena);
  if (!fiber_arena || address < base || region_of(address) >= fiber_regions) return kNotInArena;
  size_t region = fiber ? size_t(fiber - fiber_headers) : region_of(address);
  uintptr_t stack = reinterpret_cast<uintptr_t>(stack_bottom(region));
  uintptr_t priv = reinterpret_cast<uintptr_t>(private_bottom(region));
  uintptr_t own = base + region * kFiberRegion;
  if (address < own) return kBelowPrivate;  // far below: an index, not a deep call chain
  if (address < stack) return kBelowStack;
  if (address < stack + kFiberStack) return kInStack;
  if (address < priv) return kBelowPrivate;
  if (address < priv + kPrivateStack) return kInStack;
  return kAboveStack;
}

}  // namespace mtw

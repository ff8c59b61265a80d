#include "fiber.h"

#include <string.h>
#include <sys/mman.h>

namespace mtw {

#if defined(__APPLE__)
#define MTW_SYM(name) "_" #name
#else
#define MTW_SYM(name) #name
#endif

// mtw_switch(save_sp, new_sp): push the callee-saved registers, store the stack pointer
// in *save_sp, load new_sp and pop the other context's registers. The floating-point
// control state is not switched: every fiber runs kernel code in the same environment.
#if defined(__x86_64__)
__asm__(
    ".text\n"
    ".globl " MTW_SYM(mtw_switch) "\n"
    MTW_SYM(mtw_switch) ":\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n");
#elif defined(__aarch64__)
__asm__(
    ".text\n"
    ".globl " MTW_SYM(mtw_switch) "\n"
    ".p2align 2\n"
    MTW_SYM(mtw_switch) ":\n"
    "  sub sp, sp, #176\n"
    "  stp x19, x20, [sp, #0]\n"
    "  stp x21, x22, [sp, #16]\n"
    "  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n"
    "  stp x27, x28, [sp, #64]\n"
    "  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n"
    "  stp d10, d11, [sp, #112]\n"
    "  stp d12, d13, [sp, #128]\n"
    "  stp d14, d15, [sp, #144]\n"
    "  mov x2, sp\n"
    "  str x2, [x0]\n"
    "  mov sp, x1\n"
    "  ldp x19, x20, [sp, #0]\n"
    "  ldp x21, x22, [sp, #16]\n"
    "  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n"
    "  ldp x27, x28, [sp, #64]\n"
    "  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n"
    "  ldp d10, d11, [sp, #112]\n"
    "  ldp d12, d13, [sp, #128]\n"
    "  ldp d14, d15, [sp, #144]\n"
    "  add sp, sp, #176\n"
    "  ret\n");
#else
#error "the mtwork emulator supports x86-64 and arm64 hosts"
#endif

char* fiber_arena = nullptr;
Fiber* fiber_headers = nullptr;
size_t fiber_regions = 0;

bool fiber_arena_init(uint32_t workers) {
  size_t regions = size_t(workers) * kFibersPerWorker;
  void* raw = mmap(nullptr, regions * kFiberRegion, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return false;
  void* headers = mmap(nullptr, regions * sizeof(Fiber), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (headers == MAP_FAILED) {
    munmap(raw, regions * kFiberRegion);
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
  if (mprotect(stack_bottom(region), kFiberStack, PROT_READ | PROT_WRITE) != 0 ||
      mprotect(private_bottom(region), kPrivateStack, PROT_READ | PROT_WRITE) != 0)
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
#if defined(__x86_64__)
  // Frame popped by mtw_switch: r15, r14, r13, r12, rbx, rbp, return address. After
  // `ret`, rsp = top - 8, the alignment a called function expects.
  uint64_t* sp = reinterpret_cast<uint64_t*>(top - 16);
  *sp = reinterpret_cast<uint64_t>(start);
  sp -= 6;
  memset(sp, 0, 6 * sizeof(uint64_t));
  fiber->sp = sp;
#else
  uint64_t* sp = reinterpret_cast<uint64_t*>(top - 176);
  memset(sp, 0, 176);
  sp[11] = reinterpret_cast<uint64_t>(start);  // x30, the link register
  fiber->sp = sp;
#endif
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

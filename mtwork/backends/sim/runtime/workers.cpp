// Which worker runs the code here: the pool's workers, found from the stack pointer (no
// thread-local lookup, which may allocate in a dlopen'ed library). Everything in the
// runtime that needs its worker (the pool, the sanitizer, the profiler) asks here.
#include <stdint.h>

#include "scheduler.h"

using namespace mtw;

Worker** mtw::workers = nullptr;
int mtw::pool_size = 0;

// SafeStack (kernels are built with -fsanitize=safe-stack and
// -safestack-use-pointer-address) asks here where the private stack pointer lives: the
// fiber's, or for kernel code the scheduler runs on its own stack (the combine functions
// of SIMD-group functions), the worker's.
extern "C" __attribute__((visibility("default"))) void** __safestack_pointer_address() {
  uintptr_t sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  if (stack_place(sp) == kInStack) return &fiber_headers[region_of(sp)].private_sp;
  return &worker_here()->private_sp;
}

Worker* mtw::worker_here() {
  uintptr_t sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  if (stack_place(sp) == kInStack) return fiber_headers[region_of(sp)].worker;
  for (int i = 0; i < pool_size; ++i) {
    Worker* w = workers[i];
    if (sp - w->os_stack_lo < w->os_stack_hi - w->os_stack_lo) return w;
  }
  return nullptr;
}

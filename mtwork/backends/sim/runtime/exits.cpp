// The C library's ways of ending the process, as kernel code sees them.
//
// Kernels call these instead of the C library's (include/mtw_exits.h renames the calls): a
// kernel's call of exit() lands here, and fails the dispatch as a fault does (a
// KernelFault naming the thread), instead of ending the process that runs it, the
// caller's own when in-process.
// abort() needs nothing here: its SIGABRT is a fault already (pool.cpp).
#include <stdio.h>

#include "runtime.h"

namespace {

[[noreturn]] void stop_dispatch(const char* call, int status) {
  char message[96];
  snprintf(message, sizeof(message), "%s(%d) called in kernel code", call, status);
  mtw_kernel_fault(message);
  __builtin_unreachable();  // mtw_kernel_fault leaves the thread's fiber for good
}

}  // namespace

extern "C" {
[[noreturn]] void mtw_kernel_exit(int status) { stop_dispatch("exit", status); }
[[noreturn]] void mtw_kernel__exit(int status) { stop_dispatch("_exit", status); }
[[noreturn]] void mtw_kernel__Exit(int status) { stop_dispatch("_Exit", status); }
[[noreturn]] void mtw_kernel_quick_exit(int status) { stop_dispatch("quick_exit", status); }
}

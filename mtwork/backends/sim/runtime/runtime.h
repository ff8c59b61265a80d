// The emulator runtime's C interface, called from Python through ctypes.
#pragma once

#include <stdint.h>

#include "mtw_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mtw_launch {
  mtw_entry_fn entry;
  void* const* buffers;
  const char* kernel_name;
  uint32_t grid[3];            // threads per grid (dispatchThreads semantics)
  uint32_t threadgroup[3];     // threads per threadgroup, already clamped to the grid
  uint32_t tg_memory_limit;    // bytes of threadgroup memory a threadgroup may use
  uint32_t tg_static_bytes;    // bytes reserved up front for [[threadgroup(n)]] arguments
  uint32_t workers;            // OS threads to spread threadgroups over (0: all cores)
  uint32_t barrier_free;       // `entry` is mtw_entry_barrier_free: blocking is a bug
} mtw_launch;

enum mtw_status {
  MTW_OK = 0,
  MTW_RUNNING = 1,
  MTW_FAULT = 2,          // a signal inside kernel code (bad pointer, trap, stack overflow)
  MTW_DEADLOCK = 3,       // threads blocked forever (barrier divergence, early return)
  MTW_TG_MEMORY = 4,      // threadgroup memory over budget
  MTW_CANCELLED = 5,      // stopped from outside (watchdog, interrupt)
  MTW_KERNEL_ERROR = 6,   // the kernel reported an error itself
  MTW_SYSTEM = 7,         // the runtime could not get memory or threads
  MTW_NEEDS_FIBERS = 8,   // a kernel run as barrier-free blocked: run it on the general path
};

// Starts a dispatch; returns nonzero if another is running. One dispatch at a time.
int mtw_dispatch_start(const mtw_launch* launch);
// Waits up to timeout_ms; returns MTW_RUNNING while the dispatch goes on, else its status.
int mtw_dispatch_wait(uint32_t timeout_ms);
// Stops the running dispatch: workers inside kernel code are interrupted.
void mtw_dispatch_cancel(void);
// The message of the last failed dispatch.
const char* mtw_dispatch_message(void);
// Threadgroup memory high-water mark (bytes) of the last dispatch.
uint32_t mtw_dispatch_tg_memory(void);
int mtw_abi_version(void);

#ifdef __cplusplus
}
#endif

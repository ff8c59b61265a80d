// The contract between the emulator runtime (libmtwrt) and kernel libraries.
//
// A kernel library exports `mtw_entry(mtw_group*, void* const* buffers)`, which runs the
// GPU thread `group->current` of one threadgroup. Each fiber of the runtime calls it for
// one unstarted thread after another; a thread that blocks (barrier, SIMD-group function)
// stays suspended on its fiber while another fiber goes on with the next thread. This
// keeps kernels without barriers at one fiber per threadgroup and no context switches.
#ifndef MTW_ABI_H
#define MTW_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MTW_ABI_VERSION 5
#define MTW_SIMD_WIDTH 32
#define MTW_MAX_THREADS 1024
#define MTW_MAX_SIMDGROUPS (MTW_MAX_THREADS / MTW_SIMD_WIDTH)

typedef struct mtw_group {
  // Thread bookkeeping, kept by the runtime.
  uint32_t next_thread;  // linear index of the next thread to start
  uint32_t nthreads;     // threads in this (possibly partial) threadgroup
  uint32_t current;      // linear index of the thread running now
  uint32_t done;         // threads that have returned
  uint16_t simd_done[MTW_MAX_SIMDGROUPS];  // returned threads per SIMD-group
  // Geometry: everything a thread attribute is derived from.
  uint32_t tg_size[3];        // actual size of this threadgroup (clipped at the grid edge)
  uint32_t dispatch_tg[3];    // threadgroup size given at dispatch
  uint32_t group_pos[3];      // threadgroup_position_in_grid
  uint32_t groups[3];         // threadgroups_per_grid
  uint32_t grid[3];           // threads_per_grid
  uint32_t tg_cursor[MTW_MAX_THREADS];  // per-thread bump offset into threadgroup memory
  char* tg_memory;            // this threadgroup's threadgroup memory
  uint32_t tg_memory_size;    // bytes available in tg_memory
  uint32_t tg_memory_used;    // high-water mark, for the budget check
  uint32_t tg_static_bytes;   // bytes taken by [[threadgroup(n)]] arguments
  uint32_t barrier_free;      // running the barrier-free entry: blocking is a bug
  void* runtime;              // the runtime's private state for this group
} mtw_group;

// `mtw_entry` runs threads that may block; `mtw_entry_barrier_free` runs all threads of a
// group in plain nested loops (vectorizable) for kernels that never block.
typedef void (*mtw_entry_fn)(mtw_group* group, void* const* buffers);

// Combines the values of one SIMD-group collective. `ins[l]` and `outs[l]` point at
// lane l's argument and result (null for lanes not taking part); `active` has one bit
// per taking-part lane.
typedef void (*mtw_combine_fn)(const void* const* ins, void* const* outs, uint32_t active);

// Runtime entry points called from kernel code. Barriers and collectives are convergent
// and never merged: the optimizer may neither copy a call into branches nor fold calls
// from two branches into one, so the call site (the return address) identifies the
// barrier in the source, which is how divergence is detected.
#if defined(__clang__)
#define MTW_CONVERGENT __attribute__((convergent, nomerge, noinline))
#else
#define MTW_CONVERGENT
#endif
MTW_CONVERGENT void mtw_threadgroup_barrier(uint32_t flags);
MTW_CONVERGENT void mtw_simd_collective(const void* in, void* out, mtw_combine_fn combine);
// A threadgroup variable: `name` and `element_size` let the sanitizer name what it reports.
void* mtw_threadgroup_alloc(uint32_t size, uint32_t align, const char* name,
                            uint32_t element_size);
// Sanitizer mode: accesses between begin and end are one atomic operation (not a race).
void mtw_sanitizer_atomic(int inside);
void mtw_kernel_fault(const char* message);

// Logging (os_log, include/mtw_logging.h): one argument of a message, its value widened
// (integers to 64 bits, floats to double); `count` components of a vector, 1 for a scalar.
enum mtw_log_kind { MTW_LOG_SIGNED = 0, MTW_LOG_UNSIGNED = 1, MTW_LOG_FLOAT = 2,
                    MTW_LOG_STRING = 3, MTW_LOG_POINTER = 4 };
// Metal's log levels: os_log::log, log_debug, log_info, log_error, log_fault.
enum mtw_log_level { MTW_LOG_DEFAULT = 0, MTW_LOG_DEBUG = 1, MTW_LOG_INFO = 2,
                     MTW_LOG_ERROR = 3, MTW_LOG_FAULT = 4 };
typedef struct mtw_log_arg {
  uint32_t kind;   // mtw_log_kind
  uint32_t count;  // components
  union {
    int64_t i[4];
    uint64_t u[4];
    double f[4];
    const void* p;
  } value;
} mtw_log_arg;
// Writes one message of the running thread into the dispatch's log, `format` (checked
// when the kernel compiled, include/mtw_log_format.h) printed with `args`; `file` and
// `line` are the call's place in the compiled source.
void mtw_log_message(uint32_t level, const char* subsystem, const char* category,
                     const char* format, const char* file, uint32_t line,
                     const mtw_log_arg* args, uint32_t count);

#ifdef __cplusplus
}
#endif

#endif  // MTW_ABI_H

// Sanitizer mode: checks every load, store, copy and fill of an instrumented kernel.
//
// Kernels compiled for sanitizing call __sanitizer_cov_load/storeN (clang's
// -fsanitize-coverage=trace-loads,trace-stores) before each load and store,
// mtw_sanitizer_memcpy/memmove/memset in place of the memory intrinsics (struct and vector
// copies, zero-fill loops), and mtw_sanitizer_storeN before each atomic read-modify-write,
// which the tracing does not see (compiler.SANITIZE_FLAGS). Accesses to a thread's own
// stack and to the runtime's state pass; accesses to device buffers are checked against
// the buffers' bounds (and inputs against writes); accesses to threadgroup memory go
// through a shadow per byte that finds races between two barriers, and reads of bytes
// never written (sanitizer.cpp). Array subscripts whose bound clang knows (thread-private
// and threadgroup arrays) are checked by clang's -fsanitize=array-bounds, which calls
// __ubsan_handle_out_of_bounds; SIMD-group functions that read an inactive lane call
// mtw_sanitizer_inactive_lane (include/mtw_simd.h). Findings are recorded, with the
// calls that led to them, in sanitizer_findings.cpp.
#pragma once

#include <pthread.h>
#include <stdint.h>

#include "runtime.h"

namespace mtw {

struct Worker;
struct Dispatch;

constexpr uint32_t kMaxTgArrays = 64;
// What a worker's escape jump carries when the sanitizer stops a kernel (not a signal).
constexpr int kSanitizerStop = 0x100;

// An array findings can name: a threadgroup array (its place in threadgroup memory), or
// the type of an array whose subscript went out of bounds (offset kNotThreadgroup, size
// its extent, name clang's type name, e.g. 'float[8]').
struct TgArray {
  uint32_t offset;
  uint32_t size;
  uint32_t element_size;
  const char* name;
};
constexpr uint32_t kNotThreadgroup = 0xFFFFFFFFu;

// One byte of threadgroup memory, as last seen in the current barrier interval. Lanes of
// one SIMD-group are ordered by the collectives between their accesses, so each access
// keeps its SIMD-group's collective count (w->simd_epoch) at the time.
struct TgShadow {
  uint32_t group;         // which threadgroup run this entry belongs to (else: stale)
  uint32_t epoch;         // barrier interval of the accesses below
  uint16_t writer;        // thread that last wrote, or kNobody
  uint16_t write_simd;    // its SIMD-group's collectives at that write
  uint16_t first_reader;  // first thread that read, or kNobody
  uint16_t far_reader;    // a reader of another SIMD-group than first_reader's, or kNobody
  uint16_t reader;        // thread that last read, or kNobody
  uint16_t reader2;       // another lane of reader's SIMD-group read at read_simd, or kNobody
  uint16_t read_simd;     // reader's SIMD-group's collectives at that read
  uint8_t flags;          // kWritten: written since the threadgroup started
  uint8_t pad;
};

struct SanitizerState {
  pthread_mutex_t lock;
  uint32_t findings;
  TgArray arrays[kMaxTgArrays];
  uint32_t array_count;
  uintptr_t image_lo, image_hi;  // the kernel library's own memory (constants, tables)
  uintptr_t image_base;          // its load address (code offsets count from it)
};

void sanitizer_begin_dispatch(Dispatch* d);
void sanitizer_begin_worker(Worker* w);
void sanitizer_register_array(Worker* w, uint32_t offset, uint32_t size, const char* name,
                              uint32_t element_size);
void sanitizer_report(Worker* w, uint32_t kind, uint32_t thread, uint32_t other,
                      const void* pc);
// Thread `linear`'s thread_position_in_threadgroup (all 0xFFFFFFFF: no such thread).
void sanitizer_position(const Worker* w, uint32_t linear, uint32_t out[3]);
// A finding of `kind` by `thread` (linear) at kernel code `pc`, its other fields unset.
mtw_finding sanitizer_finding(Worker* w, uint32_t kind, uint32_t thread, const void* pc);
// Records a finding, folding repeats of the same kind at the same code into one.
void sanitizer_record(Worker* w, const mtw_finding& f);
// The index of the array {offset, size, name} in the dispatch's table (added if new), or
// -1 when the table is full.
int32_t sanitizer_array(Worker* w, uint32_t offset, uint32_t size, const char* name,
                        uint32_t element_size);
// A collective released for `mask` while other live lanes wait elsewhere.
void sanitizer_simd_release(Worker* w, uint32_t simdgroup, uint32_t mask, const void* site);

}  // namespace mtw

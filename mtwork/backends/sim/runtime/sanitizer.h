// Sanitizer mode: checks every load and store of an instrumented kernel.
//
// Kernels compiled for sanitizing call __sanitizer_cov_load/storeN (clang's
// -fsanitize-coverage=trace-loads,trace-stores) before each memory access. Accesses to a
// thread's own stack and to the runtime's state pass; accesses to device buffers are
// checked against the buffers' bounds (and inputs against writes); accesses to threadgroup
// memory go through a shadow per byte that finds races between two barriers, and reads of
// bytes never written.
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

struct TgArray {
  uint32_t offset;
  uint32_t size;
  uint32_t element_size;
  const char* name;
};

// One byte of threadgroup memory, as last seen.
struct TgShadow {
  uint32_t group;       // which threadgroup run this entry belongs to (else: stale)
  uint32_t epoch;       // barrier interval of the accesses below
  uint16_t writer;      // thread that wrote in this interval, or kNobody
  uint16_t reader;      // first thread that read in this interval, or kNobody
  uint16_t simd_epoch;  // SIMD-group collectives completed at the last access
  uint8_t flags;        // kWritten, kManyReaders
  uint8_t pad;
};

struct SanitizerState {
  pthread_mutex_t lock;
  uint32_t findings;
  TgArray arrays[kMaxTgArrays];
  uint32_t array_count;
  uintptr_t image_lo, image_hi;  // the kernel library's own memory (constants, tables)
};

void sanitizer_begin_dispatch(Dispatch* d);
void sanitizer_begin_worker(Worker* w);
void sanitizer_register_array(Worker* w, uint32_t offset, uint32_t size, const char* name,
                              uint32_t element_size);
void sanitizer_report(Worker* w, uint32_t kind, uint32_t thread, uint32_t other,
                      const void* pc);
// A collective released for `mask` while other live lanes wait elsewhere.
void sanitizer_simd_release(Worker* w, uint32_t simdgroup, uint32_t mask, const void* site);

}  // namespace mtw

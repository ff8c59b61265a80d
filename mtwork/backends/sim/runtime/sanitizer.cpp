#include "sanitizer.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler.h"

namespace mtw {

namespace {

constexpr uint16_t kNobody = 0xFFFF;
constexpr uint8_t kWritten = 1;
constexpr const char* kStoppedBeforeWrite =
    "stopped by the sanitizer before an out-of-bounds write";

inline uint32_t simdgroup_of(uint32_t thread) { return thread / MTW_SIMD_WIDTH; }

// The thread that an access by `t` races with at `e` (kNobody: none), and whether that
// thread wrote. Threads of different SIMD-groups race unless a barrier is between; lanes
// of one SIMD-group race unless a collective (or simdgroup_barrier) is between.
uint16_t racing(const Worker* w, const TgShadow& e, uint32_t t, bool write, bool* other_write) {
  uint32_t sg = simdgroup_of(t);
  uint16_t now = w->simd_epoch[sg];
  if (e.writer != kNobody && e.writer != t &&
      (simdgroup_of(e.writer) != sg || e.write_simd == now)) {
    *other_write = true;
    return e.writer;
  }
  *other_write = false;
  if (!write || e.first_reader == kNobody) return kNobody;
  if (simdgroup_of(e.first_reader) != sg) return e.first_reader;
  if (e.far_reader != kNobody) return e.far_reader;
  if (e.reader != kNobody && simdgroup_of(e.reader) == sg && e.read_simd == now)
    return e.reader != t ? e.reader : e.reader2;
  return kNobody;
}

void note_access(TgShadow& e, const Worker* w, uint32_t t, bool write) {
  uint32_t sg = simdgroup_of(t);
  uint16_t now = w->simd_epoch[sg];
  if (write) {
    e.writer = uint16_t(t);
    e.write_simd = now;
    e.flags |= kWritten;
    return;
  }
  if (e.first_reader == kNobody) e.first_reader = uint16_t(t);
  else if (e.far_reader == kNobody && simdgroup_of(e.first_reader) != sg) e.far_reader = uint16_t(t);
  if (e.reader != kNobody && simdgroup_of(e.reader) == sg && e.read_simd == now) {
    if (e.reader != t) {
      e.reader2 = e.reader;
      e.reader = uint16_t(t);
    }
  } else {
    e.reader = uint16_t(t);
    e.reader2 = kNobody;
    e.read_simd = now;
  }
}

void report_threadgroup(Worker* w, uint32_t kind, uint32_t at, bool write, uint32_t other,
                        bool other_write, const void* pc) {
  mtw_finding f = sanitizer_finding(w, kind, w->group.current, pc);
  f.write = write;
  f.other_write = other_write;
  sanitizer_position(w, other, f.other);
  const SanitizerState& san = w->dispatch->san;
  for (uint32_t i = 0; i < san.array_count; ++i) {
    const TgArray& a = san.arrays[i];
    if (a.offset != kNotThreadgroup && at >= a.offset && at < a.offset + a.size) {
      f.tg_array = int32_t(i);
      f.element = (at - a.offset) / a.element_size;
      break;
    }
  }
  sanitizer_record(w, f);
}

// The shadow of byte `at`, as of the current threadgroup and barrier interval.
TgShadow& shadow_of(Worker* w, uint32_t at) {
  TgShadow& e = w->tg_shadow[at];
  if (e.group != w->group_serial) {
    e = TgShadow{w->group_serial, w->barrier_epoch, kNobody, 0, kNobody, kNobody,
                 kNobody, kNobody, 0, 0, 0};
  } else if (e.epoch != w->barrier_epoch) {
    e.epoch = w->barrier_epoch;
    e.writer = e.first_reader = e.far_reader = e.reader = e.reader2 = kNobody;
  }
  return e;
}

// Checks each byte against what the current barrier interval did to it before; reports
// the first defect of the access.
void threadgroup_access(Worker* w, uint32_t offset, uint32_t size, bool write, const void* pc) {
  uint32_t t = w->group.current;
  uint64_t end = uint64_t(offset) + size;
  if (end > kTgMemoryCapacity) end = kTgMemoryCapacity;
  bool reported = false;
  for (uint32_t at = offset; at < end; ++at) {
    TgShadow& e = shadow_of(w, at);
    uint32_t kind = 0;
    bool other_write = false;
    uint16_t other = kNobody;
    if (!write && !(e.flags & kWritten)) kind = MTW_FINDING_UNINITIALIZED;
    else if ((other = racing(w, e, t, write, &other_write)) != kNobody) kind = MTW_FINDING_RACE;
    note_access(e, w, t, write);
    if (!kind || reported) continue;
    report_threadgroup(w, kind, at, write, other == kNobody ? t : other, other_write, pc);
    reported = true;
  }
}

// Inside an atomic operation: no race with other atomics, and the atomic stores that
// initialise a counter are not traced, so neither races nor reads of bytes never written
// are reported; a write counts as initialising.
void atomic_threadgroup_access(Worker* w, uint32_t offset, uint32_t size, bool write) {
  uint64_t end = uint64_t(offset) + size;
  if (!write) return;
  for (uint64_t at = offset; at < end && at < kTgMemoryCapacity; ++at)
    shadow_of(w, uint32_t(at)).flags |= kWritten;
}

// Reports an access at `address`, outside every buffer (naming the nearest one), and
// stops the kernel before a write there.
void out_of_bounds(Worker* w, uintptr_t address, bool write, const void* pc) {
  const mtw_launch& L = w->dispatch->launch;
  int32_t nearest = -1;
  uint64_t best = UINT64_MAX;
  for (uint32_t i = 0; i < L.nbuffers; ++i) {
    const mtw_buffer_info& b = L.buffer_info[i];
    if (b.kind == MTW_BUFFER_INTERNAL) continue;
    uint64_t distance = address < b.base ? b.base - address : address - (b.base + b.size) + 1;
    if (distance < best) best = distance, nearest = int32_t(i);
  }
  mtw_finding f = sanitizer_finding(w, MTW_FINDING_OUT_OF_BOUNDS, w->group.current, pc);
  f.write = write;
  f.buffer = nearest;
  if (nearest >= 0) {
    const mtw_buffer_info& b = L.buffer_info[nearest];
    int64_t bytes = int64_t(address) - int64_t(b.base);
    f.element = bytes >= 0 ? bytes / b.element_size : -((-bytes + b.element_size - 1) /
                                                          b.element_size);
  }
  sanitizer_record(w, f);
  if (write) {
    // The store has not happened yet: stop here, before it corrupts the host's memory.
    snprintf(w->message, sizeof(w->message), "%s", kStoppedBeforeWrite);
    w->in_kernel = 0;
    siglongjmp(w->escape, kSanitizerStop);
  }
}

// An access of `size` bytes at `address`, outside threadgroup memory and the stacks: it
// must lie inside one buffer (a copy or a vector that starts inside and runs past the end
// is out of bounds from its first byte outside), or in the kernel library's constants.
void device_access(Worker* w, uintptr_t address, uint32_t size, bool write, const void* pc) {
  const mtw_launch& L = w->dispatch->launch;
  for (uint32_t i = 0; i < L.nbuffers; ++i) {
    const mtw_buffer_info& b = L.buffer_info[i];
    uint64_t at = address - b.base;
    if (at >= b.size) continue;
    uint64_t inside = b.size - at < size ? b.size - at : size;
    if (write && b.kind == MTW_BUFFER_INPUT) {
      mtw_finding f = sanitizer_finding(w, MTW_FINDING_INPUT_WRITE, w->group.current, pc);
      f.write = 1;
      f.buffer = int32_t(i);
      f.element = int64_t(at) / b.element_size;
      sanitizer_record(w, f);
    }
    if (write && b.written) memset(b.written + at, 1, inside);
    if (inside < size) out_of_bounds(w, address + inside, write, pc);
    return;
  }
  const SanitizerState& san = w->dispatch->san;
  if (address - san.image_lo < san.image_hi - san.image_lo) return;
  out_of_bounds(w, address, write, pc);
}

// The worker running this code: a fiber's from its header (the common case, inline),
// else the one whose OS stack this is.
inline Worker* this_worker() {
  uintptr_t sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  uintptr_t arena = reinterpret_cast<uintptr_t>(fiber_arena);
  if (sp - arena < fiber_regions << kFiberRegionShift) return fiber_headers[region_of(sp)].worker;
  return worker_here();
}

// Every traced access comes here, so the cases that need no check leave first: the
// fibers' stacks (frames and private arrays), then the runtime's own state.
void on_access(const void* p, uint32_t size, bool write, const void* pc) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a - reinterpret_cast<uintptr_t>(fiber_arena) < fiber_regions << kFiberRegionShift) return;
  Worker* w = this_worker();
  if (!w || !w->in_kernel || !w->dispatch->launch.sanitize) return;
  if (a - reinterpret_cast<uintptr_t>(w) < sizeof(Worker)) return;
  uintptr_t tg = reinterpret_cast<uintptr_t>(w->tg_memory);
  if (a - tg < kTgMemoryCapacity) {
    if (w->atomic_depth) atomic_threadgroup_access(w, uint32_t(a - tg), size, write);
    else threadgroup_access(w, uint32_t(a - tg), size, write, pc);
    return;
  }
  if (a - w->os_stack_lo < w->os_stack_hi - w->os_stack_lo) return;
  device_access(w, a, size, write, pc);
}

// A copy or fill of `n` bytes: one access of all of them.
inline void on_range(const void* p, size_t n, bool write, const void* pc) {
  if (n) on_access(p, n > UINT32_MAX ? UINT32_MAX : uint32_t(n), write, pc);
}

}  // namespace

void sanitizer_begin_worker(Worker* w) {
  // Allocated here, outside kernel context, where a signal cannot interrupt malloc.
  w->tg_shadow = static_cast<TgShadow*>(calloc(kTgMemoryCapacity, sizeof(TgShadow)));
}

// The sanitizer's side of the memory-access callbacks (access.cpp).
void sanitizer_access(const void* p, uint32_t size, bool write, const void* pc) {
  on_access(p, size, write, pc);
}

}  // namespace mtw

using mtw::on_access;
using mtw::on_range;

// What sanitize builds call in place of llvm.memcpy, llvm.memmove and llvm.memset (struct
// and vector copies, zero-fill loops): clang's AddressSanitizer pass with its own checks
// off and these names (compiler.SANITIZE_FLAGS). A copy reads its source and writes its
// destination; a fill writes.
extern "C" void* mtw_sanitizer_memcpy(void* dst, const void* src, size_t n) {
  on_range(src, n, false, __builtin_return_address(0));
  on_range(dst, n, true, __builtin_return_address(0));
  return memcpy(dst, src, n);
}
extern "C" void* mtw_sanitizer_memmove(void* dst, const void* src, size_t n) {
  on_range(src, n, false, __builtin_return_address(0));
  on_range(dst, n, true, __builtin_return_address(0));
  return memmove(dst, src, n);
}
extern "C" void* mtw_sanitizer_memset(void* dst, int value, size_t n) {
  on_range(dst, n, true, __builtin_return_address(0));
  return memset(dst, value, n);
}

// What sanitize builds call before each atomic read-modify-write (AddressSanitizer's pass
// again), for its bounds and its write: the atomic's own value is the operation's affair.
#define MTW_ATOMIC_RMW(bytes)                                  \
  extern "C" void mtw_sanitizer_store##bytes(uintptr_t p) {    \
    on_access(reinterpret_cast<const void*>(p), bytes, true,   \
              __builtin_return_address(0));                    \
  }
MTW_ATOMIC_RMW(1)
MTW_ATOMIC_RMW(2)
MTW_ATOMIC_RMW(4)
MTW_ATOMIC_RMW(8)
MTW_ATOMIC_RMW(16)
extern "C" void mtw_sanitizer_storeN(uintptr_t p, size_t n) {
  on_range(reinterpret_cast<const void*>(p), n, true, __builtin_return_address(0));
}

extern "C" void mtw_sanitizer_atomic(int inside) {
  mtw::Worker* w = mtw::worker_here();
  if (w) w->atomic_depth += inside ? 1 : -1;
}

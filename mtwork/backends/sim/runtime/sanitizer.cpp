#include "sanitizer.h"

#include <dlfcn.h>
#include <link.h>
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

struct ImageSearch {
  uintptr_t address, lo, hi, base;
};

// The memory of the loaded object that holds `address` (its constants and tables).
int find_image(struct dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<ImageSearch*>(data);
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    uintptr_t start = info->dlpi_addr + ph.p_vaddr;
    if (start < lo) lo = start;
    if (start + ph.p_memsz > hi) hi = start + ph.p_memsz;
  }
  if (search->address >= lo && search->address < hi) {
    search->lo = lo;
    search->hi = hi;
    search->base = info->dlpi_addr;
    return 1;
  }
  return 0;
}

// Holds off the watchdog's signal while the lock (or the loader's, in dladdr) is held:
// jumping out then would hang.
class HoldCancel {
 public:
  HoldCancel() {
    sigset_t cancel;
    sigemptyset(&cancel);
    sigaddset(&cancel, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &cancel, &previous_);
  }
  ~HoldCancel() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }

 private:
  sigset_t previous_;
};

// Where `pc` is in the object that holds it (the kernel library, from the dispatch's
// record of it; anything else, from the loader).
uint64_t code_offset(const SanitizerState& san, const void* pc) {
  uintptr_t at = reinterpret_cast<uintptr_t>(pc);
  if (at - san.image_lo < san.image_hi - san.image_lo) return at - san.image_base;
  HoldCancel hold;
  Dl_info info;
  if (pc && dladdr(pc, &info) && info.dli_fbase)
    return uint64_t(reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_fbase));
  return 0;
}

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

// Checks each byte against what the current barrier interval did to it before; reports
// the first defect of the access.
void threadgroup_access(Worker* w, uint32_t offset, uint32_t size, bool write, const void* pc) {
  uint32_t t = w->group.current;
  uint64_t end = uint64_t(offset) + size;
  if (end > kTgMemoryCapacity) end = kTgMemoryCapacity;
  bool reported = false;
  for (uint32_t at = offset; at < end; ++at) {
    TgShadow& e = w->tg_shadow[at];
    if (e.group != w->group_serial) {
      e = TgShadow{w->group_serial, w->barrier_epoch, kNobody, 0, kNobody, kNobody,
                   kNobody, kNobody, 0, 0, 0};
    } else if (e.epoch != w->barrier_epoch) {
      e.epoch = w->barrier_epoch;
      e.writer = e.first_reader = e.far_reader = e.reader = e.reader2 = kNobody;
    }
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
  for (uint64_t at = offset; at < end && at < kTgMemoryCapacity; ++at) {
    TgShadow& e = w->tg_shadow[at];
    if (e.group != w->group_serial) {
      e = TgShadow{w->group_serial, w->barrier_epoch, kNobody, 0, kNobody, kNobody,
                   kNobody, kNobody, 0, 0, 0};
    }
    e.flags |= kWritten;
  }
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

void sanitizer_position(const Worker* w, uint32_t linear, uint32_t out[3]) {
  const mtw_group& g = w->group;
  if (linear >= g.nthreads) {  // a lane past the end of a partial SIMD-group
    out[0] = out[1] = out[2] = 0xFFFFFFFFu;
    return;
  }
  out[0] = linear % g.tg_size[0];
  out[1] = (linear / g.tg_size[0]) % g.tg_size[1];
  out[2] = linear / (g.tg_size[0] * g.tg_size[1]);
}

// The calls that led to kernel code at `pc`, when it is on this thread's stack: the
// frame-pointer chain from here, from the frame that returns to `pc` outwards, keeping
// the return addresses into the kernel library (the runtime's frames between, such as a
// SIMD-group function's, are passed over).
static void callers_of(const Worker* w, const void* pc, uint64_t out[MTW_FINDING_CALLERS]) {
  const SanitizerState& san = w->dispatch->san;
  auto on_stack = [w](uintptr_t a) {
    return stack_place(a) == kInStack || a - w->os_stack_lo < w->os_stack_hi - w->os_stack_lo;
  };
  auto* fp = static_cast<uintptr_t*>(__builtin_frame_address(0));
  bool found = false;
  uint32_t n = 0;
  for (int depth = 0; depth < 64 && n < MTW_FINDING_CALLERS; ++depth) {
    uintptr_t here = reinterpret_cast<uintptr_t>(fp);
    if (here % sizeof(uintptr_t) || !on_stack(here) || !on_stack(here + sizeof(uintptr_t)))
      break;
    uintptr_t ret = fp[1];
    if (found && ret - san.image_lo < san.image_hi - san.image_lo)
      out[n++] = ret - san.image_base;
    found = found || ret == reinterpret_cast<uintptr_t>(pc);
    auto* next = reinterpret_cast<uintptr_t*>(fp[0]);
    if (next <= fp) break;
    fp = next;
  }
}

void sanitizer_record(Worker* w, const mtw_finding& f) {
  Dispatch* d = w->dispatch;
  const mtw_launch& L = d->launch;
  HoldCancel hold;
  pthread_mutex_lock(&d->san.lock);
  bool folded = false;
  for (uint32_t i = 0; i < d->san.findings && i < L.max_findings; ++i) {
    mtw_finding& old = L.findings[i];
    if (old.kind == f.kind && old.pc == f.pc && old.buffer == f.buffer &&
        old.tg_array == f.tg_array && old.write == f.write) {
      old.count += 1;
      folded = true;
      break;
    }
  }
  if (!folded && d->san.findings < L.max_findings) L.findings[d->san.findings++] = f;
  pthread_mutex_unlock(&d->san.lock);
}

mtw_finding sanitizer_finding(Worker* w, uint32_t kind, uint32_t thread, const void* pc) {
  mtw_finding f;
  memset(&f, 0, sizeof(f));
  f.kind = kind;
  f.buffer = -1;
  f.tg_array = -1;
  f.count = 1;
  f.pc = code_offset(w->dispatch->san, pc);
  callers_of(w, pc, f.callers);
  sanitizer_position(w, thread, f.thread);
  memcpy(f.group, w->group.group_pos, sizeof(f.group));
  return f;
}

int32_t sanitizer_array(Worker* w, uint32_t offset, uint32_t size, const char* name,
                        uint32_t element_size) {
  SanitizerState& san = w->dispatch->san;
  HoldCancel hold;
  pthread_mutex_lock(&san.lock);
  int32_t found = -1;
  for (uint32_t i = 0; i < san.array_count && found < 0; ++i)
    if (san.arrays[i].offset == offset && san.arrays[i].name == name) found = int32_t(i);
  if (found < 0 && san.array_count < kMaxTgArrays) {
    found = int32_t(san.array_count);
    san.arrays[san.array_count++] = TgArray{offset, size, element_size ? element_size : 1, name};
  }
  pthread_mutex_unlock(&san.lock);
  return found;
}

void sanitizer_begin_dispatch(Dispatch* d) {
  pthread_mutex_init(&d->san.lock, nullptr);
  d->san.findings = 0;
  d->san.array_count = 0;
  ImageSearch search{reinterpret_cast<uintptr_t>(d->launch.entry), 0, 0, 0};
  dl_iterate_phdr(find_image, &search);
  d->san.image_lo = search.lo;
  d->san.image_hi = search.hi;
  d->san.image_base = search.base;
}

void sanitizer_begin_worker(Worker* w) {
  // Allocated here, outside kernel context, where a signal cannot interrupt malloc.
  w->tg_shadow = static_cast<TgShadow*>(calloc(kTgMemoryCapacity, sizeof(TgShadow)));
}

void sanitizer_register_array(Worker* w, uint32_t offset, uint32_t size, const char* name,
                              uint32_t element_size) {
  sanitizer_array(w, offset, size, name, element_size);
}

void sanitizer_report(Worker* w, uint32_t kind, uint32_t thread, uint32_t other,
                      const void* pc) {
  mtw_finding f = sanitizer_finding(w, kind, thread, pc);
  sanitizer_position(w, other, f.other);
  sanitizer_record(w, f);
}

void sanitizer_simd_release(Worker* w, uint32_t simdgroup, uint32_t mask, const void* site) {
  uint32_t first = __builtin_ctz(mask);
  for (uint32_t lane = 0; lane < MTW_SIMD_WIDTH; ++lane) {
    uint32_t t = simdgroup * MTW_SIMD_WIDTH + lane;
    if (t >= w->group.nthreads || (mask & (1u << lane))) continue;
    if (w->waits[t].kind != kNotWaiting) {
      sanitizer_report(w, MTW_FINDING_SIMD_DIVERGENCE, simdgroup * MTW_SIMD_WIDTH + first, t,
                       site);
      return;
    }
  }
}

}  // namespace mtw

using mtw::on_access;
using mtw::on_range;

// Callbacks of clang's -fsanitize-coverage=trace-loads,trace-stores.
#define MTW_TRACE(bits, bytes)                                                       \
  extern "C" void __sanitizer_cov_load##bytes(uint##bits##_t* p) {                   \
    on_access(p, bytes, false, __builtin_return_address(0));                            \
  }                                                                                  \
  extern "C" void __sanitizer_cov_store##bytes(uint##bits##_t* p) {                  \
    on_access(p, bytes, true, __builtin_return_address(0));                             \
  }
MTW_TRACE(8, 1)
MTW_TRACE(16, 2)
MTW_TRACE(32, 4)
MTW_TRACE(64, 8)
extern "C" void __sanitizer_cov_load16(void* p) {
  on_access(p, 16, false, __builtin_return_address(0));
}
extern "C" void __sanitizer_cov_store16(void* p) {
  on_access(p, 16, true, __builtin_return_address(0));
}

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

#define MTW_FINDING_CASE(name, code, text) \
  case code:                               \
    return which ? text : #name;

static const char* finding_kind(uint32_t code, bool which) {
  switch (code) { MTW_FINDING_KINDS(MTW_FINDING_CASE) }
  return nullptr;
}
#undef MTW_FINDING_CASE

extern "C" const char* mtw_finding_kind_name(uint32_t code) { return finding_kind(code, false); }
extern "C" const char* mtw_finding_kind_text(uint32_t code) { return finding_kind(code, true); }

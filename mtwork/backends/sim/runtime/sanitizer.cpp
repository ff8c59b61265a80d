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
constexpr uint8_t kWritten = 1, kManyReaders = 2;
constexpr const char* kStoppedBeforeWrite =
    "stopped by the sanitizer before an out-of-bounds write";

struct ImageSearch {
  uintptr_t address, lo, hi;
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
    return 1;
  }
  return 0;
}

void position(const Worker* w, uint32_t linear, uint32_t out[3]) {
  const mtw_group& g = w->group;
  out[0] = linear % g.tg_size[0];
  out[1] = (linear / g.tg_size[0]) % g.tg_size[1];
  out[2] = linear / (g.tg_size[0] * g.tg_size[1]);
}

uint64_t code_offset(const void* pc) {
  Dl_info info;
  if (pc && dladdr(pc, &info) && info.dli_fbase)
    return uint64_t(reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_fbase));
  return 0;
}

// Records a finding, folding repeats of the same kind at the same code into one. The
// watchdog's signal is held off meanwhile: jumping out with the lock held would hang.
void record(Worker* w, const mtw_finding& f) {
  Dispatch* d = w->dispatch;
  const mtw_launch& L = d->launch;
  sigset_t cancel, previous;
  sigemptyset(&cancel);
  sigaddset(&cancel, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &cancel, &previous);
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
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

mtw_finding make_finding(Worker* w, uint32_t kind, uint32_t thread, const void* pc) {
  sigset_t cancel, previous;  // dladdr takes the loader's lock: no jumping out meanwhile
  sigemptyset(&cancel);
  sigaddset(&cancel, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &cancel, &previous);
  uint64_t offset = code_offset(pc);
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  mtw_finding f;
  memset(&f, 0, sizeof(f));
  f.kind = kind;
  f.buffer = -1;
  f.tg_array = -1;
  f.count = 1;
  f.pc = offset;
  position(w, thread, f.thread);
  memcpy(f.group, w->group.group_pos, sizeof(f.group));
  return f;
}

bool conflicting(const Worker* w, uint32_t a, uint32_t b, uint16_t simd_epoch_then) {
  if (a == b) return false;
  uint32_t sg = a / MTW_SIMD_WIDTH;
  if (sg != b / MTW_SIMD_WIDTH) return true;
  // Lanes of one SIMD-group are ordered by a collective (or simdgroup_barrier) between.
  return w->simd_epoch[sg] == simd_epoch_then;
}

void threadgroup_access(Worker* w, uint32_t offset, uint32_t size, bool write, const void* pc) {
  const mtw_group& g = w->group;
  uint32_t t = g.current;
  uint16_t simd_now = w->simd_epoch[t / MTW_SIMD_WIDTH];
  for (uint32_t k = 0; k < size; ++k) {
    TgShadow& e = w->tg_shadow[offset + k];
    if (e.group != w->group_serial) {
      e = TgShadow{w->group_serial, w->barrier_epoch, kNobody, kNobody, simd_now, 0, 0};
    } else if (e.epoch != w->barrier_epoch) {
      e.epoch = w->barrier_epoch;
      e.writer = e.reader = kNobody;
      e.flags &= kWritten;
    }
    uint32_t kind = 0, other = t, other_write = 0;
    if (write) {
      if (e.writer != kNobody && conflicting(w, e.writer, t, e.simd_epoch)) {
        kind = MTW_FINDING_RACE, other = e.writer, other_write = 1;
      } else if (e.reader != kNobody &&
                 (conflicting(w, e.reader, t, e.simd_epoch) || (e.flags & kManyReaders))) {
        kind = MTW_FINDING_RACE, other = e.reader;
      }
      e.writer = uint16_t(t);
      e.flags |= kWritten;
    } else {
      if (!(e.flags & kWritten)) {
        kind = MTW_FINDING_UNINITIALIZED;
      } else if (e.writer != kNobody && conflicting(w, e.writer, t, e.simd_epoch)) {
        kind = MTW_FINDING_RACE, other = e.writer, other_write = 1;
      }
      if (e.reader == kNobody) e.reader = uint16_t(t);
      else if (e.reader != t) e.flags |= kManyReaders;
    }
    e.simd_epoch = simd_now;
    if (!kind) continue;
    mtw_finding f = make_finding(w, kind, t, pc);
    f.write = write;
    f.other_write = other_write;
    position(w, other, f.other);
    const SanitizerState& san = w->dispatch->san;
    uint32_t at = offset + k;
    for (uint32_t i = 0; i < san.array_count; ++i) {
      const TgArray& a = san.arrays[i];
      if (at >= a.offset && at < a.offset + a.size) {
        f.tg_array = int32_t(i);
        f.element = (at - a.offset) / a.element_size;
        break;
      }
    }
    record(w, f);
    return;  // one finding per access
  }
}

void device_access(Worker* w, uintptr_t address, uint32_t size, bool write, const void* pc) {
  const mtw_launch& L = w->dispatch->launch;
  for (uint32_t i = 0; i < L.nbuffers; ++i) {
    const mtw_buffer_info& b = L.buffer_info[i];
    if (address - b.base >= b.size) continue;
    if (b.kind == MTW_BUFFER_INTERNAL) return;
    if (write && b.kind == MTW_BUFFER_INPUT) {
      mtw_finding f = make_finding(w, MTW_FINDING_INPUT_WRITE, w->group.current, pc);
      f.write = 1;
      f.buffer = int32_t(i);
      f.element = int64_t(address - b.base) / b.element_size;
      record(w, f);
    }
    if (write && b.written) {
      uint64_t end = address - b.base + size;
      memset(b.written + (address - b.base), 1, (end > b.size ? b.size : end) - (address - b.base));
    }
    return;
  }
  const SanitizerState& san = w->dispatch->san;
  if (address - san.image_lo < san.image_hi - san.image_lo) return;
  // Outside every buffer: name the nearest one.
  int32_t nearest = -1;
  uint64_t best = UINT64_MAX;
  for (uint32_t i = 0; i < L.nbuffers; ++i) {
    const mtw_buffer_info& b = L.buffer_info[i];
    if (b.kind == MTW_BUFFER_INTERNAL) continue;
    uint64_t distance = address < b.base ? b.base - address : address - (b.base + b.size) + 1;
    if (distance < best) best = distance, nearest = int32_t(i);
  }
  mtw_finding f = make_finding(w, MTW_FINDING_OUT_OF_BOUNDS, w->group.current, pc);
  f.write = write;
  f.buffer = nearest;
  if (nearest >= 0) {
    const mtw_buffer_info& b = L.buffer_info[nearest];
    int64_t bytes = int64_t(address) - int64_t(b.base);
    f.element = bytes >= 0 ? bytes / b.element_size : -((-bytes + b.element_size - 1) /
                                                          b.element_size);
  }
  record(w, f);
  if (write) {
    // The store has not happened yet: stop here, before it corrupts the host's memory.
    snprintf(w->message, sizeof(w->message), "%s", kStoppedBeforeWrite);
    w->in_kernel = 0;
    siglongjmp(w->escape, kSanitizerStop);
  }
}

void on_access(const void* p, uint32_t size, bool write, const void* pc) {
  Worker* w = worker_here();
  if (!w || !w->in_kernel || w->atomic_depth || !w->dispatch->launch.sanitize) return;
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  // A thread's own memory and the runtime's: fiber stacks, the worker's stack and state.
  if (stack_place(a) != kNotInArena) return;
  if (a - w->os_stack_lo < w->os_stack_hi - w->os_stack_lo) return;
  if (a - reinterpret_cast<uintptr_t>(w) < sizeof(Worker)) return;
  uintptr_t tg = reinterpret_cast<uintptr_t>(w->tg_memory);
  if (a - tg < kTgMemoryCapacity) {
    threadgroup_access(w, uint32_t(a - tg), size, write, pc);
    return;
  }
  device_access(w, a, size, write, pc);
}

}  // namespace

void sanitizer_begin_dispatch(Dispatch* d) {
  pthread_mutex_init(&d->san.lock, nullptr);
  d->san.findings = 0;
  d->san.array_count = 0;
  ImageSearch search{reinterpret_cast<uintptr_t>(d->launch.entry), 0, 0};
  dl_iterate_phdr(find_image, &search);
  d->san.image_lo = search.lo;
  d->san.image_hi = search.hi;
}

void sanitizer_begin_worker(Worker* w) {
  // Allocated here, outside kernel context, where a signal cannot interrupt malloc.
  w->tg_shadow = static_cast<TgShadow*>(calloc(kTgMemoryCapacity, sizeof(TgShadow)));
}

void sanitizer_register_array(Worker* w, uint32_t offset, uint32_t size, const char* name,
                              uint32_t element_size) {
  SanitizerState& san = w->dispatch->san;
  pthread_mutex_lock(&san.lock);
  bool known = false;
  for (uint32_t i = 0; i < san.array_count; ++i)
    if (san.arrays[i].offset == offset && san.arrays[i].name == name) known = true;
  if (!known && san.array_count < kMaxTgArrays)
    san.arrays[san.array_count++] = TgArray{offset, size, element_size ? element_size : 1, name};
  pthread_mutex_unlock(&san.lock);
}

void sanitizer_report(Worker* w, uint32_t kind, uint32_t thread, uint32_t other,
                      const void* pc) {
  mtw_finding f = make_finding(w, kind, thread, pc);
  position(w, other, f.other);
  record(w, f);
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

namespace mtw {

// The sanitizer's side of the memory-access callbacks (access.cpp).
void sanitizer_access(const void* p, uint32_t size, bool write, const void* pc) {
  on_access(p, size, write, pc);
}

}  // namespace mtw

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

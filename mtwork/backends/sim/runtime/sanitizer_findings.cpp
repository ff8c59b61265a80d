// The sanitizer's findings: where each was (the code address and the calls that led
// there), which thread, folded by place; the dispatch's table of arrays findings name; and
// the checks that sanitize builds of kernels call directly, beside the memory accesses
// (sanitizer.cpp): array subscripts past their bound, and SIMD-group functions that read
// an inactive lane.
#include <pthread.h>
#include <signal.h>
#include <string.h>

#include "platform.h"
#include "sanitizer.h"
#include "scheduler.h"

namespace mtw {

namespace {

// Holds off the watchdog's signal while the lock (or the loader's, in image_of) is held:
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
  platform::Image image;
  return platform::image_of(pc, &image) ? at - image.base : 0;
}

// The calls that led to kernel code at `pc`, when it is on this thread's stack: the
// frame-pointer chain from here, from the frame that returns to `pc` outwards, keeping
// the return addresses into the kernel library (the runtime's frames between, such as a
// SIMD-group function's, are passed over).
void callers_of(const Worker* w, const void* pc, uint64_t out[MTW_FINDING_CALLERS]) {
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
  platform::Image image{0, 0, 0};
  platform::image_of(reinterpret_cast<const void*>(d->launch.entry), &image);
  d->san.image_lo = image.lo;
  d->san.image_hi = image.hi;
  d->san.image_base = image.base;
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

namespace {

// What clang's -fsanitize=array-bounds hands its handler (compiler-rt's ubsan_handlers.h
// and ubsan_value.h: the check's source location, the array's and the index's types).
struct UbsanLocation {
  const char* file;
  uint32_t line, column;
};
struct UbsanType {
  uint16_t kind;  // 0: an integer
  uint16_t info;  // integers: bit 0 set when signed, the rest log2 of the width in bits
  char name[1];   // e.g. 'float[8]', quotes included
};
struct UbsanOutOfBounds {
  UbsanLocation where;
  const UbsanType* array;
  const UbsanType* index;
};

// The index as a signed number (ubsan passes integers up to 64 bits by value, wider ones
// by address).
int64_t index_value(const UbsanType* type, uintptr_t value) {
  uint32_t bits = 1u << (type->info >> 1);
  uint64_t v = bits <= 64 ? uint64_t(value) : *reinterpret_cast<const uint64_t*>(value);
  if (bits >= 64) return int64_t(v);
  uint64_t mask = (uint64_t(1) << bits) - 1;
  v &= mask;
  if ((type->info & 1) && (v >> (bits - 1))) v |= ~mask;  // sign-extend
  return int64_t(v);
}

// The outermost extent in a type name such as 'float[8][4]' (8), or 0.
uint32_t extent_of(const char* type_name) {
  const char* open = strchr(type_name, '[');
  uint32_t n = 0;
  for (const char* c = open ? open + 1 : ""; *c >= '0' && *c <= '9'; ++c) n = n * 10 + (*c - '0');
  return n;
}

}  // namespace

}  // namespace mtw

using namespace mtw;

// An array subscripted outside its bound: reported (with the array's type in the table of
// arrays, so the report can give its extent) and the kernel goes on, as the GPU would.
extern "C" void __ubsan_handle_out_of_bounds(UbsanOutOfBounds* data, uintptr_t index) {
  Worker* w = worker_here();
  if (!w || !w->in_kernel || !w->dispatch->launch.sanitize) return;
  mtw_finding f = sanitizer_finding(w, MTW_FINDING_ARRAY_INDEX, w->group.current,
                                    __builtin_return_address(0));
  f.element = index_value(data->index, index);
  f.tg_array = sanitizer_array(w, kNotThreadgroup, extent_of(data->array->name),
                               data->array->name, 0);
  sanitizer_record(w, f);
}

// A SIMD-group function's combine step found lane `lane`'s source lane `source` inactive
// (returned, waiting elsewhere, or past the end of a partial SIMD-group): Metal leaves the
// result undefined. `ins` is the collective's argument table, which names the SIMD-group
// being released.
extern "C" void mtw_sanitizer_inactive_lane(const void* const* ins, uint32_t lane,
                                            uint32_t source) {
  Worker* w = worker_here();
  if (!w || !w->dispatch->launch.sanitize || lane >= MTW_SIMD_WIDTH) return;
  uint32_t simdgroups = (w->group.nthreads + MTW_SIMD_WIDTH - 1) / MTW_SIMD_WIDTH;
  for (uint32_t sg = 0; sg < simdgroups; ++sg) {
    const SimdWait& s = w->simd[sg];
    if (!(s.waiting & (1u << lane)) || s.in[lane] != ins[lane]) continue;
    uint32_t t = sg * MTW_SIMD_WIDTH + lane;
    mtw_finding f = sanitizer_finding(w, MTW_FINDING_INACTIVE_LANE, t, w->waits[t].site);
    f.element = source;
    sanitizer_position(w, sg * MTW_SIMD_WIDTH + source, f.other);
    sanitizer_record(w, f);
    return;
  }
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

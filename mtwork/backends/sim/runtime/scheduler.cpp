#include "scheduler.h"

#include <stdio.h>
#include <string.h>

namespace mtw {

namespace {

constexpr uint32_t kNoThread = 0xFFFFFFFFu;

Worker* worker_of(Fiber* fiber) { return fiber->worker; }

[[noreturn]] void fail(Worker* w, int status, const char* message);

// A kernel guessed barrier-free runs as plain loops with nothing to suspend; when it
// blocks after all, the dispatch stops and the caller runs it again on the general path.
void check_may_block(Worker* w, const char* what) {
  if (!w->group.barrier_free) return;
  char message[256];
  snprintf(message, sizeof(message), "%s called in a kernel run as barrier-free", what);
  fail(w, MTW_NEEDS_FIBERS, message);
}

[[noreturn]] void fail(Worker* w, int status, const char* message) {
  w->failure = status;
  snprintf(w->message, sizeof(w->message), "%s", message);
  Fiber* f = current_fiber();
  mtw_switch(&f->sp, w->scheduler_sp);
  __builtin_unreachable();
}

Fiber* take_fiber(Worker* w);

// Suspends the calling fiber. Control goes straight to the next runnable fiber (or a new
// one for the next unstarted thread), without a round trip through the scheduler; only
// when neither exists does the scheduler take over (finished group, or stuck threads).
void block(Worker* w, Fiber* f) {
  f->state = kFiberBlocked;
  mtw_group& g = w->group;
  Fiber* next = nullptr;
  if (!w->runnable.empty()) {
    next = w->runnable.pop();
    g.current = next->thread;
  } else if (g.next_thread < g.nthreads) {
    next = take_fiber(w);
  }
  if (!next) {
    mtw_switch(&f->sp, w->scheduler_sp);
    return;
  }
  w->running = next;
  next->state = kFiberRunning;
  mtw_switch(&f->sp, next->sp);
}

void fiber_main() {
  Fiber* f = current_fiber();
  Worker* w = worker_of(f);
  const mtw_launch& launch = w->dispatch->launch;
  launch.entry(&w->group, launch.buffers);
  f->state = kFiberFinished;
  mtw_switch(&f->sp, w->scheduler_sp);
  __builtin_unreachable();
}

Fiber* take_fiber(Worker* w) {
  Fiber* f = w->free_fibers;
  if (f) {
    w->free_fibers = f->next_free;
  } else {
    if (w->fiber_count > MTW_MAX_THREADS) return nullptr;
    if (!w->fiber_arena) w->fiber_arena = fiber_arena_reserve(MTW_MAX_THREADS + 1);
    if (!w->fiber_arena) return nullptr;
    f = fiber_create(w, w->fiber_arena, w->fiber_count);
    if (!f) return nullptr;
    w->all_fibers[w->fiber_count++] = f;
  }
  fiber_prepare(f, fiber_main);
  f->state = kFiberRunning;
  f->thread = kNoThread;
  return f;
}

void give_back(Worker* w, Fiber* f) {
  f->state = kFiberFree;
  f->next_free = w->free_fibers;
  w->free_fibers = f;
}

// Remembers that the lanes in `mask` completed a collective at `site`.
void remember_site(SimdWait& s, const void* site, uint32_t mask) {
  for (uint32_t i = 0; i < kSitesRemembered; ++i) {
    if (s.done_site[i] == site) {
      s.done_lanes[i] |= mask;
      return;
    }
  }
  uint32_t slot = s.done_next++ % kSitesRemembered;  // forget the oldest
  s.done_site[slot] = site;
  s.done_lanes[slot] = mask;
}

uint32_t lanes_done_at(const SimdWait& s, const void* site) {
  for (uint32_t i = 0; i < kSitesRemembered; ++i)
    if (s.done_site[i] == site) return s.done_lanes[i];
  return 0;
}

uint32_t lanes_in(const mtw_group& g, uint32_t simdgroup) {
  uint32_t first = simdgroup * MTW_SIMD_WIDTH;
  uint32_t left = g.nthreads - first;
  return left < MTW_SIMD_WIDTH ? left : MTW_SIMD_WIDTH;
}

// Runs one collective for the lanes in `mask` and makes them runnable (except `self`,
// the lane that completed it and simply continues).
void release_simd(Worker* w, uint32_t simdgroup, uint32_t mask, uint32_t self) {
  SimdWait& s = w->simd[simdgroup];
  const void* ins[MTW_SIMD_WIDTH] = {};
  void* outs[MTW_SIMD_WIDTH] = {};
  mtw_combine_fn combine = nullptr;
  for (uint32_t lane = 0; lane < MTW_SIMD_WIDTH; ++lane) {
    if (!(mask & (1u << lane))) continue;
    ins[lane] = s.in[lane];
    outs[lane] = s.out[lane];
    if (!combine) combine = s.combine[lane];
  }
  if (w->dispatch->launch.sanitize) {
    sanitizer_simd_release(w, simdgroup, mask, w->waits[simdgroup * MTW_SIMD_WIDTH +
                                                       __builtin_ctz(mask)].site);
  }
  combine(ins, outs, mask);
  w->simd_epoch[simdgroup] += 1;
  remember_site(s, w->waits[simdgroup * MTW_SIMD_WIDTH + __builtin_ctz(mask)].site, mask);
  s.waiting &= ~mask;
  for (uint32_t lane = 0; lane < MTW_SIMD_WIDTH; ++lane) {
    if (!(mask & (1u << lane))) continue;
    uint32_t t = simdgroup * MTW_SIMD_WIDTH + lane;
    ThreadWait& tw = w->waits[t];
    tw.kind = kNotWaiting;
    tw.collectives++;
    if (t != self) w->runnable.push(tw.fiber);
  }
}

// When nothing can run, lanes of a SIMD-group that wait in collectives go ahead with the
// lanes that are there: lanes that returned or wait at a threadgroup barrier are inactive,
// as on the GPU. Lanes waiting at different call sites diverged, and the GPU would run one
// side with the others inactive until they reconverge. Which first: a site that other
// waiting lanes have already passed (they have left a loop these lanes are still in), else
// the site with the fewest collectives done (lanes behind go first, so the branches of an
// if/else each finish before the code after them), ties by lower code address. Returns
// whether any collective was released.
bool release_stuck_simd(Worker* w) {
  const mtw_group& g = w->group;
  uint32_t simdgroups = (g.nthreads + MTW_SIMD_WIDTH - 1) / MTW_SIMD_WIDTH;
  bool released = false;
  for (uint32_t sg = 0; sg < simdgroups; ++sg) {
    uint32_t waiting = w->simd[sg].waiting;
    if (!waiting) continue;
    const void* best_site = nullptr;
    bool best_passed = false;
    uint32_t best_count = 0;
    for (uint32_t lane = 0; lane < MTW_SIMD_WIDTH; ++lane) {
      if (!(waiting & (1u << lane))) continue;
      const ThreadWait& tw = w->waits[sg * MTW_SIMD_WIDTH + lane];
      // Has a lane now waiting elsewhere completed this site before?
      uint32_t elsewhere = 0;
      for (uint32_t other = 0; other < MTW_SIMD_WIDTH; ++other)
        if ((waiting & (1u << other)) && w->waits[sg * MTW_SIMD_WIDTH + other].site != tw.site)
          elsewhere |= 1u << other;
      bool passed = (lanes_done_at(w->simd[sg], tw.site) & elsewhere) != 0;
      bool better = !best_site || (passed && !best_passed) ||
                    (passed == best_passed &&
                     (tw.collectives < best_count ||
                      (tw.collectives == best_count && tw.site < best_site)));
      if (better) {
        best_site = tw.site;
        best_passed = passed;
        best_count = tw.collectives;
      }
    }
    uint32_t mask = 0;
    for (uint32_t lane = 0; lane < MTW_SIMD_WIDTH; ++lane) {
      if ((waiting & (1u << lane)) && w->waits[sg * MTW_SIMD_WIDTH + lane].site == best_site)
        mask |= 1u << lane;
    }
    release_simd(w, sg, mask, kNoThread);
    released = true;
  }
  return released;
}

void report_deadlock(Worker* w) {
  const mtw_group& g = w->group;
  uint32_t at_barrier = 0, first_waiting = kNoThread, first_returned = kNoThread;
  for (uint32_t t = 0; t < g.nthreads; ++t) {
    if (w->waits[t].kind == kAtBarrier) {
      ++at_barrier;
      if (first_waiting == kNoThread) first_waiting = t;
    } else if (first_returned == kNoThread) {
      first_returned = t;
    }
  }
  char waiting[160] = "", returned[160] = "";
  if (first_waiting != kNoThread) describe_thread(w, first_waiting, waiting, sizeof(waiting));
  if (first_returned != kNoThread) describe_thread(w, first_returned, returned, sizeof(returned));
  if (w->dispatch->launch.sanitize && first_waiting != kNoThread) {
    sanitizer_report(w, MTW_FINDING_BARRIER_DIVERGENCE, first_waiting,
                     first_returned != kNoThread ? first_returned : first_waiting,
                     w->waits[first_waiting].site);
  }
  w->failure = MTW_DEADLOCK;
  snprintf(w->message, sizeof(w->message),
           "%u of %u threads wait at threadgroup_barrier (first: %s) while %u "
           "returned without reaching it (first: %s); every thread of a threadgroup must "
           "reach each barrier",
           at_barrier, g.nthreads, waiting, g.nthreads - at_barrier, returned);
}

}  // namespace

void describe_thread(const Worker* w, uint32_t linear, char* out, size_t size) {
  const mtw_group& g = w->group;
  if (g.barrier_free) {  // its loop does not record which thread runs
    snprintf(out, size, "a thread of threadgroup_position_in_grid (%u,%u,%u)", g.group_pos[0],
             g.group_pos[1], g.group_pos[2]);
    return;
  }
  uint32_t x = linear % g.tg_size[0];
  uint32_t y = (linear / g.tg_size[0]) % g.tg_size[1];
  uint32_t z = linear / (g.tg_size[0] * g.tg_size[1]);
  snprintf(out, size,
           "thread_position_in_threadgroup (%u,%u,%u), thread_position_in_grid (%u,%u,%u), "
           "threadgroup_position_in_grid (%u,%u,%u)",
           x, y, z, g.group_pos[0] * g.dispatch_tg[0] + x, g.group_pos[1] * g.dispatch_tg[1] + y,
           g.group_pos[2] * g.dispatch_tg[2] + z, g.group_pos[0], g.group_pos[1], g.group_pos[2]);
}

void reset_fibers(Worker* w) {
  w->free_fibers = nullptr;
  for (uint32_t i = 0; i < w->fiber_count; ++i) give_back(w, w->all_fibers[i]);
  w->runnable.head = w->runnable.tail = 0;
  w->running = nullptr;
}

int run_threadgroup(Worker* w, uint64_t index) {
  Dispatch* d = w->dispatch;
  const mtw_launch& launch = d->launch;
  mtw_group& g = w->group;
  uint64_t rest = index;
  g.group_pos[0] = uint32_t(rest % d->groups[0]);
  rest /= d->groups[0];
  g.group_pos[1] = uint32_t(rest % d->groups[1]);
  g.group_pos[2] = uint32_t(rest / d->groups[1]);
  g.nthreads = 1;
  for (int k = 0; k < 3; ++k) {
    uint32_t start = g.group_pos[k] * launch.threadgroup[k];
    uint32_t left = launch.grid[k] - start;
    g.tg_size[k] = left < launch.threadgroup[k] ? left : launch.threadgroup[k];
    g.nthreads *= g.tg_size[k];
  }
  g.next_thread = 0;
  g.current = 0;
  g.done = 0;
  uint32_t simdgroups = (g.nthreads + MTW_SIMD_WIDTH - 1) / MTW_SIMD_WIDTH;
  memset(g.simd_done, 0, simdgroups * sizeof(g.simd_done[0]));
  if (!g.barrier_free) {  // the barrier-free loop never blocks: nothing to wait for
    for (uint32_t sg = 0; sg < simdgroups; ++sg) {
      SimdWait& s = w->simd[sg];
      s.waiting = 0;
      if (s.done_next) {
        s.done_next = 0;
        memset(s.done_site, 0, sizeof(s.done_site));
      }
    }
    memset(w->waits, 0, g.nthreads * sizeof(ThreadWait));
  }
  g.tg_memory_used = launch.tg_static_bytes;
  w->barrier_arrived = 0;
  w->failure = MTW_OK;
  if (launch.sanitize) {
    if (!w->tg_shadow) {
      snprintf(w->message, sizeof(w->message), "out of memory for the sanitizer's shadow");
      return MTW_SYSTEM;
    }
    w->group_serial += 1;
    w->barrier_epoch = 0;
    memset(w->simd_epoch, 0, sizeof(w->simd_epoch));
  }

  for (;;) {
    Fiber* f;
    if (!w->runnable.empty()) {
      f = w->runnable.pop();
      g.current = f->thread;
    } else if (g.next_thread < g.nthreads) {
      f = take_fiber(w);
      if (!f) {
        snprintf(w->message, sizeof(w->message), "out of memory for fiber stacks");
        return MTW_SYSTEM;
      }
    } else if (g.done == g.nthreads) {
      break;
    } else if (release_stuck_simd(w)) {
      continue;
    } else {
      report_deadlock(w);
      return MTW_DEADLOCK;
    }
    w->running = f;
    f->state = kFiberRunning;
    mtw_switch(&w->scheduler_sp, f->sp);
    // Fibers hand control to each other; the one coming back here is w->running.
    Fiber* back = w->running;
    w->running = nullptr;
    if (w->failure != MTW_OK) return w->failure;
    if (back->state == kFiberFinished) give_back(w, back);
  }
  uint32_t used = g.tg_memory_used;
  uint32_t seen = d->tg_memory_used;
  while (used > seen && !__atomic_compare_exchange_n(&d->tg_memory_used, &seen, used, false,
                                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return MTW_OK;
}

}  // namespace mtw

using namespace mtw;

extern "C" void mtw_threadgroup_barrier(uint32_t) {
  Fiber* f = current_fiber();
  Worker* w = worker_of(f);
  check_may_block(w, "threadgroup_barrier");
  mtw_group& g = w->group;
  uint32_t t = g.current;
  const void* site = __builtin_return_address(0);
  ThreadWait& tw = w->waits[t];
  tw.kind = kAtBarrier;
  tw.site = site;
  tw.fiber = f;
  f->thread = t;
  if (++w->barrier_arrived < g.nthreads) {
    block(w, f);
    return;
  }
  for (uint32_t u = 0; u < g.nthreads; ++u) {
    if (w->waits[u].site == site) continue;
    char here[160], there[160], message[512];
    describe_thread(w, t, here, sizeof(here));
    describe_thread(w, u, there, sizeof(there));
    if (w->dispatch->launch.sanitize)
      sanitizer_report(w, MTW_FINDING_BARRIER_DIVERGENCE, t, u, site);
    snprintf(message, sizeof(message),
             "barrier divergence: threads wait at different threadgroup_barrier calls "
             "(%s and %s); all threads of a threadgroup must reach the same barrier",
             here, there);
    fail(w, MTW_DEADLOCK, message);
  }
  w->barrier_arrived = 0;
  w->barrier_epoch += 1;
  for (uint32_t u = 0; u < g.nthreads; ++u) {
    w->waits[u].kind = kNotWaiting;
    if (u != t) w->runnable.push(w->waits[u].fiber);
  }
}

extern "C" void mtw_simd_collective(const void* in, void* out, mtw_combine_fn combine) {
  Fiber* f = current_fiber();
  Worker* w = worker_of(f);
  check_may_block(w, "a SIMD-group function");
  mtw_group& g = w->group;
  uint32_t t = g.current;
  uint32_t sg = t / MTW_SIMD_WIDTH, lane = t % MTW_SIMD_WIDTH;
  SimdWait& s = w->simd[sg];
  s.in[lane] = in;
  s.out[lane] = out;
  s.combine[lane] = combine;
  s.waiting |= 1u << lane;
  ThreadWait& tw = w->waits[t];
  tw.kind = kAtSimd;
  tw.site = __builtin_return_address(0);
  tw.fiber = f;
  f->thread = t;
  uint32_t alive = lanes_in(g, sg) - g.simd_done[sg];
  if (uint32_t(__builtin_popcount(s.waiting)) == alive) {
    bool same_site = true;
    for (uint32_t l = 0; l < MTW_SIMD_WIDTH && same_site; ++l)
      if ((s.waiting & (1u << l)) && w->waits[sg * MTW_SIMD_WIDTH + l].site != tw.site)
        same_site = false;
    if (same_site) {
      release_simd(w, sg, s.waiting, t);
      return;
    }
  }
  block(w, f);
}

extern "C" void* mtw_threadgroup_alloc(uint32_t size, uint32_t align, const char* name,
                                       uint32_t element_size) {
  Worker* w = worker_of(current_fiber());
  check_may_block(w, "threadgroup memory");
  mtw_group& g = w->group;
  uint32_t t = g.current;
  uint32_t offset = (g.tg_cursor[t] + align - 1) & ~(align - 1);
  uint64_t end = uint64_t(offset) + size;
  if (end > g.tg_memory_size) {
    char message[256];
    snprintf(message, sizeof(message),
             "threadgroup memory over budget: the kernel's threadgroup variables need at least "
             "%llu bytes, more than the %u bytes a threadgroup has",
             (unsigned long long)end, g.tg_memory_size);
    fail(w, MTW_TG_MEMORY, message);
  }
  g.tg_cursor[t] = uint32_t(end);
  if (end > g.tg_memory_used) g.tg_memory_used = uint32_t(end);
  if (t == 0 && w->dispatch->launch.sanitize)
    sanitizer_register_array(w, offset, size, name, element_size);
  return g.tg_memory + offset;
}

extern "C" void mtw_kernel_fault(const char* message) {
  Worker* w = worker_of(current_fiber());
  char text[512], where[160];
  describe_thread(w, w->group.current, where, sizeof(where));
  snprintf(text, sizeof(text), "%s (%s)", message, where);
  fail(w, MTW_KERNEL_ERROR, text);
}

extern "C" uint32_t mtw_thread_index_in_threadgroup(void) {
  return worker_of(current_fiber())->group.current;
}

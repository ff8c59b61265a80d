#include "scheduler.h"

#include <stdio.h>
#include <string.h>

namespace mtw {

namespace {

Worker* worker_of(Fiber* fiber) { return fiber->worker; }
void fiber_main();

}  // namespace

Fiber* take_fiber(Worker* w) {
  Fiber* f = w->free_fibers;
  if (f) {
    w->free_fibers = f->next_free;
  } else {
    if (w->fiber_count >= kFibersPerWorker) return nullptr;
    f = fiber_create(w, w->index, w->fiber_count);
    if (!f) return nullptr;
    w->all_fibers[w->fiber_count++] = f;
  }
  fiber_prepare(f, fiber_main);
  f->state = kFiberRunning;
  f->thread = kNoThread;
  return f;
}


void refuse_blocking(Worker* w, const char* what) {
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

namespace {

// A fiber takes threads from its group one after another; one that blocks stays
// suspended here, and another fiber goes on with the next unstarted thread.
void fiber_main() {
  Fiber* f = current_fiber();
  Worker* w = worker_of(f);
  const mtw_launch& launch = w->dispatch->launch;
  mtw_group& g = w->group;
  if (g.barrier_free) {
    launch.entry(&g, launch.buffers);  // every thread, in plain loops
  } else {
    while (g.next_thread < g.nthreads) {
      const uint32_t i = g.next_thread++;
      g.current = i;
      g.tg_cursor[i] = g.tg_static_bytes;
      launch.entry(&g, launch.buffers);
      g.done += 1;
      g.simd_done[i / MTW_SIMD_WIDTH] += 1;
    }
  }
  f->state = kFiberFinished;
  mtw_switch(&f->sp, w->scheduler_sp);
  __builtin_unreachable();
}

void give_back(Worker* w, Fiber* f) {
  f->state = kFiberFree;
  f->next_free = w->free_fibers;
  w->free_fibers = f;
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
  for (uint32_t i = 0; i < w->fiber_count; ++i) {
    w->all_fibers[i]->worker = w;
    give_back(w, w->all_fibers[i]);
  }
  w->runnable.head = w->runnable.tail = 0;
  w->running = nullptr;
}

namespace {

void record_live(Worker* w, uint32_t linear, uint32_t state, uintptr_t pc) {
  Dispatch* d = w->dispatch;
  __atomic_fetch_add(&d->live_total, 1, __ATOMIC_RELAXED);
  uint32_t slot = __atomic_fetch_add(&d->live_slots, 1, __ATOMIC_RELAXED);
  if (slot >= kLiveRecorded) return;
  mtw_live_thread& out = d->live[slot];
  const mtw_group& g = w->group;
  memcpy(out.group, g.group_pos, sizeof(out.group));
  if (g.barrier_free) {  // its loop does not record which thread runs
    out.thread[0] = out.thread[1] = out.thread[2] = 0xFFFFFFFFu;
  } else {
    out.thread[0] = linear % g.tg_size[0];
    out.thread[1] = (linear / g.tg_size[0]) % g.tg_size[1];
    out.thread[2] = linear / (g.tg_size[0] * g.tg_size[1]);
  }
  out.state = state;
  out.reserved = 0;
  out.pc = pc;
}

}  // namespace

void record_live_threads(Worker* w, uintptr_t running_pc) {
  const mtw_group& g = w->group;
  if (g.barrier_free) {
    record_live(w, 0, MTW_LIVE_RUNNING, running_pc);
    return;
  }
  bool ready[MTW_MAX_THREADS] = {};
  for (uint32_t i = w->runnable.head; i != w->runnable.tail; i = (i + 1) % (MTW_MAX_THREADS + 1))
    if (w->runnable.items[i]->thread < g.nthreads) ready[w->runnable.items[i]->thread] = true;
  uint32_t started = g.next_thread < g.nthreads ? g.next_thread : g.nthreads;
  for (uint32_t t = 0; t < started; ++t) {
    const ThreadWait& tw = w->waits[t];
    uintptr_t site = reinterpret_cast<uintptr_t>(tw.site);
    if (w->running && t == g.current) record_live(w, t, MTW_LIVE_RUNNING, running_pc);
    else if (tw.kind == kAtBarrier) record_live(w, t, MTW_LIVE_AT_BARRIER, site);
    else if (tw.kind == kAtSimd) record_live(w, t, MTW_LIVE_AT_SIMD, site);
    else if (ready[t]) record_live(w, t, MTW_LIVE_READY, site);
  }
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
    uint64_t start = uint64_t(g.group_pos[k]) * launch.threadgroup[k];
    uint64_t left = launch.grid[k] - start;
    g.tg_size[k] = uint32_t(left < launch.threadgroup[k] ? left : launch.threadgroup[k]);
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
      s.waiting = s.stepping = 0;
      if (s.done_next) {
        s.done_next = 0;
        memset(s.done_site, 0, sizeof(s.done_site));
      }
    }
    memset(w->waits, 0, g.nthreads * sizeof(ThreadWait));
  }
  g.tg_memory_used = launch.tg_static_bytes;
  w->barrier_arrived = 0;
  w->barrier_elsewhere = 0;
  w->failure = MTW_OK;
  w->combining = 0;
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
    } else if (resolve_stuck(w)) {
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

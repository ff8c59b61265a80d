// Runs the threads of one threadgroup as fibers on one OS thread.
#pragma once

#include <setjmp.h>
#include <stdint.h>

#include "fiber.h"
#include "runtime.h"
#include "sanitizer.h"

namespace mtw {

constexpr uint32_t kTgMemoryCapacity = 64 * 1024;

enum WaitKind : uint8_t { kNotWaiting = 0, kAtBarrier, kAtSimd };

struct ThreadWait {
  Fiber* fiber;
  const void* site;          // return address of the runtime call: which barrier / function
  const void* last_barrier;  // the barrier this thread last went through
  uint32_t collectives;      // SIMD-group collectives (and lockstep steps) completed
  uint32_t barriers;         // threadgroup barriers this thread has gone through
  WaitKind kind;
};

constexpr uint32_t kSitesRemembered = 16;

struct SimdWait {
  uint32_t waiting;   // lanes blocked in a collective or at a threadgroup-memory step
  uint32_t stepping;  // of those, the lanes at a threadgroup-memory step (lockstep kernels)
  // Which lanes have completed a collective at each recently seen call site.
  const void* done_site[kSitesRemembered];
  uint32_t done_lanes[kSitesRemembered];
  uint32_t done_next;
  const void* in[MTW_SIMD_WIDTH];
  void* out[MTW_SIMD_WIDTH];
  mtw_combine_fn combine[MTW_SIMD_WIDTH];
};

// A ring of runnable fibers, in the order they became runnable.
struct RunQueue {
  Fiber* items[MTW_MAX_THREADS + 1];
  uint32_t head = 0, tail = 0;
  bool empty() const { return head == tail; }
  void push(Fiber* f) {
    items[tail] = f;
    tail = (tail + 1) % (MTW_MAX_THREADS + 1);
  }
  Fiber* pop() {
    Fiber* f = items[head];
    head = (head + 1) % (MTW_MAX_THREADS + 1);
    return f;
  }
};

constexpr uint32_t kLiveRecorded = 64;

// One kernel launch, shared by all workers.
struct Dispatch {
  mtw_launch launch;
  uint64_t groups_total;          // threadgroups it runs: the grid's, or launch.ngroups
  uint32_t groups[3];
  volatile uint64_t next_group;   // taken with __atomic builtins
  uint64_t groups_per_claim;      // how many a worker takes at a time
  volatile int cancelled;
  volatile int status;            // first failure wins
  volatile uint32_t tg_memory_used;
  char message[2048];
  // Threads still live when the dispatch was stopped from outside: the first recorded,
  // and how many there were in all.
  mtw_live_thread live[kLiveRecorded];
  volatile uint32_t live_slots;
  volatile uint64_t live_total;
  SanitizerState san;
};

constexpr size_t kWorkerPrivateStack = size_t(64) << 10;

struct Worker {
  uint32_t index = 0;             // in the pool: which slice of the fiber arena is ours
  // SafeStack's private stack for kernel code run off a fiber (see pool.cpp).
  char* private_stack = nullptr;
  void* private_sp = nullptr;
  Dispatch* dispatch = nullptr;
  mtw_group group;
  void* scheduler_sp = nullptr;   // the worker's own context while a fiber runs
  Fiber* running = nullptr;
  Fiber* free_fibers = nullptr;
  Fiber* all_fibers[kFibersPerWorker];
  uint32_t fiber_count = 0;
  RunQueue runnable;
  uint32_t barrier_arrived = 0;     // threads waiting at any barrier
  const void* barrier_site = nullptr;  // where the first of them waits
  uint32_t barrier_elsewhere = 0;   // how many of them wait at other barriers
  ThreadWait waits[MTW_MAX_THREADS];
  SimdWait simd[MTW_MAX_SIMDGROUPS];
  char* tg_memory = nullptr;
  // Failure raised from kernel context: set, then control returns to the scheduler.
  int failure = MTW_OK;
  char message[1024];
  // Fault isolation: where a signal handler jumps back to, whether kernel code runs, and
  // what the handler saw (it only stores these; the message is written after the jump).
  sigjmp_buf escape;
  volatile int in_kernel = 0;
  volatile uintptr_t fault_address = 0;
  volatile uintptr_t fault_pc = 0;
  // Sanitizer state: shadow of threadgroup memory, barrier and SIMD intervals.
  TgShadow* tg_shadow = nullptr;
  uint32_t group_serial = 0;
  uint32_t barrier_epoch = 0;
  uint16_t simd_epoch[MTW_MAX_SIMDGROUPS];
  int atomic_depth = 0;
  int combining = 0;  // inside a collective's combine function (kernel code the runtime runs)
  uintptr_t os_stack_lo = 0, os_stack_hi = 0;
};

// The worker pool (fixed once created).
extern Worker** workers;
extern int pool_size;

// The worker whose code runs here: found from the stack pointer, on a fiber or on the
// worker's own stack (no thread-local lookup, which may allocate in a dlopen'ed library).
Worker* worker_here();

constexpr uint32_t kNoThread = 0xFFFFFFFFu;

// For code running on a fiber: fails the threadgroup (control goes back to the
// scheduler); refuses blocking on the barrier-free path (a kernel guessed barrier-free
// runs as plain loops with nothing to suspend: when it blocks after all, the dispatch
// stops and the caller runs it again on the general path).
[[noreturn]] void fail(Worker* worker, int status, const char* message);
void refuse_blocking(Worker* worker, const char* what);
inline void check_may_block(Worker* w, const char* what) {
  if (w->group.barrier_free) refuse_blocking(w, what);
}
// A fiber for the next unstarted thread (null when out of memory).
Fiber* take_fiber(Worker* w);

// Suspends the calling fiber. Control goes straight to the next runnable fiber (or a new
// one for the next unstarted thread), without a round trip through the scheduler; only
// when neither exists does the scheduler take over (finished group, or stuck threads).
inline void block(Worker* w, Fiber* f) {
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
// Inlined into the barrier and SIMD-group paths: as a call of its own, the switch that
// follows costs markedly more (bench/runtime.py).

// convergence.cpp. When nothing can run: releases a SIMD-group function or a barrier
// (false when none can be: a deadlock, which report_deadlock then describes).
bool resolve_stuck(Worker* worker);
void report_deadlock(Worker* worker);
// convergence.cpp. A lockstep kernel's thread is about to access threadgroup memory at
// `site`: it waits until the other live lanes of its SIMD-group are blocked too, and the
// lanes at the same access go on as one step (see convergence.cpp).
void simd_step(Worker* worker, const void* site);

// Runs threadgroup `index` of the worker's dispatch; returns an mtw_status.
int run_threadgroup(Worker* worker, uint64_t index);
// Describes thread `linear` of the worker's current group, e.g. "thread (3,0,0) of
// threadgroup (1,0,0)".
void describe_thread(const Worker* worker, uint32_t linear, char* out, size_t size);
// Forgets all fibers' state after an abandoned threadgroup.
void reset_fibers(Worker* worker);
// Records the threads of the worker's current group that have not finished (for a
// dispatch stopped from outside); `running_pc` is where the running one was stopped.
void record_live_threads(Worker* worker, uintptr_t running_pc);

}  // namespace mtw

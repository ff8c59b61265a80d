// Worker threads, dispatch lifecycle and fault isolation.
//
// Threadgroups are spread over a pool of OS threads; each runs whole threadgroups as
// fibers. A fault inside kernel code (bad pointer, trap, stack overflow) is caught by a
// signal handler on the faulting worker, which jumps back to the worker's loop: the
// dispatch fails with a message and the host process carries on. A watchdog outside
// (the Python caller) stops a dispatch that runs too long through mtw_dispatch_cancel.
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "platform.h"
#include "scheduler.h"

using namespace mtw;

namespace {

constexpr int kCancelSignal = SIGUSR2;
const int kFaultSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT};
constexpr int kFaultSignalCount = sizeof(kFaultSignals) / sizeof(kFaultSignals[0]);
// Each worker's signal stack is aligned to its size, with the worker's address in its
// first bytes: the handler finds its worker from its own stack pointer, touching no
// thread-local storage (which may allocate in a dlopen'ed library) and taking no lock.
constexpr size_t kSignalStack = size_t(64) << 10;

pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t work_ready = PTHREAD_COND_INITIALIZER;
pthread_cond_t work_done = PTHREAD_COND_INITIALIZER;
pthread_t* threads = nullptr;
uint64_t generation = 0;
int participants = 0;
int active = 0;
bool busy = false;
Dispatch current;
char last_message[2048];
mtw_live_thread last_live[kLiveRecorded];
uint32_t last_live_count = 0;
uint64_t last_live_total = 0;
struct sigaction previous[NSIG];

void record_failure(Dispatch* d, int status, const char* detail) {
  int expected = MTW_OK;
  if (__atomic_compare_exchange_n(&d->status, &expected, status, false, __ATOMIC_SEQ_CST,
                                  __ATOMIC_SEQ_CST)) {
    snprintf(d->message, sizeof(d->message), "%s", detail);
  }
}

// The first failure stops the whole dispatch: workers still inside kernel code are
// interrupted (a worker entering it sees `cancelled` first; see run_dispatch).
void stop_others(Dispatch* d, const Worker* self) {
  __atomic_store_n(&d->cancelled, 1, __ATOMIC_SEQ_CST);
  for (int i = 0; i < participants; ++i)
    if (workers[i] != self && __atomic_load_n(&workers[i]->in_kernel, __ATOMIC_SEQ_CST))
      pthread_kill(threads[i], kCancelSignal);
}

// The worker whose signal stack `frame` is on, or null (another thread's signal).
Worker* signal_stack_owner(const void* frame) {
  uintptr_t base = reinterpret_cast<uintptr_t>(frame) & ~(uintptr_t)(kSignalStack - 1);
  Worker* w = *reinterpret_cast<Worker* const*>(base);
  for (int i = 0; i < pool_size; ++i)
    if (workers[i] == w) return w;
  return nullptr;
}

// Async-signal-safe: plain loads and stores, then a jump back to the worker's loop,
// which writes the message.
void on_signal(int sig, siginfo_t* info, void* context) {
  char here;
  Worker* w = pool_size ? signal_stack_owner(&here) : nullptr;
  if (w && w->in_kernel) {
    w->in_kernel = 0;
    w->fault_address = reinterpret_cast<uintptr_t>(info->si_addr);
    w->fault_pc = platform::interrupted_pc(context);
    siglongjmp(w->escape, sig);
  }
  if (sig == kCancelSignal) return;
  // Not ours: hand it to whoever had it before, or let the default action happen.
  const struct sigaction& old = previous[sig];
  if (old.sa_flags & SA_SIGINFO) {
    if (old.sa_sigaction) {
      old.sa_sigaction(sig, info, context);
      return;
    }
  } else if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN && old.sa_handler) {
    old.sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_handler(int sig) {
  struct sigaction now;
  sigaction(sig, nullptr, &now);
  if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_signal) return;
  struct sigaction ours;
  memset(&ours, 0, sizeof(ours));
  ours.sa_sigaction = on_signal;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&ours.sa_mask);
  sigaction(sig, &ours, &previous[sig]);
}

void install_handlers() {
  for (int i = 0; i < kFaultSignalCount; ++i) install_handler(kFaultSignals[i]);
  install_handler(kCancelSignal);
}

// Notes the worker's own OS stack (where its scheduler runs), for worker_here().
void record_os_stack(Worker* w) {
  uintptr_t lo, hi;
  if (platform::thread_stack(&lo, &hi)) {
    w->os_stack_lo = lo;
    w->os_stack_hi = hi;
  }
}

// What a fault was, written after the handler has jumped back (normal context).
void describe_fault(Worker* w, int sig) {
  char where[200];
  describe_thread(w, w->group.current, where, sizeof(where));
  uintptr_t addr = w->fault_address;
  bool memory = platform::is_memory_fault(sig);
  StackPlace place = memory ? stack_place(addr, w->running) : kNotInArena;
  if (place == kBelowStack) {
    snprintf(w->message, sizeof(w->message),
             "stack overflow in %s: the thread's frames need more than the %zu KiB emulated "
             "stack (large private arrays, or deep recursion?), or a private array was "
             "indexed far below its start (address %p)",
             where, kFiberStack / kKiB, reinterpret_cast<void*>(addr));
  } else if (place == kBelowPrivate) {
    snprintf(w->message, sizeof(w->message),
             "stack overflow in %s: the thread's private arrays need more than the %zu KiB "
             "emulated private memory, or a private array was indexed far below its start "
             "(address %p)",
             where, kPrivateStack / kKiB, reinterpret_cast<void*>(addr));
  } else if (place == kAboveStack) {
    snprintf(w->message, sizeof(w->message),
             "access above the thread's stack in %s: a private array indexed far past its "
             "end (address %p)",
             where, reinterpret_cast<void*>(addr));
  } else if (place == kInStack) {
    snprintf(w->message, sizeof(w->message),
             "%s at address %p in %s: the thread's stack was overwritten (a private array "
             "indexed outside its bounds?)",
             platform::fault_name(sig), reinterpret_cast<void*>(addr), where);
  } else if (memory) {
    snprintf(w->message, sizeof(w->message), "%s at address %p in %s",
             platform::fault_name(sig), reinterpret_cast<void*>(addr), where);
  } else {
    snprintf(w->message, sizeof(w->message), "%s in %s", platform::fault_name(sig), where);
  }
}

// Threadgroups of a barrier-free kernel are cheap: a worker claims a run of them at a
// time, about kClaimThreads threads, so that each worker streams through a buffer in long
// runs that the hardware prefetcher follows rather than in pieces of a threadgroup
// interleaved with the other workers' (an elementwise kernel ran 1.5-2x slower so); at
// least kClaimsPerWorker runs per worker keep the work balanced.
constexpr uint64_t kClaimThreads = 16384;
constexpr uint64_t kClaimsPerWorker = 8;

uint64_t groups_per_claim(const Dispatch* d, int workers) {
  if (!d->launch.barrier_free || workers < 1) return 1;
  uint64_t threads = 1;
  for (int k = 0; k < 3; ++k) threads *= d->launch.threadgroup[k] ? d->launch.threadgroup[k] : 1;
  uint64_t by_size = kClaimThreads / threads;
  uint64_t by_balance = d->groups_total / (uint64_t(workers) * kClaimsPerWorker);
  uint64_t chunk = by_size < by_balance ? by_size : by_balance;
  return chunk > 1 ? chunk : 1;
}

void run_dispatch(Worker* w) {
  Dispatch* d = &current;
  w->dispatch = d;
  // A thread stopped inside an atomic (a sanitizer stop, a fault) never left its scope.
  w->atomic_depth = 0;
  w->group.tg_memory = w->tg_memory;
  w->group.tg_memory_size = d->launch.tg_memory_limit;
  w->group.tg_static_bytes = d->launch.tg_static_bytes;
  w->group.barrier_free = d->launch.barrier_free;
  for (int k = 0; k < 3; ++k) {
    w->group.dispatch_tg[k] = d->launch.threadgroup[k];
    w->group.groups[k] = d->groups[k];
    w->group.grid[k] = d->launch.grid[k];
  }
  int sig = sigsetjmp(w->escape, 1);
  if (sig != 0) {
    if (sig == kCancelSignal) {
      // Only the dispatch stopped from outside is reported with its live threads; a worker
      // stopped because another faulted has nothing to add.
      if (__atomic_load_n(&d->status, __ATOMIC_SEQ_CST) == MTW_CANCELLED)
        record_live_threads(w, w->fault_pc);
      snprintf(w->message, sizeof(w->message), "stopped while running");
    } else if (sig != kSanitizerStop) {  // the sanitizer wrote its own message
      describe_fault(w, sig);
    }
    reset_fibers(w);
    const int status = sig == kCancelSignal   ? MTW_CANCELLED
                       : sig == kSanitizerStop ? MTW_SANITIZER_STOP
                                               : MTW_FAULT;
    record_failure(d, status, w->message);
    if (sig != kCancelSignal) stop_others(d, w);
    return;
  }
  const uint64_t chunk = d->groups_per_claim;
  for (uint64_t index = 0, end = 0;; ++index) {
    if (index == end) {
      index = __atomic_fetch_add(&d->next_group, chunk, __ATOMIC_RELAXED);
      end = index + chunk < d->groups_total ? index + chunk : d->groups_total;
    }
    if (index >= d->groups_total) return;
    // Announce kernel code before looking at `cancelled` (stop_others does the reverse),
    // so a stop either sees this worker inside or this worker sees the stop.
    __atomic_store_n(&w->in_kernel, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&d->cancelled, __ATOMIC_SEQ_CST) ||
        __atomic_load_n(&d->status, __ATOMIC_SEQ_CST) != MTW_OK) {
      w->in_kernel = 0;
      return;
    }
    int status = run_threadgroup(w, d->launch.groups ? d->launch.groups[index] : index);
    w->in_kernel = 0;
    if (status != MTW_OK) {
      reset_fibers(w);
      record_failure(d, status, w->message);
      stop_others(d, w);
      return;
    }
  }
}

void* worker_main(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  record_os_stack(w);
  sanitizer_begin_worker(w);
  // Interrupts belong to the host's main thread; only faults and cancellation come here.
  sigset_t mask;
  sigfillset(&mask);
  for (int i = 0; i < kFaultSignalCount; ++i) sigdelset(&mask, kFaultSignals[i]);
  sigdelset(&mask, kCancelSignal);
  pthread_sigmask(SIG_SETMASK, &mask, nullptr);
  char* signal_stack = static_cast<char*>(aligned_alloc(kSignalStack, kSignalStack));
  if (signal_stack) {
    *reinterpret_cast<Worker**>(signal_stack) = w;
    stack_t alt;
    alt.ss_sp = signal_stack + 64;
    alt.ss_size = kSignalStack - 64;
    alt.ss_flags = 0;
    sigaltstack(&alt, nullptr);
  }
  int index = int(w->index);
  pthread_mutex_lock(&mutex);
  uint64_t seen = 0;  // generations start at 1
  for (;;) {
    while (generation == seen || index >= participants) {
      seen = generation;
      pthread_cond_wait(&work_ready, &mutex);
    }
    seen = generation;
    pthread_mutex_unlock(&mutex);
    run_dispatch(w);
    pthread_mutex_lock(&mutex);
    if (--active == 0) pthread_cond_broadcast(&work_done);
  }
  return nullptr;
}

bool ensure_pool() {
  if (pool_size) return true;
  int n = platform::cpu_count();
  workers = static_cast<Worker**>(calloc(n, sizeof(Worker*)));
  threads = static_cast<pthread_t*>(calloc(n, sizeof(pthread_t)));
  if (!workers || !threads || !fiber_arena_init(uint32_t(n))) return false;
  for (int i = 0; i < n; ++i) {
    // Zeroed memory is a valid initial Worker (all its defaults are zeros); the runtime
    // links no C++ library, so no operator new.
    Worker* w = static_cast<Worker*>(calloc(1, sizeof(Worker)));
    if (!w) return false;
    w->index = uint32_t(i);
    w->private_stack = static_cast<char*>(aligned_alloc(64, kWorkerPrivateStack));
    if (!w->private_stack) return false;
    w->private_sp = w->private_stack + kWorkerPrivateStack;
    w->tg_memory = static_cast<char*>(aligned_alloc(64, kTgMemoryCapacity));
    workers[i] = w;
  }
  pool_size = n;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1 << 20);
  for (int i = 0; i < n; ++i) pthread_create(&threads[i], &attr, worker_main, workers[i]);
  pthread_attr_destroy(&attr);
  return true;
}

}  // namespace

extern "C" int mtw_dispatch_start(const mtw_launch* launch) {
  pthread_mutex_lock(&mutex);
  if (busy) {
    pthread_mutex_unlock(&mutex);
    return 1;
  }
  if (!ensure_pool()) {
    pthread_mutex_unlock(&mutex);
    return 2;
  }
  install_handlers();
  Dispatch* d = &current;
  d->launch = *launch;
  if (d->launch.tg_memory_limit > kTgMemoryCapacity) d->launch.tg_memory_limit = kTgMemoryCapacity;
  d->groups_total = 1;
  for (int k = 0; k < 3; ++k) {
    // In 64 bits: a grid dimension near 2^32 must not wrap to a handful of threadgroups.
    uint64_t grid = launch->grid[k], tg = launch->threadgroup[k] ? launch->threadgroup[k] : 1;
    d->groups[k] = uint32_t((grid + tg - 1) / tg);
    d->groups_total *= d->groups[k];
  }
  if (launch->groups) d->groups_total = launch->ngroups;
  d->live_slots = 0;
  d->live_total = 0;
  d->next_group = 0;
  d->cancelled = 0;
  d->status = MTW_OK;
  d->tg_memory_used = launch->tg_static_bytes;
  d->message[0] = 0;
  if (d->launch.sanitize) sanitizer_begin_dispatch(d);
  int want = launch->workers ? int(launch->workers) : pool_size;
  if (want > pool_size) want = pool_size;
  if (uint64_t(want) > d->groups_total) want = int(d->groups_total);
  d->groups_per_claim = groups_per_claim(d, want);
  participants = want;
  active = want;
  busy = true;
  ++generation;
  if (active == 0) pthread_cond_broadcast(&work_done);
  pthread_cond_broadcast(&work_ready);
  pthread_mutex_unlock(&mutex);
  return 0;
}

extern "C" int mtw_dispatch_wait(uint32_t timeout_ms) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += timeout_ms / 1000;
  deadline.tv_nsec += long(timeout_ms % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec += 1;
    deadline.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&mutex);
  while (active > 0) {
    if (pthread_cond_timedwait(&work_done, &mutex, &deadline) == ETIMEDOUT && active > 0) {
      pthread_mutex_unlock(&mutex);
      return MTW_RUNNING;
    }
  }
  int status = MTW_OK;
  if (busy) {
    busy = false;
    status = current.status;
    snprintf(last_message, sizeof(last_message), "%s", current.message);
    last_live_count = current.live_slots < kLiveRecorded ? current.live_slots : kLiveRecorded;
    memcpy(last_live, current.live, last_live_count * sizeof(mtw_live_thread));
    last_live_total = current.live_total;
  }
  pthread_mutex_unlock(&mutex);
  return status;
}

extern "C" void mtw_dispatch_cancel(void) {
  pthread_mutex_lock(&mutex);
  if (busy) {
    int expected = MTW_OK;
    __atomic_compare_exchange_n(&current.status, &expected, int(MTW_CANCELLED), false,
                                __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    stop_others(&current, nullptr);
  }
  pthread_mutex_unlock(&mutex);
}

extern "C" const char* mtw_dispatch_message(void) { return last_message; }

extern "C" uint64_t mtw_dispatch_live_threads(mtw_live_thread* out, uint32_t max) {
  pthread_mutex_lock(&mutex);
  uint32_t n = last_live_count < max ? last_live_count : max;
  if (out && n) memcpy(out, last_live, n * sizeof(mtw_live_thread));
  uint64_t total = last_live_total;
  pthread_mutex_unlock(&mutex);
  return total;
}

extern "C" uint32_t mtw_dispatch_tg_memory(void) { return current.tg_memory_used; }

extern "C" int mtw_abi_version(void) { return MTW_ABI_VERSION; }

extern "C" uint32_t mtw_sanitizer_findings(void) {
  return current.launch.sanitize ? current.san.findings : 0;
}

extern "C" uint32_t mtw_sanitizer_tg_arrays(void) {
  return current.launch.sanitize ? current.san.array_count : 0;
}

extern "C" const char* mtw_sanitizer_tg_array_name(uint32_t index) {
  return index < current.san.array_count ? current.san.arrays[index].name : "";
}

extern "C" uint32_t mtw_sanitizer_tg_array_element_size(uint32_t index) {
  return index < current.san.array_count ? current.san.arrays[index].element_size : 0;
}

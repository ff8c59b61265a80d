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
#include <unistd.h>

#include "scheduler.h"

using namespace mtw;

__thread Worker* mtw::tls_worker = nullptr;
Worker** mtw::workers = nullptr;
int mtw::pool_size = 0;

namespace {

constexpr int kCancelSignal = SIGUSR2;
const int kFaultSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT};
constexpr int kFaultSignalCount = sizeof(kFaultSignals) / sizeof(kFaultSignals[0]);

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
struct sigaction previous[NSIG];


void record_failure(Dispatch* d, int status, const char* detail) {
  int expected = MTW_OK;
  if (__atomic_compare_exchange_n(&d->status, &expected, status, false, __ATOMIC_ACQ_REL,
                                  __ATOMIC_ACQUIRE)) {
    snprintf(d->message, sizeof(d->message), "%s", detail);
  }
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "segmentation fault (invalid memory access)";
    case SIGBUS: return "bus error (misaligned or invalid memory access)";
    case SIGFPE: return "arithmetic trap (integer division by zero or overflow)";
    case SIGILL: return "illegal instruction (trap)";
    case SIGTRAP: return "trap";
    case SIGABRT: return "abort";
    default: return "signal";
  }
}

void on_signal(int sig, siginfo_t* info, void* context) {
  Worker* w = tls_worker;
  if (w && w->in_kernel) {
    w->in_kernel = 0;
    if (sig == kCancelSignal) {
      snprintf(w->message, sizeof(w->message), "stopped while running");
    } else {
      char where[200];
      describe_thread(w, w->group.current, where, sizeof(where));
      uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
      Fiber* fiber = w->running;
      uintptr_t region = reinterpret_cast<uintptr_t>(fiber);
      bool overflow = fiber && addr >= region && addr < region + 2 * kPage;
      if (overflow) {
        snprintf(w->message, sizeof(w->message),
                 "stack overflow in %s: thread-private data exceeds the %zu KiB emulated "
                 "stack (large arrays in thread memory?)",
                 where, (kFiberRegion - 2 * kPage) / 1024);
      } else if (sig == SIGSEGV || sig == SIGBUS) {
        snprintf(w->message, sizeof(w->message), "%s at address %p in %s", signal_name(sig),
                 info->si_addr, where);
      } else {
        snprintf(w->message, sizeof(w->message), "%s in %s", signal_name(sig), where);
      }
    }
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

void run_dispatch(Worker* w) {
  Dispatch* d = &current;
  w->dispatch = d;
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
    reset_fibers(w);
    record_failure(d, sig == kCancelSignal ? MTW_CANCELLED : MTW_FAULT, w->message);
    return;
  }
  for (;;) {
    if (__atomic_load_n(&d->status, __ATOMIC_ACQUIRE) != MTW_OK || d->cancelled) return;
    uint64_t index = __atomic_fetch_add(&d->next_group, 1, __ATOMIC_RELAXED);
    if (index >= d->groups_total) return;
    w->in_kernel = 1;
    int status = run_threadgroup(w, index);
    w->in_kernel = 0;
    if (status != MTW_OK) {
      reset_fibers(w);
      record_failure(d, status, w->message);
      return;
    }
  }
}

void* worker_main(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  tls_worker = w;
  sanitizer_begin_worker(w);
  // Interrupts belong to the host's main thread; only faults and cancellation come here.
  sigset_t mask;
  sigfillset(&mask);
  for (int i = 0; i < kFaultSignalCount; ++i) sigdelset(&mask, kFaultSignals[i]);
  sigdelset(&mask, kCancelSignal);
  pthread_sigmask(SIG_SETMASK, &mask, nullptr);
  stack_t alt;
  alt.ss_size = 64 * 1024;
  alt.ss_sp = malloc(alt.ss_size);
  alt.ss_flags = 0;
  sigaltstack(&alt, nullptr);
  int index = 0;
  pthread_mutex_lock(&mutex);
  for (int i = 0; i < pool_size; ++i)
    if (workers[i] == w) index = i;
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
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int n = cores > 0 ? int(cores) : 1;
  workers = static_cast<Worker**>(calloc(n, sizeof(Worker*)));
  threads = static_cast<pthread_t*>(calloc(n, sizeof(pthread_t)));
  if (!workers || !threads) return false;
  for (int i = 0; i < n; ++i) {
    // Zeroed memory is a valid initial Worker (all its defaults are zeros); the runtime
    // links no C++ library, so no operator new.
    Worker* w = static_cast<Worker*>(calloc(1, sizeof(Worker)));
    if (!w) return false;
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
    d->groups[k] = (launch->grid[k] + launch->threadgroup[k] - 1) / launch->threadgroup[k];
    d->groups_total *= d->groups[k];
  }
  d->next_group = 0;
  d->cancelled = 0;
  d->status = MTW_OK;
  d->tg_memory_used = launch->tg_static_bytes;
  d->message[0] = 0;
  if (d->launch.sanitize) sanitizer_begin_dispatch(d);
  int want = launch->workers ? int(launch->workers) : pool_size;
  if (want > pool_size) want = pool_size;
  if (uint64_t(want) > d->groups_total) want = int(d->groups_total);
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
    current.cancelled = 1;
    for (int i = 0; i < participants; ++i)
      if (workers[i]->in_kernel) pthread_kill(threads[i], kCancelSignal);
  }
  pthread_mutex_unlock(&mutex);
}

extern "C" const char* mtw_dispatch_message(void) { return last_message; }

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

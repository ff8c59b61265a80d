// A dispatch of the emulator without Python: what mtwork's run room does (load the
// runtime, then a kernel library; lay the buffers out; start a dispatch and wait), for a
// machine whose Python cannot be had here: arm64 Linux under qemu-user. The test
// (tests/platforms/foreign.py) writes a plan from a real mtwork call and compares what
// this writes back with the same plan run on this machine.
//
//   driver RUNTIME KERNEL PLAN OUT
//
// PLAN, one item a line:
//   entry NAME              mtw_entry (fibers) or mtw_entry_barrier_free (loops, engine)
//   barrier_free 0|1
//   lockstep 0|1
//   grid X Y Z
//   threadgroup X Y Z       already clamped to the grid
//   tg_static BYTES         taken by [[threadgroup(n)]] arguments
//   slots N                 the launcher's pointer table
//   buffer SLOT BYTES DATA FILE   a buffer: BYTES from FILE, element 0 DATA bytes in
//   offset SLOT VALUE       a [[threadgroup(n)]] argument's offset
// OUT gets slotN.bin, each buffer after the dispatch, and status.txt: the dispatch's
// status (runtime.h's mtw_status) on the first line, its message on the second.
//
// Each buffer ends at a page boundary, followed by a page of slack and a guard page that
// faults, as the worker process's arena lays them out.
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"

#define MAX_SLOTS 4096

typedef int (*start_fn)(const mtw_launch*);
typedef int (*wait_fn)(uint32_t);
typedef void (*cancel_fn)(void);
typedef const char* (*message_fn)(void);
typedef int (*version_fn)(void);

static void* slot_value[MAX_SLOTS];
static char* span_of[MAX_SLOTS];      // a buffer's first byte
static size_t bytes_of[MAX_SLOTS];    // a buffer's bytes (0: not a buffer)

static void die(const char* what, const char* detail) {
  fprintf(stderr, "driver: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  exit(2);
}

static void* symbol(void* library, const char* name) {
  void* found = dlsym(library, name);
  if (!found) die("missing symbol", name);
  return found;
}

// A buffer of `bytes` whose last byte ends a page, then a page of slack, then a guard.
static char* guarded(size_t bytes) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t pages = (bytes + page - 1) / page;
  if (pages == 0) pages = 1;
  size_t total = (pages + 2) * page;
  char* base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) die("mmap", NULL);
  if (mprotect(base + (pages + 1) * page, page, PROT_NONE) != 0) die("mprotect", NULL);
  return base + pages * page - bytes;
}

static void load_buffer(unsigned slot, size_t bytes, size_t data, const char* file) {
  if (slot >= MAX_SLOTS) die("slot out of range", file);
  char* span = guarded(bytes);
  FILE* f = fopen(file, "rb");
  if (!f || fread(span, 1, bytes, f) != bytes) die("cannot read", file);
  fclose(f);
  span_of[slot] = span;
  bytes_of[slot] = bytes;
  slot_value[slot] = span + data;
}

static void write_file(const char* folder, const char* name, const void* data, size_t n) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", folder, name);
  FILE* f = fopen(path, "wb");
  if (!f || fwrite(data, 1, n, f) != n) die("cannot write", path);
  fclose(f);
}

int main(int argc, char** argv) {
  if (argc != 5) die("usage: driver RUNTIME KERNEL PLAN OUT", NULL);
  void* runtime = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
  if (!runtime) die("cannot load the runtime", dlerror());
  if (((version_fn)symbol(runtime, "mtw_abi_version"))() != MTW_ABI_VERSION)
    die("the runtime's ABI version differs from this driver's", NULL);
  void* kernel = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!kernel) die("cannot load the kernel", dlerror());

  mtw_launch launch;
  memset(&launch, 0, sizeof(launch));
  launch.kernel_name = "kernel";
  launch.tg_memory_limit = 32768;
  unsigned slots = 0;
  FILE* plan = fopen(argv[3], "r");
  if (!plan) die("cannot read", argv[3]);
  char word[64], name[4096];
  while (fscanf(plan, "%63s", word) == 1) {
    unsigned slot, a, b, c;
    unsigned long long n, data;
    if (!strcmp(word, "entry") && fscanf(plan, "%4095s", name) == 1) {
      launch.entry = (mtw_entry_fn)symbol(kernel, name);
    } else if (!strcmp(word, "barrier_free") && fscanf(plan, "%u", &a) == 1) {
      launch.barrier_free = a;
    } else if (!strcmp(word, "lockstep") && fscanf(plan, "%u", &a) == 1) {
      launch.lockstep = a;
    } else if (!strcmp(word, "grid") && fscanf(plan, "%u %u %u", &a, &b, &c) == 3) {
      launch.grid[0] = a, launch.grid[1] = b, launch.grid[2] = c;
    } else if (!strcmp(word, "threadgroup") && fscanf(plan, "%u %u %u", &a, &b, &c) == 3) {
      launch.threadgroup[0] = a, launch.threadgroup[1] = b, launch.threadgroup[2] = c;
    } else if (!strcmp(word, "tg_static") && fscanf(plan, "%u", &a) == 1) {
      launch.tg_static_bytes = a;
    } else if (!strcmp(word, "slots") && fscanf(plan, "%u", &slots) == 1) {
      if (slots > MAX_SLOTS) die("too many slots", NULL);
    } else if (!strcmp(word, "buffer") &&
               fscanf(plan, "%u %llu %llu %4095s", &slot, &n, &data, name) == 4) {
      load_buffer(slot, (size_t)n, (size_t)data, name);
    } else if (!strcmp(word, "offset") && fscanf(plan, "%u %llu", &slot, &n) == 2) {
      if (slot >= MAX_SLOTS) die("slot out of range", NULL);
      slot_value[slot] = (void*)(uintptr_t)n;
    } else {
      die("cannot read the plan at", word);
    }
  }
  fclose(plan);
  if (!launch.entry) die("the plan names no entry", NULL);
  launch.buffers = slot_value;

  start_fn start = (start_fn)symbol(runtime, "mtw_dispatch_start");
  wait_fn wait = (wait_fn)symbol(runtime, "mtw_dispatch_wait");
  cancel_fn cancel = (cancel_fn)symbol(runtime, "mtw_dispatch_cancel");
  message_fn message = (message_fn)symbol(runtime, "mtw_dispatch_message");
  if (start(&launch) != 0) die("the runtime could not start its worker threads", NULL);
  int status;
  time_t deadline = time(NULL) + 300;  // a watchdog, as mtwork's
  while ((status = wait(100)) == MTW_RUNNING)
    if (time(NULL) > deadline) cancel();

  for (unsigned slot = 0; slot < slots; ++slot) {
    if (!bytes_of[slot]) continue;
    char file[64];
    snprintf(file, sizeof(file), "slot%u.bin", slot);
    write_file(argv[4], file, span_of[slot], bytes_of[slot]);
  }
  char text[4200];
  int n = snprintf(text, sizeof(text), "%d\n%s\n", status, message());
  write_file(argv[4], "status.txt", text, (size_t)n);
  return 0;
}

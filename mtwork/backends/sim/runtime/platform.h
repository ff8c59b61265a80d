// The runtime's platform layer: every call that differs between the hosts the emulator
// runs on (Linux and macOS, x86-64 and arm64) is made here, each with the reason, and
// nowhere else in the runtime.
//
// What differs:
// - the fiber switch and a new fiber's first frame: each CPU saves its own registers;
//   Mach-O names C symbols with a leading underscore;
// - memory: address space reserved without memory and committed later (fiber stacks),
//   plain zeroed mappings (the profiler's tables); page sizes differ (4 KiB on x86-64
//   and most arm64 Linux, 16 KiB on Apple Silicon), so fixed layouts are multiples of
//   the largest, and the page size is asked of the system, never assumed;
// - a thread's own stack: glibc says it through pthread_getattr_np, macOS through
//   pthread_get_stackaddr_np (the top) and pthread_get_stacksize_np;
// - a signal handler's context: where the interrupted instruction was (ucontext_t's
//   layout is the C library's and the CPU's);
// - which signals are invalid memory accesses: SIGSEGV everywhere, and on macOS SIGBUS
//   too, which its kernel raises for a page the process has protected (a guard page);
// - the loaded image holding an address, for code offsets a symbolizer reads: from the
//   ELF program headers (dl_iterate_phdr) on Linux, from the Mach-O segments on macOS.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace mtw {
namespace platform {

// The largest page of a supported host (16 KiB on Apple Silicon, 64 KiB on arm64 Linux
// kernels built so): fixed layouts of memory whose pages are protected one by one (the
// fiber stacks' guards) are multiples of it.
constexpr size_t kLargestPage = size_t(64) << 10;

// The system's page size.
size_t page_size();

// Address space for `bytes`, inaccessible and holding no memory until committed; null
// when it cannot be had.
void* reserve(size_t bytes);
// Makes [at, at + bytes) of reserved space readable and writable (page aligned).
bool commit(void* at, size_t bytes);
// Zeroed read-write memory of its own mapping (null when it cannot be had), and its end.
void* map_zeroed(size_t bytes);
void unmap(void* at, size_t bytes);

// The calling thread's stack, [lo, hi); false when the system does not say.
bool thread_stack(uintptr_t* lo, uintptr_t* hi);

// In a signal handler: the address of the instruction the signal interrupted.
uintptr_t interrupted_pc(const void* ucontext);
// Whether signal `sig` is an access to memory the process may not touch.
bool is_memory_fault(int sig);
// What `sig` means, for a fault's message (the same words for the same event on every
// host).
const char* fault_name(int sig);

// The loaded image (executable or library) holding `address`: the span of its segments
// and the base its code offsets count from (what a symbolizer takes).
struct Image {
  uintptr_t lo, hi, base;
};
bool image_of(const void* address, Image* out);

// Processors online (at least 1).
int cpu_count();

// The first frame of a fiber whose stack ends at `top` (16-byte aligned): switched to by
// mtw_switch, it starts running `start`. Returns the stack pointer to switch to.
void* fiber_first_frame(uintptr_t top, void (*start)());

}  // namespace platform

// Saves the callee-saved registers and the stack pointer in *save_sp, then loads
// new_sp's context and returns into it (platform.cpp, in assembly for each CPU).
extern "C" void mtw_switch(void** save_sp, void* new_sp);

}  // namespace mtw

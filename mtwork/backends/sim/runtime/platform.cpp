// The platform layer (see platform.h): one section per difference, Linux and macOS,
// x86-64 and arm64.
#if defined(__APPLE__)
#include <dlfcn.h>
#include <mach-o/loader.h>
#include <pthread.h>
#include <sys/ucontext.h>  // <ucontext.h> is the deprecated API, refused without _XOPEN_SOURCE
#elif defined(__linux__)
#include <link.h>
#include <pthread.h>
#include <ucontext.h>
#else
#error "the mtwork emulator runs on Linux and macOS"
#endif
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "platform.h"

namespace mtw {
namespace platform {

// --- the fiber switch ----------------------------------------------------------------------

#if defined(__APPLE__)
#define MTW_SYM(name) "_" #name  // Mach-O's C symbols start with an underscore
#else
#define MTW_SYM(name) #name
#endif

// mtw_switch(save_sp, new_sp): push the callee-saved registers of the CPU's C calling
// convention (the same on Linux and macOS for each CPU), store the stack pointer in
// *save_sp, load new_sp and pop the other context's registers. The floating-point control
// state is not switched: every fiber runs kernel code in the same environment. On arm64,
// x18 is left alone (macOS reserves it for the system).
#if defined(__x86_64__)
__asm__(
    ".text\n"
    ".globl " MTW_SYM(mtw_switch) "\n"
    MTW_SYM(mtw_switch) ":\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n");

void* fiber_first_frame(uintptr_t top, void (*start)()) {
  // Popped by mtw_switch: r15, r14, r13, r12, rbx, rbp, then the return address. After
  // `ret`, rsp = top - 8, the alignment a called function expects.
  uint64_t* sp = reinterpret_cast<uint64_t*>(top - 16);
  *sp = reinterpret_cast<uint64_t>(start);
  sp -= 6;
  memset(sp, 0, 6 * sizeof(uint64_t));
  return sp;
}
#elif defined(__aarch64__)
__asm__(
    ".text\n"
    ".globl " MTW_SYM(mtw_switch) "\n"
    ".p2align 2\n"
    MTW_SYM(mtw_switch) ":\n"
    "  sub sp, sp, #176\n"
    "  stp x19, x20, [sp, #0]\n"
    "  stp x21, x22, [sp, #16]\n"
    "  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n"
    "  stp x27, x28, [sp, #64]\n"
    "  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n"
    "  stp d10, d11, [sp, #112]\n"
    "  stp d12, d13, [sp, #128]\n"
    "  stp d14, d15, [sp, #144]\n"
    "  mov x2, sp\n"
    "  str x2, [x0]\n"
    "  mov sp, x1\n"
    "  ldp x19, x20, [sp, #0]\n"
    "  ldp x21, x22, [sp, #16]\n"
    "  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n"
    "  ldp x27, x28, [sp, #64]\n"
    "  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n"
    "  ldp d10, d11, [sp, #112]\n"
    "  ldp d12, d13, [sp, #128]\n"
    "  ldp d14, d15, [sp, #144]\n"
    "  add sp, sp, #176\n"
    "  ret\n");

void* fiber_first_frame(uintptr_t top, void (*start)()) {
  // The 176 bytes mtw_switch pops, all zeros but x30 (the link register `ret` jumps to);
  // after it sp = top, 16-byte aligned as the ABI wants.
  uint64_t* sp = reinterpret_cast<uint64_t*>(top - 176);
  memset(sp, 0, 176);
  sp[11] = reinterpret_cast<uint64_t>(start);
  return sp;
}
#else
#error "the mtwork emulator runs on x86-64 and arm64 hosts"
#endif

// --- memory --------------------------------------------------------------------------------

size_t page_size() {
  long size = sysconf(_SC_PAGESIZE);
  return size > 0 ? size_t(size) : kLargestPage;
}

void* reserve(size_t bytes) {
  // MAP_NORESERVE: Linux counts no swap for the untouched stacks of 1,025 fibers a core
  // (macOS accepts the flag and never counts any).
  void* at = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return at == MAP_FAILED ? nullptr : at;
}

bool commit(void* at, size_t bytes) {
  return mprotect(at, bytes, PROT_READ | PROT_WRITE) == 0;
}

void* map_zeroed(size_t bytes) {
  void* at = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return at == MAP_FAILED ? nullptr : at;
}

void unmap(void* at, size_t bytes) { munmap(at, bytes); }

// --- threads -------------------------------------------------------------------------------

bool thread_stack(uintptr_t* lo, uintptr_t* hi) {
#if defined(__APPLE__)
  // macOS gives the stack's top (its highest address) and its size; no attribute object.
  pthread_t self = pthread_self();
  uintptr_t top = reinterpret_cast<uintptr_t>(pthread_get_stackaddr_np(self));
  size_t size = pthread_get_stacksize_np(self);
  if (!top || !size) return false;
  *lo = top - size;
  *hi = top;
  return true;
#else
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return false;
  void* base;
  size_t size;
  bool known = pthread_attr_getstack(&attr, &base, &size) == 0;
  pthread_attr_destroy(&attr);
  if (!known) return false;
  *lo = reinterpret_cast<uintptr_t>(base);
  *hi = *lo + size;
  return true;
#endif
}

int cpu_count() {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return cores > 0 ? int(cores) : 1;
}

// --- signals -------------------------------------------------------------------------------

uintptr_t interrupted_pc(const void* context) {
  const ucontext_t* uc = static_cast<const ucontext_t*>(context);
#if defined(__APPLE__) && defined(__x86_64__)
  return uintptr_t(uc->uc_mcontext->__ss.__rip);  // macOS: uc_mcontext is a pointer
#elif defined(__APPLE__)
  return uintptr_t(__darwin_arm_thread_state64_get_pc(uc->uc_mcontext->__ss));
#elif defined(__x86_64__)
  return uintptr_t(uc->uc_mcontext.gregs[REG_RIP]);
#else
  return uintptr_t(uc->uc_mcontext.pc);
#endif
}

bool is_memory_fault(int sig) {
  // SIGBUS too: macOS raises it for an access to a page of a mapping the process
  // protected (a guard page), where Linux raises SIGSEGV; Linux raises it for a page of
  // a mapped file past the file's end.
  return sig == SIGSEGV || sig == SIGBUS;
}

const char* fault_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "segmentation fault (invalid memory access)";
#if defined(__APPLE__)
    // A guard page hit (see is_memory_fault): the words Linux's SIGSEGV gets.
    case SIGBUS: return "segmentation fault (invalid memory access)";
#else
    case SIGBUS: return "bus error (misaligned or invalid memory access)";
#endif
    case SIGFPE: return "arithmetic trap (integer division by zero or overflow)";
    case SIGILL: return "illegal instruction (trap)";
    case SIGTRAP: return "trap";
    case SIGABRT: return "abort";
    default: return "signal";
  }
}

// --- loaded images -------------------------------------------------------------------------

#if defined(__APPLE__)
bool image_of(const void* address, Image* out) {
  // The Mach-O header dladdr finds, and its 64-bit segments; code offsets count from the
  // image's virtual address 0 (a library's __TEXT segment starts there).
  Dl_info info;
  if (!address || !dladdr(address, &info) || !info.dli_fbase) return false;
  const auto* header = static_cast<const mach_header_64*>(info.dli_fbase);
  if (header->magic != MH_MAGIC_64) return false;
  const char* command = reinterpret_cast<const char*>(header + 1);
  uintptr_t lo = UINTPTR_MAX, hi = 0, slide = 0;
  bool text = false;
  for (uint32_t i = 0; i < header->ncmds; ++i) {
    const auto* load = reinterpret_cast<const load_command*>(command);
    if (load->cmd == LC_SEGMENT_64) {
      const auto* segment = reinterpret_cast<const segment_command_64*>(command);
      if (strcmp(segment->segname, SEG_TEXT) == 0) {
        slide = reinterpret_cast<uintptr_t>(header) - uintptr_t(segment->vmaddr);
        text = true;
      }
      if (segment->initprot != 0) {  // not __PAGEZERO
        if (segment->vmaddr < lo) lo = uintptr_t(segment->vmaddr);
        if (segment->vmaddr + segment->vmsize > hi) hi = uintptr_t(segment->vmaddr + segment->vmsize);
      }
    }
    command += load->cmdsize;
  }
  if (!text || lo >= hi) return false;
  out->lo = lo + slide;
  out->hi = hi + slide;
  out->base = slide;
  return true;
}
#else
namespace {

int find_image(struct dl_phdr_info* info, size_t, void* data) {
  // The span of the object's loadable segments; its load bias is the base ELF code
  // offsets count from.
  auto* search = static_cast<Image*>(data);
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    uintptr_t start = info->dlpi_addr + ph.p_vaddr;
    if (start < lo) lo = start;
    if (start + ph.p_memsz > hi) hi = start + ph.p_memsz;
  }
  if (search->base >= lo && search->base < hi) {
    *search = Image{lo, hi, uintptr_t(info->dlpi_addr)};
    return 1;
  }
  return 0;
}

}  // namespace

bool image_of(const void* address, Image* out) {
  Image search{0, 0, reinterpret_cast<uintptr_t>(address)};  // base: the address sought
  if (!address || !dl_iterate_phdr(find_image, &search)) return false;
  *out = search;
  return true;
}
#endif

}  // namespace platform
}  // namespace mtw

// A kernel's calls of the C library's process exits go to the runtime instead
// (runtime/exits.cpp), which fails the dispatch as a fault does: exit() in kernel code must
// not end the process running it, the caller's own when in-process.
//
// Each exit is renamed for the code after this header (clang's #pragma redefine_extname,
// also for a declaration already seen), whoever declares it: the kernel, <stdlib.h> or
// <unistd.h>. The new names carry the target's prefix of C symbols (an underscore on
// Mach-O), so they meet the runtime's functions on every host, where a linker's --wrap
// exists on ELF only. Read as text by every compile (compiler.METAL_PREDECLARED): a
// precompiled header does not keep a rename of a name it never declared.
#define MTW_EXIT_PASTE_(a, b) a##b
#define MTW_EXIT_PASTE(a, b) MTW_EXIT_PASTE_(a, b)
#define MTW_EXIT_TEXT_(x) #x
#define MTW_EXIT_TEXT(x) MTW_EXIT_TEXT_(x)
#define MTW_EXIT_TO_RUNTIME(name, to) \
  _Pragma(MTW_EXIT_TEXT(redefine_extname name MTW_EXIT_PASTE(__USER_LABEL_PREFIX__, to)))
MTW_EXIT_TO_RUNTIME(exit, mtw_kernel_exit)
MTW_EXIT_TO_RUNTIME(_exit, mtw_kernel__exit)
MTW_EXIT_TO_RUNTIME(_Exit, mtw_kernel__Exit)
MTW_EXIT_TO_RUNTIME(quick_exit, mtw_kernel_quick_exit)

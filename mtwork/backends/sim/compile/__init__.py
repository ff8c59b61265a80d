"""From a `Program` to a shared library: the author's sources rewritten for C++ (`rewrite`,
`sources`, `translation`), the launcher that calls the kernel for each thread
(`launcher`), clang from ziglang against the shim (`compiler`, with the precompiled
prelude, `precompiled`, and the link, `linking`), and the source checks that choose how a
kernel is built (`lockstep`). `swizzles` writes the shim's swizzle table.

Uses `count/` (the profiled variant's instrumentation) and the layers below the backends."""

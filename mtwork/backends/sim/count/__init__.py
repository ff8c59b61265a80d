"""What the profiler counts, decided at compile time: clang's IR read (`llvm_ir`), each
basic block's operations classified (`ir_ops`), its loops, critical paths and register
pressure estimated (`ir_loops`, `ilp`, `registers`), and the IR instrumented so the
runtime counts every block and memory access (`instrument`).

Uses only the layers of mtwork below the backends (the dispatch record); nothing else of
the emulator. `compile/` builds the profiled variant with it; `report/` reads its table."""

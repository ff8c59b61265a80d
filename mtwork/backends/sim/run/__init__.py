"""Running a built kernel: the runtime library over ctypes (`runtime`, with its C records
in `abi`), the memory of a dispatch (`memory`, `arena`) and its log (`logbuffer`), and the
worker process that runs kernels in isolation (`isolation` on this side, `channel`
between the two).

Uses `compile/` (the runtime library's build, the launcher's constants) and the layers
below the backends."""

"""Apple GPU limits a kernel must respect (Metal feature set tables; MLX's dispatch)."""

THREADGROUP_MEMORY_BYTES = 32 * 1024
MAX_THREADS_PER_THREADGROUP = 1024

"""Apple GPU limits a kernel must respect (Apple's Metal feature set tables; MSL spec)."""

# Threadgroup memory a threadgroup may use, on every Apple GPU family MLX supports.
THREADGROUP_MEMORY_BYTES = 32 * 1024
MAX_THREADS_PER_THREADGROUP = 1024
SIMD_WIDTH = 32
# Positions in a grid are `uint3` in the shading language: each dimension fits 32 bits.
MAX_GRID_DIMENSION = 2**32 - 1
# Metal's argument table has 31 buffer slots, [[buffer(0)]] to [[buffer(30)]].
MAX_BUFFER_INDEX = 30
# setThreadgroupMemoryLength takes a multiple of 16 bytes.
THREADGROUP_MEMORY_ALIGNMENT = 16

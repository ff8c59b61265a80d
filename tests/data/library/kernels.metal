// Fixture for tests/test_library.py: two kernels with every kind of parameter.
#include <metal_stdlib>
#include "common/blocks.h"

using namespace metal;

// y += alpha * x, N consecutive elements per thread.
template <typename T, int N>
[[kernel]] void axpy_blocked(
    const device T* x [[buffer(0)]],
    device T* y [[buffer(1)]],
    constant float& alpha [[buffer(2)]],
    constant uint& n [[buffer(3)]],
    uint gid [[thread_position_in_grid]]) {
  for (int k = 0; k < Block<N>::size; ++k) {
    uint i = gid * N + k;
    if (i < n) {
      y[i] = T(alpha * float(x[i])) + y[i];
    }
  }
}

template [[host_name("axpy_float_4")]] [[kernel]]
decltype(axpy_blocked<float, 4>) axpy_blocked<float, 4>;
template [[host_name("axpy_half_2")]] [[kernel]] void axpy_blocked<half, 2>(
    const device half*, device half*, constant float&, constant uint&, uint);

constant bool use_scale [[function_constant(0)]];
constant float scale [[function_constant(1)]];
constant bool use_bias [[function_constant(2)]];
constant bool has_scale = is_function_constant_defined(scale);

// One sum per threadgroup: out[group] = sum of in[] over the group's threads.
[[kernel]] void block_sum(
    const device float* in [[buffer(0)]],
    device float* out [[buffer(1)]],
    constant uint& n [[buffer(2)]],
    const device float* bias [[buffer(3), function_constant(use_bias)]],
    threadgroup float* partial [[threadgroup(0)]],
    uint gid [[thread_position_in_grid]],
    ushort lid [[thread_index_in_threadgroup]],
    uint2 group [[threadgroup_position_in_grid]],
    uint tg_size [[threads_per_threadgroup]]) {
  threadgroup Sum total;
  partial[lid] = gid < n ? in[gid] : 0.0;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lid == 0) {
    total.value = 0;
    for (uint i = 0; i < tg_size; ++i) {
      total.add(partial[i]);
    }
    float s = finish(total.value, use_scale, has_scale, scale);
    if (use_bias) {
      s += bias[group.x];
    }
    out[group.x] = s;
  }
}

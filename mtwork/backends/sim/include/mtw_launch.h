// Thread attributes, computed from the threadgroup's geometry and a thread's linear index.
// Included by the launcher the emulator appends to each kernel.
//
// Three-component attributes are computed as three scalars (a `triple`) and written into
// the kernel's vector type one member at a time. Built as vector arithmetic, an attribute
// reaches the kernel as a bit-cast of a vector into the two 64-bit integers the x86-64
// ABI passes a uint3 in, and after inlining the loop vectorizer cannot follow an index
// taken from it ("cannot identify array bounds"); scalars stored member by member become
// plain integer arithmetic it can.
#pragma once

#include "metal_stdlib"

namespace mtw_attr {

struct triple {
  uint32_t x, y, z;
};

MTW_INLINE triple vec3(const uint32_t v[3]) { return {v[0], v[1], v[2]}; }
MTW_INLINE uint3 local_of(const mtw_group* g, uint32_t i) {
  uint32_t tx = g->tg_size[0], ty = g->tg_size[1];
  return uint3(i % tx, (i / tx) % ty, i / (tx * ty));
}
MTW_INLINE uint32_t dispatch_threads(const mtw_group* g) {
  return g->dispatch_tg[0] * g->dispatch_tg[1] * g->dispatch_tg[2];
}

MTW_INLINE uint dispatch_quadgroups_per_threadgroup(const mtw_group* g, uint32_t, uint3) {
  return (dispatch_threads(g) + 3) / 4;
}
MTW_INLINE uint dispatch_simdgroups_per_threadgroup(const mtw_group* g, uint32_t, uint3) {
  return (dispatch_threads(g) + MTW_SIMD_WIDTH - 1) / MTW_SIMD_WIDTH;
}
MTW_INLINE triple dispatch_threads_per_threadgroup(const mtw_group* g, uint32_t, uint3) {
  return vec3(g->dispatch_tg);
}
MTW_INLINE triple grid_origin(const mtw_group*, uint32_t, uint3) { return {0, 0, 0}; }
MTW_INLINE triple grid_size(const mtw_group* g, uint32_t, uint3) { return vec3(g->grid); }
MTW_INLINE uint quadgroup_index_in_threadgroup(const mtw_group*, uint32_t i, uint3) { return i / 4; }
MTW_INLINE uint quadgroups_per_threadgroup(const mtw_group* g, uint32_t, uint3) {
  return (g->nthreads + 3) / 4;
}
MTW_INLINE uint simdgroup_index_in_threadgroup(const mtw_group*, uint32_t i, uint3) {
  return i / MTW_SIMD_WIDTH;
}
MTW_INLINE uint simdgroups_per_threadgroup(const mtw_group* g, uint32_t, uint3) {
  return (g->nthreads + MTW_SIMD_WIDTH - 1) / MTW_SIMD_WIDTH;
}
MTW_INLINE uint thread_execution_width(const mtw_group*, uint32_t, uint3) { return MTW_SIMD_WIDTH; }
MTW_INLINE uint thread_index_in_quadgroup(const mtw_group*, uint32_t i, uint3) { return i % 4; }
MTW_INLINE uint thread_index_in_simdgroup(const mtw_group*, uint32_t i, uint3) {
  return i % MTW_SIMD_WIDTH;
}
MTW_INLINE uint thread_index_in_threadgroup(const mtw_group*, uint32_t i, uint3) { return i; }
MTW_INLINE triple thread_position_in_threadgroup(const mtw_group*, uint32_t, uint3 local) {
  return {local.x, local.y, local.z};
}
MTW_INLINE triple threadgroup_position_in_grid(const mtw_group* g, uint32_t, uint3) {
  return vec3(g->group_pos);
}
MTW_INLINE triple thread_position_in_grid(const mtw_group* g, uint32_t, uint3 local) {
  return {g->group_pos[0] * g->dispatch_tg[0] + local.x,
          g->group_pos[1] * g->dispatch_tg[1] + local.y,
          g->group_pos[2] * g->dispatch_tg[2] + local.z};
}
MTW_INLINE triple threadgroups_per_grid(const mtw_group* g, uint32_t, uint3) {
  return vec3(g->groups);
}
MTW_INLINE triple threads_per_grid(const mtw_group* g, uint32_t, uint3) { return vec3(g->grid); }
MTW_INLINE uint threads_per_simdgroup(const mtw_group*, uint32_t, uint3) { return MTW_SIMD_WIDTH; }
// In a partial threadgroup at the grid's edge this is the actual size; the size given at
// dispatch is dispatch_threads_per_threadgroup.
MTW_INLINE triple threads_per_threadgroup(const mtw_group* g, uint32_t, uint3) {
  return vec3(g->tg_size);
}

// Converts an attribute to the type the kernel declares (uint, ushort2, uint3, ...).
template <typename To>
MTW_INLINE To as(triple v) {
  if constexpr (metal::__is_vec_v<To>) {
    using E = metal::__elem_t<To>;
    constexpr int n = metal::__vec_traits<To>::size;
    To r;
    r.x = E(v.x);
    r.y = E(v.y);
    if constexpr (n >= 3) r.z = E(v.z);
    if constexpr (n == 4) r.w = E(0);
    return r;
  } else {
    return To(v.x);
  }
}
template <typename To>
MTW_INLINE To as(uint v) {
  return To(v);
}

}  // namespace mtw_attr

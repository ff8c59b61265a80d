// The fast engine's part of a kernel library (mtwork/backends/sim/engine): the loop that
// runs one region of the kernel for every thread of a threadgroup, the context memory
// that keeps each thread's values across barriers, and threadgroup variables.
//
// Only the translation unit the engine builds includes this. Its pass turns the kernel
// into region functions (`mtw.region.N`) and a driver (`mtw_entry_barrier_free`, which
// the runtime calls once per threadgroup on one fiber) calling the helpers below; they
// are kept (`used`) until the pass has called them, then inlined.
#pragma once

#include "mtw_launch.h"

extern "C" {
// runtime/engine.cpp: memory for the context (per worker, reused), and the way back to
// the fiber engine when the threads of a group do not reach the same barrier.
__attribute__((malloc)) void* mtw_engine_scratch(uint64_t bytes);
[[noreturn]] void mtw_engine_fallback(const char* reason);
}

#define MTW_ENGINE_HELPER extern "C" __attribute__((used, always_inline)) inline

// A thread's position in its group, as the engine's launcher (engine/build.py) hands it
// to the attributes: three scalars. A uint3 goes by value as a bit-cast of a vector into
// two 64-bit integers (the x86-64 ABI), which the pass copies into every region that
// recomputes an index from it; a loop over threads holding that vector code does not
// vectorize ("instruction return type cannot be vectorized"). The attributes that read
// the position take it as scalars; the others get a uint3 nobody reads.
struct mtw_engine_local {
  uint32_t x, y, z;
  operator uint3() const { return uint3(x, y, z); }
};

namespace mtw_attr {
MTW_INLINE triple thread_position_in_threadgroup(const mtw_group*, uint32_t,
                                                 mtw_engine_local local) {
  return {local.x, local.y, local.z};
}
MTW_INLINE triple thread_position_in_grid(const mtw_group* g, uint32_t, mtw_engine_local local) {
  return {g->group_pos[0] * g->dispatch_tg[0] + local.x,
          g->group_pos[1] * g->dispatch_tg[1] + local.y,
          g->group_pos[2] * g->dispatch_tg[2] + local.z};
}
}  // namespace mtw_attr

constexpr uint32_t kMtwEngineExit = 0xFFFFFFFFu;      // the thread's kernel returned
constexpr uint32_t kMtwEngineDiverged = 0xFFFFFFFEu;  // threads left a region differently
constexpr uint32_t kMtwEngineUnset = 0xFFFFFFFFu;     // a threadgroup variable not met yet
constexpr uint32_t kMtwEngineThreads = 1024;          // slots per value in the context

// The context's first fields, as the pass declares them (engine/emit.py, Layout): each
// thread's threadgroup-memory cursor and position, the region it goes to next (kept
// where the kernel has implicit syncs), and the arguments it hands to the SIMD-group
// function it stopped at. The offsets of the kernel's threadgroup variables follow, then
// the values the pass keeps per thread.
struct mtw_engine_frame {
  uint32_t cursor[kMtwEngineThreads];
  uint32_t x[kMtwEngineThreads], y[kMtwEngineThreads], z[kMtwEngineThreads];
  uint32_t next[kMtwEngineThreads];
  const void* ins[kMtwEngineThreads];
  void* outs[kMtwEngineThreads];
  uint32_t sites[];
};

// One region of the kernel for one thread (engine/emit.py): returns the region the thread
// goes to next, or kMtwEngineExit.
typedef uint32_t (*mtw_engine_region)(mtw_group* g, void* const* buffers, char* ctx,
                                      const char* uniform_in, char* uniform_out, uint32_t i,
                                      uint32_t x, uint32_t y, uint32_t z);
// Region `region` for threads first .. first + count - 1 (the pass's dispatcher, a switch
// over its regions): where they all went next, or kMtwEngineDiverged.
typedef uint32_t (*mtw_engine_regions)(uint32_t region, mtw_group* g, void* const* buffers,
                                       char* ctx, const char* uniform_in, char* uniform_out,
                                       uint32_t first, uint32_t count);

// Runs `region` for every thread in order (x fastest, as thread indices count) and
// returns where they all went next: a region number, kMtwEngineExit, or
// kMtwEngineDiverged when they did not all go the same way. (Equal results have equal
// OR and AND; unequal ones differ in some bit, set in the OR and clear in the AND.)
// `noted`: where each thread's next region is written, or null.
MTW_ENGINE_HELPER uint32_t mtw_engine_run(mtw_group* __restrict g,
                                          void* const* __restrict buffers,
                                          char* __restrict ctx,
                                          const char* __restrict uniform_in,
                                          char* __restrict uniform_out,
                                          mtw_engine_region region,
                                          uint32_t* __restrict noted) {
  const uint32_t tx = g->tg_size[0], ty = g->tg_size[1], tz = g->tg_size[2];
  uint32_t any = 0, all = 0xFFFFFFFFu;
  for (uint32_t z = 0; z < tz; ++z)
    for (uint32_t y = 0; y < ty; ++y) {
      const uint32_t row = (z * ty + y) * tx;
      for (uint32_t x = 0; x < tx; ++x) {
        const uint32_t next = region(g, buffers, ctx, uniform_in, uniform_out, row + x, x, y, z);
        if (noted) noted[row + x] = next;
        any |= next;
        all &= next;
      }
    }
  return any == all ? any : kMtwEngineDiverged;
}

// The same for a region whose threads are independent of one another: an iteration of a
// reduction loop (engine/loops.py), which only reads the kernel's memory and keeps its
// values in each thread's own slots of the context. Marked so (`assume_safety`: the
// accesses of different iterations never depend on each other), the loop over threads
// vectorizes with a gather for a load whose address comes from a thread's slot, where
// the vectorizer could otherwise not bound that address.
MTW_ENGINE_HELPER uint32_t mtw_engine_run_independent(mtw_group* __restrict g,
                                                      void* const* __restrict buffers,
                                                      char* __restrict ctx,
                                                      const char* __restrict uniform_in,
                                                      char* __restrict uniform_out,
                                                      mtw_engine_region region,
                                                      uint32_t* __restrict noted) {
  const uint32_t tx = g->tg_size[0], ty = g->tg_size[1], tz = g->tg_size[2];
  uint32_t any = 0, all = 0xFFFFFFFFu;
  for (uint32_t z = 0; z < tz; ++z)
    for (uint32_t y = 0; y < ty; ++y) {
      const uint32_t row = (z * ty + y) * tx;
#pragma clang loop vectorize(assume_safety)
      for (uint32_t x = 0; x < tx; ++x) {
        const uint32_t next = region(g, buffers, ctx, uniform_in, uniform_out, row + x, x, y, z);
        noted[row + x] = next;
        any |= next;
        all &= next;
      }
    }
  return any == all ? any : kMtwEngineDiverged;
}

// The same for the threads first .. first + count - 1 (the lanes of one SIMD-group).
MTW_ENGINE_HELPER uint32_t mtw_engine_lanes(mtw_group* __restrict g,
                                            void* const* __restrict buffers,
                                            char* __restrict ctx,
                                            const char* __restrict uniform_in,
                                            char* __restrict uniform_out,
                                            mtw_engine_region region, uint32_t first,
                                            uint32_t count) {
  const mtw_engine_frame* f = reinterpret_cast<const mtw_engine_frame*>(ctx);
  uint32_t any = 0, all = 0xFFFFFFFFu;
  for (uint32_t i = first; i < first + count; ++i) {
    const uint32_t next = region(g, buffers, ctx, uniform_in, uniform_out, i, f->x[i], f->y[i],
                                 f->z[i]);
    any |= next;
    all &= next;
  }
  return any == all ? any : kMtwEngineDiverged;
}

// This worker's context, `bytes` long, set up for the threadgroup `g` with `sites`
// threadgroup variables.
MTW_ENGINE_HELPER char* mtw_engine_begin(mtw_group* g, uint64_t bytes, uint32_t sites) {
  mtw_engine_frame* f = static_cast<mtw_engine_frame*>(mtw_engine_scratch(bytes));
  const uint32_t tx = g->tg_size[0], ty = g->tg_size[1], tz = g->tg_size[2];
  for (uint32_t t = 0; t < g->nthreads; ++t) f->cursor[t] = g->tg_static_bytes;
  // Nested loops, not divisions of the index: the group's set-up is paid per threadgroup.
  for (uint32_t z = 0, t = 0; z < tz; ++z)
    for (uint32_t y = 0; y < ty; ++y)
      for (uint32_t x = 0; x < tx; ++x, ++t) {
        f->x[t] = x;
        f->y[t] = y;
        f->z[t] = z;
      }
  for (uint32_t s = 0; s < sites; ++s) f->sites[s] = kMtwEngineUnset;
  return reinterpret_cast<char*>(f);
}

[[noreturn]] inline void mtw_engine_diverged() {
  mtw_engine_fallback("the threads of a threadgroup did not all reach the same barrier or "
                      "SIMD-group function (some went elsewhere or returned)");
}

// Threads that left a region at different sync points, some of them implicit ones (the
// heads of reduction loops, engine/loops.py: no barrier, passed a different number of
// times where trip counts differ): each thread in turn runs on by itself (`one`: region
// r for the threads first .. first + count - 1) through implicit syncs to its next
// barrier or return. Returns where they all went, or kMtwEngineDiverged. `implicit[r]`:
// region r starts at an implicit sync.
MTW_ENGINE_HELPER uint32_t mtw_engine_settle(mtw_group* g, void* const* buffers, char* ctx,
                                             char* uniform_in, char* uniform_out,
                                             uint64_t uniform_bytes, mtw_engine_regions one,
                                             const uint8_t* implicit) {
  const mtw_engine_frame* f = reinterpret_cast<const mtw_engine_frame*>(ctx);
  uint32_t any = 0, all = 0xFFFFFFFFu;
  __builtin_memcpy(uniform_in, uniform_out, uniform_bytes);
  for (uint32_t t = 0; t < g->nthreads; ++t) {
    uint32_t next = f->next[t];
    while (next != kMtwEngineExit && next != kMtwEngineDiverged && implicit[next]) {
      next = one(next, g, buffers, ctx, uniform_in, uniform_out, t, 1);
      __builtin_memcpy(uniform_in, uniform_out, uniform_bytes);
    }
    any |= next;
    all &= next;
  }
  return any == all ? any : kMtwEngineDiverged;
}

// A kernel without SIMD-group functions: each region for all threads at once, until they
// return. `uniform_bytes`: the size of a record of uniform values. With implicit syncs
// (`implicit` not null), threads that part at one are settled (above).
MTW_ENGINE_HELPER void mtw_engine_drive_group(mtw_group* g, void* const* buffers, char* ctx,
                                              char* uniform_in, char* uniform_out,
                                              uint64_t uniform_bytes,
                                              mtw_engine_regions regions,
                                              mtw_engine_regions one,
                                              const uint8_t* implicit) {
  uint32_t next = 0;
  while (next != kMtwEngineExit) {
    next = regions(next, g, buffers, ctx, uniform_in, uniform_out, 0, g->nthreads);
    if (next == kMtwEngineDiverged && implicit)
      next = mtw_engine_settle(g, buffers, ctx, uniform_in, uniform_out, uniform_bytes, one,
                               implicit);
    if (next == kMtwEngineDiverged) mtw_engine_diverged();
    __builtin_memcpy(uniform_in, uniform_out, uniform_bytes);
  }
}

// A kernel with SIMD-group functions (`combines[k]`: the function that completes sync
// point k, null for a threadgroup barrier). Each SIMD-group runs region after region,
// completing its SIMD-group functions itself, until it reaches a barrier; when every
// SIMD-group waits at the same one, all go on after it. Each SIMD-group has its own
// records of uniform values, as it may be ahead of the others.
MTW_ENGINE_HELPER void mtw_engine_drive_simd(mtw_group* g, void* const* buffers, char* ctx,
                                             char* uniform_in, char* uniform_out,
                                             uint64_t uniform_bytes,
                                             mtw_engine_regions regions,
                                             const mtw_combine_fn* combines) {
  mtw_engine_frame* f = reinterpret_cast<mtw_engine_frame*>(ctx);
  const uint32_t n = g->nthreads, groups = (n + MTW_SIMD_WIDTH - 1) / MTW_SIMD_WIDTH;
  uint32_t start = 0;
  while (start != kMtwEngineExit) {
    uint32_t stop = kMtwEngineUnset;
    for (uint32_t sg = 0; sg < groups; ++sg) {
      const uint32_t first = sg * MTW_SIMD_WIDTH;
      const uint32_t count = n - first < MTW_SIMD_WIDTH ? n - first : MTW_SIMD_WIDTH;
      const uint32_t active = count == 32 ? 0xFFFFFFFFu : (1u << count) - 1;
      char* in = uniform_in + sg * uniform_bytes;
      char* out = uniform_out + sg * uniform_bytes;
      uint32_t next = start;
      for (;;) {
        next = regions(next, g, buffers, ctx, in, out, first, count);
        if (next == kMtwEngineDiverged) mtw_engine_diverged();
        __builtin_memcpy(in, out, uniform_bytes);
        if (next == kMtwEngineExit || !combines[next - 1]) break;
        combines[next - 1](f->ins + first, f->outs + first, active);
      }
      if (sg && next != stop) mtw_engine_diverged();
      stop = next;
    }
    start = stop;
  }
}

// A SIMD-group function run by one lane, thread `i` (engine/separable.py: a simdgroup_load
// where no lane writes what another could read between the sync points around it). The
// combine function sees that lane alone.
MTW_ENGINE_HELPER void mtw_engine_lane_collective(const void* in, void* out,
                                                  mtw_combine_fn combine, uint32_t i) {
  const uint32_t lane = i % MTW_SIMD_WIDTH;
  const void* ins[MTW_SIMD_WIDTH];
  void* outs[MTW_SIMD_WIDTH];
  ins[lane] = in;
  outs[lane] = out;
  combine(ins, outs, 1u << lane);
}

MTW_ENGINE_HELPER void mtw_engine_end(mtw_group* g) {
  g->next_thread = g->done = g->nthreads;
}

// A threadgroup variable, as the runtime's mtw_threadgroup_alloc places it: each thread
// bumps its own cursor. The address is then kept once per threadgroup, so every thread
// must get the same offset at the same `site`; one that does not sends the dispatch back
// to the fiber engine. Over the budget, the kernel traps, and the fiber engine reports it.
MTW_ENGINE_HELPER void* mtw_engine_tg_alloc(mtw_group* g, char* ctx, uint32_t i, uint32_t site,
                                            uint32_t size, uint32_t align) {
  mtw_engine_frame* f = reinterpret_cast<mtw_engine_frame*>(ctx);
  const uint32_t offset = (f->cursor[i] + align - 1) & ~(align - 1);
  const uint64_t end = uint64_t(offset) + size;
  if (end > g->tg_memory_size) __builtin_trap();
  f->cursor[i] = uint32_t(end);
  if (end > g->tg_memory_used) g->tg_memory_used = uint32_t(end);
  if (f->sites[site] == kMtwEngineUnset) f->sites[site] = offset;
  else if (f->sites[site] != offset)
    mtw_engine_fallback("threads placed a threadgroup variable at different offsets");
  return g->tg_memory + offset;
}

// The runtime looks this entry up in every kernel library; the engine's runs whole
// threadgroups through mtw_entry_barrier_free only.
extern "C" __attribute__((visibility("default"))) void mtw_entry(mtw_group*, void* const*) {
  mtw_engine_fallback("the fast engine's library has no per-thread entry");
}

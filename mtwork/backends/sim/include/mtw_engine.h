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
void* mtw_engine_scratch(uint64_t bytes);
[[noreturn]] void mtw_engine_fallback(const char* reason);
}

#define MTW_ENGINE_HELPER extern "C" __attribute__((used, always_inline)) inline

constexpr uint32_t kMtwEngineExit = 0xFFFFFFFFu;      // the thread's kernel returned
constexpr uint32_t kMtwEngineDiverged = 0xFFFFFFFEu;  // threads left a region differently
constexpr uint32_t kMtwEngineUnset = 0xFFFFFFFFu;     // a threadgroup variable not met yet
constexpr uint32_t kMtwEngineThreads = 1024;          // slots per value in the context

typedef uint32_t (*mtw_engine_region)(mtw_group* g, void* const* buffers, char* ctx,
                                      const char* uniform_in, char* uniform_out, uint32_t i,
                                      uint32_t x, uint32_t y, uint32_t z);

// Runs `region` for every thread in order (x fastest, as thread indices count) and
// returns where they all went next: a region number, kMtwEngineExit, or
// kMtwEngineDiverged when they did not all go the same way. (Equal results have equal
// OR and AND; unequal ones differ in some bit, set in the OR and clear in the AND.)
MTW_ENGINE_HELPER uint32_t mtw_engine_run(mtw_group* __restrict g,
                                          void* const* __restrict buffers,
                                          char* __restrict ctx,
                                          const char* __restrict uniform_in,
                                          char* __restrict uniform_out,
                                          mtw_engine_region region) {
  const uint32_t tx = g->tg_size[0], ty = g->tg_size[1], tz = g->tg_size[2];
  uint32_t any = 0, all = 0xFFFFFFFFu;
  for (uint32_t z = 0; z < tz; ++z)
    for (uint32_t y = 0; y < ty; ++y) {
      const uint32_t row = (z * ty + y) * tx;
      for (uint32_t x = 0; x < tx; ++x) {
        const uint32_t next = region(g, buffers, ctx, uniform_in, uniform_out, row + x, x, y, z);
        any |= next;
        all &= next;
      }
    }
  return any == all ? any : kMtwEngineDiverged;
}

// The context of this worker, `bytes` long: it starts with each thread's threadgroup
// memory cursor (kMtwEngineThreads of them), then the offset of each of the kernel's
// `sites` threadgroup variables (the pass lays the rest out after them).
MTW_ENGINE_HELPER char* mtw_engine_begin(mtw_group* g, uint64_t bytes, uint32_t sites) {
  char* scratch = static_cast<char*>(mtw_engine_scratch(bytes));
  uint32_t* cursors = reinterpret_cast<uint32_t*>(scratch);
  for (uint32_t t = 0; t < g->nthreads; ++t) cursors[t] = g->tg_static_bytes;
  uint32_t* offsets = cursors + kMtwEngineThreads;
  for (uint32_t s = 0; s < sites; ++s) offsets[s] = kMtwEngineUnset;
  return scratch;
}

MTW_ENGINE_HELPER void mtw_engine_end(mtw_group* g, uint32_t next) {
  if (next != kMtwEngineExit)
    mtw_engine_fallback("the threads of a threadgroup did not all reach the same barrier "
                        "(some took another barrier or returned)");
  g->next_thread = g->done = g->nthreads;
}

// A threadgroup variable, as the runtime's mtw_threadgroup_alloc places it: each thread
// bumps its own cursor. The address is then kept once per threadgroup, so every thread
// must get the same offset at the same `site`; one that does not sends the dispatch back
// to the fiber engine. Over the budget, the kernel traps, and the fiber engine reports it.
MTW_ENGINE_HELPER void* mtw_engine_tg_alloc(mtw_group* g, uint32_t* cursors, uint32_t* sites,
                                            uint32_t i, uint32_t site, uint32_t size,
                                            uint32_t align) {
  const uint32_t offset = (cursors[i] + align - 1) & ~(align - 1);
  const uint64_t end = uint64_t(offset) + size;
  if (end > g->tg_memory_size) __builtin_trap();
  cursors[i] = uint32_t(end);
  if (end > g->tg_memory_used) g->tg_memory_used = uint32_t(end);
  if (sites[site] == kMtwEngineUnset) sites[site] = offset;
  else if (sites[site] != offset)
    mtw_engine_fallback("threads placed a threadgroup variable at different offsets");
  return g->tg_memory + offset;
}

// The runtime looks this entry up in every kernel library; the engine's runs whole
// threadgroups through mtw_entry_barrier_free only.
extern "C" __attribute__((visibility("default"))) void mtw_entry(mtw_group*, void* const*) {
  mtw_engine_fallback("the fast engine's library has no per-thread entry");
}

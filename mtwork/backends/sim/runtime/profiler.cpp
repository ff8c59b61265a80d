// The profiler: counts what a profiled kernel does, as a GPU's SIMD-groups would run it.
//
// A kernel library built for profiling (backends/sim/count/instrument.py) calls
// mtw_profile_block at the start of each block that does counted work and
// mtw_profile_branch before each of its own conditional branches; its loads and stores
// arrive through the sanitizer-coverage callbacks (access.cpp), its atomics and
// simdgroup_matrix loads and stores through the shim's hooks (include/mtw_profile.h).
//
// A GPU runs the 32 lanes of a SIMD-group together; the emulator runs them one after
// another. So a lane's k-th execution of a block, of a branch or of the access at one
// code address is taken to be the same SIMD-group issue as the other lanes' k-th
// executions of it. Per threadgroup, a worker keeps
// - per thread and block, the executions: a block's issues in a SIMD-group are then the
//   most executions of any of its lanes, and the lanes active in them the sum;
// - per code address (site) and thread, a trail of its accesses and branches in the
//   order the thread made them (tally.h). When the threadgroup is done, each lane's k-th
//   entry of a site lines up with the other lanes' k-th, and every SIMD-group issue is
//   counted: the bytes and lines of device memory it touches, the threadgroup-memory
//   wavefronts it needs, whether its lanes branched both ways.
// A worker sees that its threadgroup is done when a hook of its next one arrives (or at
// mtw_profile_collect), and adds the threadgroup's counts to its totals; collect sums the
// workers'. Every count is a sum of per-threadgroup integers, or (distinct lines) a
// union of sets, so the result does not depend on which worker ran which threadgroup or
// in what order: the counts are the same on every run and on any number of cores.
#include "profiler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "platform.h"
#include "tally.h"

namespace mtw {

mtw_entry_fn profiled_entry = nullptr;

namespace {

using namespace tally;

template <typename T>
T* carve(char*& at, size_t count) {
  T* p = reinterpret_cast<T*>(at);
  at += (count * sizeof(T) + 63) & ~size_t(63);
  return p;
}

// Points the shard's arrays into `base` (null: only measures); returns the bytes needed.
size_t layout(Shard& s, char* base) {
  const mtw_profile& c = shared.config;
  char* at = base;
  s.executions = carve<uint32_t>(at, size_t(c.threads) * c.blocks);
  s.ran = carve<uint64_t>(at, size_t(shared.simdgroups) * shared.words);
  s.ran_list = carve<uint32_t>(at, size_t(shared.simdgroups) * c.blocks);
  s.ran_count = carve<uint32_t>(at, shared.simdgroups);
  s.group_most = carve<uint32_t>(at, c.blocks);
  s.group_list = carve<uint32_t>(at, c.blocks);
  s.arena = carve<uint64_t>(at, kArenaWords);
  s.trails = carve<Trail>(at, kTrailCapacity);
  s.site_trails = carve<uint32_t>(at, kMaxSites);
  s.touched = carve<uint32_t>(at, kMaxSites);
  s.site_pc = carve<uint64_t>(at, kMaxSites);
  s.site_branch = carve<uint32_t>(at, kMaxSites);
  s.site_pieces = carve<uint8_t>(at, kMaxSites);
  s.site_slot = carve<uint32_t>(at, kSiteSlots);
  s.branch_site = carve<uint32_t>(at, c.branches);
  s.lanes = carve<uint64_t>(at, c.blocks);
  s.simd = carve<uint64_t>(at, c.blocks);
  s.groups = carve<uint64_t>(at, c.blocks);
  s.divergences = carve<uint64_t>(at, c.branches);
  s.totals = carve<Total>(at, kTotalSlots);
  return size_t(at - base);
}

// Sites are numbered densely as they are first seen.
uint32_t new_site(Shard& s, uint64_t pc, uint32_t branch) {
  if (s.sites == kMaxSites) {
    full("table of access sites");
    return kNoSite;
  }
  s.site_pc[s.sites] = pc;
  s.site_branch[s.sites] = branch;
  s.site_pieces[s.sites] = 0;
  return s.sites++;
}

uint32_t site_of(Shard& s, uint64_t pc) {
  for (uint32_t i = 0, slot = hash(pc); i < kSiteSlots; ++i, ++slot) {
    uint32_t& entry = s.site_slot[slot % kSiteSlots];
    if (entry == 0) {
      uint32_t site = new_site(s, pc, kNotBranch);
      if (site != kNoSite) entry = site + 1;
      return site;
    }
    if (s.site_pc[entry - 1] == pc) return entry - 1;
  }
  full("table of access sites");
  return kNoSite;
}

uint32_t branch_site(Shard& s, uint32_t branch) {
  uint32_t& entry = s.branch_site[branch];
  if (entry == 0) {
    uint32_t site = new_site(s, 0, branch);
    if (site == kNoSite) return kNoSite;
    entry = site + 1;
  }
  return entry - 1;
}

// Where an address lies: a buffer (its offset in it), threadgroup memory, or nowhere
// counted (the thread's own stack, the runtime's memory, the kernel's constants).
uint8_t locate(const Worker* w, uintptr_t a, uint64_t* offset) {
  uintptr_t tg = reinterpret_cast<uintptr_t>(w->tg_memory);
  if (a - tg < kTgMemoryCapacity) {
    *offset = a - tg;
    return kThreadgroupMemory;
  }
  const mtw_profile& c = shared.config;
  for (uint32_t i = 0; i < c.nbuffers; ++i) {
    const mtw_buffer_info& b = c.buffers[i];
    if (b.kind != MTW_BUFFER_INTERNAL && a - b.base < b.size) {
      *offset = a - b.base;
      return uint8_t(i);
    }
  }
  return kNowhere;
}

// With slots: points the shard's counts at those of the slot of the threadgroup `g` is.
bool into_slot(Shard& s, const mtw_group& g) {
  const mtw_profile& c = shared.config;
  uint64_t linear = g.group_pos[0] + uint64_t(g.groups[0]) *
                                          (g.group_pos[1] + uint64_t(g.groups[1]) * g.group_pos[2]);
  uint32_t k = 0;
  while (k < c.nslots && c.slot_group[k] != linear) ++k;
  if (k == c.nslots) {
    full("list of threadgroups counted apart (a threadgroup not in it ran)");
    s.active = false;
    return false;
  }
  uint64_t* counts = shared.slot_counts + size_t(k) * (3 * c.blocks + c.branches);
  s.slot = k;
  s.lanes = counts;
  s.simd = counts + c.blocks;
  s.groups = counts + 2 * size_t(c.blocks);
  s.divergences = counts + 3 * size_t(c.blocks);
  s.totals = shared.slot_totals + size_t(k) * kTotalSlots;
  s.last_total = nullptr;
  s.hashes = c.slot_hashes ? c.slot_hashes + 2 * size_t(k) : nullptr;
  s.checked = c.slot_checked && c.slot_checked[k];
  return true;
}

// With slots: the memory of every slot's counts and totals.
bool slots_ready() {
  const mtw_profile& c = shared.config;
  if (!c.nslots) return true;
  size_t counts = (size_t(c.nslots) * (3 * c.blocks + c.branches) * sizeof(uint64_t) + 63) & ~size_t(63);
  shared.slot_bytes = counts + size_t(c.nslots) * kTotalSlots * sizeof(Total);
  void* memory = platform::map_zeroed(shared.slot_bytes);
  if (!memory) return false;
  shared.slot_counts = static_cast<uint64_t*>(memory);
  shared.slot_totals = reinterpret_cast<Total*>(static_cast<char*>(memory) + counts);
  return true;
}

// The shard of `w`'s worker, counting the threadgroup `w` runs now.
Shard* shard_of(Worker* w) {
  if (w->index >= shared.nshards) {
    full("set of workers");
    return nullptr;
  }
  Shard& s = shared.shards[w->index];
  const uint32_t* pos = w->group.group_pos;
  if (!s.active || s.pos[0] != pos[0] || s.pos[1] != pos[1] || s.pos[2] != pos[2]) {
    if (s.active) finish(s);
    s.active = true;
    memcpy(s.pos, pos, sizeof(s.pos));
    s.nthreads = w->group.nthreads;
    s.accesses = 0;
    if (shared.config.nslots && !into_slot(s, w->group)) return nullptr;
  }
  return &s;
}

// The shard of the running thread's worker, or null when the launch is not profiled.
// `on_fiber`: called from kernel code, which always runs on a fiber (not so the hooks of
// SIMD-group plumbing, which the scheduler may run on the worker's own stack).
Shard* counting(Worker** out, bool on_fiber) {
  Worker* w = on_fiber ? current_fiber()->worker : calling_worker();
  if (!w || !profiling(w)) return nullptr;
  *out = w;
  return shard_of(w);
}

// A shard's memory kept from the last profile that ended well, for the next one: a
// sampled profile counts a few threadgroups a dispatch, one dispatch after another (a
// sweep's settings, each another kernel), and mapping its tables afresh for each cost
// more than counting (unmapping the last one's pages, faulting the new one's in). The
// mapping is rounded up so that the next kernel's layout (its threads and blocks) most
// likely fits; its per-thread tables are cleared when it is taken again.
constexpr size_t kMappingGranule = size_t(8) << 20;

struct KeptMemory {
  void* memory;
  size_t bytes;
};
KeptMemory kept_memory[kMaxKeptShards];

// Memory of at least `bytes` for shard `i` (its size in `*mapped`), kept or new.
void* kept_or_new(uint32_t i, size_t bytes, size_t* mapped, bool* reused) {
  KeptMemory* k = i < kMaxKeptShards ? &kept_memory[i] : nullptr;
  if (k && k->memory && k->bytes >= bytes) {
    void* memory = k->memory;
    *mapped = k->bytes;
    k->memory = nullptr;
    *reused = true;
    return memory;
  }
  if (k && k->memory) {
    platform::unmap(k->memory, k->bytes);
    k->memory = nullptr;
  }
  *reused = false;
  *mapped = (bytes + kMappingGranule - 1) / kMappingGranule * kMappingGranule;
  return platform::map_zeroed(*mapped);
}

// A kept shard's tables cleared for this profile's layout: what a count reads before it
// writes (the log's chunks and trails are written before they are read).
void clear_tables(Shard& s) {
  const mtw_profile& c = shared.config;
  memset(s.executions, 0, size_t(c.threads) * c.blocks * sizeof(uint32_t));
  memset(s.ran, 0, size_t(shared.simdgroups) * shared.words * sizeof(uint64_t));
  memset(s.ran_count, 0, shared.simdgroups * sizeof(uint32_t));
  memset(s.group_most, 0, c.blocks * sizeof(uint32_t));
  memset(s.site_trails, 0, kMaxSites * sizeof(uint32_t));
  memset(s.site_slot, 0, kSiteSlots * sizeof(uint32_t));
  memset(s.branch_site, 0, c.branches * sizeof(uint32_t));
  memset(s.lanes, 0, c.blocks * sizeof(uint64_t));
  memset(s.simd, 0, c.blocks * sizeof(uint64_t));
  memset(s.groups, 0, c.blocks * sizeof(uint64_t));
  memset(s.divergences, 0, c.branches * sizeof(uint64_t));
  memset(static_cast<void*>(s.totals), 0, kTotalSlots * sizeof(Total));
}

}  // namespace

// Disarms; `keep`: the count finished, its shards' memory may serve the next one.
void tally::release(bool keep) {
  __atomic_store_n(&profiled_entry, nullptr, __ATOMIC_SEQ_CST);
  for (uint32_t i = 0; i < shared.nshards; ++i) {
    Shard& s = shared.shards[i];
    if (!s.memory) continue;
    if (keep && i < kMaxKeptShards && !kept_memory[i].memory)
      kept_memory[i] = KeptMemory{s.memory, s.bytes};
    else
      platform::unmap(s.memory, s.bytes);
  }
  free(shared.shards);
  shared.shards = nullptr;
  shared.nshards = 0;
  for (uint32_t b = 0; b < kMaxBuffers; ++b) {
    free(shared.line_bits[b]);
    shared.line_bits[b] = nullptr;
  }
  if (shared.slot_counts) platform::unmap(shared.slot_counts, shared.slot_bytes);
  shared.slot_counts = nullptr;
  shared.slot_totals = nullptr;
}

void profiler_access(Worker* w, const void* p, uint32_t size, bool write, const void* pc,
                     uint32_t pieces) {
  if (w->atomic_depth) return;  // part of an atomic, counted as one
  Shard* s = shard_of(w);
  uint64_t offset;
  uint8_t where = s ? locate(w, reinterpret_cast<uintptr_t>(p), &offset) : kNowhere;
  if (where == kNowhere) return;
  Event e{offset, 0, uint16_t(w->group.current), uint8_t(size),
          uint8_t(where | (write ? kStore : 0))};
  if (where == kThreadgroupMemory && s->hashes) {
    mix(s->hashes[0], reinterpret_cast<uint64_t>(pc), packed(offset, e.size, e.where) ^
                                                          uint64_t(e.thread) << 48);
    if (s->checked && !s->gathering) return;  // only compared: no issues lined up
  }
  if (s->gathering) {
    if (s->gathered_count < kGathered) s->gathered[s->gathered_count++] = e;
    else full("record of one simdgroup_matrix access");
    return;
  }
  uint32_t site = site_of(*s, reinterpret_cast<uint64_t>(pc));
  if (site == kNoSite) return;
  if (pieces > 1) s->site_pieces[site] = uint8_t(pieces);
  record(*s, site, e.thread, packed(offset, e.size, e.where));
}

}  // namespace mtw

using namespace mtw;

extern "C" void mtw_profile_block(uint32_t block) {
  Worker* w;
  Shard* s = counting(&w, true);
  if (!s || block >= shared.config.blocks) return;
  const uint32_t blocks = shared.config.blocks, t = w->group.current;
  const uint32_t sg = t / MTW_SIMD_WIDTH;
  if (s->executions[size_t(t) * blocks + block]++ != 0) return;
  uint64_t& bits = s->ran[size_t(sg) * shared.words + block / 64];
  if (bits & (uint64_t(1) << (block % 64))) return;
  bits |= uint64_t(1) << (block % 64);
  s->ran_list[size_t(sg) * blocks + s->ran_count[sg]++] = block;
}

extern "C" void mtw_profile_branch(uint32_t branch, uint32_t way) {
  Worker* w;
  Shard* s = counting(&w, true);
  if (!s || branch >= shared.config.branches) return;
  if (s->hashes) {
    mix(s->hashes[1], branch, uint64_t(w->group.current) << 32 | way);
    if (s->checked) return;  // only compared: no divergence counted
  }
  uint32_t site = branch_site(*s, branch);
  if (site != kNoSite) record(*s, site, w->group.current, packed(way, 0, 0));
}

extern "C" void mtw_profile_atomic(const volatile void* object, int inside) {
  Worker* w;
  Shard* s = counting(&w, false);
  if (!s) return;
  if (!inside) {
    if (w->atomic_depth > 0) w->atomic_depth -= 1;
    return;
  }
  w->atomic_depth += 1;
  uint64_t offset;
  uint8_t where = locate(w, reinterpret_cast<uintptr_t>(object), &offset);
  if (where == kNowhere) return;
  int32_t buffer = where == kThreadgroupMemory ? MTW_PROFILE_THREADGROUP : int32_t(where);
  // A device atomic reads and writes its line where the GPU's caches meet DRAM: the line
  // is traffic of the dispatch like a loaded one.
  if (where != kThreadgroupMemory)
    mark_lines(where, offset / shared.config.line_bytes, offset / shared.config.line_bytes);
  Total* t = total(*s, reinterpret_cast<uint64_t>(__builtin_return_address(0)), buffer,
                   MTW_ACCESS_ATOMIC);
  if (t) t->counts.accesses += 1;
}

extern "C" void mtw_profile_group_access(const void* const* ins, uint32_t mask, int inside) {
  Worker* w;
  Shard* s = mask ? counting(&w, false) : nullptr;
  if (!s) return;
  if (!inside) {
    if (s->gathering && s->gathered_count)
      count_access(*s, s->gather_pc, s->gathered, s->gathered_count);
    s->gathering = false;
    return;
  }
  // The access belongs to the call site of the first active lane's collective.
  uint32_t lane = __builtin_ctz(mask), simdgroups = (w->group.nthreads + 31) / 32;
  s->gather_pc = 0;
  for (uint32_t sg = 0; sg < simdgroups; ++sg) {
    if (w->simd[sg].in[lane] == ins[lane]) {
      s->gather_pc = reinterpret_cast<uint64_t>(w->waits[sg * MTW_SIMD_WIDTH + lane].site);
      break;
    }
  }
  s->gathering = true;
  s->gathered_count = 0;
}

extern "C" void mtw_profile_disarm(void) { release(false); }

extern "C" const char* mtw_profile_message(void) { return shared.message; }

extern "C" int mtw_profile_arm(const mtw_profile* profile) {
  release(false);
  shared.config = *profile;
  shared.ranges = 0;
  shared.overflow = 0;
  shared.message[0] = 0;
  const mtw_profile& c = shared.config;
  if (c.nbuffers > kMaxBuffers || c.threads == 0 || c.threads > MTW_MAX_THREADS ||
      c.line_bytes == 0) {
    snprintf(shared.message, sizeof(shared.message), "the profiler takes at most %u buffers and "
             "%u threads per threadgroup", kMaxBuffers, MTW_MAX_THREADS);
    return 1;
  }
  platform::Image image;
  shared.image_base =
      platform::image_of(reinterpret_cast<const void*>(c.entry), &image) ? image.base : 0;
  shared.simdgroups = (c.threads + MTW_SIMD_WIDTH - 1) / MTW_SIMD_WIDTH;
  shared.words = (c.blocks + 63) / 64;
  shared.nshards = pool_size ? uint32_t(pool_size) : uint32_t(platform::cpu_count());
  shared.shards = static_cast<Shard*>(calloc(shared.nshards, sizeof(Shard)));
  bool ok = shared.shards != nullptr;
  for (uint32_t i = 0; ok && i < shared.nshards; ++i) {
    Shard& s = shared.shards[i];
    bool reused = false;
    s.memory = kept_or_new(i, layout(s, nullptr), &s.bytes, &reused);
    ok = s.memory != nullptr;
    if (ok) {
      layout(s, static_cast<char*>(s.memory));
      if (reused) clear_tables(s);
      s.arena_used = 1;
    }
  }
  for (uint32_t b = 0; ok && b < c.nbuffers; ++b) {
    uint64_t words = (c.buffers[b].size / c.line_bytes + 2 + 63) / 64;
    shared.line_bits[b] = static_cast<uint64_t*>(calloc(words, sizeof(uint64_t)));
    ok = shared.line_bits[b] != nullptr;
  }
  ok = ok && slots_ready();
  if (!ok) {
    release(false);
    snprintf(shared.message, sizeof(shared.message), "no memory for the profiler's tables");
    return 2;
  }
  __atomic_store_n(&profiled_entry, c.entry, __ATOMIC_SEQ_CST);
  return 0;
}

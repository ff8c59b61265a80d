// The profiler's results (runtime.h, mtw_profile): what the shards counted, summed for
// the whole dispatch, or kept apart for each threadgroup of the profile's slots.
#include <stdlib.h>
#include <string.h>

#include "profiler.h"
#include "tally.h"

namespace mtw {
namespace {

using namespace tally;

int by_key(const void* a, const void* b) {
  const mtw_profile_site& x = *static_cast<const mtw_profile_site*>(a);
  const mtw_profile_site& y = *static_cast<const mtw_profile_site*>(b);
  if (x.pc != y.pc) return x.pc < y.pc ? -1 : 1;
  if (x.buffer != y.buffer) return x.buffer < y.buffer ? -1 : 1;
  return x.kind < y.kind ? -1 : x.kind > y.kind;
}

// The totals of (pc, buffer, kind) in `n` tables, summed, sorted, into `out` (at most
// `room` of them); returns how many there are.
uint32_t gather_sites(Total* const* tables, uint32_t n, mtw_profile_site* out, uint32_t room) {
  size_t used = 0;
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t k = 0; k < kTotalSlots; ++k) used += tables[i][k].used;
  mtw_profile_site* all =
      static_cast<mtw_profile_site*>(malloc((used ? used : 1) * sizeof(mtw_profile_site)));
  if (!all) {
    full("memory for the results");
    return 0;
  }
  size_t found = 0;
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t k = 0; k < kTotalSlots; ++k)
      if (tables[i][k].used) all[found++] = tables[i][k].counts;
  qsort(all, found, sizeof(mtw_profile_site), by_key);
  uint32_t kept = 0;
  for (size_t i = 0; i < found; ++i) {
    if (kept > 0 && by_key(&all[i], &all[kept - 1]) == 0) {
      all[kept - 1].accesses += all[i].accesses;
      all[kept - 1].bytes += all[i].bytes;
      all[kept - 1].lines += all[i].lines;
      all[kept - 1].wavefronts += all[i].wavefronts;
      all[kept - 1].conflicts += all[i].conflicts;
    } else {
      all[kept++] = all[i];
    }
  }
  for (uint32_t i = 0; i < kept && i < room; ++i) {
    out[i] = all[i];
    out[i].pc = all[i].pc - shared.image_base;
  }
  free(all);
  return kept;
}

// The whole dispatch's counts: every shard's, summed.
uint32_t whole_results() {
  const mtw_profile& c = shared.config;
  memset(c.block_lanes, 0, c.blocks * sizeof(uint64_t));
  memset(c.block_simd, 0, c.blocks * sizeof(uint64_t));
  memset(c.block_groups, 0, c.blocks * sizeof(uint64_t));
  memset(c.divergences, 0, c.branches * sizeof(uint64_t));
  Total* tables[kMaxKeptShards];
  uint32_t n = 0;
  for (uint32_t i = 0; i < shared.nshards; ++i) {
    const Shard& s = shared.shards[i];
    for (uint32_t b = 0; b < c.blocks; ++b) {
      c.block_lanes[b] += s.lanes[b];
      c.block_simd[b] += s.simd[b];
      c.block_groups[b] += s.groups[b];
    }
    for (uint32_t b = 0; b < c.branches; ++b) c.divergences[b] += s.divergences[b];
    if (n < kMaxKeptShards) tables[n++] = s.totals;
    else full("set of workers");
  }
  return gather_sites(tables, n, c.sites, c.max_sites);
}

// Each slot's counts apart; returns the most sites of one slot.
uint32_t slot_results() {
  const mtw_profile& c = shared.config;
  uint32_t most = 0;
  for (uint32_t k = 0; k < c.nslots; ++k) {
    const uint64_t* counts = shared.slot_counts + size_t(k) * (3 * c.blocks + c.branches);
    memcpy(c.block_lanes + size_t(k) * c.blocks, counts, c.blocks * sizeof(uint64_t));
    memcpy(c.block_simd + size_t(k) * c.blocks, counts + c.blocks, c.blocks * sizeof(uint64_t));
    memcpy(c.block_groups + size_t(k) * c.blocks, counts + 2 * size_t(c.blocks),
           c.blocks * sizeof(uint64_t));
    memcpy(c.divergences + size_t(k) * c.branches, counts + 3 * size_t(c.blocks),
           c.branches * sizeof(uint64_t));
    Total* table = shared.slot_totals + size_t(k) * kTotalSlots;
    uint32_t sites = gather_sites(&table, 1, c.sites + size_t(k) * c.max_sites, c.max_sites);
    if (c.slot_site_count) c.slot_site_count[k] = sites;
    most = sites > most ? sites : most;
  }
  return most;
}

}  // namespace
}  // namespace mtw

using namespace mtw;

extern "C" uint32_t mtw_profile_collect(void) {
  if (!profiler_armed()) return 0;
  const mtw_profile& c = shared.config;
  for (uint32_t i = 0; i < shared.nshards; ++i)
    if (shared.shards[i].active) finish(shared.shards[i]);
  for (uint32_t b = 0; b < c.nbuffers; ++b) {
    uint64_t words = (c.buffers[b].size / c.line_bytes + 2 + 63) / 64, lines = 0;
    for (uint64_t k = 0; k < words; ++k) lines += __builtin_popcountll(shared.line_bits[b][k]);
    c.distinct_lines[b] = lines;
  }
  uint32_t sites = c.nslots ? slot_results() : whole_results();
  if (c.range_count) *c.range_count = shared.ranges;
  bool complete = !shared.overflow;
  release(complete);
  return complete ? sites : 0xFFFFFFFFu;
}

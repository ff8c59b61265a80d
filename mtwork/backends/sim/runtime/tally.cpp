// The profiler's tally of one threadgroup: its block executions, and the accesses and
// branches of its log grouped into SIMD-group issues (see profiler.cpp).
#include "tally.h"

#include <stdio.h>
#include <string.h>

namespace mtw {
namespace tally {

Shared shared;

void full(const char* what) {
  if (!shared.overflow) {
    snprintf(shared.message, sizeof(shared.message),
             "the profiler's %s is full; profile a smaller dispatch", what);
    shared.overflow = 1;
  }
}

Total* total(Shard& s, uint64_t pc, int32_t buffer, uint32_t kind) {
  // An access site's issues come one after another: the last total found is likely it.
  Total* last = s.last_total;
  if (last && last->counts.pc == pc && last->counts.buffer == buffer && last->counts.kind == kind)
    return last;
  s.last_total = lookup_total(s, pc, buffer, kind);
  return s.last_total;
}

Total* lookup_total(Shard& s, uint64_t pc, int32_t buffer, uint32_t kind) {
  uint64_t key = pc ^ (uint64_t(uint32_t(buffer)) << 48) ^ (uint64_t(kind) << 56);
  for (uint32_t i = 0, slot = hash(key); i < kTotalSlots; ++i, ++slot) {
    Total& t = s.totals[slot % kTotalSlots];
    if (!t.used) {
      t.used = true;
      t.counts.pc = pc;
      t.counts.buffer = buffer;
      t.counts.kind = kind;
      return &t;
    }
    if (t.counts.pc == pc && t.counts.buffer == buffer && t.counts.kind == kind) return &t;
  }
  full("table of access sites");
  return nullptr;
}

void mark_lines(uint32_t buffer, uint64_t first, uint64_t last) {
  uint64_t* bits = shared.line_bits[buffer];
  for (uint64_t line = first; line <= last; ++line)
    __atomic_fetch_or(&bits[line >> 6], uint64_t(1) << (line & 63), __ATOMIC_RELAXED);
}

namespace {

// Records one merged byte range of a device access, when the profile asks for them (past
// its room, only counted: the caller sees that the record is short).
void record_range(const Shard& s, uint64_t pc, uint8_t buffer, uint32_t kind,
                  uint64_t access, uint64_t lo, uint64_t hi) {
  const mtw_profile& c = shared.config;
  uint64_t at = __atomic_fetch_add(&shared.ranges, 1, __ATOMIC_RELAXED);
  if (at < c.max_ranges)
    c.ranges[at] = mtw_profile_range{pc - shared.image_base, buffer, kind, access, lo, hi,
                                     s.slot, 0};
}

// One SIMD-group access of device memory: the lanes' byte ranges, sorted by offset.
void count_device(Shard& s, uint64_t pc, const Event* e, uint32_t n, uint32_t pieces) {
  const uint64_t line_bytes = shared.config.line_bytes;
  uint8_t buffer = e[0].where & ~kStore;
  uint32_t kind = (e[0].where & kStore) ? MTW_ACCESS_STORE : MTW_ACCESS_LOAD;
  uint64_t access = s.accesses++;
  uint64_t bytes = 0, lines = 0, last_line = UINT64_MAX;
  auto add = [&](uint64_t lo, uint64_t hi) {
    if (shared.config.ranges) record_range(s, pc, buffer, kind, access, lo, hi);
    bytes += hi - lo;
    uint64_t first = lo / line_bytes, last = (hi - 1) / line_bytes;
    if (first == last_line) ++first;
    if (first <= last) {
      lines += last - first + 1;
      mark_lines(buffer, first, last);
    }
    last_line = last;
  };
  uint64_t lo = e[0].value, hi = lo + e[0].size;
  for (uint32_t i = 1; i < n; ++i) {
    if (e[i].value <= hi) {
      if (e[i].value + e[i].size > hi) hi = e[i].value + e[i].size;
    } else {
      add(lo, hi);
      lo = e[i].value;
      hi = lo + e[i].size;
    }
  }
  add(lo, hi);
  Total* t = total(s, pc, buffer, kind);
  if (!t) return;
  t->counts.accesses += pieces;
  t->counts.bytes += bytes;
  t->counts.lines += lines;
}

// One SIMD-group access of threadgroup memory, under the bank model mtwork.gpu.Counters
// documents: 32 banks of 4 bytes (docs/records/gpu-model.md: a microbenchmark study found
// M1's "a classical shared memory with 32 independent banks"; MLX pads its threadgroup tiles
// by 16 bytes, steel/gemm/gemm.h, which only helps on banked memory). Lanes reading one word
// share it; the access needs as many wavefronts as the most distinct words in one bank,
// at least one per 32 words: the wavefronts beyond that are bank conflicts.
void count_threadgroup(Shard& s, uint64_t pc, const Event* e, uint32_t n, uint32_t pieces) {
  uint32_t in_bank[kBanks] = {};
  uint64_t words = 0, last_word = UINT64_MAX;
  auto add = [&](uint64_t lo, uint64_t hi) {
    for (uint64_t w = lo / kBankBytes; w <= (hi - 1) / kBankBytes; ++w) {
      if (w == last_word) continue;
      in_bank[w % kBanks] += 1;
      words += 1;
      last_word = w;
    }
  };
  uint64_t lo = e[0].value, hi = lo + e[0].size;
  for (uint32_t i = 1; i < n; ++i) {
    if (e[i].value <= hi) {
      if (e[i].value + e[i].size > hi) hi = e[i].value + e[i].size;
    } else {
      add(lo, hi);
      lo = e[i].value;
      hi = lo + e[i].size;
    }
  }
  add(lo, hi);
  uint32_t most = 0;
  for (uint32_t b = 0; b < kBanks; ++b) most = in_bank[b] > most ? in_bank[b] : most;
  uint64_t wavefronts = (words + kBanks - 1) / kBanks;
  if (wavefronts < pieces) wavefronts = pieces;  // each instruction needs one
  if (most < wavefronts) most = uint32_t(wavefronts);
  Total* t = total(s, pc, MTW_PROFILE_THREADGROUP,
                   (e[0].where & kStore) ? MTW_ACCESS_STORE : MTW_ACCESS_LOAD);
  if (!t) return;
  t->counts.accesses += pieces;
  t->counts.wavefronts += wavefronts;
  t->counts.conflicts += most - wavefronts;
}

}  // namespace

// One SIMD-group access: its lanes' pieces, by where they went (a buffer, threadgroup
// memory), each place counted as an access of its own.
void count_access(Shard& s, uint64_t pc, Event* e, uint32_t n, uint32_t pieces) {
  auto before = [](const Event& a, const Event& b) {
    uint8_t wa = a.where & ~kStore, wb = b.where & ~kStore;
    return wa < wb || (wa == wb && a.value < b.value);
  };
  for (uint32_t i = 1; i < n; ++i) {
    Event x = e[i];
    uint32_t j = i;
    for (; j > 0 && before(x, e[j - 1]); --j) e[j] = e[j - 1];
    e[j] = x;
  }
  for (uint32_t i = 0; i < n;) {
    uint32_t j = i + 1;
    while (j < n && (e[j].where & ~kStore) == (e[i].where & ~kStore)) ++j;
    if ((e[i].where & ~kStore) == kThreadgroupMemory)
      count_threadgroup(s, pc, e + i, j - i, pieces);
    else
      count_device(s, pc, e + i, j - i, pieces);
    i = j;
  }
}

namespace {

// The issues of one SIMD-group at one site: each lane's k-th entry with the others'.
void count_issues(Shard& s, uint32_t site, const Trail* trails, uint32_t lanes) {
  uint32_t chunk[MTW_SIMD_WIDTH], at[MTW_SIMD_WIDTH], most = 0;
  for (uint32_t lane = 0; lane < lanes; ++lane) {
    chunk[lane] = trails[lane].head;
    at[lane] = 0;
    most = trails[lane].count > most ? trails[lane].count : most;
  }
  const bool branch = s.site_branch[site] != kNotBranch;
  Event issue[MTW_SIMD_WIDTH];
  for (uint32_t k = 0; k < most; ++k) {
    uint32_t n = 0;
    for (uint32_t lane = 0; lane < lanes; ++lane) {
      if (trails[lane].count <= k) continue;
      if (at[lane] == uint32_t(s.arena[chunk[lane]] >> 32)) {
        chunk[lane] = uint32_t(s.arena[chunk[lane]]);
        at[lane] = 0;
      }
      uint64_t entry = s.arena[chunk[lane] + 1 + at[lane]++];
      issue[n++] = Event{entry >> 16, site, uint16_t(lane), uint8_t(entry >> 8), uint8_t(entry)};
    }
    if (branch) {
      bool diverged = false;
      for (uint32_t i = 1; i < n; ++i) diverged |= issue[i].value != issue[0].value;
      s.divergences[s.site_branch[site]] += diverged;
    } else {
      count_access(s, s.site_pc[site], issue, n, s.site_pieces[site] ? s.site_pieces[site] : 1);
    }
  }
}

void count_log(Shard& s) {
  for (uint32_t i = 0; i < s.touched_count; ++i) {
    uint32_t site = s.touched[i];
    const Trail* trails = s.trails + (s.site_trails[site] - 1);
    for (uint32_t first = 0; first < s.nthreads; first += MTW_SIMD_WIDTH) {
      uint32_t lanes = s.nthreads - first < MTW_SIMD_WIDTH ? s.nthreads - first : MTW_SIMD_WIDTH;
      count_issues(s, site, trails + first, lanes);
    }
    s.site_trails[site] = 0;
  }
  s.touched_count = 0;
  s.trails_used = 0;
  s.arena_used = 1;
}

void count_blocks(Shard& s) {
  const uint32_t blocks = shared.config.blocks;
  uint32_t simdgroups = (s.nthreads + MTW_SIMD_WIDTH - 1) / MTW_SIMD_WIDTH;
  for (uint32_t sg = 0; sg < simdgroups; ++sg) {
    uint32_t first = sg * MTW_SIMD_WIDTH;
    uint32_t lanes = s.nthreads - first < MTW_SIMD_WIDTH ? s.nthreads - first : MTW_SIMD_WIDTH;
    for (uint32_t j = 0; j < s.ran_count[sg]; ++j) {
      uint32_t b = s.ran_list[size_t(sg) * blocks + j];
      uint64_t sum = 0;
      uint32_t most = 0;
      for (uint32_t t = first; t < first + lanes; ++t) {
        uint32_t& n = s.executions[size_t(t) * blocks + b];
        sum += n;
        most = n > most ? n : most;
        n = 0;
      }
      s.lanes[b] += sum;
      s.simd[b] += most;
      s.ran[size_t(sg) * shared.words + b / 64] &= ~(uint64_t(1) << (b % 64));
      if (s.group_most[b] == 0) s.group_list[s.group_count++] = b;
      if (most > s.group_most[b]) s.group_most[b] = most;
    }
    s.ran_count[sg] = 0;
  }
  for (uint32_t j = 0; j < s.group_count; ++j) {
    uint32_t b = s.group_list[j];
    s.groups[b] += s.group_most[b];
    s.group_most[b] = 0;
  }
  s.group_count = 0;
}

}  // namespace

void finish(Shard& s) {
  count_blocks(s);
  count_log(s);
  s.active = false;
}

}  // namespace tally
}  // namespace mtw

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

namespace {

void mark_lines(uint32_t buffer, uint64_t first, uint64_t last) {
  uint64_t* bits = shared.line_bits[buffer];
  for (uint64_t line = first; line <= last; ++line)
    __atomic_fetch_or(&bits[line >> 6], uint64_t(1) << (line & 63), __ATOMIC_RELAXED);
}

// One SIMD-group access of device memory: the lanes' byte ranges, sorted by offset.
void count_device(Shard& s, uint64_t pc, const Event* e, uint32_t n) {
  const uint64_t line_bytes = shared.config.line_bytes;
  uint8_t buffer = e[0].where & ~kStore;
  uint64_t bytes = 0, lines = 0, last_line = UINT64_MAX;
  auto add = [&](uint64_t lo, uint64_t hi) {
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
  Total* t = total(s, pc, buffer, (e[0].where & kStore) ? MTW_ACCESS_STORE : MTW_ACCESS_LOAD);
  if (!t) return;
  t->counts.accesses += 1;
  t->counts.bytes += bytes;
  t->counts.lines += lines;
}

// One SIMD-group access of threadgroup memory, under the bank model mtwork.gpu.Counters
// documents: 32 banks of 4 bytes (docs/records/gpu-model.md: a microbenchmark study found
// M1's "a classical shared memory with 32 independent banks"; MLX pads its threadgroup tiles
// by 16 bytes, steel/gemm/gemm.h, which only helps on banked memory). Lanes reading one word
// share it; the access needs as many wavefronts as the most distinct words in one bank,
// at least one per 32 words: the wavefronts beyond that are bank conflicts.
void count_threadgroup(Shard& s, uint64_t pc, const Event* e, uint32_t n) {
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
  Total* t = total(s, pc, MTW_PROFILE_THREADGROUP,
                   (e[0].where & kStore) ? MTW_ACCESS_STORE : MTW_ACCESS_LOAD);
  if (!t) return;
  t->counts.accesses += 1;
  t->counts.wavefronts += wavefronts;
  t->counts.conflicts += most - wavefronts;
}

}  // namespace

// One SIMD-group access: its lanes' pieces, by where they went (a buffer, threadgroup
// memory), each place counted as an access of its own.
void count_access(Shard& s, uint64_t pc, Event* e, uint32_t n) {
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
    if ((e[i].where & ~kStore) == kThreadgroupMemory) count_threadgroup(s, pc, e + i, j - i);
    else count_device(s, pc, e + i, j - i);
    i = j;
  }
}

namespace {

// The log, stably sorted by (site, thread): a radix sort of (key, index) pairs in as
// many passes of 8 bits as the keys need.
void sort_log(Shard& s) {
  const uint32_t n = s.logged;
  uint64_t *from = s.order, *to = s.spare, top = 0;
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t key = uint64_t(s.log[i].site) << 10 | s.log[i].thread;
    from[i] = key << 32 | i;
    top |= key;
  }
  for (int shift = 32; shift < 64 && (top >> (shift - 32)); shift += 8) {
    uint32_t count[kRadix + 1] = {};
    for (uint32_t i = 0; i < n; ++i) count[((from[i] >> shift) & (kRadix - 1)) + 1] += 1;
    for (uint32_t d = 0; d < kRadix; ++d) count[d + 1] += count[d];
    for (uint32_t i = 0; i < n; ++i) to[count[(from[i] >> shift) & (kRadix - 1)]++] = from[i];
    uint64_t* t = from;
    from = to;
    to = t;
  }
  s.sorted = from;
}

const Event& sorted(const Shard& s, uint32_t k) { return s.log[uint32_t(s.sorted[k])]; }

// The issues of one SIMD-group at one site: the entries [begin, end) of the sorted log.
void count_issues(Shard& s, uint32_t site, uint32_t begin, uint32_t end) {
  uint32_t start[MTW_SIMD_WIDTH], length[MTW_SIMD_WIDTH] = {}, most = 0;
  for (uint32_t k = begin; k < end; ++k) {
    uint32_t lane = sorted(s, k).thread % MTW_SIMD_WIDTH;
    if (length[lane]++ == 0) start[lane] = k;
    if (length[lane] > most) most = length[lane];
  }
  Event issue[MTW_SIMD_WIDTH];
  for (uint32_t k = 0; k < most; ++k) {
    uint32_t n = 0;
    for (uint32_t lane = 0; lane < MTW_SIMD_WIDTH; ++lane)
      if (length[lane] > k) issue[n++] = sorted(s, start[lane] + k);
    if (s.site_branch[site] != kNotBranch) {
      bool diverged = false;
      for (uint32_t i = 1; i < n; ++i) diverged |= issue[i].value != issue[0].value;
      s.divergences[s.site_branch[site]] += diverged;
    } else {
      count_access(s, s.site_pc[site], issue, n);
    }
  }
}

void count_log(Shard& s) {
  sort_log(s);
  for (uint32_t i = 0; i < s.logged;) {
    const Event& first = sorted(s, i);
    uint32_t j = i + 1;
    while (j < s.logged && sorted(s, j).site == first.site &&
           sorted(s, j).thread / MTW_SIMD_WIDTH == first.thread / MTW_SIMD_WIDTH)
      ++j;
    count_issues(s, first.site, i, j);
    i = j;
  }
  s.logged = 0;
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

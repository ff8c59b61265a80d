// The profiler: counts what a profiled kernel does, as a GPU's SIMD-groups would run it.
//
// A kernel library built for profiling (backends/sim/instrument.py) calls
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
// - a log of the accesses and branches in the order each thread made them. When the
//   threadgroup is done the log is sorted by (code address, thread), so that each lane's
//   k-th entry lines up with the others', and every SIMD-group issue is counted: the
//   bytes and lines of device memory it touches, the threadgroup-memory wavefronts it
//   needs, whether its lanes branched both ways.
// A worker sees that its threadgroup is done when a hook of its next one arrives (or at
// mtw_profile_collect), and adds the threadgroup's counts to its totals; collect sums the
// workers'. Every count is a sum of per-threadgroup integers, or (distinct lines) a
// union of sets, so the result does not depend on which worker ran which threadgroup or
// in what order: the counts are the same on every run and on any number of cores.
#include "profiler.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

namespace mtw {

mtw_entry_fn profiled_entry = nullptr;

namespace {

constexpr uint8_t kThreadgroupMemory = 63;  // Event::where of threadgroup memory
constexpr uint8_t kNowhere = 0xFF;
constexpr uint8_t kStore = 0x80;
constexpr uint32_t kMaxBuffers = 62;
constexpr uint32_t kMaxSites = 1u << 14;       // accesses' code addresses and branches
constexpr uint32_t kSiteSlots = 1u << 15;      // hash slots of access code addresses
constexpr uint32_t kNotBranch = 0xFFFFFFFFu;
constexpr uint32_t kTotalSlots = 1u << 15;     // hash slots of (pc, buffer, kind) totals
constexpr uint32_t kLogCapacity = 1u << 23;    // accesses and branches of one threadgroup
constexpr uint32_t kGathered = 256;            // accesses of one simdgroup_matrix access
constexpr uint32_t kRadix = 1u << 8;
constexpr uint32_t kNoSite = 0xFFFFFFFFu;
constexpr uint32_t kBanks = 32, kBankBytes = 4;

struct Event {
  uint64_t value;   // access: offset in its buffer or in threadgroup memory; branch: the way
  uint32_t site;    // index of its code address (an access) or of its branch
  uint16_t thread;  // linear index in the threadgroup
  uint8_t size;     // access: bytes
  uint8_t where;    // access: buffer index or kThreadgroupMemory, | kStore for a store
};

struct Total {
  mtw_profile_site counts;
  bool used;
};

// One worker's counts: the threadgroup it is counting, and its totals so far.
struct Shard {
  bool active;
  uint32_t pos[3];
  uint32_t nthreads;
  uint32_t* executions;  // [threads * blocks]
  uint64_t* ran;         // [simdgroups * words]: a bit per block the SIMD-group ran
  uint32_t* ran_list;    // [simdgroups * blocks]
  uint32_t* ran_count;   // [simdgroups]
  uint32_t* group_most;  // [blocks]: most executions of one thread of the threadgroup
  uint32_t* group_list;  // [blocks]
  uint32_t group_count;
  Event* log;            // [kLogCapacity]
  uint32_t logged;
  uint64_t* order;       // [kLogCapacity]: (site, thread) << 32 | log index, sorted
  uint64_t* spare;       // [kLogCapacity]
  uint64_t* sorted;      // order or spare: where the sort ended
  uint64_t* site_pc;     // [kMaxSites]: the code address of an access site
  uint32_t* site_branch; // [kMaxSites]: the branch of a branch site, else kNotBranch
  uint32_t* site_slot;   // [kSiteSlots]: site index + 1, 0 when free
  uint32_t* branch_site; // [branches]: site index + 1, 0 when not seen yet
  uint32_t sites;
  bool gathering;        // inside a simdgroup_matrix load or store
  uint64_t gather_pc;
  uint32_t gathered_count;
  Event gathered[kGathered];
  uint64_t* lanes;        // [blocks]
  uint64_t* simd;         // [blocks]
  uint64_t* groups;       // [blocks]
  uint64_t* divergences;  // [branches]
  Total* totals;          // [kTotalSlots]
  void* memory;           // the mapping all the arrays above live in
  size_t bytes;
};

struct State {
  mtw_profile config;
  uintptr_t image_base;
  uint32_t simdgroups, words;
  Shard* shards;
  uint32_t nshards;
  uint64_t* line_bits[kMaxBuffers];  // per buffer, a bit per line touched
  volatile int overflow;             // a table or the log was full: counts incomplete
  char message[256];
};

State state;

template <typename T>
T* carve(char*& at, size_t count) {
  T* p = reinterpret_cast<T*>(at);
  at += (count * sizeof(T) + 63) & ~size_t(63);
  return p;
}

// Points the shard's arrays into `base` (null: only measures); returns the bytes needed.
size_t layout(Shard& s, char* base) {
  const mtw_profile& c = state.config;
  char* at = base;
  s.executions = carve<uint32_t>(at, size_t(c.threads) * c.blocks);
  s.ran = carve<uint64_t>(at, size_t(state.simdgroups) * state.words);
  s.ran_list = carve<uint32_t>(at, size_t(state.simdgroups) * c.blocks);
  s.ran_count = carve<uint32_t>(at, state.simdgroups);
  s.group_most = carve<uint32_t>(at, c.blocks);
  s.group_list = carve<uint32_t>(at, c.blocks);
  s.log = carve<Event>(at, kLogCapacity);
  s.order = carve<uint64_t>(at, kLogCapacity);
  s.spare = carve<uint64_t>(at, kLogCapacity);
  s.site_pc = carve<uint64_t>(at, kMaxSites);
  s.site_branch = carve<uint32_t>(at, kMaxSites);
  s.site_slot = carve<uint32_t>(at, kSiteSlots);
  s.branch_site = carve<uint32_t>(at, c.branches);
  s.lanes = carve<uint64_t>(at, c.blocks);
  s.simd = carve<uint64_t>(at, c.blocks);
  s.groups = carve<uint64_t>(at, c.blocks);
  s.divergences = carve<uint64_t>(at, c.branches);
  s.totals = carve<Total>(at, kTotalSlots);
  return size_t(at - base);
}

void full(const char* what) {
  if (!state.overflow) {
    snprintf(state.message, sizeof(state.message),
             "the profiler's %s is full; profile a smaller dispatch", what);
    state.overflow = 1;
  }
}

uint32_t hash(uint64_t key) { return uint32_t((key * 0x9E3779B97F4A7C15ull) >> 40); }

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

// Sites are numbered densely as they are first seen, so the log sorts in few passes.
uint32_t new_site(Shard& s, uint64_t pc, uint32_t branch) {
  if (s.sites == kMaxSites) {
    full("table of access sites");
    return kNoSite;
  }
  s.site_pc[s.sites] = pc;
  s.site_branch[s.sites] = branch;
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
  const mtw_profile& c = state.config;
  for (uint32_t i = 0; i < c.nbuffers; ++i) {
    const mtw_buffer_info& b = c.buffers[i];
    if (b.kind != MTW_BUFFER_INTERNAL && a - b.base < b.size) {
      *offset = a - b.base;
      return uint8_t(i);
    }
  }
  return kNowhere;
}

void mark_lines(uint32_t buffer, uint64_t first, uint64_t last) {
  uint64_t* bits = state.line_bits[buffer];
  for (uint64_t line = first; line <= last; ++line)
    __atomic_fetch_or(&bits[line >> 6], uint64_t(1) << (line & 63), __ATOMIC_RELAXED);
}

// One SIMD-group access of device memory: the lanes' byte ranges, sorted by offset.
void count_device(Shard& s, uint64_t pc, const Event* e, uint32_t n) {
  const uint64_t line_bytes = state.config.line_bytes;
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
// documents: 32 banks of 4 bytes (docs/gpu-model.md: a microbenchmark study found M1's
// "a classical shared memory with 32 independent banks"; MLX pads its threadgroup tiles by
// 16 bytes, steel/gemm/gemm.h, which only helps on banked memory). Lanes reading one word
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
  const uint32_t blocks = state.config.blocks;
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
      s.ran[size_t(sg) * state.words + b / 64] &= ~(uint64_t(1) << (b % 64));
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

void finish(Shard& s) {
  count_blocks(s);
  count_log(s);
  s.active = false;
}

// The shard of `w`'s worker, counting the threadgroup `w` runs now.
Shard* shard_of(Worker* w) {
  if (w->index >= state.nshards) {
    full("set of workers");
    return nullptr;
  }
  Shard& s = state.shards[w->index];
  const uint32_t* pos = w->group.group_pos;
  if (!s.active || s.pos[0] != pos[0] || s.pos[1] != pos[1] || s.pos[2] != pos[2]) {
    if (s.active) finish(s);
    s.active = true;
    memcpy(s.pos, pos, sizeof(s.pos));
    s.nthreads = w->group.nthreads;
  }
  return &s;
}

void log_event(Shard& s, const Event& e) {
  if (s.logged == kLogCapacity) {
    full("log of one threadgroup (8M accesses and branches)");
    return;
  }
  s.log[s.logged++] = e;
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

void release() {
  __atomic_store_n(&profiled_entry, nullptr, __ATOMIC_SEQ_CST);
  for (uint32_t i = 0; i < state.nshards; ++i)
    if (state.shards[i].memory) munmap(state.shards[i].memory, state.shards[i].bytes);
  free(state.shards);
  state.shards = nullptr;
  state.nshards = 0;
  for (uint32_t b = 0; b < kMaxBuffers; ++b) {
    free(state.line_bits[b]);
    state.line_bits[b] = nullptr;
  }
}

int by_key(const void* a, const void* b) {
  const mtw_profile_site& x = *static_cast<const mtw_profile_site*>(a);
  const mtw_profile_site& y = *static_cast<const mtw_profile_site*>(b);
  if (x.pc != y.pc) return x.pc < y.pc ? -1 : 1;
  if (x.buffer != y.buffer) return x.buffer < y.buffer ? -1 : 1;
  return x.kind < y.kind ? -1 : x.kind > y.kind;
}

// Every shard's totals of (pc, buffer, kind), summed, into the armed profile's sites.
uint32_t collect_sites() {
  size_t used = 0;
  for (uint32_t i = 0; i < state.nshards; ++i)
    for (uint32_t k = 0; k < kTotalSlots; ++k) used += state.shards[i].totals[k].used;
  mtw_profile_site* all =
      static_cast<mtw_profile_site*>(malloc((used ? used : 1) * sizeof(mtw_profile_site)));
  if (!all) {
    full("memory for the results");
    return 0;
  }
  size_t n = 0;
  for (uint32_t i = 0; i < state.nshards; ++i)
    for (uint32_t k = 0; k < kTotalSlots; ++k)
      if (state.shards[i].totals[k].used) all[n++] = state.shards[i].totals[k].counts;
  qsort(all, n, sizeof(mtw_profile_site), by_key);
  const mtw_profile& c = state.config;
  uint32_t out = 0;
  for (size_t i = 0; i < n; ++i) {
    bool same = out > 0 && by_key(&all[i], &all[out - 1]) == 0;
    if (same) {
      all[out - 1].accesses += all[i].accesses;
      all[out - 1].bytes += all[i].bytes;
      all[out - 1].lines += all[i].lines;
      all[out - 1].wavefronts += all[i].wavefronts;
      all[out - 1].conflicts += all[i].conflicts;
    } else {
      all[out++] = all[i];
    }
  }
  for (uint32_t i = 0; i < out && i < c.max_sites; ++i) {
    c.sites[i] = all[i];
    c.sites[i].pc = all[i].pc - state.image_base;
  }
  free(all);
  return out;
}

}  // namespace

void profiler_access(Worker* w, const void* p, uint32_t size, bool write, const void* pc) {
  if (w->atomic_depth) return;  // part of an atomic, counted as one
  Shard* s = shard_of(w);
  uint64_t offset;
  uint8_t where = s ? locate(w, reinterpret_cast<uintptr_t>(p), &offset) : kNowhere;
  if (where == kNowhere) return;
  Event e{offset, 0, uint16_t(w->group.current), uint8_t(size),
          uint8_t(where | (write ? kStore : 0))};
  if (s->gathering) {
    if (s->gathered_count < kGathered) s->gathered[s->gathered_count++] = e;
    else full("record of one simdgroup_matrix access");
    return;
  }
  e.site = site_of(*s, reinterpret_cast<uint64_t>(pc));
  if (e.site != kNoSite) log_event(*s, e);
}

}  // namespace mtw

using namespace mtw;

extern "C" void mtw_profile_block(uint32_t block) {
  Worker* w;
  Shard* s = counting(&w, true);
  if (!s || block >= state.config.blocks) return;
  const uint32_t blocks = state.config.blocks, t = w->group.current;
  const uint32_t sg = t / MTW_SIMD_WIDTH;
  if (s->executions[size_t(t) * blocks + block]++ != 0) return;
  uint64_t& bits = s->ran[size_t(sg) * state.words + block / 64];
  if (bits & (uint64_t(1) << (block % 64))) return;
  bits |= uint64_t(1) << (block % 64);
  s->ran_list[size_t(sg) * blocks + s->ran_count[sg]++] = block;
}

extern "C" void mtw_profile_branch(uint32_t branch, uint32_t way) {
  Worker* w;
  Shard* s = counting(&w, true);
  if (!s || branch >= state.config.branches) return;
  uint32_t site = branch_site(*s, branch);
  if (site != kNoSite) log_event(*s, Event{way, site, uint16_t(w->group.current), 0, 0});
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

extern "C" void mtw_profile_disarm(void) { release(); }

extern "C" const char* mtw_profile_message(void) { return state.message; }

extern "C" int mtw_profile_arm(const mtw_profile* profile) {
  release();
  state.config = *profile;
  state.overflow = 0;
  state.message[0] = 0;
  const mtw_profile& c = state.config;
  if (c.nbuffers > kMaxBuffers || c.threads == 0 || c.threads > MTW_MAX_THREADS ||
      c.line_bytes == 0) {
    snprintf(state.message, sizeof(state.message), "the profiler takes at most %u buffers and "
             "%u threads per threadgroup", kMaxBuffers, MTW_MAX_THREADS);
    return 1;
  }
  Dl_info info;
  state.image_base = dladdr(reinterpret_cast<void*>(c.entry), &info) && info.dli_fbase
                         ? reinterpret_cast<uintptr_t>(info.dli_fbase) : 0;
  state.simdgroups = (c.threads + MTW_SIMD_WIDTH - 1) / MTW_SIMD_WIDTH;
  state.words = (c.blocks + 63) / 64;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  state.nshards = pool_size ? uint32_t(pool_size) : cores > 0 ? uint32_t(cores) : 1;
  state.shards = static_cast<Shard*>(calloc(state.nshards, sizeof(Shard)));
  bool ok = state.shards != nullptr;
  for (uint32_t i = 0; ok && i < state.nshards; ++i) {
    Shard& s = state.shards[i];
    s.bytes = layout(s, nullptr);
    s.memory = mmap(nullptr, s.bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (s.memory == MAP_FAILED) {
      s.memory = nullptr;
      ok = false;
    } else {
      layout(s, static_cast<char*>(s.memory));
    }
  }
  for (uint32_t b = 0; ok && b < c.nbuffers; ++b) {
    uint64_t words = (c.buffers[b].size / c.line_bytes + 2 + 63) / 64;
    state.line_bits[b] = static_cast<uint64_t*>(calloc(words, sizeof(uint64_t)));
    ok = state.line_bits[b] != nullptr;
  }
  if (!ok) {
    release();
    snprintf(state.message, sizeof(state.message), "no memory for the profiler's tables");
    return 2;
  }
  __atomic_store_n(&profiled_entry, c.entry, __ATOMIC_SEQ_CST);
  return 0;
}

extern "C" uint32_t mtw_profile_collect(void) {
  if (!profiler_armed()) return 0;
  const mtw_profile& c = state.config;
  for (uint32_t i = 0; i < state.nshards; ++i)
    if (state.shards[i].active) finish(state.shards[i]);
  memset(c.block_lanes, 0, c.blocks * sizeof(uint64_t));
  memset(c.block_simd, 0, c.blocks * sizeof(uint64_t));
  memset(c.block_groups, 0, c.blocks * sizeof(uint64_t));
  memset(c.divergences, 0, c.branches * sizeof(uint64_t));
  for (uint32_t i = 0; i < state.nshards; ++i) {
    const Shard& s = state.shards[i];
    for (uint32_t b = 0; b < c.blocks; ++b) {
      c.block_lanes[b] += s.lanes[b];
      c.block_simd[b] += s.simd[b];
      c.block_groups[b] += s.groups[b];
    }
    for (uint32_t b = 0; b < c.branches; ++b) c.divergences[b] += s.divergences[b];
  }
  for (uint32_t b = 0; b < c.nbuffers; ++b) {
    uint64_t words = (c.buffers[b].size / c.line_bytes + 2 + 63) / 64, lines = 0;
    for (uint64_t k = 0; k < words; ++k) lines += __builtin_popcountll(state.line_bits[b][k]);
    c.distinct_lines[b] = lines;
  }
  uint32_t sites = collect_sites();
  bool complete = !state.overflow;
  release();
  return complete ? sites : 0xFFFFFFFFu;
}

// The profiler's tally: what it keeps per worker, and how the records of one threadgroup
// become counts (tally.cpp). See profiler.cpp for the model.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "runtime.h"

namespace mtw {
namespace tally {

constexpr uint8_t kThreadgroupMemory = 63;  // Event::where of threadgroup memory
constexpr uint8_t kNowhere = 0xFF;
constexpr uint8_t kStore = 0x80;
constexpr uint32_t kMaxBuffers = 62;
constexpr uint32_t kMaxSites = 1u << 14;       // accesses' code addresses and branches
constexpr uint32_t kSiteSlots = 1u << 15;      // hash slots of access code addresses
constexpr uint32_t kNotBranch = 0xFFFFFFFFu;
constexpr uint32_t kTotalSlots = 1u << 15;     // hash slots of (pc, buffer, kind) totals
constexpr uint32_t kArenaWords = 1u << 24;     // accesses and branches of one threadgroup,
                                               // with their chunks' headers
constexpr uint32_t kTrailCapacity = 1u << 22;  // (site, thread) pairs of one threadgroup
constexpr uint32_t kChunkLargest = 64;         // events in a trail's largest chunks
constexpr uint32_t kMaxKeptShards = 64;        // shards whose memory a next profile reuses
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

// A log entry as one word: an access's offset, size and place (or a branch's way).
inline uint64_t packed(uint64_t value, uint8_t size, uint8_t where) {
  return value << 16 | uint64_t(size) << 8 | where;
}

// One thread's accesses (or branches) at one site of a threadgroup, in the order it made
// them: chunks of the shard's arena, each a header word (the next chunk | its capacity
// << 32) and its events. A thread's k-th entry of a site lines up with the other lanes'.
struct Trail {
  uint32_t head, tail;     // arena offsets of the first and last chunk (0: none yet)
  uint32_t count;          // entries
  uint16_t fill, capacity; // entries in the last chunk, and room
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
  uint64_t* arena;       // [kArenaWords]: the trails' chunks
  uint32_t arena_used;   // words (offset 0 is no chunk)
  Trail* trails;         // [kTrailCapacity]: a site's threads' trails side by side
  uint32_t trails_used;
  uint32_t* site_trails; // [kMaxSites]: the site's first trail + 1 (0: none yet)
  uint32_t* touched;     // [kMaxSites]: the sites with trails, in the order first touched
  uint32_t touched_count;
  uint64_t* site_pc;     // [kMaxSites]: the code address of an access site
  uint32_t* site_branch; // [kMaxSites]: the branch of a branch site, else kNotBranch
  uint8_t* site_pieces;  // [kMaxSites]: instructions one access there stands for (0: one)
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
  Total* last_total;      // the one `total` found last
  uint32_t slot;          // with slots, the slot of its threadgroup (its counts' place)
  uint64_t* hashes;       // with slots, the slot's hashes (threadgroup memory, branches)
  bool checked;           // with slots, its threadgroup is only checked: hash, do not log
  uint64_t accesses;      // device accesses of its threadgroup counted, to number ranges
  void* memory;           // the mapping all the arrays above live in
  size_t bytes;
};

// What every shard counts against: the armed profile, and the lines touched so far.
struct Shared {
  mtw_profile config;
  uintptr_t image_base;
  uint32_t simdgroups, words;       // SIMD-groups per threadgroup, bitmap words per block set
  Shard* shards;                    // one per worker
  uint32_t nshards;
  uint64_t* line_bits[kMaxBuffers];  // per buffer, a bit per line touched
  volatile uint64_t ranges;          // device access ranges recorded (config.ranges)
  uint64_t* slot_counts;             // with slots, each slot's block counts and divergences
  Total* slot_totals;                // with slots, each slot's totals [nslots * kTotalSlots]
  size_t slot_bytes;                 // the mapping both live in
  volatile int overflow;             // a table or the log was full: counts incomplete
  char message[256];
};

extern Shared shared __attribute__((visibility("hidden")));

inline uint32_t hash(uint64_t key) { return uint32_t((key * 0x9E3779B97F4A7C15ull) >> 40); }

// Mixes one entry into a running hash of a sequence (order matters).
inline void mix(uint64_t& h, uint64_t a, uint64_t b) {
  h = (h ^ a) * 0x100000001B3ull;
  h = (h ^ b) * 0x100000001B3ull;
  h ^= h >> 29;
}

// Marks the counts incomplete: `what` was full.
void full(const char* what);

// Appends one log entry to `thread`'s trail of `site` in the shard's threadgroup.
inline void record(Shard& s, uint32_t site, uint32_t thread, uint64_t entry) {
  uint32_t& first = s.site_trails[site];
  if (first == 0) {
    if (s.trails_used + s.nthreads > kTrailCapacity) {
      full("table of threads' accesses of one threadgroup");
      return;
    }
    first = s.trails_used + 1;
    for (uint32_t t = 0; t < s.nthreads; ++t) s.trails[s.trails_used + t] = Trail{};
    s.trails_used += s.nthreads;
    s.touched[s.touched_count++] = site;
  }
  Trail& t = s.trails[first - 1 + thread];
  if (t.fill == t.capacity) {
    uint32_t grown = t.capacity ? (t.capacity * 2 < kChunkLargest ? t.capacity * 2
                                                                   : kChunkLargest) : 2;
    if (s.arena_used + 1 + grown > kArenaWords) {
      full("log of one threadgroup (16M accesses and branches)");
      return;
    }
    uint32_t chunk = s.arena_used;
    s.arena[chunk] = uint64_t(grown) << 32;
    s.arena_used += 1 + grown;
    if (t.tail) s.arena[t.tail] |= chunk;
    else t.head = chunk;
    t.tail = chunk;
    t.fill = 0;
    t.capacity = uint16_t(grown);
  }
  s.arena[t.tail + 1 + t.fill++] = entry;
  t.count += 1;
}
// The totals of (code address, buffer or threadgroup memory, kind) in a shard.
Total* total(Shard& s, uint64_t pc, int32_t buffer, uint32_t kind);
Total* lookup_total(Shard& s, uint64_t pc, int32_t buffer, uint32_t kind);
// Marks lines first to last (inclusive) of a buffer as touched in the dispatch.
void mark_lines(uint32_t buffer, uint64_t first, uint64_t last);
// Counts one SIMD-group access: its lanes' pieces (reordered).
// `pieces`: the instructions the access stands for (a thread's adjacent accesses merged).
void count_access(Shard& s, uint64_t pc, Event* e, uint32_t n, uint32_t pieces = 1);
// Counts the shard's threadgroup (its block executions and its log) into its totals.
void finish(Shard& s);
// Disarms the profiler (profiler.cpp); `keep`: the count finished, and its shards' memory
// may serve the next profile.
void release(bool keep);

}  // namespace tally
}  // namespace mtw

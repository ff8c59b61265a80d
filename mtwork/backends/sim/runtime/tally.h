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

// What every shard counts against: the armed profile, and the lines touched so far.
struct Shared {
  mtw_profile config;
  uintptr_t image_base;
  uint32_t simdgroups, words;       // SIMD-groups per threadgroup, bitmap words per block set
  Shard* shards;                    // one per worker
  uint32_t nshards;
  uint64_t* line_bits[kMaxBuffers];  // per buffer, a bit per line touched
  volatile int overflow;             // a table or the log was full: counts incomplete
  char message[256];
};

extern Shared shared __attribute__((visibility("hidden")));

inline uint32_t hash(uint64_t key) { return uint32_t((key * 0x9E3779B97F4A7C15ull) >> 40); }

// Marks the counts incomplete: `what` was full.
void full(const char* what);
// The totals of (code address, buffer or threadgroup memory, kind) in a shard.
Total* total(Shard& s, uint64_t pc, int32_t buffer, uint32_t kind);
// Counts one SIMD-group access: its lanes' pieces (reordered).
void count_access(Shard& s, uint64_t pc, Event* e, uint32_t n);
// Counts the shard's threadgroup (its block executions and its log) into its totals.
void finish(Shard& s);

}  // namespace tally
}  // namespace mtw

// The emulator runtime's C interface, called from Python through ctypes.
#pragma once

#include <stdint.h>

#include "mtw_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

// Sanitizer mode: what the kernel's buffers are, and where findings go.
enum mtw_buffer_kind { MTW_BUFFER_INPUT = 0, MTW_BUFFER_OUTPUT = 1, MTW_BUFFER_INTERNAL = 2 };

typedef struct mtw_buffer_info {
  uint64_t base;           // address of element 0
  uint64_t size;           // bytes
  uint32_t element_size;
  uint32_t kind;           // mtw_buffer_kind
  const char* name;
  uint8_t* written;        // outputs: one byte per byte, set when written (may be null)
} mtw_buffer_info;

// Every kind of finding, once: its code, its name in C and Python, and its text in a
// report. Kinds 7 to 9 are found outside the runtime (after the dispatch, or from how it
// failed); they are here so that there is one table.
#define MTW_FINDING_KINDS(X)                                                   \
  X(OUT_OF_BOUNDS, 1, "out-of-bounds access")        /* outside every buffer */ \
  X(INPUT_WRITE, 2, "write to an input buffer")                                 \
  X(RACE, 3, "threadgroup memory race")  /* two threads, no barrier between */   \
  X(UNINITIALIZED, 4, "read of uninitialized threadgroup memory")               \
  X(SIMD_DIVERGENCE, 5, "SIMD divergence")  /* lanes elsewhere at a collective */ \
  X(BARRIER_DIVERGENCE, 6, "barrier divergence")                                \
  X(UNWRITTEN_OUTPUT, 7, "output never written")                                \
  X(TG_MEMORY, 8, "threadgroup memory over budget")                             \
  X(KERNEL_FAULT, 9, "kernel fault")                                            \
  X(ARRAY_INDEX, 10, "array index out of bounds")  /* a subscript past its array */ \
  X(INACTIVE_LANE, 11, "read of an inactive SIMD lane")  /* undefined result */

enum mtw_finding_kind {
#define MTW_FINDING_ENUM(name, code, text) MTW_FINDING_##name = code,
  MTW_FINDING_KINDS(MTW_FINDING_ENUM)
#undef MTW_FINDING_ENUM
};

// The name ("OUT_OF_BOUNDS") and report text of finding kind `code`, or null.
const char* mtw_finding_kind_name(uint32_t code);
const char* mtw_finding_kind_text(uint32_t code);

#define MTW_FINDING_CALLERS 6

typedef struct mtw_finding {
  uint32_t kind;
  uint32_t write;            // the access (for races: the later one) was a write
  int32_t buffer;            // index into the buffer infos, or -1
  int32_t tg_array;          // index of the array (see mtw_sanitizer_tg_arrays), or -1
  int64_t element;           // element index within the buffer or array (for
                             // INACTIVE_LANE: the lane read)
  uint32_t thread[3];        // thread_position_in_threadgroup of the thread
  uint32_t other[3];         // the other thread of a race (or the lane read; all
                             // 0xFFFFFFFF: no such thread)
  uint32_t group[3];         // threadgroup_position_in_grid
  uint32_t other_write;      // the other access of a race was a write
  uint64_t pc;               // code offset in the kernel library (for the source line)
  uint64_t count;            // how many accesses this finding stands for
  // Code offsets of the calls that led to pc, innermost first (0: no more), for findings
  // in functions that were not inlined (a helper's caller is the author's line).
  uint64_t callers[MTW_FINDING_CALLERS];
} mtw_finding;

// A thread that had not finished when a dispatch was stopped from outside.
enum mtw_live_state { MTW_LIVE_RUNNING = 0, MTW_LIVE_AT_BARRIER = 1, MTW_LIVE_AT_SIMD = 2,
                      MTW_LIVE_READY = 3 };

typedef struct mtw_live_thread {
  uint32_t group[3];   // threadgroup_position_in_grid
  uint32_t thread[3];  // thread_position_in_threadgroup (all 0xFFFFFFFF: not known)
  uint32_t state;      // mtw_live_state
  uint32_t reserved;
  uint64_t pc;         // running: where it was stopped; waiting or ready: the call it waits
                       // in (the return address into the kernel)
} mtw_live_thread;

// Logging (os_log): the dispatch's log, one block of memory, a header and then records
// one after another, each reserved by an atomic add to `used` and complete when it carries
// the header's serial (written last). The header's serial is a new number for each
// dispatch: after a process died mid-dispatch, records of an earlier one are not read as
// this one's.
#define MTW_LOG_TEXT_MAX 1024  // a message's text, in bytes, as Metal keeps (longer: cut)

typedef struct mtw_log_header {
  uint32_t serial;
  uint32_t reserved;
  uint64_t capacity;   // bytes for records after the header
  uint64_t used;       // bytes reserved by records (past `capacity`: they did not fit)
  uint64_t messages;   // messages written
  uint64_t dropped;    // messages that did not fit
  uint64_t truncated;  // messages whose text was cut at MTW_LOG_TEXT_MAX bytes
} mtw_log_header;

typedef struct mtw_log_record {
  uint32_t serial;     // the header's serial: the record is complete
  uint32_t size;       // bytes of the record, a multiple of 8 (0: the records end here)
  uint32_t group[3];   // threadgroup_position_in_grid
  uint32_t thread[3];  // thread_position_in_threadgroup
  uint32_t index;      // thread_index_in_threadgroup
  uint32_t line;       // of the call, in `file`
  uint8_t level;       // mtw_log_level
  uint8_t cut;         // the text was cut
  uint16_t file_bytes;
  uint16_t subsystem_bytes;
  uint16_t category_bytes;
  uint16_t text_bytes;
  uint16_t reserved;
  // then the file's name, the subsystem, the category and the text, unterminated
} mtw_log_record;

typedef struct mtw_launch {
  mtw_entry_fn entry;
  void* const* buffers;
  const char* kernel_name;
  uint32_t grid[3];            // threads per grid (dispatchThreads semantics)
  uint32_t threadgroup[3];     // threads per threadgroup, already clamped to the grid
  uint32_t tg_memory_limit;    // bytes of threadgroup memory a threadgroup may use
  uint32_t tg_static_bytes;    // bytes reserved up front for [[threadgroup(n)]] arguments
  uint32_t workers;            // OS threads to spread threadgroups over (0: all cores)
  uint32_t barrier_free;       // `entry` is mtw_entry_barrier_free: blocking is a bug
  uint32_t sanitize;           // the kernel library is instrumented: check its accesses
  uint32_t lockstep;           // the library traces its accesses: a SIMD-group steps through
                               // threadgroup memory in lockstep (convergence.cpp)
  const mtw_buffer_info* buffer_info;
  uint32_t nbuffers;
  uint32_t max_findings;
  mtw_finding* findings;       // filled by the sanitizer, up to max_findings
  // Run only these threadgroups (linear indices, x fastest; each below the grid's count),
  // not the whole grid (null): the profiler counts a sample of them so.
  const uint64_t* groups;
  uint64_t ngroups;
  mtw_log_header* log;         // where messages go; null: logging calls do nothing
} mtw_launch;

enum mtw_status {
  MTW_OK = 0,
  MTW_RUNNING = 1,
  MTW_FAULT = 2,          // a signal inside kernel code (bad pointer, trap, stack overflow)
  MTW_DEADLOCK = 3,       // threads blocked forever (at barriers no SIMD-group can pass)
  MTW_TG_MEMORY = 4,      // threadgroup memory over budget
  MTW_CANCELLED = 5,      // stopped from outside (watchdog, interrupt)
  MTW_KERNEL_ERROR = 6,   // the kernel reported an error itself
  MTW_SYSTEM = 7,         // the runtime could not get memory or threads
  MTW_NEEDS_FIBERS = 8,   // a kernel run as barrier-free blocked: run it on the general path
  MTW_SANITIZER_STOP = 9, // the sanitizer stopped the kernel before a write out of bounds
  MTW_LOGGED = 10,        // a kernel run without thread identities (plain loops, the fast
                          // engine) logged: run it on fibers, where messages know their thread
};

// Starts a dispatch; returns nonzero if another is running. One dispatch at a time.
int mtw_dispatch_start(const mtw_launch* launch);
// Waits up to timeout_ms; returns MTW_RUNNING while the dispatch goes on, else its status.
int mtw_dispatch_wait(uint32_t timeout_ms);
// Stops the running dispatch: workers inside kernel code are interrupted.
void mtw_dispatch_cancel(void);
// The message of the last failed dispatch.
const char* mtw_dispatch_message(void);
// Threads still live when the last dispatch was stopped from outside: copies up to `max`
// of them into `out` and returns how many there were in all (more than were recorded
// when many threadgroups ran at once).
uint64_t mtw_dispatch_live_threads(mtw_live_thread* out, uint32_t max);
// Threadgroup memory high-water mark (bytes) of the last dispatch.
uint32_t mtw_dispatch_tg_memory(void);
int mtw_abi_version(void);
// Sanitizer results of the last dispatch: findings recorded (all kinds together), and the
// threadgroup arrays the kernel declared (name and element size), by index.
uint32_t mtw_sanitizer_findings(void);
uint32_t mtw_sanitizer_tg_arrays(void);
const char* mtw_sanitizer_tg_array_name(uint32_t index);
uint32_t mtw_sanitizer_tg_array_element_size(uint32_t index);

// Profiler mode: a kernel library built for profiling (see backends/sim/count/instrument.py)
// reports the blocks it runs, the ways its branches go, its memory accesses and atomics;
// the runtime counts them per threadgroup, as a GPU's SIMD-groups would run them.
enum mtw_access_kind { MTW_ACCESS_LOAD = 0, MTW_ACCESS_STORE = 1, MTW_ACCESS_ATOMIC = 2 };
#define MTW_PROFILE_THREADGROUP (-1)  // mtw_profile_site.buffer of threadgroup memory

// The counts of one code address, one buffer (or threadgroup memory) and one kind.
typedef struct mtw_profile_site {
  uint64_t pc;          // code offset in the kernel library (for the source line)
  int32_t buffer;       // index into the buffer infos, or MTW_PROFILE_THREADGROUP
  uint32_t kind;        // mtw_access_kind
  uint64_t accesses;    // SIMD-group access instructions (atomics: lanes)
  uint64_t bytes;       // device memory: bytes requested (each byte once per access)
  uint64_t lines;       // device memory: distinct lines per access, summed
  uint64_t wavefronts;  // threadgroup memory: conflict-free wavefronts per access, summed
  uint64_t conflicts;   // threadgroup memory: extra wavefronts of bank conflicts, summed
} mtw_profile_site;

// One byte range a SIMD-group access of device memory touched (its lanes' pieces merged):
// a profile that asks for them gets every access's, so that the counts of a threadgroup
// whose addresses are another's moved by a constant can be made from the other's
// (backends/sim/report/sampling.py).
typedef struct mtw_profile_range {
  uint64_t pc;          // code offset of the access
  int32_t buffer;       // index into the buffer infos
  uint32_t kind;        // MTW_ACCESS_LOAD or MTW_ACCESS_STORE
  uint64_t access;      // which SIMD-group access of its threadgroup, in the order counted
  uint64_t lo, hi;      // byte offsets in the buffer: [lo, hi)
  uint32_t slot;        // its threadgroup's slot (0 without slots)
  uint32_t reserved;
} mtw_profile_range;

// A profile counts the whole dispatch, or (nslots > 0) each threadgroup of a list apart:
// then block_lanes, block_simd, block_groups and divergences hold nslots arrays one after
// another, sites nslots tables of max_sites, and slot_site_count the sites of each.
typedef struct mtw_profile {
  mtw_entry_fn entry;               // the profiled launch's entry (mtw_launch.entry)
  const mtw_buffer_info* buffers;   // the dispatch's buffers (MTW_BUFFER_INTERNAL: skipped)
  uint32_t nbuffers;
  uint32_t line_bytes;              // device memory line size (128)
  uint32_t threads;                 // threads per threadgroup (at most)
  uint32_t blocks;                  // instrumented blocks: ids 0 .. blocks - 1
  uint32_t branches;                // instrumented branches: ids 0 .. branches - 1
  uint32_t max_sites;               // room in `sites`
  // Filled by mtw_profile_collect:
  uint64_t* block_lanes;            // [blocks] executions, summed over threads
  uint64_t* block_simd;             // [blocks] SIMD-group issues (per SIMD-group the most
                                    // executions of one lane), summed
  uint64_t* block_groups;           // [blocks] threadgroup issues (the same per threadgroup)
  uint64_t* divergences;            // [branches] SIMD-group issues whose lanes went both ways
  uint64_t* distinct_lines;         // [nbuffers] lines touched at least once
  mtw_profile_site* sites;          // [max_sites], sorted by (pc, buffer, kind)
  mtw_profile_range* ranges;        // null, or [max_ranges]: every device access's ranges
  uint64_t max_ranges;
  uint64_t* range_count;            // filled: ranges recorded (more than max_ranges: lost)
  uint32_t nslots;                  // threadgroups counted apart (0: the dispatch as one)
  const uint64_t* slot_group;       // [nslots]: each slot's threadgroup (linear index)
  uint32_t* slot_site_count;        // [nslots], filled: sites of each slot
  // [nslots] or null: slots only checked against another threadgroup, whose accesses of
  // threadgroup memory and branches are hashed (slot_hashes), not lined up and counted
  const uint8_t* slot_checked;
  uint64_t* slot_hashes;            // [nslots * 2], zeroed, filled: each slot's hash of its
                                    // threadgroup-memory accesses, and of its branches
} mtw_profile;

// Arms the profiler for the next dispatch of `profile->entry`; nonzero (see
// mtw_profile_message) when its memory cannot be had. Dispatches of other entries are
// not counted.
int mtw_profile_arm(const mtw_profile* profile);
// After that dispatch: fills the results of the armed profile and disarms; returns the
// number of sites (more than max_sites: only the first max_sites were written).
uint32_t mtw_profile_collect(void);
// Disarms without results (after a failed dispatch).
void mtw_profile_disarm(void);
const char* mtw_profile_message(void);

#ifdef __cplusplus
}
#endif

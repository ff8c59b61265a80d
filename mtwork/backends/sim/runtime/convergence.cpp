// Where diverged threads meet again: threadgroup barriers and SIMD-group functions.
#include <stdio.h>
#include <string.h>

#include "scheduler.h"

namespace mtw {

namespace {

// Remembers that the lanes in `mask` completed a collective at `site`.
void remember_site(SimdWait& s, const void* site, uint32_t mask) {
  for (uint32_t i = 0; i < kSitesRemembered; ++i) {
    if (s.done_site[i] == site) {
      s.done_lanes[i] |= mask;
      return;
    }
  }
  uint32_t slot = s.done_next++ % kSitesRemembered;  // forget the oldest
  s.done_site[slot] = site;
  s.done_lanes[slot] = mask;
}

uint32_t lanes_done_at(const SimdWait& s, const void* site) {
  for (uint32_t i = 0; i < kSitesRemembered; ++i)
    if (s.done_site[i] == site) return s.done_lanes[i];
  return 0;
}

uint32_t lanes_in(const mtw_group& g, uint32_t simdgroup) {
  uint32_t first = simdgroup * MTW_SIMD_WIDTH;
  uint32_t left = g.nthreads - first;
  return left < MTW_SIMD_WIDTH ? left : MTW_SIMD_WIDTH;
}

bool lanes_at(const Worker* w, uint32_t sg, const void* site);

// Whether lanes at a threadgroup-memory step that have gone through `barriers` barriers
// are behind the lanes of their SIMD-group waiting at `barrier`: in the same interval
// between barriers, so still in the code before it, which goes first wherever the
// compiler laid that code out (fa_vec_common.metal's reduce: lane 0's stores and the
// lanes' loop over the output tile, before the barrier that ends each round).
bool steps_behind(const Worker* w, uint32_t sg, const void* barrier, uint32_t barriers) {
  uint32_t first = sg * MTW_SIMD_WIDTH, end = first + lanes_in(w->group, sg);
  for (uint32_t t = first; t < end; ++t)
    if (w->waits[t].kind == kAtBarrier && w->waits[t].site == barrier &&
        w->waits[t].barriers != barriers)
      return false;
  return true;
}

// Runs one collective for the lanes in `mask` and makes them runnable (except `self`,
// the lane that completed it and simply continues). Lanes at a threadgroup-memory step
// (always all of `mask` or none: a site is an access or a call) only go on: a step
// exchanges nothing, so it neither counts as a collective for the sanitizer (MSL orders
// lanes' accesses only through simdgroup_barrier and SIMD-group functions, and the race
// must still be reported) nor is divergence when other lanes are elsewhere (the lanes
// that skipped the access are inactive for it, as on the GPU).
void release_simd(Worker* w, uint32_t simdgroup, uint32_t mask, uint32_t self) {
  SimdWait& s = w->simd[simdgroup];
  const void* site = w->waits[simdgroup * MTW_SIMD_WIDTH + __builtin_ctz(mask)].site;
  if (!(s.stepping & mask)) {
    const void* ins[MTW_SIMD_WIDTH] = {};
    void* outs[MTW_SIMD_WIDTH] = {};
    mtw_combine_fn combine = nullptr;
    for (uint32_t lane = 0; lane < MTW_SIMD_WIDTH; ++lane) {
      if (!(mask & (1u << lane))) continue;
      ins[lane] = s.in[lane];
      outs[lane] = s.out[lane];
      if (!combine) combine = s.combine[lane];
    }
    if (w->dispatch->launch.sanitize) sanitizer_simd_release(w, simdgroup, mask, site);
    w->combining += 1;  // its memory accesses are no lane's steps
    combine(ins, outs, mask);
    w->combining -= 1;
    w->simd_epoch[simdgroup] += 1;
  }
  remember_site(s, site, mask);
  s.waiting &= ~mask;
  s.stepping &= ~mask;
  for (uint32_t lane = 0; lane < MTW_SIMD_WIDTH; ++lane) {
    if (!(mask & (1u << lane))) continue;
    uint32_t t = simdgroup * MTW_SIMD_WIDTH + lane;
    ThreadWait& tw = w->waits[t];
    tw.kind = kNotWaiting;
    tw.collectives++;
    if (t != self) w->runnable.push(tw.fiber);
  }
}

// When nothing can run, lanes of a SIMD-group that wait in collectives go ahead with the
// lanes that are there: lanes that returned or wait at a threadgroup barrier are inactive,
// as on the GPU. Lanes waiting at different call sites diverged, and the GPU would run one
// side with the others inactive until they reconverge. Which first: a site that other
// waiting lanes have already passed (they have left a loop these lanes are still in), else
// the site with the fewest collectives done (lanes behind go first, so the branches of an
// if/else each finish before the code after them), ties by lower code address. Returns
// whether any collective was released. A SIMD-group some of whose lanes wait at
// `barrier` (a barrier that can be released) at a lower code address than the collective
// is left alone: those lanes are behind, and go first.
bool release_stuck_simd(Worker* w, const void* barrier) {
  const mtw_group& g = w->group;
  uint32_t simdgroups = (g.nthreads + MTW_SIMD_WIDTH - 1) / MTW_SIMD_WIDTH;
  bool released = false;
  for (uint32_t sg = 0; sg < simdgroups; ++sg) {
    uint32_t waiting = w->simd[sg].waiting;
    if (!waiting) continue;
    // Lanes at threadgroup-memory steps first: a collective waits for every lane that can
    // still come to it.
    bool steps = w->simd[sg].stepping != 0;
    uint32_t candidates = steps ? w->simd[sg].stepping : waiting;
    const void* best_site = nullptr;
    bool best_passed = false;
    uint32_t best_count = 0, best_barriers = 0;
    for (uint32_t lane = 0; lane < MTW_SIMD_WIDTH; ++lane) {
      if (!(candidates & (1u << lane))) continue;
      const ThreadWait& tw = w->waits[sg * MTW_SIMD_WIDTH + lane];
      // Has a lane now waiting elsewhere completed this site before?
      uint32_t elsewhere = 0;
      for (uint32_t other = 0; other < MTW_SIMD_WIDTH; ++other)
        if ((waiting & (1u << other)) && w->waits[sg * MTW_SIMD_WIDTH + other].site != tw.site)
          elsewhere |= 1u << other;
      bool passed = (lanes_done_at(w->simd[sg], tw.site) & elsewhere) != 0;
      bool better = !best_site || (passed && !best_passed) ||
                    (passed == best_passed &&
                     (tw.collectives < best_count ||
                      (tw.collectives == best_count && tw.site < best_site)));
      if (better) {
        best_site = tw.site;
        best_passed = passed;
        best_count = tw.collectives;
        best_barriers = tw.barriers;
      }
    }
    if (barrier && lanes_at(w, sg, barrier) &&
        !(steps && steps_behind(w, sg, barrier, best_barriers)) &&
        barrier < best_site)
      continue;
    uint32_t mask = 0;
    for (uint32_t lane = 0; lane < MTW_SIMD_WIDTH; ++lane) {
      if ((candidates & (1u << lane)) && w->waits[sg * MTW_SIMD_WIDTH + lane].site == best_site)
        mask |= 1u << lane;
    }
    release_simd(w, sg, mask, kNoThread);
    released = true;
  }
  return released;
}

// Barriers as Apple GPUs run them. A threadgroup barrier counts SIMD-groups, not
// threads: a SIMD-group executes the barrier instruction once, for whichever of its lanes
// are active, and lanes that have returned are simply inactive. So threads that exited
// never hold a barrier back, and a barrier inside a branch that only some lanes of each
// SIMD-group take completes once every SIMD-group with live lanes has reached it, its
// other lanes waiting at their reconvergence point. MLX relies on both: gemv.h and
// gemv_t's loop put threadgroup_barrier inside `if (thrN == 0)` and
// `if (out_col < out_vec_size)`, fft.h returns out-of-bounds threads before its barriers,
// and MLX ships these kernels for Apple GPUs. The MSL specification (section 6.9) asks
// every thread of the threadgroup to execute the barrier and leaves such code undefined,
// so the sanitizer reports each such barrier as barrier divergence.
//
// Here, where each lane runs on as far as it can, a lane that skipped the barrier is
// blocked further on (at another barrier or a SIMD-group function) or has returned. A
// barrier is released when every SIMD-group with live lanes has at least one lane
// waiting at it. Which first, when several can be: one no waiting lane has gone round a
// loop to (the lanes at the others are behind), then the lowest code address.
constexpr uint32_t kBarrierCandidates = 16;

bool lanes_at(const Worker* w, uint32_t sg, const void* site) {
  uint32_t first = sg * MTW_SIMD_WIDTH, end = first + lanes_in(w->group, sg);
  for (uint32_t t = first; t < end; ++t)
    if (w->waits[t].kind == kAtBarrier && w->waits[t].site == site) return true;
  return false;
}

// Whether every SIMD-group with live lanes has a lane waiting at `site`.
bool every_simdgroup_at(const Worker* w, const void* site) {
  const mtw_group& g = w->group;
  uint32_t simdgroups = (g.nthreads + MTW_SIMD_WIDTH - 1) / MTW_SIMD_WIDTH;
  for (uint32_t sg = 0; sg < simdgroups; ++sg) {
    if (g.simd_done[sg] == lanes_in(g, sg)) continue;  // every lane returned
    if (!lanes_at(w, sg, site)) return false;
  }
  return true;
}

// The barrier to release when nothing can run, or null if none can be.
const void* releasable_barrier(const Worker* w) {
  const mtw_group& g = w->group;
  const void* sites[kBarrierCandidates];
  uint32_t count = 0;
  for (uint32_t t = 0; t < g.nthreads && count < kBarrierCandidates; ++t) {
    const ThreadWait& tw = w->waits[t];
    if (tw.kind != kAtBarrier) continue;
    bool seen = false;
    for (uint32_t i = 0; i < count && !seen; ++i) seen = sites[i] == tw.site;
    if (!seen) sites[count++] = tw.site;
  }
  const void* best = nullptr;
  bool best_looped = false;
  for (uint32_t i = 0; i < count; ++i) {
    if (!every_simdgroup_at(w, sites[i])) continue;
    bool looped = false;
    for (uint32_t t = 0; t < g.nthreads && !looped; ++t)
      looped = w->waits[t].kind == kAtBarrier && w->waits[t].site == sites[i] &&
               w->waits[t].last_barrier == sites[i];
    if (!best || (best_looped && !looped) || (looped == best_looped && sites[i] < best)) {
      best = sites[i];
      best_looped = looped;
    }
  }
  return best;
}

// Lets the threads waiting at `site` go on (except `self`, which simply continues).
void release_barrier(Worker* w, const void* site, uint32_t self) {
  const mtw_group& g = w->group;
  uint32_t released = 0, first_here = kNoThread, first_missing = kNoThread;
  const void* rest_site = nullptr;  // where the threads left waiting wait
  uint32_t rest_elsewhere = 0;
  for (uint32_t u = 0; u < g.nthreads; ++u) {
    ThreadWait& tw = w->waits[u];
    if (tw.kind == kAtBarrier && tw.site == site) {
      tw.kind = kNotWaiting;
      tw.last_barrier = site;
      tw.barriers++;
      ++released;
      if (first_here == kNoThread) first_here = u;
      if (u != self) w->runnable.push(tw.fiber);
      continue;
    }
    if (first_missing == kNoThread) first_missing = u;
    if (tw.kind != kAtBarrier) continue;
    if (!rest_site) rest_site = tw.site;
    else if (tw.site != rest_site) ++rest_elsewhere;
  }
  w->barrier_arrived -= released;
  w->barrier_site = rest_site;
  w->barrier_elsewhere = rest_elsewhere;
  w->barrier_epoch += 1;
  if (first_missing != kNoThread && w->dispatch->launch.sanitize)
    sanitizer_report(w, MTW_FINDING_BARRIER_DIVERGENCE, first_here, first_missing, site);
}

}  // namespace

// Nothing can run: release a collective or a barrier. Returns false on a true deadlock.
bool resolve_stuck(Worker* w) {
  const void* barrier = releasable_barrier(w);
  if (release_stuck_simd(w, barrier)) return true;
  if (!barrier) return false;
  release_barrier(w, barrier, kNoThread);
  return true;
}

// A true deadlock: threads wait at a barrier that some SIMD-group with live lanes has
// none at, and no collective is left to release.
void report_deadlock(Worker* w) {
  const mtw_group& g = w->group;
  uint32_t here = kNoThread, there = kNoThread;
  for (uint32_t t = 0; t < g.nthreads && there == kNoThread; ++t) {
    if (w->waits[t].kind != kAtBarrier) continue;
    here = t;
    for (uint32_t u = 0; u < g.nthreads; ++u) {
      if (w->waits[u].kind == kAtBarrier && w->waits[u].site != w->waits[t].site &&
          !lanes_at(w, u / MTW_SIMD_WIDTH, w->waits[t].site)) {
        there = u;
        break;
      }
    }
  }
  if (there == kNoThread) there = here;
  char first[160] = "", second[160] = "";
  if (here != kNoThread) describe_thread(w, here, first, sizeof(first));
  if (there != kNoThread) describe_thread(w, there, second, sizeof(second));
  if (w->dispatch->launch.sanitize && here != kNoThread)
    sanitizer_report(w, MTW_FINDING_BARRIER_DIVERGENCE, here, there, w->waits[here].site);
  w->failure = MTW_DEADLOCK;
  snprintf(w->message, sizeof(w->message),
           "barrier divergence: threads wait at different threadgroup_barrier calls (%s and "
           "%s) and no SIMD-group has lanes at both, so neither barrier can complete; every "
           "SIMD-group with threads still running must reach the same barrier",
           first, second);
}

}  // namespace mtw

using namespace mtw;

extern "C" void mtw_threadgroup_barrier(uint32_t) {
  Fiber* f = current_fiber();
  Worker* w = f->worker;
  check_may_block(w, "threadgroup_barrier");
  mtw_group& g = w->group;
  uint32_t t = g.current;
  const void* site = __builtin_return_address(0);
  ThreadWait& tw = w->waits[t];
  tw.kind = kAtBarrier;
  tw.site = site;
  tw.fiber = f;
  f->thread = t;
  if (w->barrier_arrived == 0) w->barrier_site = site;
  else if (site != w->barrier_site) ++w->barrier_elsewhere;
  // Go on at once when every live thread waits here; when some wait at other barriers,
  // the scheduler decides (release_barrier's rule) once nothing else can run.
  if (++w->barrier_arrived + g.done < g.nthreads || w->barrier_elsewhere) {
    block(w, f);
    return;
  }
  release_barrier(w, site, t);
}

namespace mtw {

namespace {

// Lane `t` of `f` now waits at `site`: released at once (as `t`, which goes on) when every
// live lane of its SIMD-group waits at that site, else suspended.
__attribute__((always_inline)) inline void wait_in_simdgroup(Worker* w, Fiber* f, uint32_t t, const void* site) {
  mtw_group& g = w->group;
  uint32_t sg = t / MTW_SIMD_WIDTH;
  SimdWait& s = w->simd[sg];
  ThreadWait& tw = w->waits[t];
  tw.kind = kAtSimd;
  tw.site = site;
  tw.fiber = f;
  f->thread = t;
  uint32_t alive = lanes_in(g, sg) - g.simd_done[sg];
  if (uint32_t(__builtin_popcount(s.waiting)) == alive) {
    bool same_site = true;
    for (uint32_t l = 0; l < MTW_SIMD_WIDTH && same_site; ++l)
      if ((s.waiting & (1u << l)) && w->waits[sg * MTW_SIMD_WIDTH + l].site != site)
        same_site = false;
    if (same_site) {
      release_simd(w, sg, s.waiting, t);
      return;
    }
  }
  block(w, f);
}

}  // namespace

// SIMD-group lockstep for threadgroup memory. On Apple GPUs a SIMD-group executes each
// instruction once for all its active lanes, so a threadgroup store by one lane is seen
// by every lane's next load, and every lane's load comes before any lane's store that
// follows it in the code, with no simdgroup_barrier between; llama.cpp's vector flash
// attention relies on both (fa_vec_common.metal: lane 0 overwrites the scores `ss`
// that the other lanes read just before, and its reduce across SIMD-groups reads and
// rewrites `ss` the same way). Fibers run each lane on to its next synchronisation point
// in turn, so in a kernel that needs it (lockstep.py decides from the source, and the
// library traces its loads and stores) every threadgroup-memory access is a step of the
// SIMD-group: the lane waits until the other live lanes are blocked too (at an access, a
// SIMD-group function or a barrier, or returned), then the lanes at the same access go
// on together, each to its next step. Diverged lanes are ordered as for SIMD-group
// functions (release_stuck_simd), steps before collectives.
void simd_step(Worker* w, const void* site) {
  Fiber* f = current_fiber();
  uint32_t t = w->group.current;
  SimdWait& s = w->simd[t / MTW_SIMD_WIDTH];
  uint32_t bit = 1u << (t % MTW_SIMD_WIDTH);
  s.waiting |= bit;
  s.stepping |= bit;
  wait_in_simdgroup(w, f, t, site);
}

}  // namespace mtw

extern "C" void mtw_simd_collective(const void* in, void* out, mtw_combine_fn combine) {
  Fiber* f = current_fiber();
  Worker* w = f->worker;
  check_may_block(w, "a SIMD-group function");
  uint32_t t = w->group.current;
  uint32_t lane = t % MTW_SIMD_WIDTH;
  SimdWait& s = w->simd[t / MTW_SIMD_WIDTH];
  s.in[lane] = in;
  s.out[lane] = out;
  s.combine[lane] = combine;
  s.waiting |= 1u << lane;
  wait_in_simdgroup(w, f, t, __builtin_return_address(0));
}

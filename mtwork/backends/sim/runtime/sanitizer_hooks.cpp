// Checks that sanitize builds of kernels call directly, beside the memory accesses
// (sanitizer.cpp): array subscripts past their bound, and SIMD-group functions that read
// an inactive lane.
#include <string.h>

#include "sanitizer.h"
#include "scheduler.h"

namespace mtw {

namespace {

// What clang's -fsanitize=array-bounds hands its handler (compiler-rt's ubsan_handlers.h
// and ubsan_value.h: the check's source location, the array's and the index's types).
struct UbsanLocation {
  const char* file;
  uint32_t line, column;
};
struct UbsanType {
  uint16_t kind;  // 0: an integer
  uint16_t info;  // integers: bit 0 set when signed, the rest log2 of the width in bits
  char name[1];   // e.g. 'float[8]', quotes included
};
struct UbsanOutOfBounds {
  UbsanLocation where;
  const UbsanType* array;
  const UbsanType* index;
};

// The index as a signed number (ubsan passes integers up to 64 bits by value, wider ones
// by address).
int64_t index_value(const UbsanType* type, uintptr_t value) {
  uint32_t bits = 1u << (type->info >> 1);
  uint64_t v = bits <= 64 ? uint64_t(value) : *reinterpret_cast<const uint64_t*>(value);
  if (bits >= 64) return int64_t(v);
  uint64_t mask = (uint64_t(1) << bits) - 1;
  v &= mask;
  if ((type->info & 1) && (v >> (bits - 1))) v |= ~mask;  // sign-extend
  return int64_t(v);
}

// The outermost extent in a type name such as 'float[8][4]' (8), or 0.
uint32_t extent_of(const char* type_name) {
  const char* open = strchr(type_name, '[');
  uint32_t n = 0;
  for (const char* c = open ? open + 1 : ""; *c >= '0' && *c <= '9'; ++c) n = n * 10 + (*c - '0');
  return n;
}

}  // namespace

}  // namespace mtw

using namespace mtw;

// An array subscripted outside its bound: reported (with the array's type in the table of
// arrays, so the report can give its extent) and the kernel goes on, as the GPU would.
extern "C" void __ubsan_handle_out_of_bounds(UbsanOutOfBounds* data, uintptr_t index) {
  Worker* w = worker_here();
  if (!w || !w->in_kernel || !w->dispatch->launch.sanitize) return;
  mtw_finding f = sanitizer_finding(w, MTW_FINDING_ARRAY_INDEX, w->group.current,
                                    __builtin_return_address(0));
  f.element = index_value(data->index, index);
  f.tg_array = sanitizer_array(w, kNotThreadgroup, extent_of(data->array->name),
                               data->array->name, 0);
  sanitizer_record(w, f);
}

// A SIMD-group function's combine step found lane `lane`'s source lane `source` inactive
// (returned, waiting elsewhere, or past the end of a partial SIMD-group): Metal leaves the
// result undefined. `ins` is the collective's argument table, which names the SIMD-group
// being released.
extern "C" void mtw_sanitizer_inactive_lane(const void* const* ins, uint32_t lane,
                                            uint32_t source) {
  Worker* w = worker_here();
  if (!w || !w->dispatch->launch.sanitize || lane >= MTW_SIMD_WIDTH) return;
  uint32_t simdgroups = (w->group.nthreads + MTW_SIMD_WIDTH - 1) / MTW_SIMD_WIDTH;
  for (uint32_t sg = 0; sg < simdgroups; ++sg) {
    const SimdWait& s = w->simd[sg];
    if (!(s.waiting & (1u << lane)) || s.in[lane] != ins[lane]) continue;
    uint32_t t = sg * MTW_SIMD_WIDTH + lane;
    mtw_finding f = sanitizer_finding(w, MTW_FINDING_INACTIVE_LANE, t, w->waits[t].site);
    f.element = source;
    sanitizer_position(w, sg * MTW_SIMD_WIDTH + source, f.other);
    sanitizer_record(w, f);
    return;
  }
}

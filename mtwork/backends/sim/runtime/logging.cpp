// Kernels' log messages (os_log, include/mtw_logging.h): each printed here, when the
// kernel calls, into the dispatch's log (runtime.h), with the calling thread's position
// and the call's source line. Printed at once, the message holds everything it needs (a
// string argument's characters too), so the log survives the process that ran the
// kernel: the worker's log is in the memory it shares with mtwork.
//
// Only the fiber engine knows which thread runs: a message from a kernel run as plain
// loops or on the fast engine stops the dispatch (MTW_LOGGED), which runs again on fibers.
#include <stdio.h>
#include <string.h>

#include "mtw_log_format.h"
#include "scheduler.h"

using namespace mtw;

namespace {

struct Text {
  char bytes[MTW_LOG_TEXT_MAX];
  size_t size = 0;
  bool cut = false;

  void add(const char* s, size_t n) {
    if (size + n > sizeof(bytes)) {
      n = sizeof(bytes) - size;
      cut = true;
    }
    memcpy(bytes + size, s, n);
    size += n;
  }
  // snprintf's result, which may say more than the room it had.
  void added(int wanted, size_t room) {
    if (wanted < 0) return;
    if (size_t(wanted) >= room) {
      size += room ? room - 1 : 0;
      cut = true;
    } else {
      size += size_t(wanted);
    }
  }
};

// The bits of component `k` as the conversion's length modifier reads them (what a
// variadic call's argument of that size holds on a little-endian machine).
uint64_t integer_bits(const mtw_log_arg& a, int k, const mtw_log::Spec& s) {
  uint64_t bits = a.kind == MTW_LOG_FLOAT ? uint64_t(int64_t(a.value.f[k])) : a.value.u[k];
  const bool is_signed = s.conversion == 'd' || s.conversion == 'i';
  switch (s.length) {
    case mtw_log::kHH:
      bits = is_signed ? uint64_t(int64_t(int8_t(bits))) : uint64_t(uint8_t(bits));
      break;
    case mtw_log::kH:
      bits = is_signed ? uint64_t(int64_t(int16_t(bits))) : uint64_t(uint16_t(bits));
      break;
    case mtw_log::kNone:
    case mtw_log::kHL:
      bits = is_signed ? uint64_t(int64_t(int32_t(bits))) : uint64_t(uint32_t(bits));
      break;
    default:
      break;
  }
  return bits;
}

// One component with the conversion's flags, width and precision (`head`: the text
// between '%' and the vector specifier, length modifier or conversion).
void print_component(Text& out, const char* head, size_t head_size, const mtw_log::Spec& s,
                     const int* stars, int nstars, const mtw_log_arg& a, int k) {
  char format[48] = "%";
  size_t f = 1;
  if (head_size > sizeof(format) - 8) head_size = sizeof(format) - 8;
  memcpy(format + f, head, head_size);
  f += head_size;
  const char c = s.conversion;
  if (s.takes == mtw_log::kInteger && c != 'c') format[f++] = 'l', format[f++] = 'l';
  format[f++] = c;
  format[f] = 0;
  char* at = out.bytes + out.size;
  const size_t room = sizeof(out.bytes) - out.size;
  int wanted = 0;
#define MTW_PRINT(value)                                                                  \
  wanted = nstars == 2   ? snprintf(at, room, format, stars[0], stars[1], value)          \
           : nstars == 1 ? snprintf(at, room, format, stars[0], value)                    \
                         : snprintf(at, room, format, value)
  if (s.takes == mtw_log::kFloat) {
    const double v = a.kind == MTW_LOG_FLOAT    ? a.value.f[k]
                     : a.kind == MTW_LOG_SIGNED ? double(a.value.i[k])
                                                : double(a.value.u[k]);
    MTW_PRINT(v);
  } else if (s.takes == mtw_log::kString) {
    MTW_PRINT(a.value.p ? static_cast<const char*>(a.value.p) : "(null)");
  } else if (s.takes == mtw_log::kPointer) {
    MTW_PRINT(a.value.p);
  } else if (c == 'c') {
    MTW_PRINT(int(uint8_t(a.value.u[k])));
  } else {
    const uint64_t bits = integer_bits(a, k, s);
    if (c == 'd' || c == 'i') {
      MTW_PRINT((long long)bits);
    } else {
      MTW_PRINT((unsigned long long)bits);
    }
  }
#undef MTW_PRINT
  out.added(wanted, room);
}

// `format` printed with `args` (the call's format was checked when the kernel compiled;
// what does not fit it anyway prints as "?").
void print_message(Text& out, const char* format, const mtw_log_arg* args, uint32_t count) {
  uint32_t next = 0;
  for (size_t i = 0; format[i] && !out.cut;) {
    if (format[i] != '%') {
      size_t run = 0;
      while (format[i + run] && format[i + run] != '%') ++run;
      out.add(format + i, run);
      i += run;
      continue;
    }
    const mtw_log::Spec s = mtw_log::parse(format, i);
    if (s.takes == mtw_log::kNothing && !s.problem) {
      out.add("%", 1);
      i = s.end;
      continue;
    }
    int stars[2] = {0, 0}, nstars = 0;
    for (int n = s.width_star + s.precision_star; n > 0 && next < count; --n)
      stars[nstars++] = int(args[next++].value.i[0]);
    if (s.problem || next >= count) {
      out.add("?", 1);
      i = s.end;
      continue;
    }
    // The flags, width and precision: up to the vector specifier, length or conversion.
    size_t head_end = i + 1;
    while (format[head_end] && (mtw_log::is_digit(format[head_end]) ||
                                strchr("-+ #0.*", format[head_end])))
      ++head_end;
    const mtw_log_arg& a = args[next++];
    const int components = s.vector ? int(a.count) : 1;
    for (int k = 0; k < components && k < 4; ++k) {
      if (k) out.add(",", 1);
      print_component(out, format + i + 1, head_end - i - 1, s, stars, nstars, a, k);
    }
    i = s.end;
  }
}

uint16_t clipped(size_t n) { return uint16_t(n < 0xFFFF ? n : 0xFFFF); }

void write_record(mtw_log_header* log, const Worker* w, uint32_t level, const char* file,
                  uint32_t line, const char* subsystem, const char* category, const Text& text) {
  const mtw_group& g = w->group;
  const uint16_t file_bytes = clipped(strlen(file));
  const uint16_t subsystem_bytes = clipped(subsystem ? strlen(subsystem) : 0);
  const uint16_t category_bytes = clipped(category ? strlen(category) : 0);
  const size_t body = sizeof(mtw_log_record) + file_bytes + subsystem_bytes + category_bytes +
                      text.size;
  const uint64_t size = (body + 7) & ~uint64_t(7);
  const uint64_t offset = __atomic_fetch_add(&log->used, size, __ATOMIC_RELAXED);
  if (offset + size > log->capacity) {
    __atomic_fetch_add(&log->dropped, 1, __ATOMIC_RELAXED);
    // The one reservation that ran past the end marks where the records end (a record
    // of size 0), when its first 8 bytes fit.
    if (offset + 8 <= log->capacity) {
      mtw_log_record* end = reinterpret_cast<mtw_log_record*>(
          reinterpret_cast<char*>(log + 1) + offset);
      end->size = 0;
      __atomic_store_n(&end->serial, log->serial, __ATOMIC_RELEASE);
    }
    return;
  }
  char* at = reinterpret_cast<char*>(log + 1) + offset;
  mtw_log_record* r = reinterpret_cast<mtw_log_record*>(at);
  r->size = uint32_t(size);
  const uint32_t i = g.current;
  const uint32_t local[3] = {i % g.tg_size[0], (i / g.tg_size[0]) % g.tg_size[1],
                             i / (g.tg_size[0] * g.tg_size[1])};
  for (int k = 0; k < 3; ++k) {
    r->group[k] = g.group_pos[k];
    r->thread[k] = local[k];
  }
  r->index = i;
  r->line = line;
  r->level = uint8_t(level);
  r->cut = text.cut;
  r->file_bytes = file_bytes;
  r->subsystem_bytes = subsystem_bytes;
  r->category_bytes = category_bytes;
  r->text_bytes = uint16_t(text.size);
  r->reserved = 0;
  char* p = at + sizeof(mtw_log_record);
  memcpy(p, file, file_bytes);
  p += file_bytes;
  if (subsystem_bytes) memcpy(p, subsystem, subsystem_bytes);
  p += subsystem_bytes;
  if (category_bytes) memcpy(p, category, category_bytes);
  p += category_bytes;
  memcpy(p, text.bytes, text.size);
  if (text.cut) __atomic_fetch_add(&log->truncated, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&log->messages, 1, __ATOMIC_RELAXED);
  __atomic_store_n(&r->serial, log->serial, __ATOMIC_RELEASE);
}

}  // namespace

extern "C" void mtw_log_message(uint32_t level, const char* subsystem, const char* category,
                                const char* format, const char* file, uint32_t line,
                                const mtw_log_arg* args, uint32_t count) {
  Worker* w = worker_here();
  mtw_log_header* log = w->dispatch ? w->dispatch->launch.log : nullptr;
  if (!log) return;
  if (w->group.barrier_free)
    fail(w, MTW_LOGGED, "the kernel logged (os_log) where the emulator does not track "
                        "which thread runs");
  Text text;
  print_message(text, format, args, count);
  write_record(log, w, level, file ? file : "", line, subsystem, category, text);
}

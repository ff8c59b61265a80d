// Metal's logging functions (MSL 3.2 specification, section 6.19 "Logging Functions"):
// `os_log_default.log("i = %u", i)`, and an `os_log(subsystem, category)` object's `log`,
// `log_debug`, `log_info`, `log_error` and `log_fault`.
//
// Each call's format is checked against its arguments while the kernel compiles: the
// format must be a string literal, each conversion one the logging functions take
// (include/mtw_log_format.h) and each argument of the class its conversion prints, as many
// arguments as conversions. A refused format stops the constant evaluation of the
// format's constructor in `__os_log_format::refuse`, whose arguments (the problem, the
// format, the conversion's offset) clang quotes in its note; the compiler's message is
// then told in the author's words (compile/log_formats.py).
//
// At run time the message goes to the runtime (mtw_log_message), which prints it into the
// dispatch's log with the running thread's position and the call's source line.
#pragma once

#include "mtw_log_format.h"

namespace metal {

namespace __os_log_format {

template <typename T>
struct identity {
  using type = T;
};

struct Arg {
  mtw_log::Takes takes;
  uint8_t count;  // components; 1 for a scalar
};

template <typename T>
consteval mtw_log::Takes takes_of() {
  using E = remove_cv_t<T>;
  if constexpr (is_integral_v<E> || is_same_v<E, bool> || __is_enum(E))
    return mtw_log::kInteger;
  else if constexpr (is_floating_point_v<E>)
    return mtw_log::kFloat;
  else if constexpr (is_pointer_v<E>)
    return is_same_v<remove_cv_t<__remove_pointer(E)>, char> ? mtw_log::kString
                                                              : mtw_log::kPointer;
  else
    return mtw_log::kUnsupported;
}

template <typename T>
consteval Arg arg_of() {
  if constexpr (__is_vec_v<T>) {
    constexpr mtw_log::Takes element = takes_of<__elem_t<T>>();
    return {element == mtw_log::kInteger || element == mtw_log::kFloat ? element
                                                                       : mtw_log::kUnsupported,
            uint8_t(__vec_traits<remove_cvref_t<T>>::size)};
  } else {
    return {takes_of<T>(), 1};
  }
}

// Never defined: a call of it is not a constant expression, which ends the check.
void refused_format(const char* problem);

consteval void refuse(const char* problem, const char* format, size_t offset) {
  if (problem) refused_format(problem);
  (void)format, (void)offset;
}

consteval bool fits(mtw_log::Takes wanted, const Arg& given) {
  if (given.takes == wanted) return true;
  return wanted == mtw_log::kPointer && given.takes == mtw_log::kString;
}

// Checks a value argument against its conversion; its offset in the format is `at`.
consteval void check_value(const mtw_log::Spec& s, const Arg& a, const char* f, size_t at) {
  if (a.takes == mtw_log::kUnsupported)
    refuse("the argument is of a type the logging functions cannot print (scalars, "
           "vectors of numbers, string literals and pointers)", f, at);
  if (s.vector && a.count == 1)
    refuse("a vector specifier takes a vector; the argument is a scalar", f, at);
  if (s.vector && a.count != s.vector)
    refuse("the vector specifier's component count differs from the argument's", f, at);
  if (!s.vector && a.count > 1)
    refuse("the argument is a vector: print it with a vector specifier such as %v4f or "
           "%v3u", f, at);
  if (fits(s.takes, a)) return;
  if (s.takes == mtw_log::kInteger)
    refuse("the conversion prints an integer; the argument is not one", f, at);
  else if (s.takes == mtw_log::kFloat)
    refuse("the conversion prints a float (float, half or bfloat); the argument is not one",
           f, at);
  else if (s.takes == mtw_log::kString)
    refuse("%s prints a string literal; the argument is not a pointer to characters", f, at);
  else
    refuse("%p prints a pointer; the argument is not one", f, at);
}

// A logging call's format, checked against the argument types `Args`, with the call's
// place in the source (the defaults are evaluated where the call is written).
template <typename... Args>
struct checked {
  const char* text;
  const char* file;
  uint32_t line;

  template <size_t N>
  consteval checked(const char (&format)[N], const char* file = __builtin_FILE(),
                    uint32_t line = __builtin_LINE())
      : text(format), file(file), line(line) {
    constexpr Arg args[] = {arg_of<Args>()..., Arg{mtw_log::kNothing, 0}};
    constexpr size_t given = sizeof...(Args);
    size_t next = 0;
    for (size_t i = 0; i + 1 < N && format[i]; ++i) {
      if (format[i] != '%') continue;
      const mtw_log::Spec s = mtw_log::parse(format, i);
      if (s.problem) refuse(s.problem, format, i);
      const size_t at = i;
      i = s.end - 1;
      if (s.takes == mtw_log::kNothing) continue;
      for (int stars = s.width_star + s.precision_star; stars > 0; --stars, ++next) {
        if (next >= given)
          refuse("the format has more conversions than the call has arguments", format, at);
        if (args[next].takes != mtw_log::kInteger || args[next].count != 1)
          refuse("a * width or precision takes an int argument", format, at);
      }
      if (next >= given)
        refuse("the format has more conversions than the call has arguments", format, at);
      check_value(s, args[next++], format, at);
    }
    if (next < given)
      refuse("the call has more arguments than the format has conversions", format, N - 1);
  }

  // Any other format (a `constant char*` variable, a string built at run time).
  template <typename P>
    requires(!__is_array(__remove_reference_t(P)))
  checked(P&&) = delete("the format of a logging function must be a string literal");
};

template <typename T>
using same = typename identity<T>::type;

template <typename T>
MTW_INLINE void pack_scalar(mtw_log_arg& a, int k, T v) {
  using E = remove_cv_t<T>;
  if constexpr (is_floating_point_v<E>) {
    a.kind = MTW_LOG_FLOAT;
    a.value.f[k] = double(float(v));
  } else if constexpr (is_pointer_v<E>) {
    a.kind = takes_of<E>() == mtw_log::kString ? MTW_LOG_STRING : MTW_LOG_POINTER;
    a.value.p = (const void*)v;
  } else if constexpr (__is_enum(E)) {
    a.kind = MTW_LOG_SIGNED;
    a.value.i[k] = (int64_t)v;
  } else if constexpr (is_signed_v<E>) {
    a.kind = MTW_LOG_SIGNED;
    a.value.i[k] = int64_t(v);
  } else {
    a.kind = MTW_LOG_UNSIGNED;
    a.value.u[k] = uint64_t(v);
  }
}

template <typename T>
MTW_INLINE mtw_log_arg pack(const T& v) {
  mtw_log_arg a{};
  if constexpr (__is_vec_v<T>) {
    constexpr int n = __vec_traits<remove_cvref_t<T>>::size;
    a.count = n;
    for (int k = 0; k < n; ++k) pack_scalar(a, k, __elem_t<T>(v[k]));
  } else {
    a.count = 1;
    pack_scalar(a, 0, v);
  }
  return a;
}

// Defined (and kept) in a kernel library only when a logging call is compiled into it:
// mtwork looks this symbol up to give a dispatch a log only where a message can come
// (run/runtime.py), so a kernel that does not log runs as if logging did not exist.
template <typename = void>
struct logs {
  static const char marker;
};
template <typename T>
__attribute__((used, visibility("default"))) const char logs<T>::marker = 1;
// `logs<void>`, named through the call's argument types so that only a call makes it.
template <typename T, typename...>
struct first_of {
  using type = T;
};

template <typename... Args>
MTW_INLINE void emit(uint32_t level, const char* subsystem, const char* category,
                     const checked<Args...>& format, const Args&... args) {
  (void)&logs<typename first_of<void, Args...>::type>::marker;
  if constexpr (sizeof...(Args) == 0) {
    mtw_log_message(level, subsystem, category, format.text, format.file, format.line,
                    nullptr, 0);
  } else {
    const mtw_log_arg packed[] = {pack(args)...};
    mtw_log_message(level, subsystem, category, format.text, format.file, format.line,
                    packed, sizeof...(Args));
  }
}

}  // namespace __os_log_format

struct os_log {
  const char* subsystem = nullptr;
  const char* category = nullptr;

  constexpr os_log() = default;
  constexpr os_log(const char* subsystem, const char* category)
      : subsystem(subsystem), category(category) {}

#define MTW_OS_LOG_LEVEL(name, level)                                                   \
  template <typename... Args>                                                            \
  METAL_FUNC void name(__os_log_format::checked<__os_log_format::same<Args>...> format,  \
                       Args... args) const {                                             \
    __os_log_format::emit<Args...>(level, subsystem, category, format, args...);         \
  }
  MTW_OS_LOG_LEVEL(log, MTW_LOG_DEFAULT)
  MTW_OS_LOG_LEVEL(log_debug, MTW_LOG_DEBUG)
  MTW_OS_LOG_LEVEL(log_info, MTW_LOG_INFO)
  MTW_OS_LOG_LEVEL(log_error, MTW_LOG_ERROR)
  MTW_OS_LOG_LEVEL(log_fault, MTW_LOG_FAULT)
#undef MTW_OS_LOG_LEVEL
};

// Metal's default log object (MSL 3.2 §6.19, `os_log_default.log("x = %d", x)`): no
// subsystem or category. The shim declares it here and nowhere else.
inline constexpr os_log os_log_default{};

}  // namespace metal

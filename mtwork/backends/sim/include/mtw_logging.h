// os_log for kernels: accepted and ignored (Metal prints it only under a debugger).
#pragma once

namespace metal {
struct os_log {
  constexpr os_log(const char*, const char*) {}
  constexpr os_log() {}
  template <typename... Args>
  void log_debug(const char*, Args...) const {}
  template <typename... Args>
  void log_info(const char*, Args...) const {}
  template <typename... Args>
  void log_error(const char*, Args...) const {}
  template <typename... Args>
  void log_fault(const char*, Args...) const {}
  template <typename... Args>
  void log(const char*, Args...) const {}
};
template <typename... Args>
void os_log_default_log(const char*, Args...) {}
// The default log object (MSL 3.2 specification, section 6.19 "Logging Functions"):
// `os_log_default.log("x = %d", x)`.
inline constexpr os_log os_log_default{};
}  // namespace metal

// Minimal leveled logging to stderr.  The level is process-wide: CHORUS_DEBUG,
// which the API layer reads (api/config.cpp) and sets here; Warn until then.
#pragma once

#include <fmt/format.h>

namespace chorus::log {

enum class Level { None = 0, Warn = 1, Info = 2, Trace = 3 };

Level level();
void setLevel(Level lvl);
void write(Level lvl, std::string_view msg);

template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (level() >= Level::Warn) write(Level::Warn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (level() >= Level::Info) write(Level::Info, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void trace(fmt::format_string<Args...> f, Args&&... args) {
  if (level() >= Level::Trace) write(Level::Trace, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace chorus::log

#include "common/log.hpp"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "common/env.hpp"

namespace chorus::log {

Level level() {
  // Read once: the level is a process-wide setting, not per communicator.
  static const Level lvl = [] {
    std::string s = env::getString("CHORUS_DEBUG");
    if (s == "NONE") return Level::None;
    if (s == "INFO") return Level::Info;
    if (s == "TRACE") return Level::Trace;
    return Level::Warn;
  }();
  return lvl;
}

void write(Level lvl, std::string_view msg) {
  static constexpr const char* kNames[] = {"", "WARN", "INFO", "TRACE"};
  std::string line = fmt::format("chorus {} [pid {}]: {}\n", kNames[static_cast<int>(lvl)], getpid(), msg);
  (void)!::write(2, line.data(), line.size());
}

}  // namespace chorus::log

#include "common/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>


namespace chorus::log {

namespace {
// Relaxed: a log line racing a level change may use either level.
std::atomic<Level> g_level{Level::Warn};
}  // namespace

Level level() { return g_level.load(std::memory_order_relaxed); }
void setLevel(Level lvl) { g_level.store(lvl, std::memory_order_relaxed); }

void write(Level lvl, std::string_view msg) {
  static constexpr const char* kNames[] = {"", "WARN", "INFO", "TRACE"};
  std::string line = fmt::format("chorus {} [pid {}]: {}\n", kNames[static_cast<int>(lvl)], getpid(), msg);
  (void)!::write(2, line.data(), line.size());
}

}  // namespace chorus::log

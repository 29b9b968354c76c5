#include "clock/offset.hpp"

#include <time.h>

#include <algorithm>
#include <atomic>
#include <vector>


namespace chorus::clock {

namespace {
// Relaxed: one load per timestamp, as the function-local static it replaces.
std::atomic<int64_t> g_injected_ns{0};
}  // namespace

int64_t injectedOffsetNs() { return g_injected_ns.load(std::memory_order_relaxed); }
void setInjectedOffsetNs(int64_t ns) { g_injected_ns.store(ns, std::memory_order_relaxed); }

int64_t traceNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec + injectedOffsetNs();
}

OffsetEstimate estimateOffset(std::span<const Exchange> xs) {
  OffsetEstimate e;
  e.samples = static_cast<int>(xs.size());
  if (xs.empty()) return e;
  int64_t min_rtt = xs.front().rtt();
  for (const Exchange& x : xs) min_rtt = std::min(min_rtt, x.rtt());
  const int64_t margin = std::max<int64_t>(min_rtt / 8, 1000);
  std::vector<int64_t> kept;
  for (const Exchange& x : xs)
    if (x.rtt() <= min_rtt + margin) kept.push_back(x.offset());
  std::sort(kept.begin(), kept.end());
  e.offset_ns = kept[kept.size() / 2];
  e.rtt_ns = std::max<int64_t>(min_rtt, 0);
  e.bound_ns = e.rtt_ns / 2;
  e.used = static_cast<int>(kept.size());
  return e;
}

}  // namespace chorus::clock

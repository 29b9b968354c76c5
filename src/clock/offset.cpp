#include "clock/offset.hpp"

#include <time.h>

#include <algorithm>
#include <vector>

#include "common/env.hpp"

namespace chorus::clock {

int64_t injectedOffsetNs() {
  static const int64_t v = [] {
    auto r = env::getInt("CHORUS_CLOCK_OFFSET_NS");
    return r.isOk() ? r.value() : int64_t{0};
  }();
  return v;
}

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

// Pipeline slicing shared by the ring-shaped plans (ring.cpp, exact.cpp).
#pragma once

#include "plan/partition.hpp"
#include "plan/plan.hpp"

namespace chorus::plan {

// Calls f(k, s) for k in [0, steps) and s in [0, slices) in wavefront order.
template <typename F>
void wavefront(uint64_t steps, uint64_t slices, F&& f) {
  for (uint64_t d = 0; d + 1 < steps + slices; ++d)
    for (uint64_t k = 0; k < steps; ++k)
      if (d >= k && d - k < slices) f(k, d - k);
}

// Slice s of a block [begin, begin + len) cut into S slices.
struct Slicer {
  uint64_t S;
  [[nodiscard]] Region of(Buf buf, uint64_t begin, uint64_t len, uint64_t s) const {
    uint64_t a = partBegin(len, S, s), b = partBegin(len, S, s + 1);
    return {buf, begin + a, b - a};
  }
};

}  // namespace chorus::plan

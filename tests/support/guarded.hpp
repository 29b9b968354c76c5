// A test buffer with guard bytes on each side: what a transfer writes past
// either end of the usable bytes shows up as a changed guard.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace chorus::support {

struct Guarded {
  static constexpr size_t kGuard = 4096;
  static constexpr std::byte kGuardByte{0xA5};

  explicit Guarded(size_t bytes, std::byte fill = std::byte{0x5C}) : n(bytes), mem(bytes + 2 * kGuard, kGuardByte) {
    std::fill(data(), data() + n, fill);
  }
  std::byte* data() { return mem.data() + kGuard; }
  [[nodiscard]] bool guardsIntact() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (mem[i] != kGuardByte || mem[kGuard + n + i] != kGuardByte) return false;
    return true;
  }
  [[nodiscard]] bool all(std::byte v) { return std::all_of(data(), data() + n, [&](std::byte b) { return b == v; }); }

  size_t n;
  std::vector<std::byte> mem;
};

}  // namespace chorus::support

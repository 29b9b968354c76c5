// Index arithmetic shared by the algorithm families.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace chorus::plan {

// Splits total into parts nearly equal pieces; piece i is
// [partBegin(total, parts, i), partBegin(total, parts, i + 1)).  The first
// total % parts pieces get one extra element.
constexpr uint64_t partBegin(uint64_t total, uint64_t parts, uint64_t i) {
  return total / parts * i + std::min(i, total % parts);
}

// How many pipeline slices a block of `elems` is cut into for chunk size
// `chunk` (0 = no chunking).
constexpr uint64_t numSlices(uint64_t elems, uint64_t chunk) {
  if (chunk == 0 || elems <= chunk) return 1;
  return (elems + chunk - 1) / chunk;
}

constexpr int mod(int a, int n) { return ((a % n) + n) % n; }

// Largest power of two <= n (n >= 1).
constexpr int pof2Floor(int n) { return static_cast<int>(std::bit_floor(static_cast<unsigned>(n))); }
// Smallest power of two >= n (n >= 1).
constexpr int pof2Ceil(int n) { return static_cast<int>(std::bit_ceil(static_cast<unsigned>(n))); }
// Lowest set bit of v (v > 0).
constexpr int lowBit(int v) { return v & -v; }

}  // namespace chorus::plan

// The host layout of a shape (Shape::hosts) as the two-level plans read it:
// hierarchical.cpp and the compressed hierarchical allreduce (compressed.cpp).
#pragma once

#include <algorithm>
#include <vector>

#include "plan/plan.hpp"

namespace chorus::plan {

// The host layout of a shape, or H == 0 when the plans do not handle it.
struct HostLayout {
  int H = 0, L = 0;
  std::vector<int> host, local;  // per rank
  std::vector<int> at;           // at[g * L + l]: the rank on host g with local index l

  explicit HostLayout(const Shape& sh) {
    const int n = sh.nranks;
    if (n < 1 || sh.hosts.size() != static_cast<size_t>(n)) return;
    host.assign(n, -1);
    local.assign(n, 0);
    std::vector<int> ids, sizes;  // host id and rank count per host index
    for (int r = 0; r < n; ++r) {
      const int id = sh.hosts[r];
      int g = static_cast<int>(std::find(ids.begin(), ids.end(), id) - ids.begin());
      if (g == static_cast<int>(ids.size())) {
        ids.push_back(id);
        sizes.push_back(0);
      }
      host[r] = g;
      local[r] = sizes[g]++;
    }
    const int h = static_cast<int>(ids.size());
    for (int s : sizes)
      if (s != sizes[0]) return;
    H = h;
    L = sizes[0];
    at.assign(n, 0);
    for (int r = 0; r < n; ++r) at[host[r] * L + local[r]] = r;
  }
  [[nodiscard]] bool ok() const { return H >= 2; }
  [[nodiscard]] int rank(int g, int l) const { return at[g * L + l]; }
};

}  // namespace chorus::plan

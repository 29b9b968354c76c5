#include "sim/placement.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "sim/train.hpp"

namespace chorus::sim {

int64_t alignedDomainUse(const ClusterSpec& c, const TrainConfig& k) {
  const int64_t g = c.node.domainSize();
  const int64_t t = k.tp, cp = k.cp, d = k.dp;
  // The blocks of consecutive ranks each group occupies in Megatron's order.
  std::vector<int64_t> blocks{t, t * cp, k.pp_before_dp ? t * cp * k.pp : t * cp * d};
  if (k.ep > 1) blocks.push_back(k.etp > 0 ? int64_t{k.etp} * k.ep : t * cp * k.ep);
  int64_t unit = 1;
  for (int64_t b : blocks)
    if (b >= 1 && b <= g) unit = std::lcm(unit, b);
  if (unit > g) unit = *std::max_element(blocks.begin(), blocks.end(), [&](int64_t a, int64_t b) {
    return (a <= g ? a : 0) < (b <= g ? b : 0);
  });
  const int64_t used = std::max<int64_t>(1, g - g % std::max<int64_t>(unit, 1));
  if (used * c.nodes < k.gpus) return g;  // the job needs the spare GPUs too
  return used;
}

Result<ClusterSpec> placedCluster(const ClusterSpec& c, int64_t used, int64_t job_gpus) {
  const int64_t g = c.node.domainSize();
  if (used < 1 || used > g)
    return invalidArgument("--gpus-per-domain {}: must be in [1, {}] (the GPUs of one NVLink domain of '{}')", used, g,
                           c.name);
  if (used < g && used * c.nodes < job_gpus)
    return invalidArgument("--gpus-per-domain {}: {} domains x {} = {} GPUs, fewer than the job's {} (cluster '{}')", used,
                           c.nodes, used, used * c.nodes, job_gpus, c.name);
  ClusterSpec p = c;
  p.node.domain_gpus = g;
  p.node.gpus = static_cast<int>(used);
  if (used != g) {
    const double f = static_cast<double>(used) / static_cast<double>(g);
    p.network.nics_per_node = std::max(1, static_cast<int>(std::lround(c.network.nics_per_node * f)));
    p.node.nvls_reduce_tflops = c.node.nvls_reduce_tflops * f;  // 0 (by generation) stays 0: it scales per GPU
  }
  return p;
}

std::string describePlacement(const ClusterSpec& placed, int64_t job_gpus) {
  const int64_t used = placed.node.gpus, g = placed.node.domainSize();
  const int64_t domains = (job_gpus + used - 1) / used;
  const std::string of = used == g ? fmt::format("{} GPUs", used) : fmt::format("{} of {} GPUs", used, g);
  return fmt::format("{} in each of {} NVLink domain{}", of, domains, domains == 1 ? "" : "s");
}

}  // namespace chorus::sim

// JSON views of the simulator's results (what `chorus-sim ... --json` prints).
#pragma once

#include <nlohmann/json.hpp>

#include "sim/network.hpp"
#include "sim/train.hpp"

namespace chorus::sim {

struct CollectiveReport {
  std::string collective, algo, bottleneck;
  int64_t gpus = 0;
  double bytes = 0, time_us = 0, algbw_gbps = 0, busbw_gbps = 0, latency_us = 0;
};

// Prices `collective` of `bytes` over the first `gpus` GPUs of the cluster
// (ranks in GPU order) with the analytical model.
Result<CollectiveReport> simulateCollective(const ClusterSpec& c, int64_t gpus, std::string_view collective, double bytes,
                                            std::string_view algo, const plan::Registry& reg);

nlohmann::json toJson(const CollectiveReport& r);
nlohmann::json toJson(const TrainReport& r);

// "1G", "256M", "4K", "1048576" -> bytes (binary multiples, as nccl-tests).
Result<double> parseBytes(std::string_view text);
Result<Recompute> parseRecompute(std::string_view text);

}  // namespace chorus::sim

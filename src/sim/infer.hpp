// The inference-service model: a request stream (Poisson arrivals, input and
// output length distributions) served by replicas of `tp` GPUs, either
// aggregated (each replica prefills and decodes, continuous batching with
// prefill first, as vLLM) or disaggregated (separate prefill and decode pools;
// each request's KV cache crosses the modelled network from its prefill
// replica to a decode replica, as DistServe / Splitwise).  Phase costs come
// from the same roofline as training (GEMMs at shape-dependent efficiency,
// decode bound by reading weights and KV cache from HBM) and the library's
// plans for the tensor-parallel allreduces and the KV transfer.
#pragma once

#include <string>
#include <vector>

#include "sim/network.hpp"

namespace chorus::sim {

enum class LengthDist { Fixed, Uniform, Exponential };
Result<LengthDist> parseLengthDist(std::string_view text);

struct InferConfig {
  int64_t gpus = 8;
  int tp = 0;                   // GPUs per replica; 0 = the smallest power of two (<= a node) that fits
  double rate = 10;             // requests per second (Poisson)
  int64_t requests = 2000;
  int64_t input_len = 1024, output_len = 256;  // means
  LengthDist dist = LengthDist::Fixed;  // uniform: [0.5, 1.5] x mean; exponential: mean (at least 1)
  double ttft_slo_s = 1.0, tpot_slo_s = 0.05;
  int64_t max_batch = 256;          // running requests per replica
  int64_t prefill_tokens = 8192;    // tokens per prefill batch
  int prefill_replicas = 0;         // disaggregated: 0 = try every split
  bool fp8 = false;
  uint64_t seed = 1;
};

struct ServeStats {
  std::string mode;  // "aggregated" or "disaggregated"
  int prefill_replicas = 0, decode_replicas = 0;  // aggregated: replicas in decode_replicas
  double ttft_p50_s = 0, ttft_p90_s = 0, ttft_p99_s = 0;
  double tpot_p50_s = 0, tpot_p90_s = 0, tpot_p99_s = 0;
  double throughput_rps = 0, tokens_per_s = 0;
  double slo_attainment = 0, goodput_rps = 0;  // requests meeting both SLOs (per second of the run)
  double kv_transfer_mean_s = 0;
};

struct InferReport {
  InferConfig config;
  int tp = 1, replicas = 1;
  double prefill_s_per_request = 0, decode_step_s = 0;  // at the mean length, batch 1
  double kv_bytes_per_request = 0, kv_capacity_tokens = 0;
  ServeStats aggregated;
  std::vector<ServeStats> splits;  // disaggregated, every split tried
  ServeStats best_disaggregated;
  std::string best;  // "aggregated" or "disaggregated P:D"
};

// The ranges of every InferConfig value (flag names in the messages).
Status checkInferConfig(const InferConfig& cfg);

Result<InferReport> simulateInference(const ModelSpec& m, const InferConfig& cfg, NetworkModel& net);

}  // namespace chorus::sim

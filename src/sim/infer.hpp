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

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "sim/network.hpp"

namespace chorus::sim {

enum class LengthDist { Fixed, Uniform, Exponential };
Result<LengthDist> parseLengthDist(std::string_view text);

// How requests arrive, as serving benchmarks drive a server (vLLM's
// benchmark_serving: --request-rate, --max-concurrency; offline: every request at once).
enum class LoadMode { OpenLoop, ClosedLoop, Offline };

struct InferConfig {
  int64_t gpus = 8;
  int tp = 0;                   // GPUs per replica; 0 = the smallest power of two (<= a node) that fits
  double rate = 10;             // requests per second (Poisson), open loop
  // Closed loop: `concurrency` users, each sending its next request when its
  // previous one completes (0: open loop at `rate`).
  int64_t concurrency = 0;
  bool max_throughput = false;  // offline: every request arrives at t = 0
  // Chunked prefill (vLLM V1, SGLang): every step carries the running
  // requests' decode tokens and, within `prefill_tokens` in all, chunks of
  // prompts; false: prefill-first batches of whole prompts, decode paused.
  bool chunked_prefill = false;
  bool kv_fp8 = false;          // fp8 KV cache (1 byte per element)
  bool kv_paged = false;        // KV allocated as tokens grow, newest preempted when full (vLLM); false: reserved whole at admission (TensorRT-LLM's GUARANTEED_NO_EVICT)
  // --kv-alloc paged: the paged decode-attention kernel's extra time over a
  // contiguous-cache kernel, as a fraction of the cache read (vLLM's block-table
  // lookups and branches: 20-26 % in Kwon et al. 2023, sec. 7.1, Fig. 18a; the
  // low end by default; 0 for a kernel measured at parity).
  double paged_overhead = 0.20;
  // Engine costs beside the model's kernels (docs/simulator.md, "Engine costs"):
  // the fraction of each prompt found in the prefix cache (its KV reused, its
  // tokens not prefilled; at least one token of each prompt is); host time
  // per engine step the GPU waits for (scheduling, input preparation: 0 by
  // default, no public per-step figure for an engine that overlaps it); and
  // per request before its prefill can start (HTTP, tokenisation: 0 by
  // default, likewise).  Sampling is always priced (Replica::sample).
  double prefix_hit = 0;
  double step_overhead_s = 0;
  double request_overhead_s = 0;
  double e2e_slo_s = 0;         // end-to-end latency SLO for goodput (0: none)
  int64_t requests = 2000;
  int64_t input_len = 1024, output_len = 256;  // means
  LengthDist dist = LengthDist::Fixed;  // uniform: [0.5, 1.5] x mean; exponential: mean (at least 1)
  double ttft_slo_s = 1.0, tpot_slo_s = 0.05;
  int64_t max_batch = 256;          // running requests per replica
  int64_t prefill_tokens = 8192;    // tokens per prefill batch
  int prefill_replicas = 0;         // disaggregated: 0 = try every split
  int decode_tp = 0;                // disaggregated: GPUs per decode replica (0 = tp); with --ep its attention group
  int decode_ep = 0;                // disaggregated with --ep: GPUs per decode replica's expert group (0 = ep)
  // MoE serving with expert parallelism: replicas of `ep` GPUs, experts
  // spread over all of them, attention over `tp` of them (ep / tp
  // data-parallel attention groups); 0 or 1: experts split over tp like the rest.
  int ep = 0;
  bool fp8 = false;             // fp8 weights (1 byte each) and fp8 GEMMs
  std::string attention_kernel;  // the prefill's fused attention curves (TrainConfig::attention_kernel; "" = the GPU's default)
  // Speculative decoding: `spec_tokens` = K drafted tokens per step, each
  // accepted with probability `spec_acceptance` (the first rejection ends the
  // run; the target's step verifies all K and adds one token of its own, so a
  // step yields 1..K+1 tokens, (1 - a^(K+1)) / (1 - a) on average: Leviathan
  // et al. 2023).  Drafted by the model's MTP modules (DeepSeek-V3's
  // num_nextn_predict_layers) unless `draft_model` is given; either is
  // priced as K decode steps of the drafter on the same GPUs.
  int spec_tokens = 0;
  double spec_acceptance = 0;
  std::shared_ptr<const ModelSpec> draft_model;
  bool record = false;  // keep the aggregated run's steps and requests (InferReport::steps, ::requests) for --trace
  bool aggregated = true;     // run the aggregated service
  bool disaggregated = true;  // run the disaggregated splits (open loop and offline)
  bool capacity = true;       // open loop: also run the same requests offline for each mode's capacity
  // A host emulation (sim/infer_host.hpp): the demo's arrival times (a JSON
  // list, or `kv_disagg prefill --out`'s requests) instead of a Poisson draw.
  std::string arrivals_path;
  uint64_t seed = 1;
  [[nodiscard]] LoadMode load() const {
    return max_throughput ? LoadMode::Offline : concurrency > 0 ? LoadMode::ClosedLoop : LoadMode::OpenLoop;
  }
};

// Mean, median and tail of one latency, in seconds.
struct Latency {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};

// The metrics as vLLM's benchmark_serving defines them: TTFT = first token -
// arrival; TPOT = (last token - first token) / (output - 1) per request; ITL
// = every gap between consecutive tokens of a request, pooled; E2E = last
// token - arrival.  Throughputs over the run (first arrival to last token).
struct ServeStats {
  std::string mode;  // "aggregated" or "disaggregated"
  int prefill_replicas = 0, decode_replicas = 0;  // aggregated: replicas in decode_replicas
  int decode_tp = 0;                              // disaggregated: GPUs per decode replica (its attention group under ep)
  int decode_ep = 0;                              // disaggregated expert-parallel: GPUs per decode replica
  double ttft_p50_s = 0, ttft_p90_s = 0, ttft_p99_s = 0;
  double tpot_p50_s = 0, tpot_p90_s = 0, tpot_p99_s = 0;
  Latency ttft, tpot, itl, e2e;
  double throughput_rps = 0, tokens_per_s = 0;  // requests/s, output tokens/s
  double total_tokens_per_s = 0;                // input + output tokens/s
  // Output tokens/s one user sees while its answer streams: mean over
  // requests of (output - 1) / (last token - first token).
  double per_user_tokens_per_s = 0;
  double slo_attainment = 0, goodput_rps = 0;  // requests meeting every SLO (per second of the run)
  double kv_transfer_mean_s = 0;
  double duration_s = 0;
  int64_t max_running = 0;  // most requests decoding at once on one replica
  int64_t preemptions = 0;  // --kv-alloc paged: requests preempted (recomputed) for lack of KV cache
  // Stability (open loop): the offered rate against the service's capacity
  // (its completion rate with every request queued at once: the same
  // requests run offline), and whether the queue still grows at the end:
  // the requests arrived but not yet started (no first token) when the
  // last one arrives, against the same when the middle one arrives
  // (docs/simulator.md, "Overload").
  double offered_rps = 0, capacity_rps = 0;
  int64_t backlog_mid = 0, backlog_end = 0;
  bool queue_growing = false, overloaded = false;
  [[nodiscard]] std::string label() const;  // "aggregated", "disaggregated 1:3 (decode tp 4)"
};

// One engine step of a replica (--trace).
struct ServeStep {
  int replica = 0;
  double start_s = 0, duration_s = 0;
  int64_t decodes = 0, prefill_tokens = 0;  // decoding requests; prompt tokens prefilled in the step
  int64_t prefill_pending = 0;              // chunked prefill: prompt tokens of started prompts left after the step
};
// One request's life (--trace): arrival, first token, last token, on a replica.
struct ServeRequest {
  int replica = 0;
  double arrival_s = 0, first_s = 0, done_s = 0;
  int64_t input = 0, output = 0;
};

struct InferReport {
  InferConfig config;
  int tp = 1, ep = 1, replicas = 1;
  double a2a_latency_s = 0;  // --ep: the all-to-all's fixed cost over the replica's GPUs
  double prefill_s_per_request = 0, decode_step_s = 0;  // at the mean length, batch 1
  double sample_s = 0;  // sampling one token of one request (logits to a token; Replica::sample)
  double kv_bytes_per_request = 0, kv_capacity_tokens = 0;
  double weight_bytes_per_gpu = 0, kv_capacity_bytes = 0;  // per GPU
  double draft_step_s = 0;          // speculative decoding: the drafter's K steps at batch 1
  double expected_tokens_per_step = 1;
  ServeStats aggregated;
  // Disaggregated, every split tried, best first: by goodput, then TTFT p50
  // (lower first), then fewer prefill replicas (rankSplits).
  std::vector<ServeStats> splits;
  ServeStats best_disaggregated;  // splits.front()
  std::string best;  // "aggregated" or "disaggregated P:D"
  std::vector<ServeStep> steps;        // with config.record: the aggregated run
  std::vector<ServeRequest> requests;  // with config.record
};

// The ranges of every InferConfig value (flag names in the messages).
Status checkInferConfig(const InferConfig& cfg);

// --trace: the aggregated run as a Chrome trace (a track of steps per
// replica, an async span per request: queued + prefill, then decode).
Status writeServeTrace(const InferReport& r, std::ostream& out);
// --plot with a concurrency sweep: per-user tokens/s and TTFT against output
// tokens/s per GPU, one point per concurrency (needs python3 + matplotlib).
Status plotServeSweep(const std::vector<std::pair<int64_t, InferReport>>& runs, const std::string& title,
                      const std::string& png);

Result<InferReport> simulateInference(const ModelSpec& m, const InferConfig& cfg, NetworkModel& net);

// The ranking of disaggregated splits that text and JSON share: goodput
// (higher first), then TTFT p50 (lower first), then fewer prefill replicas.
void rankSplits(std::vector<ServeStats>& splits);

// --max-rate: the highest open-loop rate at which at least `attainment` of
// the requests meet every SLO (DistServe's goodput), for the aggregated
// service and each disaggregated split, found by bisection between 0 and
// the mode's capacity (to 1 % of it); capped at the capacity (`capped`) when
// the SLOs still hold there.  0: not even the lowest rate tried meets them.
struct MaxRate {
  std::string mode;  // ServeStats::label()
  int prefill_replicas = 0, decode_replicas = 0;
  double capacity_rps = 0, max_rate_rps = 0;
  double attainment_at_max = 0;
  bool capped = false;  // the SLOs hold at the capacity itself: the service, not the SLOs, limits the rate
  int runs = 0;  // simulations the bisection took
};
Result<std::vector<MaxRate>> findMaxRates(const ModelSpec& m, const InferConfig& cfg, NetworkModel& net,
                                          double attainment);

}  // namespace chorus::sim

// What-if sweeps (`chorus-sim sweep`, issue 42 item 5): one job -- a
// collective, a training layout, a layout search or a serving deployment
// (rate, replica layout, disaggregated P:D split) -- priced on every point
// of a grid of cluster parameters (NIC rate, spine oversubscription, NVLink
// domain size, NVLink rate, HBM capacity, GPU type, leaf size) and layout
// values (tp, pp, dp, cp, ep, micro-batch), each point saying what binds.
// docs/simulator.md, "What-if sweeps".
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/infer.hpp"
#include "sim/search.hpp"
#include "sim/train.hpp"

namespace chorus::sim {

// One axis: a key and its values, from "KEY=V1,V2,..." (or "KEY=LO:HI" for
// a doubling range of numbers, as --bytes sweeps).
struct SweepAxis {
  std::string key;
  std::vector<std::string> values;
};
Result<SweepAxis> parseSweepAxis(std::string_view text);
// The keys an axis may name, for errors and --help.
std::string sweepKeysText();
bool isLayoutKey(std::string_view key);
// Serving keys: rate (req/s, open loop), concurrency (closed loop), gpus,
// tp, decode_tp, ep, prefill_replicas, pd ("P:D": P prefill and D decode
// replicas, which must fill --gpus), max_batch, input, output, prefix_hit.
bool isServeKey(std::string_view key);

// Sets one cluster parameter.  nic_gbit_s (every NIC's line rate),
// oversubscription (leaf down:up), nvlink_domain (GPUs per NVLink domain:
// node.gpus, with the NICs per GPU, the GPUs per leaf and the total GPUs
// kept), nvlink_gbyte_s, hbm_gib, leaf_nodes, gpu (a cluster file whose gpu
// block replaces this one's: "GPU type").  Errors name the key and value.
Status applyClusterValue(ClusterSpec* c, std::string_view key, std::string_view value);
// Sets one layout value (tp, pp, dp, cp, ep, micro_batch) of a training job.
Status applyLayoutValue(TrainConfig* t, std::string_view key, std::string_view value);
// Sets one serving value; `pd_decode` receives pd's D (0 when the key is not pd).
Status applyServeValue(InferConfig* ic, std::string_view key, std::string_view value, int* pd_decode);

struct SweepJob {
  enum class Kind { Collective, Train, Search, Serve } kind = Kind::Collective;
  // collective
  std::string collective = "allreduce", algo = "auto";
  double bytes = 0;
  int64_t gpus = 0;
  // train / search
  const ModelSpec* model = nullptr;
  TrainConfig train;
  SearchConfig search;
  // serve: the service (InferConfig); with a split (pd or prefill_replicas)
  // the point is that disaggregated split, else the aggregated service.
  InferConfig infer;
  NetMode mode = NetMode::Analytical;
  Library library = Library::Nccl;
};

struct SweepPoint {
  std::vector<std::pair<std::string, std::string>> values;  // one per axis, in axis order
  bool ok = false;
  std::string error;       // why the point has no figure (does not fit, layout does not divide, ...)
  double time_s = 0;       // the collective's or the iteration's time
  double rate = 0;         // busbw GB/s (collective) or tokens/s (train, search)
  double mfu = 0;          // train, search
  double memory_gib = 0;   // train, search
  std::string binds;       // what binds: the collective's link, or the step's bottleneck and its link
  std::string bound;       // train, search: the binding lower bound (resource)
  std::string algo;        // collective: the algorithm; search: the best layout; serve: the mode ("aggregated", "disaggregated 1:3")
  // serve: time_s is TTFT p50, rate output tokens/s, the rest below.
  double ttft_p90_s = 0, tpot_p50_s = 0, tpot_p90_s = 0;
  double throughput_rps = 0, goodput_rps = 0, slo_attainment = 0, capacity_rps = 0, tokens_per_s_per_gpu = 0;
  bool overloaded = false;
};

// Every point of the grid (the first axis varies slowest), priced with a
// fresh topology and network model per cluster.  A point that cannot be
// priced carries its error; an error in the axes themselves fails the sweep.
Result<std::vector<SweepPoint>> runSweep(const ClusterSpec& base, const std::vector<SweepAxis>& axes,
                                         const SweepJob& job, const plan::Registry& reg);

nlohmann::json toJson(const SweepPoint& p);
// The table `chorus-sim sweep` prints.
std::string formatSweep(const std::vector<SweepAxis>& axes, const std::vector<SweepPoint>& pts, SweepJob::Kind kind);

}  // namespace chorus::sim

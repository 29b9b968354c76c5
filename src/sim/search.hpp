// The layout search: every valid (tp, pp, dp, cp, ep classic or folded with
// etp 1, vpp, micro-batch,
// ZeRO stage, recomputation) for a model on N GPUs of a cluster at a global
// batch, each simulated by simulateTraining on a network model shared by
// every layout with the same placement (its collective cache makes the
// thousands of layouts cheap), ranked by iteration time.
#pragma once

#include <functional>
#include <vector>

#include "sim/train.hpp"

namespace chorus::sim {

struct SearchConfig {
  int64_t gpus = 0;
  int64_t global_batch = 1;
  int64_t seq = 2048;
  int top = 10;            // how many layouts to keep
  bool fp8 = false;
  bool flash_attention = true;
  std::string attention_kernel;  // TrainConfig::attention_kernel of every layout ("" = the GPU's default)
  std::string algo;        // collective plan ("" = auto)
  int max_micro_batch = 16;
  // The best `resimulate` by the closed-form estimate are simulated again as
  // schedules (src/sim/schedule.hpp) and ranked by the schedule's time; 0:
  // rank by the estimate alone.
  int resimulate = 64;
  // GPUs of each NVLink domain the job uses (sim/placement.hpp); 0: each
  // layout's aligned default (alignedDomainUse).
  int64_t gpus_per_domain = 0;
  // MoE models: how every layout dispatches (TrainConfig's fields).
  TrainConfig::MoeDispatch moe_dispatch = TrainConfig::MoeDispatch::AllToAll;
  bool fp8_dispatch = false;
  bool moe_a2a_overlap = false;  // on every layout Megatron allows it on (ep >= 2, pp 1 or vpp >= 2, not full recompute)
  double moe_imbalance = 1;
  // Pipeline schedules to try on every layout that can run them: "1f1b"
  // (1F1B, interleaved with vpp > 1), "zb-h1" (vpp 1, pp >= 2), "dualpipe"
  // (vpp 1, even pp, an even number of micro-batches >= 2 pp).
  std::vector<std::string> pp_schedules = {"1f1b"};
  // Every layout's memory reserve (TrainConfig::memory_reserve_*; < 0: the default).
  double memory_reserve_gib = -1, memory_reserve_fraction = 0;
  int dropped_shown = 5;  // the nearest misses dropped for memory, kept in SearchResult::dropped
};

// "1f1b,zb-h1,dualpipe" (--pp-schedules): each at most once, at least one.
Result<std::vector<std::string>> parsePpSchedules(std::string_view text);

struct SearchResult {
  std::vector<TrainReport> top;  // fastest first
  int64_t candidates = 0;        // layouts enumerated (valid products and divisibility)
  int64_t feasible = 0;          // of which fit in memory and simulated
  std::string first_error;       // why the first candidate failed (when none is feasible)
  // Layouts over the HBM (with the reserve): how many, and the nearest
  // misses (the smallest shortfall first; each with its memory, reserve and
  // closed-form estimate).
  int64_t dropped_memory = 0;
  std::vector<TrainReport> dropped;
  int64_t resimulated = 0;       // layouts re-simulated as schedules
  double estimate_seconds = 0, schedule_seconds = 0;  // wall time of the two phases
};

// Enumerates the candidate layouts (cheap, no simulation).
std::vector<TrainConfig> enumerateLayouts(const ModelSpec& m, const ClusterSpec& c, const SearchConfig& sc);

// Estimates every candidate (closed form), then re-simulates the best
// sc.resimulate as schedules; `progress(done, total)` is called now and then
// from the calling thread (may be empty).
Result<SearchResult> searchLayouts(const ModelSpec& m, const SearchConfig& sc, NetworkModel& net,
                                   const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace chorus::sim

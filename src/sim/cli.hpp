// chorus-sim's commands (tools/chorus-sim.cpp is their thin main): each
// takes the parsed command line, checks every value's range before any file
// is read, runs src/sim and prints (text or --json).  The return value is
// the process's exit status: 0, or 1 after a message on stderr naming what
// was wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/infer.hpp"
#include "sim/search.hpp"
#include "sim/train.hpp"

namespace chorus::sim {

// Every option of every command, as the command line gives it (strings where
// the command parses and checks them itself).
struct CliOptions {
  // shared
  std::string cluster_path, model_path, network = "analytical", library = "nccl";
  // --node-topo: an NCCL topology XML whose node replaces the cluster file's
  // (sim/nccl_topo.hpp); what came from where is printed on stderr.
  std::string node_topo_path;
  bool json = false, verbose = false;
  bool allow_unknown_keys = false;  // --allow-unknown-keys: a near-miss Hugging Face key is ignored, not refused
  int64_t gpus_per_domain = 0;
  std::string memory_reserve = "default";
  // train, search: --moe-node-limit G:K, node-limited routing (each token's
  // experts inside its K best of G expert groups), overriding the model's
  // n_group / topk_group; only the hierarchical dispatcher honours it.
  std::string moe_node_limit;  // train, search: --memory-reserve (parseMemoryReserve)
  // --plan (repeatable): plan files or directories (docs/plan-format.md),
  // added to the built-in plans, so --algo can name them.
  std::vector<std::string> plan_paths;
  // model
  int64_t model_seq = 4096;
  // collective
  std::string collective = "allreduce", bytes_text = "1G", algo = "auto";
  std::string compress = "none";  // collective and train: bf16, fp8 or fp8:BLOCK (sim/compress.hpp)
  int64_t gpus = 0;
  // train
  TrainConfig tc;
  std::string recompute = "selective", micro = "1", trace_path, plot_path, pp_schedule = "1f1b",
              moe_dispatch = "alltoall", recompute_modules, grad_dtype = "fp32", moments = "fp32", optimizer = "adam",
              rank_order = "tp-cp-ep-dp-pp";
  std::string clock = "sustained";
  bool no_sp = false, no_flash = false, estimate_only = false, sync_tp = false, no_overlap_dp = false,
       no_grad_accum_fusion = false;
  // search
  SearchConfig sc;
  std::string pp_schedules = "1f1b";
  bool no_progress = false;
  // infer
  InferConfig ic;
  std::string lengths = "fixed", concurrency_text, draft_path, kv_alloc = "reserve";
  // sweep (src/sim/sweep.hpp): the axes ("KEY=V1,V2" each), the job, where the
  // JSON goes besides --json's stdout
  std::vector<std::string> vary;
  std::string sweep_job = "auto", sweep_out;
  // sweep --tp: 0 (not given) is a training job's 1 and a serving job's smallest replica that fits.  Its own
  // field: a default_val on o.tc.tp would set every subcommand's tp to 0 when the sweep command is defined.
  int sweep_tp = 0;
  std::string rate_text;       // --rate: one rate, a list or a range (parseRates); empty: ic.rate
  bool max_rate = false;       // --max-rate: the highest rate meeting the SLOs, per mode
  double slo_attainment = 0.9;  // --max-rate: the fraction of requests that must meet every SLO
};

int runModelCommand(const CliOptions& o);
int runCollectiveCommand(const CliOptions& o);
int runTrainCommand(CliOptions o);
int runSearchCommand(CliOptions o);
int runInferCommand(CliOptions o);
int runSweepCommand(CliOptions o);  // src/sim/cli_sweep.cpp

}  // namespace chorus::sim

// chorus-sim: predicts collectives, training steps, the best parallel layout
// and inference serving on modelled clusters from the library's own plans.
// A thin main: the command line into sim::CliOptions, then the command
// (src/sim/cli.cpp: check, run src/sim, print).
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "sim/cli.hpp"
#include "sim/config.hpp"
#include "sim/ep_price.hpp"

namespace {

using chorus::sim::CliOptions;

constexpr const char* per_domain_help =
    "GPUs of each NVLink domain the job uses (e.g. 64 of an NVL72 rack's 72); 0: the largest count that keeps "
    "every tp, cp, dp and expert-parallel block inside one domain";
constexpr const char* dispatch_help =
    "alltoall (every routed copy in one all-to-all each way, Megatron-Core's dispatcher) or hierarchical (once per "
    "destination node over the NICs, then NVLink; node-limited routing; DeepEP's normal kernels)";
constexpr const char* attention_kernel_help =
    "the fused attention kernel whose measured curves price the attention core: a name in the GPU's data file "
    "(configs/gpus/; Hopper: fa3, its default, or fa2 = FlashAttention-2 as PyTorch SDPA and pre-2024 stacks run "
    "it); default: the generation's own";
constexpr const char* reserve_help =
    "HBM per GPU kept out of the layout's reach: GiB (6 or 6GiB), a percentage of the HBM (8%), or default (the CUDA "
    "context 0.5 GiB + NCCL buffers per communicator + 5% allocator fragmentation; docs/simulator.md)";
constexpr const char* allow_unknown_help =
    "read a Hugging Face config whose unknown key is a near miss of a known one (num_key_value_head) instead of "
    "refusing it (the key is then ignored and the known one's default used)";
constexpr const char* node_limit_help =
    "node-limited routing G:K: each token's top-k experts inside its K best of G equal expert groups (DeepSeek-V3: "
    "8:4, one group per node of EP 64), overriding the model's n_group / topk_group; needs --moe-dispatch "
    "hierarchical (the all-to-all dispatcher sends every routed copy and cannot use it)";
constexpr const char* fp8_dispatch_help = "dispatch tokens in fp8 (1 B + a scale per 128), combine in bf16";
constexpr const char* imbalance_help = "the busiest expert's tokens over the mean (>= 1; 1: balanced)";
constexpr const char* a2a_overlap_help =
    "combined 1F1B (Megatron-Core's --overlap-moe-expert-parallel-comm): a forward and a backward of two "
    "micro-batches as one step, each one's expert all-to-all under the other's compute; needs ep >= 2, pp 1 or "
    "vpp >= 2, no full recomputation";

// `chorus-sim calibrate ARGS`: the calibration is torch's kernels and chorus-bench, so it is the Python module
// chorus.examples.calibrate (python/chorus/examples/calibrate.py); this runs it with the interpreter the package
// is built for (CHORUS_PYTHON, default /usr/bin/python3), the build tree's package first on PYTHONPATH when
// chorus-sim runs from a build tree, and CHORUS_BENCH set to the chorus-bench beside chorus-sim.
int runCalibrate(const std::vector<std::string>& args) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path dir = self.parent_path();
    const fs::path pkg = dir.parent_path() / "python";
    if (fs::exists(pkg / "chorus" / "examples" / "calibrate.py", ec)) {
      const char* old = std::getenv("PYTHONPATH");
      const std::string path = old && *old ? pkg.string() + ":" + old : pkg.string();
      setenv("PYTHONPATH", path.c_str(), 1);
    }
    if (!std::getenv("CHORUS_BENCH") && fs::exists(dir / "chorus-bench", ec))
      setenv("CHORUS_BENCH", (dir / "chorus-bench").c_str(), 1);
  }
  const char* py = std::getenv("CHORUS_PYTHON");
  const std::string python = py && *py ? py : "/usr/bin/python3";
  std::vector<std::string> argv_s = {python, "-m", "chorus.examples.calibrate"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv_c;
  for (std::string& a : argv_s) argv_c.push_back(a.data());
  argv_c.push_back(nullptr);
  execv(python.c_str(), argv_c.data());
  std::fprintf(stderr, "chorus-sim calibrate: cannot run %s: %s (set CHORUS_PYTHON to the interpreter chorus's "
               "Python package is built for)\n", python.c_str(), std::strerror(errno));
  return 1;
}

CLI::App* addModel(CLI::App& app, CliOptions& o) {
  CLI::App* mo = app.add_subcommand("model", "describe a model: parameters, FLOPs and KV cache per token, layer shapes");
  mo->add_option("--model", o.model_path, "chorus model JSON, a Hugging Face config.json, or a directory holding one")->required();
  mo->add_option("--seq", o.model_seq, "context length for the FLOPs and KV figures (default 4096)");
  mo->add_flag("--verbose", o.verbose, "also list the Hugging Face keys that were ignored");
  mo->add_flag("--allow-unknown-keys", o.allow_unknown_keys, allow_unknown_help);
  mo->add_flag("--json", o.json, "print JSON");
  return mo;
}

CLI::App* addCollective(CLI::App& app, CliOptions& o) {
  CLI::App* col = app.add_subcommand("collective", "time one collective on the first N GPUs of a cluster");
  col->add_option("--cluster", o.cluster_path, "cluster JSON (configs/clusters/)")->required();
  col->add_option("--node-topo", o.node_topo_path, "NCCL topology XML (NCCL_TOPO_FILE format): its node replaces the cluster file's (docs/simulator.md)")->default_str("none");
  col->add_option("--gpus", o.gpus, "number of GPUs (ranks in GPU order)")->required();
  col->add_option("--collective", o.collective, "allreduce, allgather, reducescatter, broadcast, alltoall, ...");
  col->add_option("--bytes", o.bytes_text, "size (nccl-tests convention), e.g. 1G, 256M; MIN:MAX sweeps doubling (8:8G)");
  col->add_option("--algo", o.algo, "auto, a chorus plan name, or an NCCL algorithm (ring, tree, nvls, nvlstree, collnet, pat; optionally /LL, /LL128, /Simple; nccl:NAME under any library)");
  col->add_option("--plan", o.plan_paths, "a plan file or directory (docs/plan-format.md; repeatable): proven by the verifier as it loads, its plans join the built-ins, so --algo can name them");
  col->add_option("--network", o.network, "analytical or flow");
  col->add_option("--library", o.library, "nccl (NCCL's algorithms and protocols, as its tuner picks), chorus (chorus's plans) or auto");
  col->add_option("--compress", o.compress,
                  "allreduce, reducescatter, allgather of fp32 data on a narrower wire: none, bf16, fp8 or fp8:BLOCK "
                  "(e4m3 with an fp32 scale per BLOCK elements, 32-1024, default 128); fp32 accumulation");
  col->add_flag("--json", o.json, "print JSON");
  return col;
}

CLI::App* addTrain(CLI::App& app, CliOptions& o) {
  CLI::App* tr = app.add_subcommand("train", "time one training iteration");
  tr->add_option("--model", o.model_path, "chorus model JSON, Hugging Face config.json or its directory (configs/models/)")->required();
  tr->add_flag("--verbose", o.verbose, "list the Hugging Face config keys that were ignored (stderr)");
  tr->add_flag("--allow-unknown-keys", o.allow_unknown_keys, allow_unknown_help);
  tr->add_option("--cluster", o.cluster_path, "cluster JSON (configs/clusters/)")->required();
  tr->add_option("--node-topo", o.node_topo_path, "NCCL topology XML (NCCL_TOPO_FILE format): its node replaces the cluster file's (docs/simulator.md)")->default_str("none");
  tr->add_option("--gpus", o.tc.gpus, "GPUs")->required();
  tr->add_option("--tp", o.tc.tp, "tensor parallel");
  tr->add_option("--pp", o.tc.pp, "pipeline parallel");
  tr->add_option("--dp", o.tc.dp, "data parallel (default: gpus / (tp x pp x cp))");
  tr->add_option("--cp", o.tc.cp, "context parallel");
  tr->add_option("--ep", o.tc.ep, "expert parallel (within dp x cp; with --etp across tp x cp x dp)");
  tr->add_option("--etp", o.tc.etp,
                 "expert tensor parallel: fold expert parallelism across tp x cp x dp (MoE parallel folding); "
                 "default: the experts split over tp");
  tr->add_option("--vpp", o.tc.vpp, "virtual pipeline stages per GPU (interleaved 1F1B)");
  tr->add_option("--gpus-per-domain", o.gpus_per_domain, per_domain_help);
  tr->add_option("--moe-dispatch", o.moe_dispatch, dispatch_help);
  tr->add_flag("--fp8-dispatch", o.tc.fp8_dispatch, fp8_dispatch_help);
  tr->add_option("--moe-node-limit", o.moe_node_limit, node_limit_help);
  tr->add_option("--moe-imbalance", o.tc.moe_imbalance, imbalance_help);
  tr->add_flag("--moe-a2a-overlap", o.tc.moe_a2a_overlap, a2a_overlap_help);
  tr->add_option("--first-stage-layers", o.tc.first_stage_layers,
                 "layers of the first pipeline stage (default 0: the uniform split)");
  tr->add_option("--pp-layout", o.tc.pp_layout,
                 "Megatron's --pipeline-model-parallel-layout: the pp x vpp virtual stages separated by '|', each of E "
                 "(embedding, first), t (layer), m (MTP depth, last), L (loss, last); (...)*N repeats; e.g. "
                 "\"Et|(tt|)*30mL\"");
  tr->add_option("--last-stage-layers", o.tc.last_stage_layers,
                 "layers of the last pipeline stage (default 0: the uniform split)");
  tr->add_option("--global-batch", o.tc.global_batch, "sequences per iteration")->required();
  tr->add_option("--micro-batch", o.micro, "sequences per micro-batch, or auto");
  tr->add_option("--seq", o.tc.seq, "sequence length");
  tr->add_option("--recompute", o.recompute, "none, selective, full");
  tr->add_option("--rank-order", o.rank_order,
                 "how ranks are numbered, innermost first: tp-cp-ep-dp-pp (Megatron's default) or tp-cp-ep-pp-dp "
                 "(Megatron's --use-tp-pp-dp-mapping: pipeline neighbours adjacent; without ep, cp or dp of 1)");
  tr->add_option("--optimizer", o.optimizer,
                 "adam (Megatron's, the default) or sgd (plain SGD without momentum: no state, the step reads the "
                 "parameter and gradient and writes the parameter; the CPU job chorus.examples.train_gpt)");
  tr->add_option("--optimizer-moments", o.moments,
                 "Adam's two moments: fp32 or bf16 (DeepSeek-V3's low-precision optimizer states; Megatron's "
                 "--exp-avg-dtype / --exp-avg-sq-dtype bf16); the fp32 master weights stay");
  tr->add_option("--grad-dtype", o.grad_dtype,
                 "the gradient buffer: fp32 (main gradients, Megatron's --accumulate-allreduce-grads-in-fp32) or bf16 "
                 "(Megatron-Bridge's grad_reduce_in_fp32 = false)");
  tr->add_option("--recompute-modules", o.recompute_modules,
                 "with --recompute selective: what it recomputes (Megatron-Core's --recompute-modules), any of core_attn, "
                 "layernorm, mla_up_proj, mlp, moe_act, shared_experts, comma-separated (default core_attn)");
  tr->add_option("--pp-schedule", o.pp_schedule,
                 "pipeline order: 1f1b (Megatron's; interleaved with --vpp > 1), zb-h1 (zero-bubble: weight "
                 "gradients split off the backward and deferred into the drain, same peak memory; vpp 1) or dualpipe "
                 "(DeepSeek-V3's: stages r and pp-1-r on every rank, micro-batches from both ends, forward/backward "
                 "pairs combined; two parameter copies; even pp, vpp 1, an even number of micro-batches >= 2 pp)");
  tr->add_option("--mtp-layers", o.tc.mtp_layers,
                 "multi-token prediction depths trained with the model, on the last pipeline stage (Megatron's "
                 "--mtp-num-layers; DeepSeek-V3: 1)");
  tr->add_option("--recompute-layers", o.tc.recompute_layers,
                 "with --recompute full: only the first N layers of every (virtual) pipeline stage, the rest "
                 "not at all (Megatron's --recompute-method block --recompute-num-layers; default 0: every layer)");
  tr->add_option("--zero", o.tc.zero, "ZeRO stage 0..3");
  tr->add_option("--memory-reserve", o.memory_reserve, reserve_help);
  tr->add_option("--algo", o.tc.algo, "collective plan for every group (default auto)");
  tr->add_option("--plan", o.plan_paths, "a plan file or directory (docs/plan-format.md; repeatable): proven by the verifier as it loads, its plans join the built-ins, so --algo can name them");
  tr->add_option("--network", o.network, "analytical or flow");
  tr->add_option("--library", o.library, "whose collectives: nccl (default), chorus or auto");
  tr->add_option("--trace", o.trace_path, "write the simulated iteration as a Chrome trace (JSON)");
  tr->add_option("--plot", o.plot_path, "draw the breakdown into a PNG (needs /usr/bin/python3 with matplotlib)");
  tr->add_flag("--no-sequence-parallel", o.no_sp, "plain tensor parallelism (allreduce per block)");
  tr->add_flag("--no-flash-attention", o.no_flash, "materialise the s x s attention scores");
  tr->add_option("--attention-kernel", o.tc.attention_kernel, attention_kernel_help);
  tr->add_option("--clock", o.clock,
                 "the tensor-core clock: sustained (default: a training run keeps every GPU power-saturated, the "
                 "data file's sustained_clock_ratio) or burst (the boost clock of short kernel benchmarks: a "
                 "benchmark of a few iterations, such as a single-layer timing)");
  tr->add_flag("--fp8", o.tc.fp8, "fp8 GEMMs");
  tr->add_option("--compress", o.compress,
                 "the data-parallel gradient reduce-scatter on a narrower wire than the gradient buffer: none, bf16 "
                 "(with the fp32 buffer) or fp8 / fp8:BLOCK (e4m3, an fp32 scale per BLOCK elements); fp32 "
                 "accumulation, each gradient quantized once");
  tr->add_flag("--estimate", o.estimate_only, "the closed-form estimate only (no simulated schedule)");
  tr->add_flag("--no-async-tp", o.sync_tp, "schedule: every tensor-parallel collective on the critical path");
  tr->add_flag("--no-overlap-dp", o.no_overlap_dp,
               "schedule: ZeRO-0..2 gradient reduce-scatter after the backward, parameter gather before the forward");
  tr->add_flag("--no-gradient-accumulation-fusion", o.no_grad_accum_fusion,
               "each micro-batch's 16-bit weight gradients added into the gradient buffer by a separate kernel "
               "(Megatron-LM before 2022, PyTorch DDP) instead of by the weight-gradient GEMM");
  tr->add_flag("--json", o.json, "print JSON");
  return tr;
}

CLI::App* addSearch(CLI::App& app, CliOptions& o) {
  CLI::App* se = app.add_subcommand("search", "find the fastest parallel layouts for a model on N GPUs");
  se->add_option("--model", o.model_path, "chorus model JSON, Hugging Face config.json or its directory (configs/models/)")->required();
  se->add_flag("--verbose", o.verbose, "list the Hugging Face config keys that were ignored (stderr)");
  se->add_flag("--allow-unknown-keys", o.allow_unknown_keys, allow_unknown_help);
  se->add_option("--cluster", o.cluster_path, "cluster JSON (configs/clusters/)")->required();
  se->add_option("--node-topo", o.node_topo_path, "NCCL topology XML (NCCL_TOPO_FILE format): its node replaces the cluster file's (docs/simulator.md)")->default_str("none");
  se->add_option("--gpus", o.sc.gpus, "GPUs")->required();
  se->add_option("--global-batch", o.sc.global_batch, "sequences per iteration")->required();
  se->add_option("--seq", o.sc.seq, "sequence length");
  se->add_option("--top", o.sc.top, "layouts to show");
  se->add_option("--gpus-per-domain", o.sc.gpus_per_domain, per_domain_help);
  se->add_option("--moe-dispatch", o.moe_dispatch, dispatch_help);
  se->add_flag("--fp8-dispatch", o.sc.fp8_dispatch, fp8_dispatch_help);
  se->add_option("--moe-node-limit", o.moe_node_limit, node_limit_help);
  se->add_option("--moe-imbalance", o.sc.moe_imbalance, imbalance_help);
  se->add_option("--pp-schedules", o.pp_schedules,
                 "pipeline schedules to try on every layout that can run them: 1f1b, zb-h1, dualpipe (comma-separated)");
  se->add_flag("--moe-a2a-overlap", o.sc.moe_a2a_overlap,
               std::string(a2a_overlap_help) + " (search: on every expert-parallel layout that allows it)");
  se->add_option("--memory-reserve", o.memory_reserve, reserve_help);
  se->add_option("--max-micro-batch", o.sc.max_micro_batch, "largest micro-batch tried (powers of two)");
  se->add_option("--resimulate", o.sc.resimulate,
                 "re-simulate the best K layouts of the closed-form estimate as schedules and rank them by it (0: "
                 "estimate only)");
  se->add_option("--algo", o.sc.algo, "collective plan for every group (default auto)");
  se->add_option("--plan", o.plan_paths, "a plan file or directory (docs/plan-format.md; repeatable): proven by the verifier as it loads, its plans join the built-ins, so --algo can name them");
  se->add_option("--network", o.network, "analytical or flow");
  se->add_option("--library", o.library, "whose collectives: nccl (default), chorus or auto");
  se->add_flag("--fp8", o.sc.fp8, "fp8 GEMMs");
  se->add_option("--attention-kernel", o.sc.attention_kernel, attention_kernel_help);
  se->add_flag("--no-progress", o.no_progress, "no progress bar (it is drawn only when stderr is a terminal)");
  se->add_flag("--json", o.json, "print JSON");
  return se;
}

CLI::App* addInfer(CLI::App& app, CliOptions& o) {
  CLI::App* in = app.add_subcommand("infer", "serve a request stream: aggregated vs disaggregated prefill/decode");
  in->add_option("--model", o.model_path, "chorus model JSON, Hugging Face config.json or its directory (configs/models/)")->required();
  in->add_flag("--verbose", o.verbose, "list the Hugging Face config keys that were ignored (stderr)");
  in->add_flag("--allow-unknown-keys", o.allow_unknown_keys, allow_unknown_help);
  in->add_option("--cluster", o.cluster_path, "cluster JSON (configs/clusters/)")->required();
  in->add_option("--node-topo", o.node_topo_path, "NCCL topology XML (NCCL_TOPO_FILE format): its node replaces the cluster file's (docs/simulator.md)")->default_str("none");
  in->add_option("--gpus", o.ic.gpus, "GPUs of the service")->required();
  in->add_option("--tp", o.ic.tp, "GPUs per replica (default: the smallest that fits)");
  in->add_option("--rate", o.rate_text,
                 "arrivals per second (Poisson, open loop; default 10); a list (1,2,4) or a range (MIN:MAX doubling, "
                 "MIN:MAX:STEP) runs one service per rate");
  in->add_flag("--max-rate", o.max_rate,
               "find the highest rate at which --slo-attainment of the requests meet the TTFT/TPOT (and E2E) SLOs "
               "(DistServe's goodput), for the aggregated service and each disaggregated split");
  in->add_option("--slo-attainment", o.slo_attainment, "with --max-rate: the fraction of requests within every SLO (default 0.9)");
  in->add_option("--concurrency", o.concurrency_text,
                 "closed loop: N users, each sending its next request when its previous one completes; a list "
                 "(1,2,4,...) sweeps");
  in->add_flag("--max-throughput", o.ic.max_throughput, "offline: every request at t = 0 (batch bounded by KV and --max-batch)");
  in->add_flag("--chunked-prefill", o.ic.chunked_prefill,
               "every step carries the decodes and prompt chunks within --prefill-tokens (vLLM V1); default: prefill first");
  in->add_flag("--kv-fp8", o.ic.kv_fp8, "fp8 KV cache (1 byte per element)");
  in->add_option("--kv-alloc", o.kv_alloc,
                 "reserve: a request's whole cache at admission (TensorRT-LLM's GUARANTEED_NO_EVICT); paged: as it "
                 "grows, the newest requests preempted and recomputed when it runs out (vLLM)");
  in->add_option("--e2e-slo", o.ic.e2e_slo_s, "end-to-end latency SLO for goodput (s; default none)");
  in->add_option("--paged-overhead", o.ic.paged_overhead,
                 "with --kv-alloc paged: the paged decode attention's extra time, a fraction of the cache read "
                 "(default 0.20: vLLM's kernel, Kwon et al. 2023)");
  in->add_option("--prefix-hit", o.ic.prefix_hit,
                 "fraction of each prompt found in the prefix cache: not prefilled, its KV reused (default 0)");
  in->add_option("--step-overhead", o.ic.step_overhead_s,
                 "host time per engine step the GPU waits for, in s (scheduling, input preparation; default 0)");
  in->add_option("--request-overhead", o.ic.request_overhead_s,
                 "time per request before its prefill can start, in s (HTTP, tokenisation; default 0)");
  in->add_option("--spec-tokens", o.ic.spec_tokens, "speculative decoding: tokens drafted per step (default 0: off)");
  in->add_option("--spec-acceptance", o.ic.spec_acceptance, "probability that a drafted token is accepted");
  in->add_option("--draft-model", o.draft_path, "draft model (default: the model's MTP modules)");
  in->add_option("--trace", o.trace_path, "write the aggregated run's serving timeline as a Chrome trace (JSON)");
  in->add_option("--plot", o.plot_path,
                 "with a --concurrency sweep: draw tokens/s per user and TTFT against tokens/s per GPU into a PNG");
  in->add_option("--requests", o.ic.requests, "requests simulated");
  in->add_option("--input", o.ic.input_len, "mean input (prompt) tokens");
  in->add_option("--output", o.ic.output_len, "mean output tokens");
  in->add_option("--lengths", o.lengths, "fixed, uniform ([0.5, 1.5] x mean) or exponential");
  in->add_option("--ttft-slo", o.ic.ttft_slo_s, "time-to-first-token SLO (s)");
  in->add_option("--tpot-slo", o.ic.tpot_slo_s, "time-per-output-token SLO (s)");
  in->add_option("--max-batch", o.ic.max_batch, "running requests per replica");
  in->add_option("--prefill-tokens", o.ic.prefill_tokens, "tokens per prefill batch");
  in->add_option("--prefill-replicas", o.ic.prefill_replicas, "disaggregated split (default: try all)");
  in->add_flag_callback("--disaggregated", [&o] { o.ic.aggregated = false; },
                        "only the disaggregated service (required with a host emulation --cluster: the "
                        "prefill/decode demo, docs/kv.md)");
  in->add_option("--arrivals", o.ic.arrivals_path,
                 "host emulation: the request arrival times (a JSON list, or `kv_disagg prefill --out`) instead of "
                 "a Poisson draw at --rate");
  in->add_option("--decode-tp", o.ic.decode_tp,
                 "disaggregated: GPUs per decode replica (default: --tp); with --ep, its attention group");
  in->add_option("--decode-ep", o.ic.decode_ep,
                 "disaggregated with --ep: GPUs per decode replica, its experts spread over them (default: --ep)");
  in->add_option("--ep", o.ic.ep, "MoE: replicas of N GPUs with the experts spread over all, attention over --tp (default 1: "
                                "data-parallel attention)");
  in->add_option("--seed", o.ic.seed, "random seed of the request stream");
  in->add_option("--network", o.network, "analytical or flow");
  in->add_option("--library", o.library, "whose collectives: nccl (default), chorus or auto");
  in->add_flag("--fp8", o.ic.fp8, "fp8 weights (1 byte each) and fp8 GEMMs");
  in->add_option("--attention-kernel", o.ic.attention_kernel, attention_kernel_help);
  in->add_flag("--json", o.json, "print JSON");
  return in;
}

CLI::App* addSweep(CLI::App& app, CliOptions& o) {
  CLI::App* sw = app.add_subcommand(
      "sweep", "what-if: one collective, training layout or layout search on a grid of cluster and layout values, "
               "with what binds at each point");
  sw->add_option("--cluster", o.cluster_path, "cluster JSON (configs/clusters/): the base every point changes")->required();
  sw->add_option("--node-topo", o.node_topo_path, "NCCL topology XML (NCCL_TOPO_FILE format): its node replaces the base cluster's before the axes vary it (docs/simulator.md)")->default_str("none");
  sw->add_option("--vary", o.vary,
                 "an axis KEY=V1,V2,... or KEY=LO:HI (doubling); repeatable, the grid is their product. Keys: "
                 "nic_gbit_s, oversubscription, nvlink_domain (GPUs per NVLink domain), nvlink_gbyte_s, hbm_gib, "
                 "leaf_nodes, gpu (a cluster file whose GPU replaces the base's); training: tp, pp, dp, cp, ep, "
                 "micro_batch; serving (--job serve): rate, concurrency, gpus, tp, decode_tp, ep, prefill_replicas, "
                 "pd (P:D replicas, filling --gpus), max_batch, input, output, prefix_hit")->required();
  sw->add_option("--job", o.sweep_job,
                 "collective, train, search or serve (default: train with --model, else collective)");
  sw->add_option("--gpus", o.gpus, "GPUs (collective: the first N; train/search: the job's)")->required();
  sw->add_option("--collective", o.collective, "collective job: allreduce, allgather, alltoall, ...");
  sw->add_option("--bytes", o.bytes_text, "collective job: size (nccl-tests convention)");
  sw->add_option("--algo", o.algo, "collective job: auto, a chorus plan or an NCCL algorithm");
  sw->add_option("--model", o.model_path, "train/search job: chorus model JSON, Hugging Face config.json or its directory");
  sw->add_option("--tp", o.sweep_tp, "train job: tensor parallel (default 1); serve job: GPUs per replica (default: the smallest that fits)");
  sw->add_option("--pp", o.tc.pp, "train job: pipeline parallel");
  sw->add_option("--dp", o.tc.dp, "train job: data parallel (0: gpus / (tp pp cp) at every point)")->default_val(0);
  sw->add_option("--cp", o.tc.cp, "train job: context parallel");
  sw->add_option("--ep", o.tc.ep, "train job: expert parallel");
  sw->add_option("--vpp", o.tc.vpp, "train job: virtual pipeline stages per GPU");
  sw->add_option("--zero", o.tc.zero, "train job: ZeRO stage 0..3");
  sw->add_option("--global-batch", o.tc.global_batch, "train/search job: sequences per iteration");
  sw->add_option("--micro-batch", o.micro, "train job: sequences per micro-batch, or auto");
  sw->add_option("--seq", o.tc.seq, "train/search job: sequence length");
  sw->add_option("--recompute", o.recompute, "train job: none, selective, full");
  sw->add_flag("--fp8", o.tc.fp8, "fp8 GEMMs");
  sw->add_option("--network", o.network, "analytical or flow");
  sw->add_option("--library", o.library, "whose collectives: nccl (default), chorus or auto");
  sw->add_option("--rate", o.ic.rate, "serve job: arrivals per second (open loop; default 10)");
  sw->add_option("--concurrency", o.ic.concurrency, "serve job: closed loop of N users (default: open loop at --rate)");
  sw->add_flag("--max-throughput", o.ic.max_throughput, "serve job: offline, every request at t = 0");
  sw->add_option("--requests", o.ic.requests, "serve job: requests simulated per point");
  sw->add_option("--input", o.ic.input_len, "serve job: mean input tokens");
  sw->add_option("--output", o.ic.output_len, "serve job: mean output tokens");
  sw->add_option("--ttft-slo", o.ic.ttft_slo_s, "serve job: time-to-first-token SLO (s)");
  sw->add_option("--tpot-slo", o.ic.tpot_slo_s, "serve job: time-per-output-token SLO (s)");
  sw->add_option("--max-batch", o.ic.max_batch, "serve job: running requests per replica");
  sw->add_option("--prefill-tokens", o.ic.prefill_tokens, "serve job: tokens per prefill batch");
  sw->add_flag("--chunked-prefill", o.ic.chunked_prefill, "serve job: chunked prefill (vLLM V1)");
  sw->add_flag("--kv-fp8", o.ic.kv_fp8, "serve job: fp8 KV cache");
  sw->add_option("--decode-tp", o.ic.decode_tp, "serve job: GPUs per decode replica of a split (default: --tp)");
  sw->add_option("--prefix-hit", o.ic.prefix_hit, "serve job: fraction of each prompt in the prefix cache");
  sw->add_option("--step-overhead", o.ic.step_overhead_s, "serve job: host time per engine step (s)");
  sw->add_option("--seed", o.ic.seed, "serve job: random seed of the request stream");
  sw->add_option("--out", o.sweep_out, "also write the JSON here (tools/sweep_plot.py draws it)");
  sw->add_flag("--json", o.json, "print JSON");
  return sw;
}

CLI::App* addEp(CLI::App& app, chorus::sim::EpPriceCase& e, bool& json) {
  CLI::App* ep = app.add_subcommand(
      "ep", "bytes per host link of one MoE dispatch + combine, from the library's routing code, and the "
            "busiest link's bound (chorus-bench dispatch|combine's case; docs/ep.md)");
  ep->add_option("--hosts", e.hosts, "hosts");
  ep->add_option("--ranks-per-host", e.ranks_per_host, "ranks per host (consecutive ranks)");
  ep->add_option("--tokens", e.tokens, "tokens per rank");
  ep->add_option("--hidden", e.hidden, "elements per token row");
  ep->add_option("--experts", e.experts, "experts (a multiple of the ranks)");
  ep->add_option("--topk", e.topk, "experts per token");
  ep->add_option("--max-hosts", e.max_hosts, "node-limited routing: at most this many hosts per token (0: off)");
  ep->add_option("--dtype", e.dtype, "bf16, float, or fp8 (bf16 data, fp8 dispatch)");
  ep->add_option("--link-gbps", e.link_gbps, "every host link's rate, each way (Gbit/s)");
  ep->add_option("--seed", e.seed, "the uniform router's seed (chorus-bench --seed)");
  ep->add_flag("--json", json, "print JSON");
  return ep;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace chorus::sim;
  CliOptions o;
  CLI::App app{"chorus-sim: predict collectives, training steps, layouts and inference at data-center scale"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();  // --help shows every default
  CLI::App* mo = addModel(app, o);
  CLI::App* col = addCollective(app, o);
  CLI::App* tr = addTrain(app, o);
  CLI::App* se = addSearch(app, o);
  CLI::App* in = addInfer(app, o);
  CLI::App* sw = addSweep(app, o);
  EpPriceCase ep_case;
  bool ep_json = false;
  CLI::App* ep = addEp(app, ep_case, ep_json);
  CLI::App* cal = app.add_subcommand(
      "calibrate", "measure this machine (torch kernels at a CPU job's shapes, chorus-bench over shm/tcp) and write "
                   "a cluster file: runs python3 -m chorus.examples.calibrate with the arguments (--help: its own)");
  cal->prefix_command();
  cal->set_help_flag();  // --help goes to the module, which lists its options

  o.tc.dp = 0;  // not given: gpus / (tp x pp x cp) (runTrainCommand)
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A misspelt command or flag: name the nearest one before CLI11's message.
    std::vector<std::string> subs;
    for (const CLI::App* sub : app.get_subcommands({})) subs.push_back(sub->get_name());
    const CLI::App* chosen = nullptr;
    if (argc > 1) {
      const std::string cmd = argv[1];
      if (cmd.rfind("-", 0) != 0) {
        for (const CLI::App* sub : app.get_subcommands({}))
          if (sub->get_name() == cmd) chosen = sub;
        if (!chosen) {
          const std::string near = chorus::sim::nearestKey(cmd, {subs.begin(), subs.end()});
          if (!near.empty()) std::fprintf(stderr, "chorus-sim: unknown command '%s'; did you mean '%s'?\n", cmd.c_str(), near.c_str());
        }
      }
    }
    if (chosen) {
      std::vector<std::string> flags;
      for (const CLI::Option* opt : chosen->get_options())
        for (const std::string& l : opt->get_lnames()) flags.push_back("--" + l);
      for (int i = 2; i < argc; ++i) {
        std::string a = argv[i];
        if (a.rfind("--", 0) != 0) continue;
        a = a.substr(0, a.find('='));
        if (std::find(flags.begin(), flags.end(), a) != flags.end()) continue;
        const std::string near = chorus::sim::nearestKey(a, {flags.begin(), flags.end()});
        if (!near.empty())
          std::fprintf(stderr, "chorus-sim %s: unknown option '%s'; did you mean '%s'?\n", chosen->get_name().c_str(),
                       a.c_str(), near.c_str());
      }
    }
    return app.exit(e);
  }
  if (mo->parsed()) return runModelCommand(o);
  if (col->parsed()) return runCollectiveCommand(o);
  if (tr->parsed()) return runTrainCommand(o);
  if (se->parsed()) return runSearchCommand(o);
  if (in->parsed()) return runInferCommand(o);
  if (sw->parsed()) return runSweepCommand(o);
  if (ep->parsed()) return runEpCommand(ep_case, ep_json);
  if (cal->parsed()) return runCalibrate(cal->remaining());
  return 0;
}

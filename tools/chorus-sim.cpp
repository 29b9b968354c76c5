// chorus-sim: predicts collectives, training steps, the best parallel layout
// and inference serving on modelled clusters from the library's own plans.
// A thin main: parse, call src/sim, print.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <unistd.h>

#include "sim/cli_args.hpp"
#include "sim/model_info.hpp"
#include "sim/placement.hpp"
#include "sim/report.hpp"
#include "sim/trace.hpp"

namespace {

using namespace chorus;
using namespace chorus::sim;

int fail(const Status& s) {
  std::fprintf(stderr, "chorus-sim: %s\n", s.message().c_str());
  return 1;
}

void printTrain(const ModelSpec& m, const ClusterSpec& c, const TrainReport& r) {
  std::printf("%s on %lld GPUs of %s: %.3f s/iteration, %.0f tokens/s, MFU %.1f%%, %.1f GiB/GPU, bottleneck %s (%s)\n",
              m.name.c_str(), static_cast<long long>(r.config.gpus), c.name.c_str(), r.iteration_s, r.tokens_per_s,
              100 * r.mfu, r.memory_gib_per_gpu, r.bottleneck.c_str(), r.bottleneck_link.c_str());
  std::printf("  placement: %s\n", r.placement.c_str());
  if (r.config.schedule)
    std::printf("  simulated schedule: %lld tasks (%d layer%s per task); closed-form estimate %.3f s\n",
                static_cast<long long>(r.schedule_tasks), r.schedule_merged_layers,
                r.schedule_merged_layers == 1 ? "" : "s", r.estimate_s);
  for (const auto& [k, v] : r.breakdown) std::printf("  %-12s %.4f s\n", k.c_str(), v);
  std::string bounds;
  for (const auto& [k, v] : r.bounds.seconds) bounds += fmt::format("{}{} {:.3f} s", bounds.empty() ? "" : ", ", k, v);
  std::printf("  binding resource: %s (%.3f s of the %.3f s iteration); resource busy times: %s\n",
              r.bounds.binding.c_str(), r.bounds.max(), r.iteration_s, bounds.c_str());
}

void printServe(const ServeStats& s) {
  std::printf("  %-22s TTFT p50/p90/p99 %.3f/%.3f/%.3f s  TPOT p50/p90/p99 %.1f/%.1f/%.1f ms  %.2f req/s  goodput %.2f req/s (%.0f%% in SLO)\n",
              s.mode == "aggregated" ? "aggregated"
                                     : fmt::format("disaggregated {}:{}{}", s.prefill_replicas, s.decode_replicas,
                                                   s.decode_ep > 0   ? fmt::format(" (decode ep {}, tp {})", s.decode_ep, s.decode_tp)
                                                   : s.decode_tp > 0 ? fmt::format(" (decode tp {})", s.decode_tp)
                                                                     : "").c_str(),
              s.ttft_p50_s, s.ttft_p90_s, s.ttft_p99_s, 1e3 * s.tpot_p50_s, 1e3 * s.tpot_p90_s, 1e3 * s.tpot_p99_s,
              s.throughput_rps, s.goodput_rps, 100 * s.slo_attainment);
}

// The metrics block as vLLM's benchmark_serving prints it (times in ms).
void printServeDetail(const ServeStats& s, int64_t requests) {
  std::printf("    requests %lld, duration %.2f s, %.3f req/s, output %.1f tok/s, total %.1f tok/s, %.1f tok/s per user, "
              "goodput %.3f req/s, at most %lld running per replica%s\n",
              static_cast<long long>(requests), s.duration_s, s.throughput_rps, s.tokens_per_s, s.total_tokens_per_s,
              s.per_user_tokens_per_s, s.goodput_rps, static_cast<long long>(s.max_running),
              s.preemptions > 0 ? fmt::format(", {} preemptions", s.preemptions).c_str() : "");
  for (auto [name, l] : {std::pair{"TTFT", s.ttft}, {"TPOT", s.tpot}, {"ITL", s.itl}, {"E2E", s.e2e}})
    std::printf("    %-4s mean %9.2f  p50 %9.2f  p90 %9.2f  p99 %9.2f ms\n", name, 1e3 * l.mean, 1e3 * l.p50, 1e3 * l.p90,
                1e3 * l.p99);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-sim: predict collectives, training steps, layouts and inference at data-center scale"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();  // --help shows every default

  std::string cluster_path, model_path, collective = "allreduce", bytes_text = "1G", algo = "auto", network = "analytical", library = "nccl";
  int64_t gpus = 0, gpus_per_domain = 0;
  bool json = false, verbose = false;
  const char* per_domain_help =
      "GPUs of each NVLink domain the job uses (e.g. 64 of an NVL72 rack's 72); 0: the largest count that keeps "
      "every tp, cp, dp and expert-parallel block inside one domain";

  int64_t model_seq = 4096;
  auto* mo = app.add_subcommand("model", "describe a model: parameters, FLOPs and KV cache per token, layer shapes");
  mo->add_option("--model", model_path, "chorus model JSON, a Hugging Face config.json, or a directory holding one")->required();
  mo->add_option("--seq", model_seq, "context length for the FLOPs and KV figures (default 4096)");
  mo->add_flag("--verbose", verbose, "also list the Hugging Face keys that were ignored");
  mo->add_flag("--json", json, "print JSON");
  auto* col = app.add_subcommand("collective", "time one collective on the first N GPUs of a cluster");
  col->add_option("--cluster", cluster_path, "cluster JSON (configs/clusters/)")->required();
  col->add_option("--gpus", gpus, "number of GPUs (ranks in GPU order)")->required();
  col->add_option("--collective", collective, "allreduce, allgather, reducescatter, broadcast, alltoall, ...");
  col->add_option("--bytes", bytes_text, "size (nccl-tests convention), e.g. 1G, 256M; MIN:MAX sweeps doubling (8:8G)");
  col->add_option("--algo", algo, "auto, a chorus plan name, or an NCCL algorithm (ring, tree, nvls, nvlstree, collnet, pat; optionally /LL, /LL128, /Simple; nccl:NAME under any library)");
  col->add_option("--network", network, "analytical or flow");
  col->add_option("--library", library, "nccl (NCCL's algorithms and protocols, as its tuner picks), chorus (chorus's plans) or auto");
  col->add_flag("--json", json, "print JSON");

  TrainConfig tc;
  std::string recompute = "selective", micro = "1", trace_path, plot_path, pp_schedule = "1f1b";
  bool no_sp = false, no_flash = false;
  auto* tr = app.add_subcommand("train", "time one training iteration");
  tr->add_option("--model", model_path, "chorus model JSON, Hugging Face config.json or its directory (configs/models/)")->required();
  tr->add_flag("--verbose", verbose, "list the Hugging Face config keys that were ignored (stderr)");
  tr->add_option("--cluster", cluster_path, "cluster JSON (configs/clusters/)")->required();
  tr->add_option("--gpus", tc.gpus, "GPUs")->required();
  tr->add_option("--tp", tc.tp, "tensor parallel");
  tr->add_option("--pp", tc.pp, "pipeline parallel");
  tr->add_option("--dp", tc.dp, "data parallel");
  tr->add_option("--cp", tc.cp, "context parallel");
  tr->add_option("--ep", tc.ep, "expert parallel (within dp x cp; with --etp across tp x cp x dp)");
  tr->add_option("--etp", tc.etp,
                 "expert tensor parallel: fold expert parallelism across tp x cp x dp (MoE parallel folding); "
                 "default: the experts split over tp");
  tr->add_option("--vpp", tc.vpp, "virtual pipeline stages per GPU (interleaved 1F1B)");
  tr->add_option("--gpus-per-domain", gpus_per_domain, per_domain_help);
  std::string moe_dispatch = "alltoall";
  const char* dispatch_help =
      "alltoall (every routed copy in one all-to-all each way, Megatron-Core's dispatcher) or hierarchical (once per "
      "destination node over the NICs, then NVLink; node-limited routing; DeepEP's normal kernels)";
  const char* fp8_dispatch_help = "dispatch tokens in fp8 (1 B + a scale per 128), combine in bf16";
  const char* imbalance_help = "the busiest expert's tokens over the mean (>= 1; 1: balanced)";
  const char* a2a_overlap_help =
      "combined 1F1B (Megatron-Core's --overlap-moe-expert-parallel-comm): a forward and a backward of two "
      "micro-batches as one step, each one's expert all-to-all under the other's compute; needs ep >= 2, pp 1 or "
      "vpp >= 2, no full recomputation";
  tr->add_option("--moe-dispatch", moe_dispatch, dispatch_help);
  tr->add_flag("--fp8-dispatch", tc.fp8_dispatch, fp8_dispatch_help);
  tr->add_option("--moe-imbalance", tc.moe_imbalance, imbalance_help);
  tr->add_flag("--moe-a2a-overlap", tc.moe_a2a_overlap, a2a_overlap_help);
  tr->add_option("--first-stage-layers", tc.first_stage_layers,
                 "layers of the first pipeline stage (default 0: the uniform split)");
  tr->add_option("--pp-layout", tc.pp_layout,
                 "Megatron's --pipeline-model-parallel-layout: the pp x vpp virtual stages separated by '|', each of E "
                 "(embedding, first), t (layer), m (MTP depth, last), L (loss, last); (...)*N repeats; e.g. "
                 "\"Et|(tt|)*30mL\"");
  tr->add_option("--last-stage-layers", tc.last_stage_layers,
                 "layers of the last pipeline stage (default 0: the uniform split)");
  tr->add_option("--global-batch", tc.global_batch, "sequences per iteration")->required();
  tr->add_option("--micro-batch", micro, "sequences per micro-batch, or auto");
  tr->add_option("--seq", tc.seq, "sequence length");
  tr->add_option("--recompute", recompute, "none, selective, full");
  std::string recompute_modules, grad_dtype = "fp32", moments = "fp32", rank_order = "tp-cp-ep-dp-pp";
  tr->add_option("--rank-order", rank_order,
                 "how ranks are numbered, innermost first: tp-cp-ep-dp-pp (Megatron's default) or tp-cp-ep-pp-dp "
                 "(Megatron's --use-tp-pp-dp-mapping: pipeline neighbours adjacent; without ep, cp or dp of 1)");
  tr->add_option("--optimizer-moments", moments,
                 "Adam's two moments: fp32 or bf16 (DeepSeek-V3's low-precision optimizer states; Megatron's "
                 "--exp-avg-dtype / --exp-avg-sq-dtype bf16); the fp32 master weights stay");
  tr->add_option("--grad-dtype", grad_dtype,
                 "the gradient buffer: fp32 (main gradients, Megatron's --accumulate-allreduce-grads-in-fp32) or bf16 "
                 "(Megatron-Bridge's grad_reduce_in_fp32 = false)");
  tr->add_option("--recompute-modules", recompute_modules,
                 "with --recompute selective: what it recomputes (Megatron-Core's --recompute-modules), any of core_attn, "
                 "layernorm, mla_up_proj, mlp, moe_act, shared_experts, comma-separated (default core_attn)");
  tr->add_option("--pp-schedule", pp_schedule,
                 "pipeline order: 1f1b (Megatron's; interleaved with --vpp > 1), zb-h1 (zero-bubble: weight "
                 "gradients split off the backward and deferred into the drain, same peak memory; vpp 1) or dualpipe "
                 "(DeepSeek-V3's: stages r and pp-1-r on every rank, micro-batches from both ends, forward/backward "
                 "pairs combined; two parameter copies; even pp, vpp 1, an even number of micro-batches >= 2 pp)");
  tr->add_option("--mtp-layers", tc.mtp_layers,
                 "multi-token prediction depths trained with the model, on the last pipeline stage (Megatron's "
                 "--mtp-num-layers; DeepSeek-V3: 1)");
  tr->add_option("--recompute-layers", tc.recompute_layers,
                 "with --recompute full: only the first N layers of every (virtual) pipeline stage, the rest "
                 "not at all (Megatron's --recompute-method block --recompute-num-layers; default 0: every layer)");
  tr->add_option("--zero", tc.zero, "ZeRO stage 0..3");
  tr->add_option("--algo", tc.algo, "collective plan for every group (default auto)");
  tr->add_option("--network", network, "analytical or flow");
  tr->add_option("--library", library, "whose collectives: nccl (default), chorus or auto");
  tr->add_option("--trace", trace_path, "write the simulated iteration as a Chrome trace (JSON)");
  tr->add_option("--plot", plot_path, "draw the breakdown into a PNG (needs /usr/bin/python3 with matplotlib)");
  tr->add_flag("--no-sequence-parallel", no_sp, "plain tensor parallelism (allreduce per block)");
  tr->add_flag("--no-flash-attention", no_flash, "materialise the s x s attention scores");
  tr->add_flag("--fp8", tc.fp8, "fp8 GEMMs");
  bool estimate_only = false, sync_tp = false, no_overlap_dp = false;
  tr->add_flag("--estimate", estimate_only, "the closed-form estimate only (no simulated schedule)");
  tr->add_flag("--no-async-tp", sync_tp, "schedule: every tensor-parallel collective on the critical path");
  tr->add_flag("--no-overlap-dp", no_overlap_dp,
               "schedule: ZeRO-0..2 gradient reduce-scatter after the backward, parameter gather before the forward");
  tr->add_flag("--json", json, "print JSON");

  SearchConfig sc;
  bool no_progress = false;
  auto* se = app.add_subcommand("search", "find the fastest parallel layouts for a model on N GPUs");
  se->add_option("--model", model_path, "chorus model JSON, Hugging Face config.json or its directory (configs/models/)")->required();
  se->add_flag("--verbose", verbose, "list the Hugging Face config keys that were ignored (stderr)");
  se->add_option("--cluster", cluster_path, "cluster JSON (configs/clusters/)")->required();
  se->add_option("--gpus", sc.gpus, "GPUs")->required();
  se->add_option("--global-batch", sc.global_batch, "sequences per iteration")->required();
  se->add_option("--seq", sc.seq, "sequence length");
  se->add_option("--top", sc.top, "layouts to show");
  se->add_option("--gpus-per-domain", sc.gpus_per_domain, per_domain_help);
  se->add_option("--moe-dispatch", moe_dispatch, dispatch_help);
  se->add_flag("--fp8-dispatch", sc.fp8_dispatch, fp8_dispatch_help);
  se->add_option("--moe-imbalance", sc.moe_imbalance, imbalance_help);
  std::string pp_schedules = "1f1b";
  se->add_option("--pp-schedules", pp_schedules,
                 "pipeline schedules to try on every layout that can run them: 1f1b, zb-h1, dualpipe (comma-separated)");
  se->add_flag("--moe-a2a-overlap", sc.moe_a2a_overlap,
               std::string(a2a_overlap_help) + " (search: on every expert-parallel layout that allows it)");
  se->add_option("--max-micro-batch", sc.max_micro_batch, "largest micro-batch tried (powers of two)");
  se->add_option("--resimulate", sc.resimulate,
                 "re-simulate the best K layouts of the closed-form estimate as schedules and rank them by it (0: "
                 "estimate only)");
  se->add_option("--algo", sc.algo, "collective plan for every group (default auto)");
  se->add_option("--network", network, "analytical or flow");
  se->add_option("--library", library, "whose collectives: nccl (default), chorus or auto");
  se->add_flag("--fp8", sc.fp8, "fp8 GEMMs");
  se->add_flag("--no-progress", no_progress, "no progress bar (it is drawn only when stderr is a terminal)");
  se->add_flag("--json", json, "print JSON");

  InferConfig ic;
  std::string lengths = "fixed", concurrency_text, draft_path, kv_alloc = "reserve";
  auto* in = app.add_subcommand("infer", "serve a request stream: aggregated vs disaggregated prefill/decode");
  in->add_option("--model", model_path, "chorus model JSON, Hugging Face config.json or its directory (configs/models/)")->required();
  in->add_flag("--verbose", verbose, "list the Hugging Face config keys that were ignored (stderr)");
  in->add_option("--cluster", cluster_path, "cluster JSON (configs/clusters/)")->required();
  in->add_option("--gpus", ic.gpus, "GPUs of the service")->required();
  in->add_option("--tp", ic.tp, "GPUs per replica (default: the smallest that fits)");
  in->add_option("--rate", ic.rate, "arrivals per second (Poisson, open loop; default 10)");
  in->add_option("--concurrency", concurrency_text,
                 "closed loop: N users, each sending its next request when its previous one completes; a list "
                 "(1,2,4,...) sweeps");
  in->add_flag("--max-throughput", ic.max_throughput, "offline: every request at t = 0 (batch bounded by KV and --max-batch)");
  in->add_flag("--chunked-prefill", ic.chunked_prefill,
               "every step carries the decodes and prompt chunks within --prefill-tokens (vLLM V1); default: prefill first");
  in->add_flag("--kv-fp8", ic.kv_fp8, "fp8 KV cache (1 byte per element)");
  in->add_option("--kv-alloc", kv_alloc,
                 "reserve: a request's whole cache at admission (TensorRT-LLM's GUARANTEED_NO_EVICT); paged: as it "
                 "grows, the newest requests preempted and recomputed when it runs out (vLLM)");
  in->add_option("--e2e-slo", ic.e2e_slo_s, "end-to-end latency SLO for goodput (s; default none)");
  in->add_option("--spec-tokens", ic.spec_tokens, "speculative decoding: tokens drafted per step (default 0: off)");
  in->add_option("--spec-acceptance", ic.spec_acceptance, "probability that a drafted token is accepted");
  in->add_option("--draft-model", draft_path, "draft model (default: the model's MTP modules)");
  in->add_option("--trace", trace_path, "write the aggregated run's serving timeline as a Chrome trace (JSON)");
  in->add_option("--plot", plot_path,
                 "with a --concurrency sweep: draw tokens/s per user and TTFT against tokens/s per GPU into a PNG");
  in->add_option("--requests", ic.requests, "requests simulated");
  in->add_option("--input", ic.input_len, "mean input (prompt) tokens");
  in->add_option("--output", ic.output_len, "mean output tokens");
  in->add_option("--lengths", lengths, "fixed, uniform ([0.5, 1.5] x mean) or exponential");
  in->add_option("--ttft-slo", ic.ttft_slo_s, "time-to-first-token SLO (s)");
  in->add_option("--tpot-slo", ic.tpot_slo_s, "time-per-output-token SLO (s)");
  in->add_option("--max-batch", ic.max_batch, "running requests per replica");
  in->add_option("--prefill-tokens", ic.prefill_tokens, "tokens per prefill batch");
  in->add_option("--prefill-replicas", ic.prefill_replicas, "disaggregated split (default: try all)");
  in->add_option("--decode-tp", ic.decode_tp,
                 "disaggregated: GPUs per decode replica (default: --tp); with --ep, its attention group");
  in->add_option("--decode-ep", ic.decode_ep,
                 "disaggregated with --ep: GPUs per decode replica, its experts spread over them (default: --ep)");
  in->add_option("--ep", ic.ep, "MoE: replicas of N GPUs with the experts spread over all, attention over --tp (default 1: "
                                "data-parallel attention)");
  in->add_option("--seed", ic.seed, "random seed of the request stream");
  in->add_option("--network", network, "analytical or flow");
  in->add_option("--library", library, "whose collectives: nccl (default), chorus or auto");
  in->add_flag("--fp8", ic.fp8, "fp8 weights (1 byte each) and fp8 GEMMs");
  in->add_flag("--json", json, "print JSON");

  CLI11_PARSE(app, argc, argv);

  if (mo->parsed()) {
    auto model = loadModel(model_path);
    if (!model.isOk()) return fail(model.status());
    auto info = describeModel(*model, model_seq);
    if (!info.isOk()) return fail(info.status());
    if (json) std::cout << toJson(*info).dump(2) << "\n";
    else std::fputs(formatModelInfo(*info, verbose).c_str(), stdout);
    return 0;
  }
  // Every numeric flag's range, before any file is read or anything priced.
  if (col->parsed()) {
    Status st = checkCollectiveArgs(gpus, 0);  // --bytes: chorus::parseSize below checks its grammar and range
    if (!st.isOk()) return fail(st);
  }
  if (tr->parsed()) {
    auto mb = parseMicroBatch(micro);
    if (!mb.isOk()) return fail(mb.status());
    tc.micro_batch = *mb;
    Status st = checkTrainArgs(tc);
    if (!st.isOk()) return fail(st);
  }
  if (se->parsed()) {
    Status st = checkSearchArgs(sc);
    if (!st.isOk()) return fail(st);
  }
  std::vector<int64_t> sweep;
  if (in->parsed()) {
    if (!concurrency_text.empty()) {
      auto c = parseConcurrency(concurrency_text);
      if (!c.isOk()) return fail(c.status());
      sweep = *c;
      ic.concurrency = sweep.front();
    }
    Status st = checkInferConfig(ic);
    if (!st.isOk()) return fail(st);
  }
  const plan::Registry reg = plan::Registry::builtin();
  auto mode = parseNetMode(network);
  if (!mode.isOk()) return fail(mode.status());
  auto lib = parseLibrary(library);
  if (!lib.isOk()) return fail(lib.status());
  auto cluster = loadCluster(cluster_path);
  if (!cluster.isOk()) return fail(cluster.status());

  if (col->parsed()) {
    // "--bytes A:B": a sweep from A to B doubling, as nccl-tests' -b A -e B -f 2.
    std::vector<double> sizes;
    if (const size_t colon = bytes_text.find(':'); colon != std::string::npos) {
      auto lo = chorus::parseSize(bytes_text.substr(0, colon), "--bytes"),
           hi = chorus::parseSize(bytes_text.substr(colon + 1), "--bytes");
      if (!lo.isOk()) return fail(lo.status());
      if (!hi.isOk()) return fail(hi.status());
      if (!(*lo >= 1 && *hi >= *lo))
        return fail(invalidArgument("--bytes '{}': a sweep MIN:MAX needs 1 <= MIN <= MAX", bytes_text));
      for (double b = static_cast<double>(*lo); b <= static_cast<double>(*hi); b *= 2) sizes.push_back(b);
    } else {
      auto bytes = chorus::parseSize(bytes_text, "--bytes");
      if (!bytes.isOk()) return fail(bytes.status());
      sizes.push_back(static_cast<double>(*bytes));
    }
    nlohmann::json rows = nlohmann::json::array();
    for (double b : sizes) {
      auto r = simulateCollective(*cluster, gpus, collective, b, algo, reg, *mode, *lib);
      if (!r.isOk()) return fail(r.status());
      if (json) {
        nlohmann::json j = toJson(*r);
        j["network"] = network;
        j["library"] = library;
        rows.push_back(j);
      } else if (sizes.size() > 1) {
        if (b == sizes.front())
          std::printf("# %s on %lld GPUs of %s (%s, library %s)\n# %14s %12s %10s %10s  %-22s %s\n", r->collective.c_str(),
                      static_cast<long long>(gpus), cluster->name.c_str(), network.c_str(), library.c_str(), "size (B)",
                      "time (us)", "algbw", "busbw", "algo", "bottleneck");
        std::printf("  %14.0f %12.1f %10.2f %10.2f  %-22s %s\n", r->bytes, r->time_us, r->algbw_gbps, r->busbw_gbps,
                    r->algo.c_str(), r->bottleneck.c_str());
      } else {
        std::printf("%s %.0f bytes on %lld GPUs of %s (%s): %.1f us, algbw %.2f GB/s, busbw %.2f GB/s, algo %s, bottleneck %s\n",
                    r->collective.c_str(), r->bytes, static_cast<long long>(gpus), cluster->name.c_str(), network.c_str(),
                    r->time_us, r->algbw_gbps, r->busbw_gbps, r->algo.c_str(), r->bottleneck.c_str());
      }
    }
    if (json) std::cout << (rows.size() == 1 ? rows[0] : rows).dump(2) << "\n";
    return 0;
  }

  auto model = loadModel(model_path);
  if (!model.isOk()) return fail(model.status());
  if (verbose && !model->ignored_keys.empty()) {
    std::string keys;
    for (const std::string& k : model->ignored_keys) keys += " " + k;
    std::fprintf(stderr, "chorus-sim: %s: ignored keys:%s\n", model_path.c_str(), keys.c_str());
  }
  // Training: the cluster as the layout's placement sees it (sim/placement.hpp).
  ClusterSpec job_cluster = *cluster;
  if (tr->parsed()) {
    if (rank_order != "tp-cp-ep-dp-pp" && rank_order != "tp-cp-ep-pp-dp")
      return fail(invalidArgument("--rank-order '{}' is not one of tp-cp-ep-dp-pp, tp-cp-ep-pp-dp", rank_order));
    tc.pp_before_dp = rank_order == "tp-cp-ep-pp-dp";  // the placement below follows it
    auto placed = placedCluster(*cluster, gpus_per_domain != 0 ? gpus_per_domain : alignedDomainUse(*cluster, tc), tc.gpus);
    if (!placed.isOk()) return fail(placed.status());
    job_cluster = std::move(*placed);
  }
  auto topo = Topology::build(job_cluster);
  if (!topo.isOk()) return fail(topo.status());
  NetworkModel net(job_cluster, *topo, reg, *mode);
  net.setLibrary(*lib);

  if (tr->parsed()) {
    auto rc = parseRecompute(recompute);
    if (!rc.isOk()) return fail(rc.status());
    tc.recompute = *rc;
    if (grad_dtype != "fp32" && grad_dtype != "bf16")
      return fail(invalidArgument("--grad-dtype '{}' is not one of fp32, bf16", grad_dtype));
    tc.grad_bytes = grad_dtype == "bf16" ? 2 : 4;
    if (moments != "fp32" && moments != "bf16")
      return fail(invalidArgument("--optimizer-moments '{}' is not one of fp32, bf16", moments));
    tc.moment_bytes = moments == "bf16" ? 2 : 4;
    if (!recompute_modules.empty()) {
      if (tc.recompute != Recompute::Selective)
        return fail(invalidArgument("--recompute-modules {} needs --recompute selective (got --recompute {})",
                                    recompute_modules, recompute));
      auto mods = parseRecomputeModules(recompute_modules);
      if (!mods.isOk()) return fail(mods.status());
      tc.recompute_modules = *mods;
    }
    if (pp_schedule != "1f1b" && pp_schedule != "zb-h1" && pp_schedule != "dualpipe")
      return fail(invalidArgument("--pp-schedule '{}' is not one of 1f1b, zb-h1, dualpipe", pp_schedule));
    tc.zero_bubble = pp_schedule == "zb-h1";
    tc.dualpipe = pp_schedule == "dualpipe";
    tc.sequence_parallel = !no_sp;
    tc.flash_attention = !no_flash;
    tc.schedule = !estimate_only;
    tc.async_tp = !sync_tp;
    tc.overlap_dp = !no_overlap_dp;
    auto md = parseMoeDispatch(moe_dispatch);
    if (!md.isOk()) return fail(md.status());
    tc.moe_dispatch = *md;
    auto r = simulateTraining(*model, tc, net);
    if (!r.isOk()) return fail(r.status());
    nlohmann::json j = toJson(*r);
    j["network"] = network;
    if (!trace_path.empty()) {
      std::ofstream f(trace_path);
      if (!f) return fail(systemError("--trace: cannot open '{}' for writing", trace_path));
      auto sum = writeTrainTrace(*r, f);
      if (!sum.isOk()) return fail(sum.status());
      j["trace"] = {{"path", trace_path}, {"events", sum->events}, {"schedule_makespan_s", sum->makespan_s}};
      if (!json)
        std::fprintf(stderr, "trace: %s (%lld events, list-scheduled makespan %.3f s)\n", trace_path.c_str(),
                     static_cast<long long>(sum->events), sum->makespan_s);
    }
    if (!plot_path.empty()) {
      Status st = plotBreakdown(*r, fmt::format("{} on {} GPUs: {:.3f} s/iteration, MFU {:.1f}%", model->name, tc.gpus,
                                                r->iteration_s, 100 * r->mfu), plot_path);
      j["plot"] = st.isOk() ? nlohmann::json(plot_path) : nlohmann::json(st.message());
      if (!st.isOk()) std::fprintf(stderr, "chorus-sim: plot skipped: %s\n", st.message().c_str());
      else if (!json) std::fprintf(stderr, "plot: %s\n", plot_path.c_str());
    }
    if (json) std::cout << j.dump(2) << "\n";
    else printTrain(*model, *cluster, *r);
    return 0;
  }

  if (se->parsed()) {
    auto schedules = parsePpSchedules(pp_schedules);
    if (!schedules.isOk()) return fail(schedules.status());
    sc.pp_schedules = *schedules;
    const bool bar = !no_progress && isatty(STDERR_FILENO);
    const auto t0 = std::chrono::steady_clock::now();
    auto progress = [&](int64_t done, int64_t total) {
      if (!bar) return;
      const int w = 40, filled = static_cast<int>(w * done / std::max<int64_t>(total, 1));
      std::fprintf(stderr, "\r[%s%s] %lld/%lld layouts", std::string(static_cast<size_t>(filled), '#').c_str(),
                   std::string(static_cast<size_t>(w - filled), '.').c_str(), static_cast<long long>(done),
                   static_cast<long long>(total));
      if (done == total) std::fprintf(stderr, "\n");
    };
    auto md = parseMoeDispatch(moe_dispatch);
    if (!md.isOk()) return fail(md.status());
    sc.moe_dispatch = *md;
    auto r = searchLayouts(*model, sc, net, progress);
    if (!r.isOk()) return fail(r.status());
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (json) {
      nlohmann::json j = toJson(*r);
      j["search_seconds"] = secs;
      j["model"] = model->name;
      j["cluster"] = cluster->name;
      j["network"] = network;
      std::cout << j.dump(2) << "\n";
    } else {
      std::printf("%s on %lld GPUs of %s, global batch %lld x seq %lld: %lld layouts, %lld fit, searched in %.1f s\n",
                  model->name.c_str(), static_cast<long long>(sc.gpus), cluster->name.c_str(),
                  static_cast<long long>(sc.global_batch), static_cast<long long>(sc.seq),
                  static_cast<long long>(r->candidates), static_cast<long long>(r->feasible), secs);
      int i = 1;
      if (r->resimulated > 0)
        std::printf("ranked by the schedule of the best %lld by the closed-form estimate (estimates %.1f s, schedules "
                    "%.1f s)\n", static_cast<long long>(r->resimulated), r->estimate_seconds, r->schedule_seconds);
      for (const TrainReport& t : r->top)
        std::printf("%2d. %-62s %8.3f s (estimate %.3f s)  MFU %5.1f%%  %5.1f GiB  binding %s  bottleneck %s\n", i++,
                    layoutName(t.config).c_str(), t.iteration_s, t.estimate_s, 100 * t.mfu, t.memory_gib_per_gpu,
                    t.bounds.binding.c_str(), t.bottleneck.c_str());
      if (!r->top.empty()) std::printf("placement of 1.: %s\n", r->top.front().placement.c_str());
    }
    return 0;
  }

  if (in->parsed()) {
    auto d = parseLengthDist(lengths);
    if (!d.isOk()) return fail(d.status());
    if (kv_alloc != "reserve" && kv_alloc != "paged")
      return fail(invalidArgument("--kv-alloc '{}' is not one of reserve, paged", kv_alloc));
    ic.kv_paged = kv_alloc == "paged";
    if (!draft_path.empty()) {
      auto dm = loadModel(draft_path);
      if (!dm.isOk()) return fail(dm.status());
      ic.draft_model = std::make_shared<const ModelSpec>(*dm);
    }
    ic.dist = *d;
    if (!plot_path.empty() && sweep.size() < 2)
      return fail(invalidArgument("--plot '{}' draws a concurrency sweep: give --concurrency a list (1,2,4,...)", plot_path));
    if (!trace_path.empty() && sweep.size() > 1)
      return fail(invalidArgument("--trace '{}' records one run: give --concurrency one value", trace_path));
    ic.record = !trace_path.empty();
    if (sweep.size() > 1) {  // a concurrency sweep: one closed-loop run per value
      nlohmann::json runs = nlohmann::json::array();
      std::vector<std::pair<int64_t, InferReport>> points;
      if (!json)
        std::printf("%s on %lld GPUs of %s, %lld in / %lld out tokens, closed loop\n"
                    "  users  req/s  out tok/s  tok/s/user  TTFT p50/p99 ms   ITL p50/p99 ms  TPOT p50 ms  E2E p50 s\n",
                    model->name.c_str(), static_cast<long long>(ic.gpus), cluster->name.c_str(),
                    static_cast<long long>(ic.input_len), static_cast<long long>(ic.output_len));
      for (int64_t n : sweep) {
        InferConfig k = ic;
        k.concurrency = n;
        auto r = simulateInference(*model, k, net);
        if (!r.isOk()) return fail(r.status());
        const ServeStats& s = r->aggregated;
        points.emplace_back(n, *r);
        if (json) {
          nlohmann::json j = toJson(*r);
          runs.push_back(j);
        } else {
          std::printf("  %5lld %6.2f %10.1f %11.1f %8.1f/%-8.1f %7.2f/%-8.2f %10.2f %10.2f\n", static_cast<long long>(n),
                      s.throughput_rps, s.tokens_per_s, s.per_user_tokens_per_s, 1e3 * s.ttft.p50, 1e3 * s.ttft.p99,
                      1e3 * s.itl.p50, 1e3 * s.itl.p99, 1e3 * s.tpot.p50, s.e2e.p50);
        }
      }
      if (json) std::cout << nlohmann::json{{"sweep", runs}}.dump(2) << "\n";
      if (!plot_path.empty()) {
        Status st = plotServeSweep(points, fmt::format("{} on {} GPUs, {}/{} tokens", model->name, ic.gpus,
                                                       ic.input_len, ic.output_len), plot_path);
        if (!st.isOk()) std::fprintf(stderr, "chorus-sim: plot skipped: %s\n", st.message().c_str());
        else if (!json) std::fprintf(stderr, "plot: %s\n", plot_path.c_str());
      }
      return 0;
    }
    auto r = simulateInference(*model, ic, net);
    if (!r.isOk()) return fail(r.status());
    if (!trace_path.empty()) {
      std::ofstream f(trace_path);
      if (!f) return fail(systemError("--trace: cannot open '{}' for writing", trace_path));
      Status st = writeServeTrace(*r, f);
      if (!st.isOk()) return fail(st);
      if (!json)
        std::fprintf(stderr, "trace: %s (%zu steps, %zu requests)\n", trace_path.c_str(), r->steps.size(), r->requests.size());
    }
    if (json) {
      std::cout << toJson(*r).dump(2) << "\n";
    } else {
      const std::string load = ic.max_throughput ? "offline (all at once)"
                               : ic.concurrency > 0 ? fmt::format("{} users, closed loop", ic.concurrency)
                                                    : fmt::format("{:.1f} req/s", ic.rate);
      if (r->ep > 1)
        std::printf("expert parallel: replicas of %d GPUs, %d attention groups of tp %d; all-to-all latency %.1f us\n",
                    r->ep, r->ep / r->tp, r->tp, 1e6 * r->a2a_latency_s);
      std::printf("%s on %lld GPUs of %s: %d replicas of tp %d; %s, %lld in / %lld out tokens; prefill %.1f ms per "
                  "request, decode step %.1f ms (batch 1), KV %.1f MB per request, weights %.1f GB per GPU\n",
                  model->name.c_str(), static_cast<long long>(ic.gpus), cluster->name.c_str(), r->replicas, r->tp,
                  load.c_str(), static_cast<long long>(ic.input_len), static_cast<long long>(ic.output_len),
                  1e3 * r->prefill_s_per_request, 1e3 * r->decode_step_s, r->kv_bytes_per_request / 1e6,
                  r->weight_bytes_per_gpu / 1e9);
      if (ic.spec_tokens > 0)
        std::printf("  speculative decoding: %d drafted tokens per step, acceptance %.2f: %.2f tokens per step expected, "
                    "drafting %.1f ms per step (batch 1)\n",
                    ic.spec_tokens, ic.spec_acceptance, r->expected_tokens_per_step, 1e3 * r->draft_step_s);
      printServe(r->aggregated);
      printServeDetail(r->aggregated, ic.requests);
      if (!r->best_disaggregated.mode.empty()) printServe(r->best_disaggregated);
      std::printf("  best under SLOs (TTFT %.2f s, TPOT %.0f ms): %s\n", ic.ttft_slo_s, 1e3 * ic.tpot_slo_s, r->best.c_str());
    }
    return 0;
  }
  return 0;
}

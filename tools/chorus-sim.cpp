// chorus-sim: predicts collectives and training steps on modelled clusters
// from the library's own plans.  A thin main: parse, call src/sim, print.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "sim/report.hpp"

namespace {

using namespace chorus;
using namespace chorus::sim;

int fail(const Status& s) {
  std::fprintf(stderr, "chorus-sim: %s\n", s.message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"chorus-sim: predict collectives and training steps at data-center scale"};
  app.require_subcommand(1);

  std::string cluster_path, model_path, collective = "allreduce", bytes_text = "1G", algo = "auto", network = "analytical";
  int64_t gpus = 0;
  bool json = false;
  auto* col = app.add_subcommand("collective", "time one collective on the first N GPUs of a cluster");
  col->add_option("--cluster", cluster_path, "cluster JSON (configs/clusters/)")->required();
  col->add_option("--gpus", gpus, "number of GPUs (ranks in GPU order)")->required();
  col->add_option("--collective", collective, "allreduce, allgather, reducescatter, broadcast, alltoall, ...");
  col->add_option("--bytes", bytes_text, "size (nccl-tests convention), e.g. 1G, 256M");
  col->add_option("--algo", algo, "plan name or auto");
  col->add_option("--network", network, "analytical (flow: not yet implemented)");
  col->add_flag("--json", json, "print JSON");

  TrainConfig tc;
  std::string recompute = "selective", micro = "1";
  bool no_sp = false, no_flash = false;
  auto* tr = app.add_subcommand("train", "time one training iteration");
  tr->add_option("--model", model_path, "model JSON (configs/models/)")->required();
  tr->add_option("--cluster", cluster_path, "cluster JSON (configs/clusters/)")->required();
  tr->add_option("--gpus", tc.gpus, "GPUs")->required();
  tr->add_option("--tp", tc.tp, "tensor parallel");
  tr->add_option("--pp", tc.pp, "pipeline parallel");
  tr->add_option("--dp", tc.dp, "data parallel");
  tr->add_option("--cp", tc.cp, "context parallel");
  tr->add_option("--ep", tc.ep, "expert parallel (within dp x cp)");
  tr->add_option("--vpp", tc.vpp, "virtual pipeline stages per GPU (interleaved 1F1B)");
  tr->add_option("--global-batch", tc.global_batch, "sequences per iteration")->required();
  tr->add_option("--micro-batch", micro, "sequences per micro-batch, or auto");
  tr->add_option("--seq", tc.seq, "sequence length");
  tr->add_option("--recompute", recompute, "none, selective, full");
  tr->add_option("--zero", tc.zero, "ZeRO stage 0..3");
  tr->add_option("--algo", tc.algo, "collective plan for every group (default auto)");
  tr->add_flag("--no-sequence-parallel", no_sp, "plain tensor parallelism (allreduce per block)");
  tr->add_flag("--no-flash-attention", no_flash, "materialise the s x s attention scores");
  tr->add_flag("--fp8", tc.fp8, "fp8 GEMMs");
  tr->add_flag("--json", json, "print JSON");

  CLI11_PARSE(app, argc, argv);
  const plan::Registry reg = plan::Registry::builtin();

  if (col->parsed()) {
    if (network != "analytical")
      return fail(invalidArgument("--network {}: only the analytical model is implemented yet", network));
    auto cluster = loadCluster(cluster_path);
    if (!cluster.isOk()) return fail(cluster.status());
    auto bytes = parseBytes(bytes_text);
    if (!bytes.isOk()) return fail(bytes.status());
    auto r = simulateCollective(*cluster, gpus, collective, *bytes, algo, reg);
    if (!r.isOk()) return fail(r.status());
    if (json) {
      std::cout << toJson(*r).dump(2) << "\n";
    } else {
      std::printf("%s %.0f bytes on %lld GPUs of %s: %.1f us, algbw %.2f GB/s, busbw %.2f GB/s, algo %s, bottleneck %s\n",
                  r->collective.c_str(), r->bytes, static_cast<long long>(gpus), cluster->name.c_str(), r->time_us,
                  r->algbw_gbps, r->busbw_gbps, r->algo.c_str(), r->bottleneck.c_str());
    }
    return 0;
  }
  if (tr->parsed()) {
    auto cluster = loadCluster(cluster_path);
    if (!cluster.isOk()) return fail(cluster.status());
    auto model = loadModel(model_path);
    if (!model.isOk()) return fail(model.status());
    auto rc = parseRecompute(recompute);
    if (!rc.isOk()) return fail(rc.status());
    tc.recompute = *rc;
    tc.sequence_parallel = !no_sp;
    tc.flash_attention = !no_flash;
    if (micro == "auto") {
      tc.micro_batch = 0;
    } else {
      try {
        tc.micro_batch = std::stoll(micro);
      } catch (...) {
        return fail(invalidArgument("--micro-batch '{}' is not a number or auto", micro));
      }
    }
    auto r = simulateTraining(*model, *cluster, tc, reg);
    if (!r.isOk()) return fail(r.status());
    if (json) {
      std::cout << toJson(*r).dump(2) << "\n";
    } else {
      std::printf("%s on %lld GPUs of %s: %.3f s/iteration, %.0f tokens/s, MFU %.1f%%, %.1f GiB/GPU, bottleneck %s (%s)\n",
                  model->name.c_str(), static_cast<long long>(tc.gpus), cluster->name.c_str(), r->iteration_s,
                  r->tokens_per_s, 100 * r->mfu, r->memory_gib_per_gpu, r->bottleneck.c_str(), r->bottleneck_link.c_str());
      for (const auto& [k, v] : r->breakdown) std::printf("  %-12s %.4f s\n", k.c_str(), v);
    }
    return 0;
  }
  return 0;
}

#include "sim/report.hpp"

#include <charconv>

namespace chorus::sim {

Result<CollectiveReport> simulateCollective(const ClusterSpec& c, int64_t gpus, std::string_view collective, double bytes,
                                            std::string_view algo, const plan::Registry& reg) {
  plan::Collective coll;
  if (!plan::parseCollective(collective, &coll))
    return invalidArgument("--collective '{}' is not a collective (allreduce, allgather, reducescatter, broadcast, "
                           "reduce, alltoall, gather, scatter, barrier)", collective);
  if (gpus < 1 || gpus > c.gpus())
    return invalidArgument("--gpus {} is outside [1, {}] for cluster '{}'", gpus, c.gpus(), c.name);
  CHORUS_ASSIGN_OR_RETURN(Topology topo, Topology::build(c));
  NetworkModel net(c, topo, reg);
  CHORUS_ASSIGN_OR_RETURN(CollectiveCost cc, net.collective(coll, Bytes(bytes), GroupSet{gpus, 1, 1}, algo));
  CollectiveReport r;
  r.collective = std::string(collective);
  r.algo = cc.algo;
  r.bottleneck = cc.bottleneck;
  r.gpus = gpus;
  r.bytes = bytes;
  r.time_us = toUs(cc.time);
  r.latency_us = toUs(cc.latency);
  r.algbw_gbps = cc.time.value() > 0 ? bytes / cc.time.value() / 1e9 : 0;
  r.busbw_gbps = r.algbw_gbps * busBandwidthFactor(coll, gpus);
  return r;
}

nlohmann::json toJson(const CollectiveReport& r) {
  return {{"collective", r.collective}, {"gpus", r.gpus},           {"bytes", r.bytes},
          {"algo", r.algo},             {"time_us", r.time_us},     {"latency_us", r.latency_us},
          {"algbw_gbps", r.algbw_gbps}, {"busbw_gbps", r.busbw_gbps}, {"bottleneck", r.bottleneck}};
}

nlohmann::json toJson(const TrainReport& r) {
  const TrainConfig& c = r.config;
  const char* rc[] = {"none", "selective", "full"};
  nlohmann::json j = {
      {"layout", {{"gpus", c.gpus}, {"tp", c.tp}, {"pp", c.pp}, {"dp", c.dp}, {"cp", c.cp}, {"ep", c.ep},
                  {"vpp", c.vpp}, {"micro_batch", c.micro_batch}, {"global_batch", c.global_batch}, {"seq", c.seq},
                  {"recompute", rc[static_cast<int>(c.recompute)]}, {"zero", c.zero},
                  {"sequence_parallel", c.sequence_parallel}, {"flash_attention", c.flash_attention}, {"fp8", c.fp8}}},
      {"iteration_time_s", r.iteration_s},
      {"tokens_per_s", r.tokens_per_s},
      {"model_tflops_per_gpu", r.model_tflops_per_gpu},
      {"hardware_tflops_per_gpu", r.hardware_tflops_per_gpu},
      {"mfu", r.mfu},
      {"memory_gib_per_gpu", r.memory_gib_per_gpu},
      {"memory", {{"weights_gib", r.memory.weights_gib}, {"grads_gib", r.memory.grads_gib},
                  {"optimizer_gib", r.memory.optimizer_gib}, {"activations_gib", r.memory.activations_gib}}},
      {"breakdown", r.breakdown},
      {"bottleneck", r.bottleneck},
      {"bottleneck_link", r.bottleneck_link}};
  return j;
}

Result<double> parseBytes(std::string_view text) {
  double v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || v < 0) return invalidArgument("'{}' is not a size (examples: 1G, 256M, 4K, 1048576)", text);
  std::string_view suf(p, static_cast<size_t>(text.data() + text.size() - p));
  if (suf.empty() || suf == "B") return v;
  if (suf == "K" || suf == "KiB") return v * 1024;
  if (suf == "M" || suf == "MiB") return v * 1048576;
  if (suf == "G" || suf == "GiB") return v * 1073741824.0;
  if (suf == "T" || suf == "TiB") return v * 1099511627776.0;
  return invalidArgument("'{}': unknown size suffix '{}' (use K, M, G or T)", text, suf);
}

Result<Recompute> parseRecompute(std::string_view text) {
  if (text == "none") return Recompute::None;
  if (text == "selective") return Recompute::Selective;
  if (text == "full") return Recompute::Full;
  return invalidArgument("--recompute '{}' is not one of none, selective, full", text);
}

}  // namespace chorus::sim

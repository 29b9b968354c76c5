#include "sim/report.hpp"

#include <charconv>

namespace chorus::sim {

namespace {

// The flat compressed plan over one group: the direct reduce-scatter (an
// all-to-all of the wire bytes) and/or the all-gather of the quantized shards.
Result<CollectiveCost> flatCompressed(NetworkModel& net, plan::Collective coll, double wire, const GroupSet& g,
                                      std::string_view algo) {
  CollectiveCost out;
  if (coll != plan::Collective::AllGather) {
    CHORUS_ASSIGN_OR_RETURN(CollectiveCost rs, net.collective(plan::Collective::AllToAll, Bytes(wire), g, algo));
    out = rs;
    out.algo = "direct reduce-scatter (" + rs.algo + ")";
  }
  if (coll != plan::Collective::ReduceScatter) {
    CHORUS_ASSIGN_OR_RETURN(CollectiveCost ag, net.collective(plan::Collective::AllGather, Bytes(wire), g, algo));
    if (ag.time > out.time) out.bottleneck = ag.bottleneck;
    out.time += ag.time;
    out.latency += ag.latency;
    out.algo = (out.algo.empty() ? "" : out.algo + " + ") + "all-gather (" + ag.algo + ")";
  }
  return out;
}

void add(CollectiveCost* to, const CollectiveCost& c, const std::string& what) {
  if (c.time > to->time) to->bottleneck = c.bottleneck;
  to->time += c.time;
  to->latency += c.latency;
  to->algo += (to->algo.empty() ? "" : " + ") + what + " (" + c.algo + ")";
}

}  // namespace

Result<CollectiveCost> compressedCost(NetworkModel& net, plan::Collective coll, double wire, double data,
                                      const GroupSet& g, std::string_view algo) {
  // Members per node (the group's stride dividing the node) and nodes.
  const int64_t gpn = net.cluster().node.gpus, st = g.stride;
  const int64_t e = st <= gpn && gpn % st == 0 ? std::min<int64_t>(g.size, gpn / st) : 1;
  if (e <= 1 || e >= g.size || g.size % e != 0) return flatCompressed(net, coll, wire, g, algo);
  // Two levels: inside the node the data move uncompressed over NVLink (a
  // reduce-scatter of fp32 partial sums, no quantization), across nodes each
  // rail of e-th shards runs the flat compressed plan on 1/e of the data, and
  // the node all-gathers the result: still one quantization per
  // reduce-scatter and one per all-gather of an element.
  const GroupSet node{e, st, g.groups * (g.size / e), g.offset};
  const GroupSet rail{g.size / e, st * e, g.groups * e, g.offset};
  CollectiveCost out;
  if (coll != plan::Collective::AllGather) {
    CHORUS_ASSIGN_OR_RETURN(CollectiveCost rs, net.collective(plan::Collective::ReduceScatter, Bytes(data), node, algo));
    add(&out, rs, "node reduce-scatter");
  }
  CHORUS_ASSIGN_OR_RETURN(CollectiveCost x, flatCompressed(net, coll, wire / static_cast<double>(e), rail, algo));
  add(&out, x, "across nodes: " + std::string("compressed"));
  if (coll != plan::Collective::ReduceScatter) {
    CHORUS_ASSIGN_OR_RETURN(CollectiveCost ag, net.collective(plan::Collective::AllGather, Bytes(data), node, algo));
    add(&out, ag, "node all-gather");
  }
  return out;
}

Result<CollectiveReport> simulateCollective(const ClusterSpec& c, int64_t gpus, std::string_view collective, double bytes,
                                            std::string_view algo, const plan::Registry& reg, NetMode mode,
                                            Library lib, const Compression& compress) {
  plan::Collective coll;
  if (!plan::parseCollective(collective, &coll))
    return invalidArgument("--collective '{}' is not a collective (allreduce, allgather, reducescatter, broadcast, "
                           "reduce, alltoall, gather, scatter, barrier)", collective);
  if (gpus < 1 || gpus > c.gpus())
    return invalidArgument("--gpus {} is outside [1, {}] for cluster '{}'", gpus, c.gpus(), c.name);
  CHORUS_ASSIGN_OR_RETURN(Topology topo, Topology::build(c));
  NetworkModel net(c, topo, reg, mode);
  net.setLibrary(lib);
  // Compressed: fp32 data (nccl-tests' default type) on a narrower wire.
  constexpr double kDataBytes = 4;
  CHORUS_RETURN_IF_ERROR(checkCompression(compress, coll, kDataBytes));
  const double ratio = compress.on() ? compress.wireBytes() / kDataBytes : 1;
  const GroupSet all{gpus, 1, 1};
  CollectiveCost cc;
  if (!compress.on()) {
    CHORUS_ASSIGN_OR_RETURN(cc, net.collective(coll, Bytes(bytes), all, algo));
  } else {
    // The compressed plans (sim/compress.hpp): no reduction may happen in the
    // network or along a chain of hops (each would dequantize and quantize
    // again), so the reduce-scatter is direct -- every rank sends each owner
    // its quantized contribution, an all-to-all of the wire bytes -- and the
    // all-gather moves the quantized reduced shards.
    CHORUS_ASSIGN_OR_RETURN(cc, compressedCost(net, coll, bytes * ratio, bytes, all, algo));
  }
  Seconds quantize(0);
  if (compress.on())
    quantize = Bytes(quantizeHbmBytes(coll, bytes, ratio, gpus)) / (c.gpu.hbm_bw * c.gpu.hbm_efficiency) +
               c.gpu.kernel_overhead * quantizeKernels(coll);
  cc.time += quantize;
  CollectiveReport r;
  r.compress = compress.describe();
  r.wire_bytes = bytes * ratio;
  r.quantize_us = toUs(quantize);
  r.quantizations = compress.on() ? quantizations(coll) : 0;
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
          {"algbw_gbps", r.algbw_gbps}, {"busbw_gbps", r.busbw_gbps}, {"bottleneck", r.bottleneck},
          {"compress", r.compress},     {"wire_bytes", r.wire_bytes}, {"quantize_us", r.quantize_us},
          {"quantizations", r.quantizations}};
}

nlohmann::json toJson(const TrainReport& r) {
  const TrainConfig& c = r.config;
  const char* rc[] = {"none", "selective", "full"};
  nlohmann::json j = {
      {"layout", {{"gpus", c.gpus}, {"tp", c.tp}, {"pp", c.pp}, {"dp", c.dp}, {"cp", c.cp}, {"ep", c.ep}, {"etp", c.etp},
                  {"vpp", c.vpp}, {"micro_batch", c.micro_batch}, {"global_batch", c.global_batch}, {"seq", c.seq},
                  {"recompute", rc[static_cast<int>(c.recompute)]}, {"recompute_layers", c.recompute_layers}, {"grad_dtype", c.grad_bytes == 2 ? "bf16" : "fp32"}, {"grad_accum_fusion", c.grad_accum_fusion}, {"rank_order", c.pp_before_dp ? "tp-cp-ep-pp-dp" : "tp-cp-ep-dp-pp"}, {"optimizer_moments", c.moment_bytes == 2 ? "bf16" : "fp32"}, {"optimizer", c.optimizer == TrainConfig::Optimizer::Sgd ? "sgd" : "adam"}, {"recompute_modules", c.recompute == Recompute::Selective ? c.recompute_modules.describe() : std::string("-")}, {"mtp_layers", c.mtp_layers}, {"pp_schedule", c.zero_bubble ? "zb-h1" : c.dualpipe ? "dualpipe" : "1f1b"}, {"zero", c.zero},
                  {"first_stage_layers", c.first_stage_layers}, {"last_stage_layers", c.last_stage_layers}, {"pp_layout", c.pp_layout},
                  {"sequence_parallel", c.sequence_parallel}, {"flash_attention", c.flash_attention}, {"clock", c.burst_clock ? "burst" : "sustained"}, {"fp8", c.fp8},
                  {"moe_dispatch", c.moe_dispatch == TrainConfig::MoeDispatch::Hierarchical ? "hierarchical" : "alltoall"},
                  {"fp8_dispatch", c.fp8_dispatch}, {"moe_imbalance", c.moe_imbalance}, {"moe_a2a_overlap", c.moe_a2a_overlap}}},
      {"iteration_time_s", r.iteration_s},
      {"estimate_s", r.estimate_s},
      {"estimate_breakdown", r.estimate_breakdown},
      {"schedule", r.config.schedule ? nlohmann::json{{"tasks", r.schedule_tasks},
                                                      {"layers_per_task", r.schedule_merged_layers},
                                                      {"async_tp", r.config.async_tp},
                                                      {"overlap_dp", r.config.overlap_dp}}
                                     : nlohmann::json()},
      {"tokens_per_s", r.tokens_per_s},
      {"model_tflops_per_gpu", r.model_tflops_per_gpu},
      {"hardware_tflops_per_gpu", r.hardware_tflops_per_gpu},
      {"mfu", r.mfu},
      {"mfu_causal", r.mfu_causal},
      {"mfu_convention", "mfu: attention over the full s x s (Megatron, Narayanan et al. 2021 eq. 3); mfu_causal: its causal half"},
      {"memory_gib_per_gpu", r.memory_gib_per_gpu},
      {"memory_stage", r.memory_stage},
      {"memory", {{"weights_gib", r.memory.weights_gib}, {"grads_gib", r.memory.grads_gib},
                  {"optimizer_gib", r.memory.optimizer_gib}, {"activations_gib", r.memory.activations_gib},
                  {"reserve_gib", r.memory.reserve_gib},
                  {"reserve", {{"cuda_context_gib", r.memory.context_gib}, {"nccl_buffers_gib", r.memory.comm_buffers_gib},
                               {"communicators", r.memory.communicators},
                               {"allocator_fragmentation_gib", r.memory.fragmentation_gib}}},
                  {"headroom_gib", r.memory.headroom_gib}}},
      {"breakdown", r.breakdown},
      {"placement", r.placement},
      {"bottleneck", r.bottleneck},
      {"bottleneck_link", r.bottleneck_link},
      {"bounds", r.bounds.seconds},
      {"binding", r.bounds.binding}};
  nlohmann::json colls = nlohmann::json::array();
  for (const TrainReport::CollectiveLine& l : r.collectives)
    colls.push_back({{"category", l.dim}, {"collective", l.collective}, {"bytes", l.bytes}, {"ranks", l.ranks},
                     {"groups", l.groups}, {"time_s", l.time_s}, {"algo", l.algo}, {"link", l.link}});
  j["collectives"] = colls;
  if (r.moe_block.forward_s > 0) {
    const TrainReport::MoeBlock& b = r.moe_block;
    j["moe_block"] = {{"forward_s", b.forward_s},         {"backward_s", b.backward_s},
                      {"router_s", b.router_s},           {"permute_s", b.permute_s},
                      {"experts_fwd_s", b.experts_fwd_s}, {"experts_bwd_s", b.experts_bwd_s},
                      {"shared_fwd_s", b.shared_fwd_s},   {"shared_bwd_s", b.shared_bwd_s},
                      {"dispatch_s", b.dispatch_s},       {"combine_s", b.combine_s}};
  }
  return j;
}

std::string layoutName(const TrainConfig& c) {
  const char* rc[] = {"none", "selective", "full"};
  return fmt::format("tp {} pp {} dp {} cp {} ep {}{} vpp {} mb {} zero {} recompute {}{}{}", c.tp, c.pp, c.dp, c.cp, c.ep,
                     c.etp > 0 ? fmt::format(" etp {}", c.etp) : "", c.vpp, c.micro_batch, c.zero,
                     rc[static_cast<int>(c.recompute)],
                     c.recompute_layers > 0 ? fmt::format(" ({} layers per stage)", c.recompute_layers) : "",
                     c.dualpipe ? " dualpipe" : c.zero_bubble ? " zb-h1" : c.moe_a2a_overlap ? " a2a-overlap" : "");
}

nlohmann::json toJson(const SearchResult& r) {
  nlohmann::json top = nlohmann::json::array();
  for (const TrainReport& t : r.top) top.push_back(toJson(t));
  nlohmann::json dropped = nlohmann::json::array();
  for (const TrainReport& t : r.dropped)
    dropped.push_back({{"layout", layoutName(t.config)}, {"estimate_s", t.iteration_s},
                       {"memory_gib_per_gpu", t.memory_gib_per_gpu}, {"reserve_gib", t.memory.reserve_gib},
                       {"headroom_gib", t.memory.headroom_gib}});
  return {{"candidates", r.candidates}, {"feasible", r.feasible}, {"resimulated", r.resimulated},
          {"dropped_for_memory", r.dropped_memory}, {"nearest_dropped_for_memory", dropped},
          {"estimate_seconds", r.estimate_seconds}, {"schedule_seconds", r.schedule_seconds}, {"top", top}};
}

nlohmann::json toJson(const Latency& l) {
  return {{"mean_s", l.mean}, {"p50_s", l.p50}, {"p90_s", l.p90}, {"p99_s", l.p99}};
}

nlohmann::json toJson(const ServeStats& s) {
  return {{"mode", s.mode},
          {"prefill_replicas", s.prefill_replicas},
          {"decode_replicas", s.decode_replicas},
          {"decode_tp", s.decode_tp},
          {"decode_ep", s.decode_ep},
          {"ttft_s", {{"p50", s.ttft_p50_s}, {"p90", s.ttft_p90_s}, {"p99", s.ttft_p99_s}}},
          {"tpot_s", {{"p50", s.tpot_p50_s}, {"p90", s.tpot_p90_s}, {"p99", s.tpot_p99_s}}},
          {"ttft", toJson(s.ttft)},
          {"tpot", toJson(s.tpot)},
          {"itl", toJson(s.itl)},
          {"e2e", toJson(s.e2e)},
          {"duration_s", s.duration_s},
          {"request_throughput_rps", s.throughput_rps},
          {"output_tokens_per_s", s.tokens_per_s},
          {"total_tokens_per_s", s.total_tokens_per_s},
          {"output_tokens_per_s_per_user", s.per_user_tokens_per_s},
          {"max_running_per_replica", s.max_running},
          {"preemptions", s.preemptions},
          {"throughput_rps", s.throughput_rps},
          {"tokens_per_s", s.tokens_per_s},
          {"slo_attainment", s.slo_attainment},
          {"goodput_rps", s.goodput_rps},
          {"kv_transfer_mean_s", s.kv_transfer_mean_s},
          {"label", s.label()},
          {"stability", {{"offered_rps", s.offered_rps}, {"capacity_rps", s.capacity_rps},
                         {"in_system_at_middle_arrival", s.backlog_mid}, {"in_system_at_last_arrival", s.backlog_end},
                         {"queue_growing", s.queue_growing}, {"overloaded", s.overloaded}}}};
}

nlohmann::json toJson(const InferReport& r) {
  nlohmann::json splits = nlohmann::json::array();
  for (const ServeStats& s : r.splits) splits.push_back(toJson(s));
  const InferConfig& c = r.config;
  return {{"config", {{"gpus", c.gpus}, {"tp", r.tp}, {"replicas", r.replicas}, {"rate_rps", c.rate},
                      {"requests", c.requests}, {"input_len", c.input_len}, {"output_len", c.output_len},
                      {"ttft_slo_s", c.ttft_slo_s}, {"tpot_slo_s", c.tpot_slo_s}, {"e2e_slo_s", c.e2e_slo_s},
                      {"concurrency", c.concurrency}, {"max_throughput", c.max_throughput},
                      {"chunked_prefill", c.chunked_prefill}, {"prefill_tokens", c.prefill_tokens},
                      {"max_batch", c.max_batch}, {"fp8_weights", c.fp8}, {"kv_fp8", c.kv_fp8},
                      {"kv_paged", c.kv_paged}, {"paged_overhead", c.kv_paged ? c.paged_overhead : 0.0},
                      {"prefix_hit", c.prefix_hit}, {"step_overhead_s", c.step_overhead_s},
                      {"request_overhead_s", c.request_overhead_s}}},
          {"weight_bytes_per_gpu", r.weight_bytes_per_gpu},
          {"speculative", {{"tokens", c.spec_tokens}, {"acceptance", c.spec_acceptance},
                           {"draft_model", c.draft_model ? nlohmann::json(c.draft_model->name) : nlohmann::json()},
                           {"expected_tokens_per_step", r.expected_tokens_per_step}, {"draft_step_s", r.draft_step_s}}},
          {"kv_capacity_bytes_per_gpu", r.kv_capacity_bytes},
          {"prefill_s_per_request", r.prefill_s_per_request},
          {"decode_step_s", r.decode_step_s},
          {"sample_s", r.sample_s},
          {"kv_bytes_per_request", r.kv_bytes_per_request},
          {"kv_capacity_tokens_per_replica", r.kv_capacity_tokens},
          {"aggregated", toJson(r.aggregated)},
          {"disaggregated_best", r.best_disaggregated.mode.empty() ? nlohmann::json() : toJson(r.best_disaggregated)},
          {"disaggregated_splits", splits},
          {"disaggregated_ranking", "goodput_rps (higher first), then ttft p50 (lower first), then fewer prefill replicas"},
          {"best", r.best}};
}

Result<Recompute> parseRecompute(std::string_view text) {
  if (text == "none") return Recompute::None;
  if (text == "selective") return Recompute::Selective;
  if (text == "full") return Recompute::Full;
  return invalidArgument("--recompute '{}' is not one of none, selective, full", text);
}

}  // namespace chorus::sim

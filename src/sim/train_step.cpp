// The training model's iteration from its per-layer costs: the closed-form pipeline
// estimate, data parallelism and the optimizer, the physical bounds, the simulated
// schedule and the report (Trainer members; see train_detail.hpp).
#include <algorithm>
#include <array>
#include <cmath>

#include "sim/report.hpp"
#include "sim/train_detail.hpp"

namespace chorus::sim::detail {

// The closed-form pipeline: the pacing stage's compute and exposed
// communication per micro-batch, the fill-and-drain bubble and the pipeline's
// point-to-point sends.
Status Trainer::estimatePipeline() {
  // Uneven splits (Llama-3 405B's 126 layers on 16 stages) give some stages
  // one more layer; the analytical model charges the fullest share to the
  // last stage (an upper bound on the slowest stage; the trace costs each).
  pace = priceRange(first_layer, static_cast<int>(layers_per_stage), p == 1, true);
  stage_fwd = pace.fwd, stage_bwd = pace.bwd, stage_recompute = pace.recompute;
  tp_f = pace.tp_f, tp_b = pace.tp_b;
  // --moe-a2a-overlap: a pass's dispatch and combine run under the compute of
  // the pass it is combined with (the other micro-batch's backward or forward).
  ep_stage = cfg.moe_a2a_overlap || cfg.dualpipe ? overlapped(pace.ep, stage_fwd + stage_bwd + stage_recompute, smf)
                                                 : pace.ep;
  cp_exposed = cpExposed(pace);

  // Pipeline point-to-point: one activation (split over tp: the sequence
  // shard with SP; without it Megatron's scatter/gather optimisation sends
  // 1/t of the tensor and all-gathers it over NVLink on arrival) per
  // micro-batch and virtual-stage boundary, forward and backward.
  if (p > 1) {
    CHORUS_ASSIGN_OR_RETURN(CollectiveCost pc_raw, net.sendRecv(Bytes(act_bytes / T), ppg));
    const CollectiveCost pc = shared(pc_raw);
    record("pp_comm_s", "sendrecv", act_bytes / T, ppg, pc);
    p2p = pc.time;
    if (!sp && t > 1) {
      CHORUS_ASSIGN_OR_RETURN(Seconds ag, coll(plan::Collective::AllGather, act_bytes, tpg, "pp_comm_s"));
      p2p += ag;
    }
  }

  tp_stage = tp_f + tp_b;
  const Seconds per_mb = stage_fwd + stage_bwd + stage_recompute;
  const Seconds per_mb_comm = tp_stage + ep_stage + cp_exposed;
  const double bubble_units = static_cast<double>(p - 1) / static_cast<double>(v);
  compute = per_mb * mbf;
  // ZB-H1: the fill and drain cost F + B - W per stage instead of F + B + W.
  // DualPipe: (p/2 - 1)(F&B + B - 3W) (DeepSeek-V3 report, Table 2), F&B one combined pair.
  bubble = cfg.zero_bubble ? std::max(Seconds(0), per_mb + per_mb_comm - pace.wgrad * 2) * bubble_units
           : cfg.dualpipe  ? std::max(Seconds(0), per_mb + per_mb_comm + stage_bwd - pace.wgrad * 3) *
                                (static_cast<double>(p / 2 - 1) / static_cast<double>(p - 1)) * bubble_units
                           : (per_mb + per_mb_comm) * bubble_units;
  pp_comm = p2p * (2.0 * (mbf * static_cast<double>(v) + static_cast<double>(p - 1)) / static_cast<double>(v)) *
            (p > 1 ? 1.0 : 0.0);
  return {};
}

// A data-parallel collective; compressed, the gradients' reduce-scatter is
// the direct one of sim/compress.hpp (an all-to-all of the wire bytes: no
// reduction along hops or in the network).
Result<Seconds> Trainer::gradColl(plan::Collective k, double bytes, const GroupSet& g) {
  if (k != plan::Collective::ReduceScatter || !cfg.grad_compress.on()) return coll(k, bytes, g, "dp_comm_s");
  CHORUS_ASSIGN_OR_RETURN(CollectiveCost raw, compressedCost(net, k, bytes, bytes / grad_wire * grad_data, g, cfg.algo));
  const CollectiveCost cc = shared(raw);
  record("dp_comm_s", "reducescatter (compressed)", bytes, g, cc);
  return cc.time;
}

// The GPU's quantize and dequantize work around a compressed reduce-scatter
// of `params` gradients over `n` ranks.
Seconds Trainer::quantizeTime(double params, int64_t n) const {
  if (!cfg.grad_compress.on() || params <= 0) return Seconds(0);
  const double bytes = quantizeHbmBytes(plan::Collective::ReduceScatter, params * grad_data, grad_wire / grad_data, n);
  return raw_gpu.mem(bytes) + raw_gpu.g.kernel_overhead * (quantizeKernels(plan::Collective::ReduceScatter) - 1);
}

// Both groups' collectives of this stage's parameters (dense over dp x cp,
// experts over their expert-data-parallel group).
Result<Seconds> Trainer::dpColl(plan::Collective k) {
  Seconds x(0);
  if (dense_dp) {
    CHORUS_ASSIGN_OR_RETURN(x, gradColl(k, dense_params * wireBytes(k), dcg));
    if (k == plan::Collective::ReduceScatter) x += quantizeTime(dense_params, dcg.size);
  }
  if (expert_params > 0 && edp_n > 1) {
    CHORUS_ASSIGN_OR_RETURN(Seconds e, gradColl(k, expert_params * wireBytes(k), edpg));
    if (k == plan::Collective::ReduceScatter) e += quantizeTime(expert_params, edpg.size);
    x += e;
  }
  return x;
}

// Data parallelism and the optimizer.  Gradients are reduce-scattered layer
// by layer (bucket = layer) as the backward produces them and parameters
// all-gathered layer by layer ahead of the forward that uses them, so all but
// the first gathered and the last reduced layer can hide under compute
// (Megatron's overlap-grad-reduce / overlap-param-gather; FSDP's
// forward/backward prefetch).  Collectives that hide in the same window share
// its links: ZeRO-3's backward gathers the next layer while the previous
// layer's gradients are reduce-scattered, so both hide under one backward (as
// their sum), and the compute that asynchronous tp or ring-attention
// transfers already hide under is not available again to data-parallel
// transfers on the same link class.
//   ZeRO-0/1: one reduce-scatter in the last micro-batch's backward, one
//             all-gather in the first one's forward (the fp32 main gradients
//             accumulate unsharded);
//   ZeRO-2:   gradients are sharded, so every micro-batch's backward
//             reduce-scatters (DeepSpeed's stage 2);
//   ZeRO-3:   also a gather before every micro-batch's forward and backward.
Status Trainer::priceDataParallel() {
  stage_expert = expertParamsOf(first_layer, static_cast<int>(layers_per_stage));
  // Expert parameters reduce over their expert-data-parallel group (tp x cp x
  // dp / (ep x etp) GPUs, stride ep x etp folded, tp x ep classic with cp = 1;
  // classic with cp > 1 is not one strided group and keeps the dense group),
  // the rest over dp x cp.
  edp_n = (t * cp * d) / (ep * etp);
  edp_own = moe && ep > 1 && (cfg.etp > 0 || cp == 1);
  edpg = cfg.etp > 0 ? GroupSet{edp_n, ep * etp, cfg.gpus / edp_n} : GroupSet{edp_n, t * ep, cfg.gpus / edp_n};
  // Parameters travel in bf16 (the distributed optimizer's all-gather), the
  // gradients in the gradient buffer's dtype (--grad-dtype: Megatron's DDP
  // reduce-scatters its fp32 main-gradient buffer with
  // --accumulate-allreduce-grads-in-fp32, the bf16 one with
  // grad_reduce_in_fp32 = false).  With --compress the reduce-scatter carries
  // the compressed format and the GPU quantizes and dequantizes around it
  // (sim/compress.hpp).
  grad_data = static_cast<double>(cfg.grad_bytes);
  grad_wire = cfg.grad_compress.on() ? cfg.grad_compress.wireBytes() : grad_data;
  expert_params = edp_own ? stage_expert : 0;
  // Data-parallel traffic exists when dp x cp > 1, or when only the experts
  // are replicated: folded over tp (--etp) with ep x etp < tp x cp x dp, the
  // expert-data-parallel group has edp_n > 1 members even at dp x cp = 1.
  dense_dp = d * cp > 1;
  any_dp = dense_dp || (edp_own && edp_n > 1);
  dense_params = stage_params - expert_params;  // reduced over dp x cp
  // dp x cp: one block of t x cp x d ranks at stride t in Megatron's order;
  // with pp before dp (cp or dp of 1, checked) the dp replicas sit pp apart.
  dcg = cfg.pp_before_dp && d > 1 ? GroupSet{d, dp_stride, cfg.gpus / d} : GroupSet{d * cp, t, cfg.gpus / (d * cp)};
  if (any_dp) {
    CHORUS_ASSIGN_OR_RETURN(Seconds rs, dpColl(plan::Collective::ReduceScatter));
    CHORUS_ASSIGN_OR_RETURN(Seconds ag, dpColl(plan::Collective::AllGather));
    const LinkClass dp_links = ledger.collective(plan::Collective::AllGather, 1, dcg).dominant();
    Seconds claimed_f(0), claimed_b(0);
    if (t > 1 && ledger.collective(plan::Collective::AllGather, 1, tpg).dominant() == dp_links)
      for (int l = first_layer; l < first_layer + layers_per_stage; ++l) claimed_b += tpHidden(timesOf(l));
    if (cp > 1 && ledger.collective(plan::Collective::AllGather, 1, cpg).dominant() == dp_links) {
      const Seconds hidden = pace.cp - cp_exposed;
      const double fshare = stage_fwd.value() / std::max(1e-30, (stage_fwd + stage_bwd).value());
      claimed_f += hidden * fshare, claimed_b += hidden * (1 - fshare);
    }
    const Seconds win_f = std::max(Seconds(0), stage_fwd - claimed_f);
    const Seconds win_b = std::max(Seconds(0), stage_bwd + stage_recompute - claimed_b);
    const double edge = 1.0 / static_cast<double>(layers_per_stage), inner = 1 - edge;
    const Seconds fwd_gather = ag * edge + overlapped(ag * inner, win_f * inner, smf);
    const Seconds bwd_reduce = overlapped(rs * inner, win_b * inner, smf) + rs * edge;
    if (cfg.zero == 3) {
      dp_ag = fwd_gather;
      dp_rs = ag * edge + overlapped((ag + rs) * inner, win_b * inner, smf) + rs * edge;
      dp_comm = (dp_ag + dp_rs) * mbf;
    } else {
      dp_ag = fwd_gather, dp_rs = bwd_reduce;
      dp_comm = dp_ag + dp_rs * (cfg.zero == 2 ? mbf : 1.0);
    }
  }
  // The optimizer step (fused, memory bound) over the parameters this GPU
  // updates: gradient-norm read (fp32, 4 B), Adam (fp32 master, m, v read and
  // written and the fp32 gradient read: 28 B), the bf16 copy of the updated
  // weights (6 B), or SGD's (checkSchedule); then every held gradient is
  // zeroed (the buffer's bytes); and the framework's host time per layer
  // (one call per parameter tensor: the cluster's host.step_layer).
  optimizer = optimizerTime(stage_params, stage_expert, static_cast<double>(layers_per_stage));
  return {};
}

void Trainer::sumEstimate() {
  rep.breakdown["compute_s"] = compute.value();
  rep.breakdown["bubble_s"] = bubble.value();
  rep.breakdown["tp_comm_s"] = (tp_stage * mbf).value();
  rep.breakdown["ep_comm_s"] = (ep_stage * mbf).value();
  rep.breakdown["cp_comm_s"] = (cp_exposed * mbf).value();
  rep.breakdown["pp_comm_s"] = pp_comm.value();
  rep.breakdown["dp_comm_s"] = dp_comm.value();
  rep.breakdown["optimizer_s"] = optimizer.value();
  double total = 0;
  for (const auto& [k, x] : rep.breakdown) total += x;
  rep.iteration_s = rep.estimate_s = total;
  rep.estimate_breakdown = rep.breakdown;
}

// Each group's collectives per byte on every link class (the ledger), for
// the bounds and the schedule.
void Trainer::linkUnits() {
  auto unit = [&](plan::Collective k, const GroupSet& g, bool on) { return on ? ledger.collective(k, 1, g) : LinkDemand{}; };
  u_tag = unit(plan::Collective::AllGather, tpg, t > 1);
  u_trs = unit(plan::Collective::ReduceScatter, tpg, t > 1);
  u_tar = unit(plan::Collective::AllReduce, tpg, t > 1);
  u_cp = unit(plan::Collective::AllGather, cpg, cp > 1);
  u_ep = unit(plan::Collective::AllToAll, epg, moe && ep > 1 && !hier);
  u_rail = unit(plan::Collective::AllToAll, rail_g, hier && rail_g.size > 1);
  u_node = unit(plan::Collective::AllToAll, node_g, hier && node_g.size > 1);
  u_dag = unit(plan::Collective::AllGather, dcg, d * cp > 1);
  u_drs = unit(plan::Collective::ReduceScatter, dcg, d * cp > 1);
  u_eag = unit(plan::Collective::AllGather, edpg, edp_own && edp_n > 1);
  u_ers = unit(plan::Collective::ReduceScatter, edpg, edp_own && edp_n > 1);
  ep_demand = hier ? (u_rail.scaled((dispatch_bytes + a2a_bytes) * rail_share) +=
                      u_node.scaled((dispatch_bytes + a2a_bytes) * node_share))
                   : u_ep.scaled(dispatch_bytes + a2a_bytes);
}

// Per pipeline stage, from its own layers (the split of the trace and the
// schedule): the FLOPs and HBM bytes its kernels execute, its parameters and
// the bytes its GPU puts on each link class, overlapped or not, before the
// data-parallel collectives and the optimizer (bounds() adds them).
StageLoad Trainer::stageLoads() {
  // One layer's tensor-parallel traffic per micro-batch (tpComm's collectives);
  // a recomputed forward communicates again.
  auto tpLayer = [&](bool full) {
    const double fwd_tp = full ? 2 : 1;
    return sp ? (u_tag.scaled(2 * fwd_tp + 4) += u_trs.scaled(2 * fwd_tp + 2)).scaled(act_bytes)
              : u_tar.scaled((2 * fwd_tp + 2) * act_bytes);
  };
  const LinkDemand tp_layer_full = tpLayer(true), tp_layer_kept = tpLayer(false);
  const double core_flops = 2 * static_cast<double>(b) * heads_local * s * (s * static_cast<double>(cp)) *
                            (m.qkHeadDim() + m.vHeadDim());  // what selective recomputation repeats
  const size_t np = static_cast<size_t>(p);
  StageLoad x{std::vector<double>(np, 0), std::vector<double>(np, 0), std::vector<double>(np, 0),
              std::vector<double>(np, 0), std::vector<LinkDemand>(np)};
  int next = 0;
  for (int64_t k = 0; k < vs_count; ++k) {
    const int count = vs_layers[static_cast<size_t>(k)];
    const size_t sd = static_cast<size_t>(k % p);
    double widest = 0;
    x.params[sd] += paramsOf(next, count, false, &widest);
    x.expert[sd] += expertParamsOf(next, count);
    for (int l = next; l < next + count; ++l) {
      const Work& w = workOf(l);
      const bool full = fullAt(l);
      const double passes = full ? 3 : 2;  // forward, backward, recomputed forward
      double rf = 0, rb = 0;
      if (full) rf = w.f_flops, rb = w.f_bytes;
      if (cfg.recompute == Recompute::Selective) {
        const LayerTimes& lt = timesOf(l);
        rf = (rmods->core_attn ? core_flops : 0) + lt.recompute_flops, rb = lt.recompute_bytes;
      }
      x.flops[sd] += mbf * (w.f_flops + w.b_flops + rf);
      x.bytes[sd] += mbf * (w.f_bytes + w.b_bytes + rb);
      x.link[sd] += (full ? tp_layer_full : tp_layer_kept).scaled(mbf);
      x.link[sd] += u_cp.scaled(cp_bytes * passes * mbf);
      if (m.isMoeLayer(l)) x.link[sd] += ep_demand.scaled(passes * mbf);
    }
    next += count;
  }
  const size_t last = np - 1;
  if (logit_work) {
    x.flops[last] += mbf * (logit_work->f_flops + logit_work->b_flops);
    x.bytes[last] += mbf * (logit_work->f_bytes + logit_work->b_bytes);
  }
  if (t > 1) {
    const double heads = 1.0 + cfg.mtp_layers;  // the output head's traffic once per head
    x.link[last] += (sp ? (u_tag.scaled(act_bytes) += u_trs.scaled(act_bytes)) : u_tar.scaled(act_bytes)).scaled(mbf * heads);
    x.link[last] += u_tar.scaled(4 * bs * 3 * mbf * heads);  // cross-entropy
    x.link[0] += (sp ? (u_trs.scaled(act_bytes) += u_tag.scaled(act_bytes)) : u_tar.scaled(act_bytes)).scaled(mbf);
  }
  x.params[0] += V * h / T;
  if (p > 1) x.params[last] += V * h / T;
  if (p > 1) {  // 2 (p v - 1) sends per micro-batch over the pipeline's p GPUs
    const double sends = 2 * mbf * static_cast<double>(vs_count - 1) / static_cast<double>(p);
    const LinkDemand pp_link = ledger.sendRecv(act_bytes / T, ppg, sends);
    const LinkDemand regather = !sp && t > 1 ? u_tag.scaled(act_bytes * sends) : LinkDemand{};
    for (LinkDemand& y : x.link) y += pp_link, y += regather;
  }
  if (cfg.dualpipe) {  // rank r runs half the micro-batches on stage r and half on stage p-1-r, and holds both
    const StageLoad one = x;
    for (size_t r = 0; r < np; ++r) {
      const size_t o = np - 1 - r;
      x.flops[r] = (one.flops[r] + one.flops[o]) / 2, x.bytes[r] = (one.bytes[r] + one.bytes[o]) / 2;
      x.params[r] = one.params[r] + one.params[o], x.expert[r] = one.expert[r] + one.expert[o];
      x.link[r] = one.link[r].scaled(0.5) += one.link[o].scaled(0.5);
    }
  }
  return x;
}

// The physical bounds (src/sim/bounds.hpp): each is the largest stage's; the
// iteration can be no shorter than any of them.
void Trainer::bounds() {
  StageLoad x = stageLoads();
  // Per micro-batch (ZeRO-2/3) a copy runs only its half under DualPipe.
  const double per_copy = cfg.dualpipe ? mbf / 2 : mbf;
  const double dp_ag_runs = cfg.zero == 3 ? 2 * per_copy : 1, dp_rs_runs = cfg.zero >= 2 ? per_copy : 1;
  Bounds& bd = rep.bounds;
  double tensor = 0, hbm = 0;
  std::array<double, kLinkClasses> links{};
  for (size_t sd = 0; sd < static_cast<size_t>(p); ++sd) {
    const double ex = edp_own ? x.expert[sd] : 0;  // expert gradients reduce over their own group
    x.link[sd] += u_dag.scaled(act * (x.params[sd] - ex) * dp_ag_runs) += u_eag.scaled(act * ex * dp_ag_runs);
    x.link[sd] += u_drs.scaled(grad_wire * (x.params[sd] - ex) * dp_rs_runs) += u_ers.scaled(grad_wire * ex * dp_rs_runs);
    x.bytes[sd] += sharded(opt_step, x.params[sd], x.expert[sd], 1) +
                   sharded(zeroed(), x.params[sd], x.expert[sd], 2);  // optimizer
    tensor = std::max(tensor, x.flops[sd] / (cfg.fp8 ? c.gpu.peak8 : c.gpu.peak16).value());
    hbm = std::max(hbm, x.bytes[sd] / c.gpu.hbm_bw.value());
    for (size_t i = 0; i < links.size(); ++i) links[i] = std::max(links[i], x.link[sd].s[i]);
  }
  bd.seconds["tensor_cores"] = tensor;
  bd.seconds["hbm"] = hbm;
  for (int i = 0; i < kLinkClasses; ++i) {
    const LinkClass lc = static_cast<LinkClass>(i);
    const bool torus = c.network.topology == TopologyKind::Torus2d || c.network.topology == TopologyKind::Torus3d;
    if (lc == LinkClass::Uplink && torus) continue;
    bd.seconds[linkClassName(c, lc)] = links[static_cast<size_t>(i)];
  }
  // The closed-form estimate prices each collective on links of its own,
  // not shared with the collectives of other groups running at the same
  // time; where that puts it below a resource's busy time, the difference is
  // that contention (the schedule simulates it).  No estimate beats a bound.
  if (const double floor_s = bd.max(); rep.estimate_s < floor_s) {
    rep.estimate_breakdown["contention_s"] = floor_s - rep.estimate_s;
    rep.estimate_s = floor_s;
    if (!cfg.schedule) rep.iteration_s = floor_s, rep.breakdown = rep.estimate_breakdown;
  }
  double top = -1;
  for (const auto& [k, y] : bd.seconds)
    if (y > top) top = y, bd.binding = k;
}

namespace {

// `share`: ranks per core (Trainer::share); the link-seconds of a CPU rank's
// copies stretch with its time like the transfer's time (already scaled).
Transfer transferOf(double share, Seconds time, const LinkDemand& unit_demand, double bytes) {
  return Transfer{time.value(), unit_demand.scaled(bytes * share)};
}

}  // namespace

// A data-parallel collective of `params` (this GPU's share) per layer, priced alone.
Status Trainer::dpTransfers(double params, Transfer* ag_t, Transfer* rs_t, double expert) {
  if (!any_dp || params <= 0) return {};
  if (!edp_own) expert = 0;
  auto add = [&](double n_params, const GroupSet& g, const LinkDemand& u_ag, const LinkDemand& u_rs) -> Status {
    CHORUS_ASSIGN_OR_RETURN(CollectiveCost a_raw, net.collective(plan::Collective::AllGather, Bytes(act * n_params), g, cfg.algo));
    CHORUS_ASSIGN_OR_RETURN(CollectiveCost r_raw,
                            cfg.grad_compress.on()
                                ? compressedCost(net, plan::Collective::ReduceScatter, grad_wire * n_params,
                                                 grad_data * n_params, g, cfg.algo)
                                : net.collective(plan::Collective::ReduceScatter, Bytes(grad_wire * n_params), g, cfg.algo));
    const CollectiveCost a = shared(a_raw), r = shared(r_raw);
    *ag_t += transferOf(share, a.time, u_ag, act * n_params);
    *rs_t += transferOf(share, r.time + quantizeTime(n_params, g.size), u_rs, grad_wire * n_params);
    return {};
  };
  const double dense = params - expert;
  if (dense > 0 && dense_dp) CHORUS_RETURN_IF_ERROR(add(dense, dcg, u_dag, u_drs));
  if (expert > 0 && edp_n > 1) CHORUS_RETURN_IF_ERROR(add(expert, edpg, u_eag, u_ers));
  return {};
}

// Layer l of the schedule: its compute (the same per-op costs as the
// estimate), its collectives' times alone (the network model) and their
// link demands (the ledger).
LayerPlan Trainer::planLayer(int l, const Transfer& tp_fwd_t, const Transfer& tp_bwd_t, const Transfer& tp_async_t) {
  const LayerTimes& lt = timesOf(l);
  LayerPlan lp;
  lp.fwd = lt.fwd.value(), lp.bwd = lt.bwd.value(), lp.attn_core_fwd = lt.attn_core_fwd.value();
  const bool full = fullAt(l);
  if (full) lp.recompute = lt.fwd.value();
  if (cfg.recompute == Recompute::Selective) lp.recompute = lt.recompute_sel.value();
  if (t > 1)
    lp.bwd_async = (sp ? lt.qkv_dgrad + lt.qkv_wgrad + lt.fc1_dgrad + lt.fc1_wgrad : lt.qkv_wgrad + lt.fc1_wgrad).value();
  lp.wgrad = lt.wgrad.value();
  if (t > 1) lp.wgrad_async = (lt.qkv_wgrad + lt.fc1_wgrad).value();
  lp.tp_fwd = tp_fwd_t, lp.tp_bwd = tp_bwd_t, lp.tp_async = tp_async_t;
  if (cp > 1) lp.cp = transferOf(share, cp_fwd, u_cp, cp_bytes);
  if (m.isMoeLayer(l) && ep > 1) lp.ep = transferOf(share, ep_fwd, ep_demand, 1);
  if (full) {  // the recomputed forward communicates again (exposed, before the backward)
    lp.tp_recompute = tp_fwd_t;
    lp.tp_recompute += lp.cp;
    lp.tp_recompute += lp.ep;
  }
  return lp;
}

// The iteration as a schedule on shared resources: every layer of every
// virtual stage as planLayer prices it; the schedule decides what overlaps.
Status Trainer::buildSchedule() {
  IterationSpec& spec = rep.schedule_spec;
  spec = IterationSpec{};
  spec.pp = p, spec.vpp = v, spec.micro_batches = mb, spec.zero = cfg.zero, spec.comm_sm_fraction = smf;
  spec.options.async_tp = cfg.async_tp;
  spec.options.overlap_dp = cfg.overlap_dp;
  spec.options.zero_bubble = cfg.zero_bubble;
  spec.options.a2a_overlap = cfg.moe_a2a_overlap;
  Transfer tp_fwd_t, tp_bwd_t, tp_async_t;
  if (t > 1) {
    if (sp) {
      tp_fwd_t = transferOf(share, (tp_ag + tp_rs) * 2, u_tag.scaled(2) += u_trs.scaled(2), act_bytes);
      tp_bwd_t = transferOf(share, tp_ag * 2, u_tag, 2 * act_bytes);
      tp_async_t = transferOf(share, (tp_ag + tp_rs) * 2, u_tag.scaled(2) += u_trs.scaled(2), act_bytes);
    } else {
      tp_fwd_t = transferOf(share, tp_ar * 2, u_tar, 2 * act_bytes);
      tp_async_t = transferOf(share, tp_ar * 2, u_tar, 2 * act_bytes);
    }
  }
  spec.chunks.resize(static_cast<size_t>(vs_count));
  spec.optimizer_s.assign(static_cast<size_t>(p), 0);
  std::vector<double> params_of_stage(static_cast<size_t>(p), 0), expert_of_stage(static_cast<size_t>(p), 0);
  std::vector<double> stage_layers(static_cast<size_t>(p), 0);  // for the optimizer's host time per layer
  int next = 0;
  for (int64_t k = 0; k < vs_count; ++k) {
    const int count = vs_layers[static_cast<size_t>(k)];
    auto& layers = spec.chunks[static_cast<size_t>(k)];
    for (int l = next; l < next + count; ++l) {
      LayerPlan lp = planLayer(l, tp_fwd_t, tp_bwd_t, tp_async_t);
      double widest = 0;
      const double lparams = paramsOf(l, 1, false, &widest);
      params_of_stage[static_cast<size_t>(k % p)] += lparams;
      stage_layers[static_cast<size_t>(k % p)] += 1;
      expert_of_stage[static_cast<size_t>(k % p)] += expertParamsOf(l, 1);
      CHORUS_RETURN_IF_ERROR(dpTransfers(lparams, &lp.dp_ag, &lp.dp_rs, expertParamsOf(l, 1)));
      layers.push_back(lp);
    }
    next += count;
  }
  // A virtual stage without a layer (--pp-layout: Megatron's embedding- or
  // loss-only stages) still passes every micro-batch on: one task of no
  // measurable work (1 ns) that waits for its input and sends it on.
  for (auto& ch : spec.chunks)
    if (ch.empty()) {
      LayerPlan pass;
      pass.fwd = pass.bwd = 1e-9;
      ch.push_back(pass);
    }
  // The embedding (its tp reduction) on the first layer, the logits + loss on the last.
  LayerPlan& first = spec.chunks.front().front();
  LayerPlan& last = spec.chunks.back().back();
  if (t > 1) {
    first.tp_fwd += transferOf(share, sp ? tp_rs : tp_ar, sp ? u_trs : u_tar, act_bytes);
    if (sp) first.tp_bwd += transferOf(share, tp_ag, u_tag, act_bytes);
    const double heads = 1.0 + cfg.mtp_layers;
    last.tp_fwd += transferOf(share, (ce * 3 + (sp ? tp_ag : Seconds(0))) * heads,
                              u_tar.scaled(12 * bs) += (sp ? u_tag.scaled(act_bytes) : LinkDemand{}), heads);
    last.tp_async += transferOf(share, (sp ? tp_rs : tp_ar) * heads, sp ? u_trs : u_tar, act_bytes * heads);
    last.bwd_async += logit_wgrad_s.value();
    last.wgrad_async += logit_wgrad_s.value();
  }
  last.wgrad += logit_wgrad_s.value();
  last.fwd += logit_fwd.value(), last.bwd += logit_bwd.value();
  params_of_stage[0] += V * h / T;
  CHORUS_RETURN_IF_ERROR(dpTransfers(V * h / T, &first.dp_ag, &first.dp_rs));
  if (p > 1) {
    params_of_stage[static_cast<size_t>(p - 1)] += V * h / T;
    CHORUS_RETURN_IF_ERROR(dpTransfers(V * h / T, &last.dp_ag, &last.dp_rs));
  }
  if (cfg.dualpipe) {  // the second copy: the same stages, laid out from rank p - 1 down
    spec.vpp = 2;
    spec.options.dualpipe = true;
    spec.chunks.reserve(static_cast<size_t>(2 * p));
    for (int64_t k = 0; k < p; ++k) spec.chunks.push_back(spec.chunks[static_cast<size_t>(k)]);
    const auto ps0 = params_of_stage, es0 = expert_of_stage, ls0 = stage_layers;
    for (size_t r = 0; r < static_cast<size_t>(p); ++r) {
      stage_layers[r] = ls0[r] + ls0[static_cast<size_t>(p) - 1 - r];
      params_of_stage[r] = ps0[r] + ps0[static_cast<size_t>(p) - 1 - r];
      expert_of_stage[r] = es0[r] + es0[static_cast<size_t>(p) - 1 - r];
    }
  }
  for (int64_t sd = 0; sd < p; ++sd) {
    const double ps = params_of_stage[static_cast<size_t>(sd)], es = expert_of_stage[static_cast<size_t>(sd)];
    spec.optimizer_s[static_cast<size_t>(sd)] =
        optimizerTime(ps, es, static_cast<double>(stage_layers[static_cast<size_t>(sd)])).value();
  }
  if (p > 1) {
    spec.p2p.s = p2p.value();
    spec.p2p.link = ledger.sendRecv(act_bytes / T, ppg, share);
    if (!sp && t > 1) spec.p2p.link += u_tag.scaled(act_bytes * share);
  }
  cpuSharing(spec.cpu);
  return {};
}

// CPU ranks: the schedule runs each rank at its share of its host's cores
// while it is busy (sim/schedule.hpp CpuSharing) instead of the uniform
// `share` every time above carries.  The job's ranks fill node.gpus per
// host in the layout's rank order (tp-cp-ep-dp-pp: pipeline rank r / (t cp
// d); tp-cp-ep-pp-dp: (r / (t cp)) mod p).
void Trainer::cpuSharing(CpuSharing& cs) const {
  cs = CpuSharing{};
  if (c.node.cpu_cores <= 0) return;
  cs.capacity = coreCapacity(c);
  cs.time_scale = share;
  const int64_t per_host = std::max<int64_t>(1, c.node.gpus);
  const auto hosts = static_cast<size_t>((cfg.gpus + per_host - 1) / per_host);
  cs.ranks.assign(hosts, std::vector<double>(static_cast<size_t>(p), 0));
  for (int64_t r = 0; r < cfg.gpus; ++r) {
    const int64_t stage = cfg.pp_before_dp ? (r / (t * cp)) % p : r / (t * cp * d);
    cs.ranks[static_cast<size_t>(r / per_host)][static_cast<size_t>(stage)] += 1;
  }
}

// CPU ranks, with the schedule: no step is shorter than a host's compute
// over its capacity, since its busy ranks' compute progresses at most C
// calibrated threads' worth per second (sim/schedule.hpp CpuSharing).  The
// compute of each pipeline rank from the spec (its times are the uniform
// share's, `time_scale` x alone); collectives and sends stay out (a rank's
// send may overlap its own compute).
void Trainer::hostCoresBound() {
  const IterationSpec& sp = rep.schedule_spec;
  const CpuSharing& cs = sp.cpu;
  std::vector<double> work(static_cast<size_t>(p), 0);
  const double passes = sp.options.dualpipe ? mbf / 2 : mbf;  // DualPipe: half the micro-batches through each copy
  for (int64_t k = 0; k < static_cast<int64_t>(sp.chunks.size()); ++k) {
    const int64_t rank = sp.options.dualpipe && k / p == 1 ? p - 1 - k % p : k % p;
    for (const LayerPlan& lp : sp.chunks[static_cast<size_t>(k)])
      work[static_cast<size_t>(rank)] += passes * (lp.fwd + lp.bwd + lp.recompute);
  }
  for (size_t d = 0; d < work.size(); ++d) work[d] += sp.optimizer_s[d];
  double busiest = 0;
  for (const auto& host : cs.ranks) {
    double w = 0;
    for (size_t d = 0; d < work.size(); ++d) w += host[d] * work[d];
    busiest = std::max(busiest, w / cs.time_scale / cs.capacity);
  }
  Bounds& bd = rep.bounds;
  bd.seconds["host_cores"] = busiest;
  double top = -1;
  for (const auto& [k, y] : bd.seconds)
    if (y > top) top = y, bd.binding = k;
}

// Rates, MFU and the bottleneck from the final iteration time and breakdown.
void Trainer::settle() {
  const double total_s = rep.iteration_s;
  const double tokens = static_cast<double>(cfg.global_batch) * static_cast<double>(cfg.seq);
  rep.tokens_per_s = tokens / total_s;
  const double mf = modelFlopsPerIteration(m, cfg.global_batch, cfg.seq);
  double hw = mf;
  if (any_full) {  // each recomputed layer's forward again: a third of its model FLOPs
    const double share = static_cast<double>(std::count(layer_full.begin(), layer_full.end(), 1)) /
                         static_cast<double>(all_layers);
    hw = mf * (1 + share / 3);
  }
  if (cfg.recompute == Recompute::Selective) {
    hw = mf;
    if (rmods->core_attn) hw += tokens * 4 * static_cast<double>(cfg.seq) * h * m.layers;  // scores + AV again
    // The recomputed modules' GEMMs, per token of every layer.
    const double a_all = static_cast<double>(m.heads);
    for (int l = 0; l < m.layers; ++l) {
      double per = 0;
      if (rmods->mla_up_proj && m.hasMla())
        per += 2 * (static_cast<double>(m.mla.q_lora_rank) * a_all * m.qkHeadDim() +
                    static_cast<double>(m.mla.kv_lora_rank) * a_all *
                        static_cast<double>(m.mla.qk_nope_head_dim + m.mla.v_head_dim));
      if (!m.isMoeLayer(l) && rmods->mlp) per += 2 * (mats - 1) * h * static_cast<double>(m.ffn_hidden);
      if (m.isMoeLayer(l) && rmods->shared_experts) per += 2 * (mats - 1) * h * m.sharedFfn();
      hw += tokens * per;
    }
  }
  const double n = static_cast<double>(cfg.gpus);
  rep.model_tflops_per_gpu = mf / total_s / n / 1e12;
  rep.hardware_tflops_per_gpu = hw / total_s / n / 1e12;
  rep.mfu = mf / total_s / n / (cfg.fp8 ? c.gpu.peak8 : c.gpu.peak16).value();
  rep.mfu_causal = modelFlopsPerIteration(m, cfg.global_batch, cfg.seq, true) / total_s / n /
                   (cfg.fp8 ? c.gpu.peak8 : c.gpu.peak16).value();
  double worst = -1;
  for (const auto& [k, x] : rep.breakdown)
    if (k != "compute_s" && x > worst) worst = x, rep.bottleneck = k;
  // The resource of the category named (issue 17, item 8): the link of that
  // category's slowest collective, not of another category's.
  if (auto it = dim_link.find(rep.bottleneck); it != dim_link.end()) rep.bottleneck_link = it->second.second;
  else if (rep.bottleneck == "optimizer_s") rep.bottleneck_link = "hbm";
  else if (rep.bottleneck == "contention_s") rep.bottleneck_link = rep.bounds.binding + " (shared by concurrent collectives)";
  else if (rep.bottleneck == "bubble_s") rep.bottleneck_link = "pipeline fill and drain (compute)";
  else rep.bottleneck_link = "none";
}

// One MoE block as a layer benchmark times it (its compute, its collectives
// exposed), and the pacing stage's parts.
void Trainer::reportBlockAndStage() {
  if (moe_times) {
    TrainReport::MoeBlock& blk = rep.moe_block;
    blk = moe_times->moe;
    blk.dispatch_s = ep_dispatch.value(), blk.combine_s = ep_combine.value();
    blk.forward_s += blk.dispatch_s + blk.combine_s;
    blk.backward_s += blk.dispatch_s + blk.combine_s;
  }
  TrainReport::Stage& st = rep.stage;
  st.fwd_s = stage_fwd.value();
  st.bwd_s = stage_bwd.value();
  st.recompute_s = stage_recompute.value();
  st.tp_fwd_s = tp_f.value();
  st.tp_bwd_s = tp_b.value();
  st.other_comm_s = (ep_stage + cp_exposed).value();
  st.p2p_s = p > 1 ? p2p.value() : 0;
  st.dp_rs_s = any_dp ? dp_rs.value() : 0;
  st.dp_ag_s = any_dp ? dp_ag.value() : 0;
  st.optimizer_s = optimizer.value();
  st.micro_batches = mb;
}

// Every (stage, chunk) from its own content, for the trace: the layers split
// in order over the p v virtual stages as placeLayers laid them out.
Status Trainer::stageCosts() {
  rep.chunks.resize(static_cast<size_t>(vs_count));
  rep.stages.resize(static_cast<size_t>(p));
  std::vector<double> stage_chunk_fwd(static_cast<size_t>(p), 0), stage_chunk_bwd(static_cast<size_t>(p), 0),
      tail_expert(static_cast<size_t>(p), 0);
  int next_layer = 0;
  for (int64_t k = 0; k < vs_count; ++k) {
    const int count = vs_layers[static_cast<size_t>(k)];
    TrainReport::Chunk& ch = rep.chunks[static_cast<size_t>(k)];
    ch.first_layer = next_layer, ch.layers = count;
    ch.embedding = k == 0, ch.logits = k == vs_count - 1;
    const RangeCost rc = priceRange(next_layer, count, ch.embedding, ch.logits);
    ch.fwd_s = rc.fwd.value(), ch.bwd_s = rc.bwd.value(), ch.recompute_s = rc.recompute.value();
    ch.tp_fwd_s = rc.tp_f.value(), ch.tp_bwd_s = rc.tp_b.value();
    ch.other_comm_s = (rc.ep + cpExposed(rc)).value();
    const size_t sd = static_cast<size_t>(k % p);
    double widest = 0;
    rep.stages[sd].params += paramsOf(next_layer, count, false, &widest);
    tail_expert[sd] += expertParamsOf(next_layer, count);
    stage_chunk_fwd[sd] += ch.fwd_s, stage_chunk_bwd[sd] += ch.bwd_s;
    next_layer += count;
  }
  for (int64_t sd = 0; sd < p; ++sd) {
    TrainReport::StageTail& tail = rep.stages[static_cast<size_t>(sd)];
    if (sd == 0 || sd == p - 1) tail.params += V * h / T;  // the embedding or logits shard (tied when p = 1)
    if (d * cp > 1) {  // priced outside coll(): the bottleneck link stays the pacing stage's
      CHORUS_ASSIGN_OR_RETURN(CollectiveCost rs_raw, net.collective(plan::Collective::ReduceScatter,
                                                                    Bytes(tail.params * act), dcg, cfg.algo));
      CHORUS_ASSIGN_OR_RETURN(CollectiveCost ag_raw,
                              net.collective(plan::Collective::AllGather, Bytes(tail.params * act), dcg, cfg.algo));
      const CollectiveCost rs = shared(rs_raw), ag = shared(ag_raw);
      tail.dp_rs_s = overlapped(rs.time, Seconds(stage_chunk_bwd[static_cast<size_t>(sd)]), smf).value();
      tail.dp_ag_s = overlapped(ag.time, Seconds(stage_chunk_fwd[static_cast<size_t>(sd)]), smf).value();
    }
    const double te = tail_expert[static_cast<size_t>(sd)];
    double layers_sd = 0;
    for (int64_t k = sd; k < vs_count; k += p) layers_sd += vs_layers[static_cast<size_t>(k)];
    tail.optimizer_s = optimizerTime(tail.params, te, layers_sd).value();
  }
  return {};
}

}  // namespace chorus::sim::detail

// The training model's collectives and per-layer compute (Trainer members; see
// train_detail.hpp).
#include <algorithm>
#include <cmath>

#include "sim/train_detail.hpp"

namespace chorus::sim::detail {

void Trainer::note(const std::string& dim, const CollectiveCost& cc) {
  auto& [worst, link] = dim_link[dim];
  if (link.empty() || cc.time.value() > worst) worst = cc.time.value(), link = cc.bottleneck;
}

void Trainer::record(const std::string& dim, std::string_view what, double bytes, const GroupSet& g,
                     const CollectiveCost& cc) {
  note(dim, cc);
  for (const TrainReport::CollectiveLine& l : rep.collectives)
    if (l.dim == dim && l.collective == what && l.bytes == bytes && l.ranks == g.size && l.groups == g.groups) return;
  rep.collectives.push_back({dim, std::string(what), cc.algo, cc.bottleneck, bytes, cc.time.value(), g.size, g.groups});
}

Result<Seconds> Trainer::coll(plan::Collective k, double bytes, const GroupSet& g, const char* dim) {
  CHORUS_ASSIGN_OR_RETURN(CollectiveCost raw, net.collective(k, Bytes(bytes), g, cfg.algo));
  const CollectiveCost cc = shared(raw);
  record(dim, plan::collectiveName(k), bytes, g, cc);
  return cc.time;
}

// The communication primitives of one layer and micro-batch on the placed
// groups (Megatron's order tp, cp, (ep,) dp, pp; or tp, cp, pp, dp with --rank-order).
Status Trainer::priceCollectives() {
  tpg = GroupSet{t, 1, cfg.gpus / t};
  cpg = GroupSet{cp, t, cfg.gpus / cp};
  epg = cfg.etp > 0 ? GroupSet{ep, etp, cfg.gpus / ep} : GroupSet{ep, t * cp, cfg.gpus / ep};
  pp_stride = cfg.pp_before_dp ? t * cp : t * cp * d, dp_stride = cfg.pp_before_dp ? t * cp * p : t * cp;
  ppg = GroupSet{p, pp_stride, cfg.gpus / p};
  act_bytes = bs * h * act;
  if (t > 1) {
    if (sp) {
      CHORUS_ASSIGN_OR_RETURN(tp_ag, coll(plan::Collective::AllGather, act_bytes, tpg, "tp_comm_s"));
      CHORUS_ASSIGN_OR_RETURN(tp_rs, coll(plan::Collective::ReduceScatter, act_bytes, tpg, "tp_comm_s"));
    } else {
      CHORUS_ASSIGN_OR_RETURN(tp_ar, coll(plan::Collective::AllReduce, act_bytes, tpg, "tp_comm_s"));
    }
  }
  cp_bytes = static_cast<double>(b) * s * m.kvWidth() / m.kvSplit(T) * act * cp;
  if (cp > 1) {
    CHORUS_ASSIGN_OR_RETURN(cp_fwd, coll(plan::Collective::AllGather, cp_bytes, cpg, "cp_comm_s"));
  }
  CHORUS_RETURN_IF_ERROR(priceExpertDispatch());
  if (t > 1) {
    CHORUS_ASSIGN_OR_RETURN(ce, coll(plan::Collective::AllReduce, 4 * bs, tpg, "tp_comm_s"));
  }
  return {};
}

// Expert dispatch and combine, per MoE layer and micro-batch, one way.  The
// GPU holding the busiest expert receives (L - 1 + F) / L of the mean (its L
// local experts at the mean load but one at F times it): it paces the
// all-to-all and the grouped GEMM.
Status Trainer::priceExpertDispatch() {
  const double local_n = moe ? static_cast<double>(m.moe.experts) / static_cast<double>(ep) : 1;
  imb = (local_n - 1 + cfg.moe_imbalance) / local_n;
  const double copies_elems = bs * m.moe.top_k * h / T * imb;  // routed copies this GPU sends (and receives)
  a2a_bytes = copies_elems * act;                             // the combine, bf16
  dispatch_bytes = copies_elems * (cfg.fp8_dispatch ? 1 + 4.0 / 128 : act);
  // Hierarchical: the expert group's members on one node (e_node, at the
  // group's stride) and its nodes (n_nodes, one GPU each at the same local
  // rank: a rail); each token crosses to each distinct remote node it is
  // routed to once, then one NVLink hop per copy inside the node.
  hier = moe && ep > 1 && cfg.moe_dispatch == TrainConfig::MoeDispatch::Hierarchical;
  // Per byte of routed copies, what a member of the rail / node group sends
  // in its all-to-all (whose byte count includes the member's own share).
  if (hier) {
    const int64_t st = epg.stride, gpn = c.node.gpus;
    const int64_t e_node = st <= gpn && gpn % st == 0 ? std::min<int64_t>(ep, gpn / st) : 1;
    if (e_node < 1 || ep % e_node != 0 || (e_node < ep && e_node * st != gpn))
      return invalidArgument("--moe-dispatch hierarchical: the expert group (ep {} at stride {}) must fill whole {}-GPU "
                             "nodes or lie in one", ep, st, gpn);
    const int64_t n_nodes = ep / e_node;
    node_g = GroupSet{e_node, st, cfg.gpus / e_node};
    rail_g = GroupSet{n_nodes, gpn, cfg.gpus / n_nodes};
    // Distinct nodes a token's top_k experts lie on, routing uniform (the
    // benchmarks force-balance it).  Node-limited routing picks the experts
    // inside the token's topk_group best of n_group groups: a group spanning
    // several nodes confines the picks to those groups' nodes; several
    // groups per node, a node is hit when one of its groups is picked.
    const double E = m.moe.experts, k = m.moe.top_k, nn = static_cast<double>(n_nodes);
    auto untouched = [](double pool, double out, double kk) {  // P(none of kk picks among `out` of `pool`)
      double pr = 1;
      for (int i = 0; i < static_cast<int>(kk); ++i) pr *= std::max(0.0, (pool - out - i) / (pool - i));
      return pr;
    };
    // Distinct units (nodes, or GPUs) of `units` equal shares of the experts
    // that a token's top_k picks land on.
    auto unitsHit = [&](int64_t units) {
      const double u = static_cast<double>(units);
      double hit = u * (1 - untouched(E, E / u, k));
      const int64_t ng = m.moe.n_group, tg = m.moe.topk_group;
      if (ng > 0 && tg > 0 && tg < ng) {
        if (units % ng == 0) {
          const double spans = static_cast<double>(units / ng);
          hit = static_cast<double>(tg) * spans * (1 - untouched(static_cast<double>(tg) * E / ng, E / u, k));
        } else if (ng % units == 0) {
          hit = u * (1 - untouched(static_cast<double>(ng), static_cast<double>(ng / units), static_cast<double>(tg)));
        }
      }
      return hit;
    };
    const double nodes_hit = unitsHit(n_nodes);
    const double remote = nodes_hit * static_cast<double>(n_nodes - 1) / static_cast<double>(n_nodes);
    // The NICs carry `remote` of a token's top_k copies, scaled by n / (n - 1)
    // (the all-to-all's byte count includes the member's own share).  Inside
    // the node DeepEP forwards a token once to each GPU that holds one of its
    // experts (the GPU's local experts share that copy; the combine sums them
    // before sending back: DeepEP's README, "dispatch ... to ranks"), so
    // NVLink carries the distinct GPUs hit, not the top_k copies.
    rail_share = n_nodes > 1 ? remote / k * nn / (nn - 1) : 0;
    gpu_copies = std::min(1.0, unitsHit(ep) / k);
    node_share = e_node > 1 ? gpu_copies : 0;
  }
  if (moe && ep > 1) {
    CHORUS_ASSIGN_OR_RETURN(Seconds dsp, epOneWay(dispatch_bytes));
    CHORUS_ASSIGN_OR_RETURN(Seconds cmb, epOneWay(a2a_bytes));
    ep_fwd = dsp + cmb, ep_dispatch = dsp, ep_combine = cmb;
  }
  return {};
}

Result<Seconds> Trainer::epOneWay(double bytes) {
  if (!hier) return coll(plan::Collective::AllToAll, bytes, epg, "ep_comm_s");
  Seconds across(0), inside(0);
  if (rail_share > 0) {
    CHORUS_ASSIGN_OR_RETURN(across, coll(plan::Collective::AllToAll, bytes * rail_share, rail_g, "ep_comm_s"));
  }
  if (node_share > 0) {
    CHORUS_ASSIGN_OR_RETURN(inside, coll(plan::Collective::AllToAll, bytes * node_share, node_g, "ep_comm_s"));
  }
  return std::max(across, inside);  // pipelined: NVLink forwarding behind the RDMA chunks
}

// Tensor-parallel communication of one layer (Megatron-LM's f/g operators).
//  forward:  SP: all-gather before QKV and FC1, reduce-scatter after the
//            output projection and FC2; no SP: allreduce after each.
//  backward: the row-parallel linears' conjugates are exposed (SP: two
//            all-gathers of the output gradient).  The column-parallel
//            linears run their collectives asynchronously (Megatron's
//            async tensor-parallel backward): without SP the input-gradient
//            allreduce overlaps the weight-gradient GEMM; with SP the
//            input, of which only the sequence shard was saved, is all-gathered
//            again while the input-gradient GEMM runs (Korthikanti et al.
//            2022, sec. 4.2.2), and the input gradient's reduce-scatter
//            overlaps the weight-gradient GEMM.
void Trainer::tpComm(const LayerTimes& lt, Seconds* fwd, Seconds* bwd) const {
  if (t == 1) return;
  if (sp) {
    *fwd += (tp_ag + tp_rs) * 2;
    *bwd += tp_ag * 2;
    *bwd += overlapped(tp_ag, lt.qkv_dgrad, smf) + overlapped(tp_rs, lt.qkv_wgrad, smf);
    *bwd += overlapped(tp_ag, lt.fc1_dgrad, smf) + overlapped(tp_rs, lt.fc1_wgrad, smf);
  } else {
    *fwd += tp_ar * 2;
    *bwd += overlapped(tp_ar, lt.qkv_wgrad, smf) + overlapped(tp_ar, lt.fc1_wgrad, smf);
  }
}

// The backward compute those asynchronous collectives hide under (no other
// collective on the same links can hide there too).
Seconds Trainer::tpHidden(const LayerTimes& lt) const {
  if (t == 1) return Seconds(0);
  if (sp)
    return std::min(tp_ag, lt.qkv_dgrad) + std::min(tp_rs, lt.qkv_wgrad) + std::min(tp_ag, lt.fc1_dgrad) +
           std::min(tp_rs, lt.fc1_wgrad);
  return std::min(tp_ar, lt.qkv_wgrad) + std::min(tp_ar, lt.fc1_wgrad);
}

// A GEMM of the layer: its forward time, with its two backward GEMMs added to
// the layer's backward (*dg, *wg: each of them, for the overlap of tp collectives).
Seconds Trainer::mm(LayerSums& x, double mm_m, double mm_n, double mm_k, double batch, Seconds* dg, Seconds* wg) {
  const Seconds dx = gpu.dgrad(mm_m, mm_n, mm_k, batch), w = gpu.wgrad(mm_m, mm_n, mm_k, batch);
  if (dg) *dg = dx;
  if (wg) *wg = w;
  x.bw += dx + w;
  x.lt.wgrad += w;
  return gpu.gemm(mm_m, mm_n, mm_k, batch);
}

// fp8 (TransformerEngine): each fp8 GEMM's input is cast to fp8 with its
// transpose for the weight gradient (read 2 B, write 1 + 1 B per element),
// and backward its output gradient likewise.  Not the router, the attention
// core or the logits (bf16 in Megatron's fp8 recipes).
void Trainer::q8(LayerSums& x, double mm_m, double mm_n, double mm_k, double batch) {
  if (!cfg.fp8) return;
  const double fb = 4 * mm_m * mm_k * batch, bb = 4 * mm_m * mm_n * batch;
  x.q8_fwd += raw_gpu.mem(fb), x.q8_bwd += raw_gpu.mem(bb);
  gpu.fwd_bytes += fb, gpu.bwd_bytes += bb;  // metered as what they are, not as forward element-wise bytes
}

// The attention block's projections and core; returns the core's forward
// (its element-wise part included).
Seconds Trainer::attentionBlock(LayerSums& x) {
  LayerTimes& lt = x.lt;
  x.f += mm(x, bs, m.attnInParams() / h / T, h, 1, &lt.qkv_dgrad, &lt.qkv_wgrad);  // qkv (MLA: with its latents)
  q8(x, bs, m.attnInParams() / h / T, h, 1);
  x.f += mm(x, bs, h, heads_v / T, 1);  // output projection
  q8(x, bs, h, heads_v / T, 1);
  // The core over all keys (ring attention): with FlashAttention one fused
  // causal kernel forward and one backward (sim/compute.hpp), else the
  // scores and AV as batched GEMMs.
  Seconds core = cfg.flash_attention
                     ? gpu.attention(b * heads_local, s, s * cp, m.qkHeadDim(), m.vHeadDim(), true, false)
                     : mm(x, s, s * cp, m.qkHeadDim(), b * heads_local) + mm(x, s, m.vHeadDim(), s * cp, b * heads_local);
  if (cfg.flash_attention) x.bw += gpu.attention(b * heads_local, s, s * cp, m.qkHeadDim(), m.vHeadDim(), true, true);
  Seconds core_ew(0);
  if (!cfg.flash_attention) {  // scale, mask, softmax, dropout over the b a/t s x s scores
    core_ew += gpu.mem(4.5 * act * b * heads_local * s * s * cp);  // 9 B per score in 16 bits
    core_ew += gpu.mem(2 * act * bs * heads_v / T);  // the context's [b np s hn] -> [s b h] permute copy
  }
  core += core_ew;
  x.f += core - core_ew;
  x.ew += core_ew;
  return core;
}

void Trainer::denseFfn(LayerSums& x) {
  const double ff = static_cast<double>(m.ffn_hidden) / T;
  x.f += mm(x, bs, (mats - 1) * ff, h, 1, &x.lt.fc1_dgrad, &x.lt.fc1_wgrad) + mm(x, bs, h, ff, 1);
  q8(x, bs, (mats - 1) * ff, h, 1), q8(x, bs, h, ff, 1);
  x.ew += gpu.mem((mats == 3 ? 6 : 4) * bs * ff * act / 2);  // activation function
}

// A MoE block: the experts' grouped GEMMs (paced by the busiest expert's
// GPU), shared experts, router and the token permutations; its parts are
// measured as differences of the running sums (TrainReport::MoeBlock).
void Trainer::moeBlock(LayerSums& x) {
  LayerTimes& lt = x.lt;
  const LayerSums start = x;
  auto partSince = [&x](const LayerSums& from, double* fwd, double* bwd) {
    *fwd += (x.f - from.f + x.ew - from.ew + x.q8_fwd - from.q8_fwd).value();
    if (bwd) *bwd += (x.bw - from.bw + (x.ew - from.ew) * 2 + x.q8_bwd - from.q8_bwd).value();
  };
  const double ef = static_cast<double>(m.moe.expert_ffn_hidden) / static_cast<double>(etp);
  const double local_experts = static_cast<double>(m.moe.experts) / static_cast<double>(ep);
  const double tok = bs * m.moe.top_k * static_cast<double>(ep * etp) / (T * static_cast<double>(m.moe.experts)) * imb;
  x.f += mm(x, tok, (mats - 1) * ef, h, local_experts, &lt.fc1_dgrad, &lt.fc1_wgrad) + mm(x, tok, h, ef, local_experts);
  q8(x, tok, (mats - 1) * ef, h, local_experts), q8(x, tok, h, ef, local_experts);
  x.ew += gpu.mem((mats == 3 ? 6 : 4) * bs * m.moe.top_k * ef);  // activation
  partSince(start, &lt.moe.experts_fwd_s, &lt.moe.experts_bwd_s);
  if (m.moe.shared_experts) {
    const LayerSums before_shared = x;
    x.f += mm(x, bs, (mats - 1) * m.sharedFfn() / T, h, 1) + mm(x, bs, h, m.sharedFfn() / T, 1);
    q8(x, bs, (mats - 1) * m.sharedFfn() / T, h, 1), q8(x, bs, h, m.sharedFfn() / T, 1);
    partSince(before_shared, &lt.moe.shared_fwd_s, &lt.moe.shared_bwd_s);
  }
  const Seconds f2 = x.f;
  x.f += mm(x, bs, m.moe.experts, h, 1);  // router
  lt.moe.router_s = (x.f - f2).value();
  const Seconds ew3 = x.ew;
  // Token permutation around the experts (Megatron-Core's all-to-all
  // dispatcher): the permute before the dispatch writes one copy per
  // routed token, the unpermute after the combine reads them back into
  // their tokens; with expert parallelism the received tokens are sorted
  // by local expert and back (a read and a write of every copy each).
  // The permutes run on the sender's own tokens (the mean load); the
  // sorts on what the busiest expert's GPU receives (x imb).
  const double received = a2a_bytes, sent = a2a_bytes / imb, tokens = bs * h * act / T;
  if (hier) {
    // DeepEP reads the tokens in its dispatch kernel (no permute before
    // it) and delivers one copy per GPU hit: a permute of what arrived
    // into one copy per local expert, and its reverse before the combine.
    x.perm += gpu.permute(received * gpu_copies + received) + gpu.permute(received + received * gpu_copies);
  } else {
    x.perm += gpu.permute(tokens + sent) + gpu.permute(sent + tokens);
    if (ep > 1) x.perm += gpu.permute(2 * received) + gpu.permute(2 * received);
  }
  x.ew += x.perm;
  lt.moe.permute_s = (x.ew - ew3).value();
  partSince(start, &lt.moe.forward_s, &lt.moe.backward_s);
  lt.moe.backward_s -= x.perm.value();
}

// Selective recomputation: each module's forward again, unmetered by the
// forward's meter (the bounds add lt.recompute_flops / _bytes).
Seconds Trainer::selectiveRecompute(bool dense, Seconds core, LayerTimes& lt) const {
  auto rgemm = [&](double mm_m, double mm_n, double mm_k, double batch = 1) {
    if (mm_m <= 0 || mm_n <= 0 || mm_k <= 0) return Seconds(0);
    lt.recompute_flops += 2 * mm_m * mm_n * mm_k * batch;
    lt.recompute_bytes += (cfg.fp8 ? 1 : act) * batch * (mm_m * mm_k + mm_k * mm_n + mm_m * mm_n);
    Seconds x = raw_gpu.gemm(mm_m, mm_n, mm_k, batch);
    if (cfg.fp8) x += raw_gpu.mem(4 * mm_m * mm_k * batch), lt.recompute_bytes += 4 * mm_m * mm_k * batch;  // its input's cast
    return x;
  };
  auto rmem = [&](double bytes) {
    lt.recompute_bytes += bytes;
    return raw_gpu.mem(bytes);
  };
  const RecomputeModules& rm = *rmods;
  const double act_bytes_per = mats == 3 ? 6 : 4;  // the activation kernel's bytes per output element (2 B)
  Seconds r(0);
  if (rm.core_attn) r += core;
  if (rm.layernorm) r += rmem(2 * 2 * act * bs * hsp);
  if (rm.mla_up_proj && m.hasMla()) {
    const double a_l = static_cast<double>(heads_local);
    if (m.mla.q_lora_rank > 0) r += rgemm(bs, a_l * m.qkHeadDim(), static_cast<double>(m.mla.q_lora_rank));
    r += rgemm(bs, a_l * static_cast<double>(m.mla.qk_nope_head_dim + m.mla.v_head_dim),
               static_cast<double>(m.mla.kv_lora_rank));
    r += rmem(act * 2 * bs * a_l * static_cast<double>(m.mla.qk_rope_head_dim));  // rotary on q and k
  }
  if (dense && rm.mlp) {
    const double ff = static_cast<double>(m.ffn_hidden) / T;
    r += rgemm(bs, (mats - 1) * ff, h) + rmem(act_bytes_per * bs * ff * act / 2);
  }
  if (!dense && rm.moe_act)
    r += rmem(act_bytes_per * bs * m.moe.top_k * static_cast<double>(m.moe.expert_ffn_hidden) / static_cast<double>(etp));
  if (!dense && rm.shared_experts && m.moe.shared_experts) {
    const double sf = m.sharedFfn() / T;
    r += rgemm(bs, (mats - 1) * sf, h) + rmem(act_bytes_per * bs * sf * act / 2);
  }
  return r;
}

// The compute of one layer per micro-batch on one GPU.
LayerTimes Trainer::layerTimes(int layer) {
  LayerSums x;
  const Seconds core = attentionBlock(x);
  const bool dense = !m.isMoeLayer(layer);
  if (dense) denseFfn(x);
  else moeBlock(x);
  // Two layer norms (read + write) and two dropout + residual adds (read x,
  // mask, residual; write) over the (sequence-split) hidden state.
  // In 16 bits 4 B and 7 B per element; the mask is 1 B whatever the dtype.
  x.ew += gpu.mem(2 * 2 * act * bs * hsp) + gpu.mem(2 * ((m.dropout ? 1 : 0) + 3 * act) * bs * hsp);
  LayerTimes& lt = x.lt;
  lt.fwd = x.f + x.ew + x.q8_fwd;
  lt.attn_core_fwd = core;
  lt.recompute_sel = selectiveRecompute(dense, core, lt);
  lt.bwd = x.bw + x.ew * 2 - x.perm + x.q8_bwd;  // element-wise backward kernels move about twice the forward's bytes
  // The framework's host time per layer pass (Python, autograd, dispatch:
  // the cluster's `host`, measured by chorus-sim calibrate; zero on GPUs).
  lt.fwd += host(c.host.layer_fwd);
  lt.bwd += host(c.host.layer_bwd);
  // Unfused gradient accumulation: each of this GPU's parameters of the
  // layer gets its 16-bit gradient added into the buffer (read it, read and
  // write the buffer element) by a kernel of its own in the backward; the
  // first micro-batch's gradient is stored, not added (autograd's
  // AccumulateGrad), so per micro-batch on average (mb - 1) / mb of that.
  if (!cfg.grad_accum_fusion && mb > 1) {
    double widest = 0;
    const double acc = paramsOf(layer, 1, false, &widest) * (act + 2.0 * cfg.grad_bytes);
    const double share = static_cast<double>(mb - 1) / static_cast<double>(mb);
    lt.bwd += raw_gpu.mem(acc) * share;
    gpu.bwd_bytes += acc * share;
  }
  return lt;
}

// layerTimes depends on a layer only through its kind (dense or MoE).  Each
// kind's work (FLOPs, HBM bytes) is metered when it is first priced.
const LayerTimes& Trainer::timesOf(int l) {
  const bool dense_kind = !m.isMoeLayer(l);
  std::optional<LayerTimes>& o = dense_kind ? dense_times : moe_times;
  if (!o) {
    const Meter before = gpu;
    o = layerTimes(l);
    Work& w = dense_kind ? dense_work : moe_work;
    w.f_flops = gpu.fwd_flops - before.fwd_flops;
    w.b_flops = gpu.bwd_flops - before.bwd_flops;
    const double ew = gpu.ew_bytes - before.ew_bytes;        // element-wise forward; its backward moves twice as much
    const double perm = gpu.perm_bytes - before.perm_bytes;  // but a permutation's backward moves the same once
    w.f_bytes = gpu.fwd_bytes - before.fwd_bytes + ew;
    w.b_bytes = gpu.bwd_bytes - before.bwd_bytes + 2 * ew - perm;
  }
  return *o;
}

const Work& Trainer::workOf(int l) {
  timesOf(l);
  return !m.isMoeLayer(l) ? dense_work : moe_work;
}

// Layers [first, first + count) on one GPU per micro-batch, the logits + loss
// when `logits` (the last stage), the embedding's tensor-parallel reduction
// when `embedding` (the first).
RangeCost Trainer::priceRange(int first, int count, bool embedding, bool logits) {
  RangeCost rc;
  for (int l = first; l < first + count; ++l) {
    const LayerTimes& lt = timesOf(l);
    rc.fwd += lt.fwd;
    rc.bwd += lt.bwd;
    rc.wgrad += lt.wgrad;
    const bool moe_layer = m.isMoeLayer(l), full = fullAt(l);
    if (full) rc.recompute += lt.fwd;
    if (cfg.recompute == Recompute::Selective) rc.recompute += lt.recompute_sel;
    Seconds f(0), bw(0);
    tpComm(lt, &f, &bw);
    rc.tp_f += f;
    rc.tp_b += bw;
    if (full) rc.tp_b += f;  // the recomputed forward communicates again
    // Forward, backward, and the recomputed forward's communication.
    const double comm_passes = full ? 3 : 2;
    rc.cp += cp_fwd * comm_passes;
    if (moe_layer) rc.ep += ep_fwd * comm_passes;
  }
  if (logits) priceLogits(rc);
  // The vocab-parallel embedding's partial lookups are summed (allreduce,
  // or reduce-scatter into the sequence shards) on the first stage; its
  // gradient comes back by an all-gather (SP).
  if (embedding && t > 1) {
    rc.tp_f += sp ? tp_rs : tp_ar;
    if (sp) rc.tp_b += tp_ag;
  }
  return rc;
}

// Logits (GEMM + vocab-parallel cross-entropy) on the last stage.  With tp
// the logits' input is all-gathered (SP; its gradient reduce-scattered) or
// its gradient allreduced (overlapping the weight-gradient GEMM), and the
// cross-entropy allreduces 3 fp32 values per token (max, sum, target logit).
// Multi-token prediction (--mtp-layers D, DeepSeek-V3's MTP as Megatron runs
// it on the last stage): each depth adds a layer (in the range: the last
// virtual stage holds them), the projection of the normed hidden state and
// next-token embedding, 2h -> h, and its own logits and loss through the
// shared output head.
void Trainer::priceLogits(RangeCost& rc) {
  const double heads = 1.0 + cfg.mtp_layers;
  const Meter before = gpu;
  const Seconds logit_gemm = gpu.gemm(bs, V / T, h), logit_wgrad = gpu.wgrad(bs, V / T, h);
  // The loss in fp32: 12 B per logit in 16 bits (its write and read, the fp32
  // copy's), 8 B backward; the dtype's share scales with its size.
  const double ce_f = 2 * act + 8, ce_b = 2 * act + 4;
  const Seconds head_f = logit_gemm + gpu.mem(ce_f * bs * V / T) + host(c.host.head_fwd);
  const double fwd_ew = gpu.ew_bytes - before.ew_bytes;
  const Seconds head_b = gpu.dgrad(bs, V / T, h) + logit_wgrad + gpu.mem(ce_b * bs * V / T) + host(c.host.head_bwd);
  const Work head{gpu.fwd_flops - before.fwd_flops, gpu.fwd_bytes - before.fwd_bytes + fwd_ew,
                  gpu.bwd_flops - before.bwd_flops,
                  gpu.bwd_bytes - before.bwd_bytes + (gpu.ew_bytes - before.ew_bytes - fwd_ew)};
  Seconds proj_f(0), proj_b(0), proj_raw_f(0), proj_raw_b(0);
  Work proj;
  if (cfg.mtp_layers > 0) {
    const Meter pb = gpu;
    proj_f = gpu.gemm(bs, h / T, 2 * h) + gpu.mem(2 * 2 * act * bs * hsp);  // + the two RMSNorms
    const double pew = gpu.ew_bytes - pb.ew_bytes;
    proj_b = gpu.dgrad(bs, h / T, 2 * h) + gpu.wgrad(bs, h / T, 2 * h) + gpu.mem(2 * 2 * 2 * act * bs * hsp);
    proj = Work{gpu.fwd_flops - pb.fwd_flops, gpu.fwd_bytes - pb.fwd_bytes + pew, gpu.bwd_flops - pb.bwd_flops,
                gpu.bwd_bytes - pb.bwd_bytes + (gpu.ew_bytes - pb.ew_bytes - pew)};
    proj_raw_f = raw_gpu.gemm(bs, h / T, 2 * h) + raw_gpu.mem(2 * 2 * act * bs * hsp);
    proj_raw_b = raw_gpu.dgrad(bs, h / T, 2 * h) + raw_gpu.wgrad(bs, h / T, 2 * h) +
                 raw_gpu.mem(2 * 2 * 2 * act * bs * hsp);
  }
  const double depth = cfg.mtp_layers;
  rc.fwd += head_f * heads + proj_f * depth;
  rc.bwd += head_b * heads + proj_b * depth;
  rc.wgrad += logit_wgrad * heads;
  logit_fwd = (logit_gemm + raw_gpu.mem(ce_f * bs * V / T) + host(c.host.head_fwd)) * heads + proj_raw_f * depth;
  logit_bwd = (raw_gpu.dgrad(bs, V / T, h) + logit_wgrad + raw_gpu.mem(ce_b * bs * V / T) + host(c.host.head_bwd)) * heads +
              proj_raw_b * depth;
  logit_wgrad_s = logit_wgrad * heads;
  if (!logit_work)
    logit_work = Work{head.f_flops * heads + proj.f_flops * depth, head.f_bytes * heads + proj.f_bytes * depth,
                      head.b_flops * heads + proj.b_flops * depth, head.b_bytes * heads + proj.b_bytes * depth};
  if (t > 1) {
    rc.tp_f += ce * 3 * heads;
    if (sp) {
      rc.tp_f += tp_ag * heads;
      rc.tp_b += overlapped(tp_rs, logit_wgrad, smf) * heads;
    } else {
      rc.tp_b += overlapped(tp_ar, logit_wgrad, smf) * heads;
    }
  }
}

// Ring attention overlaps its transfers with the attention blocks.
Seconds Trainer::cpExposed(const RangeCost& rc) const {
  return cp > 1 ? Seconds(std::max(0.0, (rc.cp - (rc.fwd + rc.bwd) * 0.1).value())) : Seconds(0);
}

}  // namespace chorus::sim::detail

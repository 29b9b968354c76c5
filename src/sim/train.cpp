#include "sim/train.hpp"

#include <algorithm>
#include <cmath>

#include "sim/topology.hpp"

namespace chorus::sim {
namespace {

constexpr double kAct = 2;  // bytes per 16-bit activation element

// Forward FLOPs of one layer's GEMMs per token (matrix multiplies only; the
// attention term uses the full s x s score matrix as the accounting does).
double layerFlopsPerToken(const ModelSpec& m, int layer, double seq) {
  const double h = static_cast<double>(m.hidden), kv = static_cast<double>(m.kv_heads * m.headDim());
  const double mats = m.activation == Activation::SwiGlu ? 3 : 2;
  double f = 2 * (2 * h * h + 2 * h * kv) + 2 * 2 * seq * h;  // q,o + k,v projections; scores + AV
  if (m.moe.experts == 0 || layer < m.moe.dense_layers)
    f += 2 * mats * h * static_cast<double>(m.ffn_hidden);
  else
    f += 2 * mats * h * static_cast<double>(m.moe.expert_ffn_hidden) * (m.moe.top_k + m.moe.shared_experts);
  return f;
}

// A GEMM's time on one GPU: the roofline of its FLOPs at the shape-dependent
// efficiency and its operand traffic at HBM bandwidth.  Efficiency saturates
// with size: eff = max * size / (size + half) where size = m n k batch
// (small GEMMs under-fill the GPU's SMs and waves).
struct Gpu {
  const GpuSpec& g;
  bool fp8;
  [[nodiscard]] Seconds gemm(double m, double n, double k, double batch = 1) const {
    if (m <= 0 || n <= 0 || k <= 0) return Seconds(0);
    const double size = m * n * k * batch;
    const double eff = g.gemm_efficiency * size / (size + g.gemm_half_size);
    const Flops fl(2 * size);
    const Seconds tc = fl / ((fp8 ? g.peak8 : g.peak16) * eff);
    const Seconds tm = Bytes(kAct * batch * (m * k + k * n + m * n)) / (g.hbm_bw * g.hbm_efficiency);
    return std::max(tc, tm) + g.kernel_overhead;
  }
  // An element-wise kernel moving `bytes` through HBM.
  [[nodiscard]] Seconds mem(double bytes) const {
    return Bytes(bytes) / (g.hbm_bw * g.hbm_efficiency) + g.kernel_overhead;
  }
};

struct LayerTimes {
  Seconds fwd, bwd, attn_core_fwd;  // attn_core: what selective recomputation repeats
};

}  // namespace

double modelFlopsPerIteration(const ModelSpec& m, int64_t global_batch, int64_t seq) {
  const double tokens = static_cast<double>(global_batch) * static_cast<double>(seq);
  double per_token = 2 * static_cast<double>(m.hidden) * static_cast<double>(m.vocab);  // logits
  for (int l = 0; l < m.layers; ++l) per_token += layerFlopsPerToken(m, l, static_cast<double>(seq));
  return 3 * tokens * per_token;  // forward + backward (2x)
}

Result<TrainReport> simulateTraining(const ModelSpec& m, const ClusterSpec& c, const TrainConfig& cfg,
                                     const plan::Registry& reg) {
  const int64_t t = cfg.tp, p = cfg.pp, d = cfg.dp, cp = cfg.cp, ep = cfg.ep, v = cfg.vpp;
  if (t < 1 || p < 1 || d < 1 || cp < 1 || ep < 1 || v < 1)
    return invalidArgument("layout tp={} pp={} dp={} cp={} ep={} vpp={}: every degree must be >= 1", t, p, d, cp, ep, v);
  if (t * p * d * cp != cfg.gpus)
    return invalidArgument("layout tp={} x pp={} x dp={} x cp={} = {} but --gpus = {} (they must be equal)", t, p, d, cp,
                           t * p * d * cp, cfg.gpus);
  if (cfg.gpus > c.gpus())
    return invalidArgument("--gpus {} exceeds cluster '{}' with {} GPUs ({} nodes x {})", cfg.gpus, c.name, c.gpus(),
                           c.nodes, c.node.gpus);
  if (m.heads % t != 0 || m.kv_heads % std::min<int64_t>(t, m.kv_heads) != 0)
    return invalidArgument("tp={} must divide heads={} (model '{}')", t, m.heads, m.name);
  if (m.layers < p * v)
    return invalidArgument("layers={} is fewer than pp x vpp = {} x {} stages (model '{}')", m.layers, p, v, m.name);
  if (ep > 1 && (m.moe.experts == 0 || m.moe.experts % ep != 0 || (d * cp) % ep != 0))
    return invalidArgument("ep={} must divide the experts ({}) and dp x cp = {}", ep, m.moe.experts, d * cp);
  if (cfg.seq % (cp * (cfg.sequence_parallel ? t : 1)) != 0)
    return invalidArgument("seq={} is not divisible by cp={} (x tp={} with sequence parallelism)", cfg.seq, cp, t);
  if (cfg.zero < 0 || cfg.zero > 3) return invalidArgument("--zero {} is not one of 0, 1, 2, 3", cfg.zero);
  if (cfg.micro_batch == 0) {  // auto: the largest micro-batch that fits and divides the batch share
    Result<TrainReport> best = invalidArgument("no micro-batch fits (try more recomputation or parallelism)");
    for (int64_t b = 1; b <= 16; b *= 2) {
      if (cfg.global_batch % (d * b) != 0) break;
      TrainConfig k = cfg;
      k.micro_batch = b;
      Result<TrainReport> r = simulateTraining(m, c, k, reg);
      if (!r.isOk()) break;
      if (!best.isOk() || r->iteration_s < best->iteration_s) best = std::move(r);
    }
    return best;
  }
  const int64_t b = cfg.micro_batch;
  if (cfg.global_batch % (d * b) != 0)
    return invalidArgument("global batch {} is not divisible by dp x micro-batch = {} x {}", cfg.global_batch, d, b);
  const int64_t mb = cfg.global_batch / (d * b);  // micro-batches per iteration per pipeline
  if (v > 1 && mb % p != 0)
    return invalidArgument("interleaved schedule: micro-batches per pipeline ({}) must be a multiple of pp={}", mb, p);

  CHORUS_ASSIGN_OR_RETURN(Topology topo, Topology::build(c));
  NetworkModel net(c, topo, reg);
  const Gpu gpu{c.gpu, cfg.fp8};
  const bool sp = cfg.sequence_parallel && t > 1;
  const double h = static_cast<double>(m.hidden), V = static_cast<double>(m.vocab);
  const double s = static_cast<double>(cfg.seq) / static_cast<double>(cp);  // local sequence
  const double bs = static_cast<double>(b) * s;                             // local tokens
  const double hd = static_cast<double>(m.headDim()), kvd = static_cast<double>(m.kv_heads) * hd;
  const double heads_local = static_cast<double>(m.heads) / static_cast<double>(t);
  const double T = static_cast<double>(t);
  const double mats = m.activation == Activation::SwiGlu ? 3 : 2;
  const double hsp = sp ? h / T : h;  // width of the replicated/sequence-split elementwise region

  // ---- communication of one layer (forward) ------------------------------
  const GroupSet tpg{t, 1, cfg.gpus / t};
  const GroupSet cpg{cp, t, cfg.gpus / cp};
  const GroupSet epg{ep, t * cp, cfg.gpus / ep};
  const GroupSet ppg{p, t * cp * d, cfg.gpus / p};
  std::string worst_link;
  double worst_link_t = -1;
  auto coll = [&](plan::Collective k, double bytes, const GroupSet& g) -> Result<Seconds> {
    CHORUS_ASSIGN_OR_RETURN(CollectiveCost cc, net.collective(k, Bytes(bytes), g, cfg.algo));
    if (cc.time.value() > worst_link_t) worst_link_t = cc.time.value(), worst_link = cc.bottleneck;
    return cc.time;
  };
  const double act_bytes = bs * h * kAct;  // one layer boundary's activations
  Seconds tp_fwd(0);  // TP communication in one layer's forward; backward mirrors it
  if (t > 1) {
    if (sp) {
      CHORUS_ASSIGN_OR_RETURN(Seconds ag, coll(plan::Collective::AllGather, act_bytes, tpg));
      CHORUS_ASSIGN_OR_RETURN(Seconds rs, coll(plan::Collective::ReduceScatter, act_bytes, tpg));
      tp_fwd = (ag + rs) * 2;
    } else {
      CHORUS_ASSIGN_OR_RETURN(Seconds ar, coll(plan::Collective::AllReduce, act_bytes, tpg));
      tp_fwd = ar * 2;
    }
  }
  Seconds cp_fwd(0);  // ring attention: K and V blocks pass around the cp ring
  if (cp > 1) {
    CHORUS_ASSIGN_OR_RETURN(Seconds ag, coll(plan::Collective::AllGather,
                                             2 * static_cast<double>(b) * s * kvd / std::min(T, double(m.kv_heads)) * kAct * cp, cpg));
    cp_fwd = ag;
  }
  const bool moe = m.moe.experts > 0;
  Seconds ep_fwd(0);  // dispatch + combine all-to-all per MoE layer
  if (moe && ep > 1) {
    CHORUS_ASSIGN_OR_RETURN(Seconds a2a, coll(plan::Collective::AllToAll, bs * m.moe.top_k * h * kAct / T, epg));
    ep_fwd = a2a * 2;
  }

  // ---- compute of one layer ------------------------------------------------
  auto layerTimes = [&](int layer) {
    LayerTimes lt;
    Seconds f(0);
    f += gpu.gemm(bs, (h + 2 * kvd) / T, h);                // qkv
    f += gpu.gemm(bs, h, h / T);                            // output projection
    Seconds core = gpu.gemm(s, s * cp, hd, b * heads_local)  // scores over all keys (ring attention)
                   + gpu.gemm(s, hd, s * cp, b * heads_local);
    if (!cfg.flash_attention)  // scale, mask, softmax, dropout over the b a/t s x s scores
      core += gpu.mem(9.0 * b * heads_local * s * s * cp);
    f += core;
    const bool dense = !moe || layer < m.moe.dense_layers;
    if (dense) {
      const double ff = static_cast<double>(m.ffn_hidden) / T;
      f += gpu.gemm(bs, (mats - 1) * ff, h) + gpu.gemm(bs, h, ff);
      f += gpu.mem((mats == 3 ? 6 : 4) * bs * ff * kAct / 2);  // activation function
    } else {
      const double ef = static_cast<double>(m.moe.expert_ffn_hidden) / T;
      const double local_experts = static_cast<double>(m.moe.experts) / static_cast<double>(ep);
      const double tok = bs * m.moe.top_k * static_cast<double>(ep) / static_cast<double>(m.moe.experts);
      f += gpu.gemm(tok, (mats - 1) * ef, h, local_experts) + gpu.gemm(tok, h, ef, local_experts);
      if (m.moe.shared_experts)
        f += gpu.gemm(bs, (mats - 1) * ef * m.moe.shared_experts, h) + gpu.gemm(bs, h, ef * m.moe.shared_experts);
      f += gpu.mem((mats == 3 ? 6 : 4) * bs * m.moe.top_k * ef) + gpu.gemm(bs, m.moe.experts, h);  // act + router
    }
    // Two layer norms (read + write) and two dropout + residual adds (read x,
    // mask, residual; write) over the (sequence-split) hidden state.
    f += gpu.mem(2 * 4 * bs * hsp) + gpu.mem(2 * 7 * bs * hsp);
    lt.fwd = f;
    lt.attn_core_fwd = core;
    lt.bwd = f * 2;  // data and weight gradients: twice the forward's work
    return lt;
  };

  // ---- one pipeline stage (the last: it also computes the logits) --------
  // Uneven splits (Llama-3 405B's 126 layers on 16 stages) give some stages
  // one more layer; the fullest stage paces the pipeline.
  const int64_t layers_per_stage = (m.layers + p - 1) / p;
  Seconds stage_fwd(0), stage_bwd(0), stage_recompute(0);
  Seconds tp_stage(0), cp_stage(0), ep_stage(0);
  const int first_layer = static_cast<int>(m.layers - layers_per_stage);
  for (int l = first_layer; l < m.layers; ++l) {
    const LayerTimes lt = layerTimes(l);
    stage_fwd += lt.fwd;
    stage_bwd += lt.bwd;
    const bool moe_layer = moe && l >= m.moe.dense_layers;
    if (cfg.recompute == Recompute::Full) stage_recompute += lt.fwd;
    if (cfg.recompute == Recompute::Selective) stage_recompute += lt.attn_core_fwd;
    // Forward, backward, and the recomputed forward's communication.
    const double comm_passes = cfg.recompute == Recompute::Full ? 3 : 2;
    tp_stage += tp_fwd * comm_passes;
    cp_stage += cp_fwd * comm_passes;
    if (moe_layer) ep_stage += ep_fwd * comm_passes;
  }
  // Logits (GEMM + cross-entropy) on the last stage.
  stage_fwd += gpu.gemm(bs, V / T, h) + gpu.mem(12 * bs * V / T);
  stage_bwd += gpu.gemm(bs, V / T, h) * 2 + gpu.mem(8 * bs * V / T);
  // Ring attention overlaps its transfers with the attention blocks.
  const Seconds cp_exposed = cp > 1 ? Seconds(std::max(0.0, (cp_stage - (stage_fwd + stage_bwd) * 0.1).value())) : Seconds(0);

  // Pipeline point-to-point: one activation (split over tp with sp) per
  // micro-batch and virtual-stage boundary, forward and backward.
  Seconds p2p(0);
  if (p > 1) {
    CHORUS_ASSIGN_OR_RETURN(CollectiveCost pc, net.sendRecv(Bytes(act_bytes / T), ppg));
    p2p = pc.time;
  }

  const Seconds per_mb = stage_fwd + stage_bwd + stage_recompute;
  const Seconds per_mb_comm = tp_stage + ep_stage + cp_exposed;
  const double mbf = static_cast<double>(mb);
  const double bubble_units = static_cast<double>(p - 1) / static_cast<double>(v);
  const Seconds compute = per_mb * mbf;
  const Seconds bubble = (per_mb + per_mb_comm) * bubble_units;
  const Seconds pp_comm = p2p * (2.0 * (mbf * static_cast<double>(v) + static_cast<double>(p - 1)) / static_cast<double>(v)) *
                          (p > 1 ? 1.0 : 0.0);

  // ---- parameters, data parallelism, optimizer ---------------------------
  double stage_params = V * h / T;  // embedding or logits shard
  for (int l = first_layer; l < m.layers; ++l) {
    double lp = m.layerParams(l);
    if (moe && l >= m.moe.dense_layers) {
      const double expert = mats * h * static_cast<double>(m.moe.expert_ffn_hidden);
      lp -= expert * m.moe.experts * (1.0 - 1.0 / static_cast<double>(ep));
    }
    stage_params += lp / T;
  }
  const double grad_bytes = stage_params * 2;  // bf16 gradients reduced
  const double dpc = static_cast<double>(d * cp);
  Seconds dp_comm(0);
  if (d * cp > 1) {
    const GroupSet dcg{d * cp, t, cfg.gpus / (d * cp)};
    CHORUS_ASSIGN_OR_RETURN(Seconds rs, coll(plan::Collective::ReduceScatter, grad_bytes, dcg));
    CHORUS_ASSIGN_OR_RETURN(Seconds ag, coll(plan::Collective::AllGather, grad_bytes, dcg));
    // Gradient reduce-scatter overlaps the last micro-batch's backward, the
    // parameter all-gather the first micro-batch's forward (Megatron's
    // overlap-grad-reduce / overlap-param-gather).  ZeRO-3 gathers weights
    // before every micro-batch's forward and backward, overlapped per layer.
    if (cfg.zero == 3) {
      const Seconds per_pass = std::max(Seconds(0), ag - stage_fwd) + std::max(Seconds(0), ag - stage_bwd);
      dp_comm = per_pass * mbf + std::max(Seconds(0), rs - stage_bwd);
    } else {
      dp_comm = std::max(Seconds(0), rs - stage_bwd) + std::max(Seconds(0), ag - stage_fwd);
    }
  }
  // Adam (fused, memory bound): fp32 master, m, v read and written, fp32 grad
  // read, bf16 weights written: 30 bytes per parameter held.
  const double opt_shard = cfg.zero >= 1 ? dpc : 1.0;
  const Seconds optimizer = gpu.mem(30 * stage_params / opt_shard);

  // ---- memory ----------------------------------------------------------------
  TrainReport rep;
  rep.config = cfg;
  const double w_div = cfg.zero >= 3 ? dpc : 1, g_div = cfg.zero >= 2 ? dpc : 1;
  rep.memory.weights_gib = toGib(Bytes(2 * stage_params / w_div));
  rep.memory.grads_gib = toGib(Bytes(4 * stage_params / g_div));  // fp32 main gradients
  rep.memory.optimizer_gib = toGib(Bytes(12 * stage_params / opt_shard));
  // Activations per layer and micro-batch (Korthikanti et al. 2022, eqs. 1-6):
  // s b h (34 + 5 a s / h) bytes, split by tp where sequence/tensor parallel.
  const double a = static_cast<double>(m.heads);
  const double attn_scores = cfg.flash_attention ? 0 : 5 * a * (s * cp) / h;
  double per_layer = 0;
  switch (cfg.recompute) {
    case Recompute::None: per_layer = sp ? bs * h * (34 + attn_scores) / T : bs * h * (10 + (24 + attn_scores) / T); break;
    case Recompute::Selective: per_layer = sp ? bs * h * 34 / T : bs * h * (10 + 24 / T); break;
    case Recompute::Full: per_layer = 2 * bs * h / (sp ? T : 1); break;
  }
  if (!sp && cfg.recompute != Recompute::Full) per_layer = std::max(per_layer, 0.0);
  // The first stage keeps pp micro-batches in flight (interleaving: x (1 + (p-1)/(p v))).
  const double in_flight = static_cast<double>(std::min<int64_t>(p, mb)) * (1 + static_cast<double>(p - 1) / (p * v) * (v > 1));
  double act = per_layer * static_cast<double>(layers_per_stage) * in_flight;
  if (cfg.recompute == Recompute::Full) act += bs * h * (34 + attn_scores) / (sp ? T : 1);  // one layer live in backward
  act += 4 * bs * V / T;  // logits and their gradient (fp32 loss) on the last stage
  rep.memory.activations_gib = toGib(Bytes(act));
  rep.memory_gib_per_gpu =
      rep.memory.weights_gib + rep.memory.grads_gib + rep.memory.optimizer_gib + rep.memory.activations_gib;
  if (rep.memory_gib_per_gpu > toGib(c.gpu.hbm))
    return invalidArgument(
        "layout tp={} pp={} dp={} cp={} ep={} micro-batch={} does not fit: {:.1f} GiB per GPU > {:.1f} GiB HBM of {} "
        "(weights {:.1f}, gradients {:.1f}, optimizer {:.1f}, activations {:.1f}); try --zero {}, --recompute "
        "selective/full, a smaller micro-batch or more tp/pp",
        t, p, d, cp, ep, b, rep.memory_gib_per_gpu, toGib(c.gpu.hbm), c.gpu.name, rep.memory.weights_gib,
        rep.memory.grads_gib, rep.memory.optimizer_gib, rep.memory.activations_gib, std::min(cfg.zero + 1, 3));

  // ---- totals -----------------------------------------------------------------
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
  rep.iteration_s = total;
  const double tokens = static_cast<double>(cfg.global_batch) * static_cast<double>(cfg.seq);
  rep.tokens_per_s = tokens / total;
  const double mf = modelFlopsPerIteration(m, cfg.global_batch, cfg.seq);
  double hw = mf;
  if (cfg.recompute == Recompute::Full) hw = mf * 4 / 3;
  if (cfg.recompute == Recompute::Selective)
    hw = mf + tokens * 4 * static_cast<double>(cfg.seq) * h * m.layers;  // scores + AV again
  const double n = static_cast<double>(cfg.gpus);
  rep.model_tflops_per_gpu = mf / total / n / 1e12;
  rep.hardware_tflops_per_gpu = hw / total / n / 1e12;
  rep.mfu = mf / total / n / (cfg.fp8 ? c.gpu.peak8 : c.gpu.peak16).value();
  double worst = -1;
  for (const auto& [k, x] : rep.breakdown)
    if (k != "compute_s" && x > worst) worst = x, rep.bottleneck = k;
  rep.bottleneck_link = worst_link;
  return rep;
}

}  // namespace chorus::sim

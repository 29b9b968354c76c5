#include "sim/train.hpp"

#include "sim/report.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "sim/bounds.hpp"
#include "sim/compute.hpp"
#include "sim/placement.hpp"
#include "sim/topology.hpp"

namespace chorus::sim {
namespace {

constexpr double kAct = 2;  // bytes per 16-bit activation element

// Forward FLOPs of one layer's GEMMs per token (matrix multiplies only; the
// attention term uses the full s x s score matrix as the accounting does).
double layerFlopsPerToken(const ModelSpec& m, int layer, double seq) {
  const double h = static_cast<double>(m.hidden), a = static_cast<double>(m.heads);
  const double mats = m.activation == Activation::SwiGlu ? 3 : 2;
  // q, k, v, o projections; scores (qk wide) and AV (v wide) per head
  double f = 2 * m.attnParams() + 2 * seq * a * (m.qkHeadDim() + m.vHeadDim());
  f += 2 * mats * h * m.ffnPerToken(layer);
  return f;
}

// A GEMM's time on one GPU and an element-wise kernel's: the per-operator
// compute model (sim/compute.hpp: tiles, waves, split-K, the K dimension and
// dtype from configs/gpus/*.json; the cluster's roofline curve for a GPU
// without a data file).
struct Gpu {
  const GpuSpec& g;
  bool fp8;
  std::string_view attention_kernel;  // "" = the generation's default
  Compute c{g, fp8, attention_kernel};
  // Forward GEMM: output m x n, reduction k.
  [[nodiscard]] Seconds gemm(double m, double n, double k, double batch = 1) const { return c.gemm(m, n, k, batch); }
  // Its backward: the input gradient (m x k, reduction n) and the weight
  // gradient (k x n, reduction m), each with its own tiling.
  [[nodiscard]] Seconds dgrad(double m, double n, double k, double batch = 1) const { return gemm(m, k, n, batch); }
  [[nodiscard]] Seconds wgrad(double m, double n, double k, double batch = 1) const { return gemm(k, n, m, batch); }
  // The fused (flash) attention core of `heads` problems, forward or backward.
  [[nodiscard]] Seconds attention(double heads, double sq, double skv, double d_qk, double d_v, bool causal,
                                  bool backward) const {
    return c.attention(heads, sq, skv, d_qk, d_v, causal, 0, backward);
  }
  // An element-wise kernel moving `bytes` through HBM.
  [[nodiscard]] Seconds mem(double bytes) const { return c.mem(bytes); }
};

// Counts the work the per-op costs are asked for (what the tensor-core and
// HBM bounds sum): every GEMM's FLOPs and its operands and output, each moved
// through HBM once (1 B per element in fp8, else 2), and every element-wise
// kernel's bytes; it forwards each call to the cost source unchanged.
struct Meter {
  const Gpu& g;
  double fwd_flops = 0, fwd_bytes = 0, bwd_flops = 0, bwd_bytes = 0, ew_bytes = 0;
  double perm_bytes = 0;  // the part of ew_bytes that permutes tokens: its backward moves the same bytes once
  void count(double m, double n, double k, double batch, double* flops, double* bytes) const {
    if (m <= 0 || n <= 0 || k <= 0) return;
    *flops += 2 * m * n * k * batch;
    *bytes += (g.fp8 ? 1 : kAct) * batch * (m * k + k * n + m * n);
  }
  Seconds gemm(double m, double n, double k, double batch = 1) {
    count(m, n, k, batch, &fwd_flops, &fwd_bytes);
    return g.gemm(m, n, k, batch);
  }
  Seconds dgrad(double m, double n, double k, double batch = 1) {
    count(m, k, n, batch, &bwd_flops, &bwd_bytes);
    return g.dgrad(m, n, k, batch);
  }
  Seconds wgrad(double m, double n, double k, double batch = 1) {
    count(k, n, m, batch, &bwd_flops, &bwd_bytes);
    return g.wgrad(m, n, k, batch);
  }
  Seconds mem(double bytes) {
    ew_bytes += bytes;
    return g.mem(bytes);
  }
  // A token permutation (a gather or scatter of rows): its gradient is the
  // inverse permutation, the same bytes once, not the twice-as-many of other
  // element-wise kernels' backwards.
  Seconds permute(double bytes) {
    perm_bytes += bytes;
    return mem(bytes);
  }
  // The fused attention core: its two GEMMs' FLOPs per head (QK^T and PV;
  // the backward's four, without FlashAttention's recomputed scores, so the
  // bound stays a lower bound; causal: half the pairs) and Q, K, V and the
  // output once through HBM.
  Seconds attention(double heads, double sq, double skv, double d_qk, double d_v, bool causal, bool backward) {
    const double flops = 2 * heads * sq * skv * (d_qk + d_v) * (causal ? 0.5 : 1) * (backward ? 2 : 1);
    const double bytes = kAct * heads * (sq * (d_qk + d_v) + skv * (d_qk + d_v));
    *(backward ? &bwd_flops : &fwd_flops) += flops;
    *(backward ? &bwd_bytes : &fwd_bytes) += bytes;
    return g.attention(heads, sq, skv, d_qk, d_v, causal, backward);
  }
};
// The work of one layer's (or the logits') forward and backward on one GPU
// per micro-batch: FLOPs and HBM bytes.
struct Work {
  double f_flops = 0, f_bytes = 0, b_flops = 0, b_bytes = 0;
};

struct LayerTimes {
  Seconds fwd, bwd, attn_core_fwd;  // attn_core: the attention core's forward
  Seconds recompute_sel;            // what selective recomputation's modules repeat in the backward
  double recompute_flops = 0, recompute_bytes = 0;  // its GEMM FLOPs (beyond the attention core's) and HBM bytes
  Seconds wgrad;  // every weight-gradient GEMM of the backward (zero-bubble's W pass)
  TrainReport::MoeBlock moe;  // a MoE layer's block, without its collectives (filled in by the caller)
  Seconds qkv_dgrad, qkv_wgrad, fc1_dgrad, fc1_wgrad;  // the column-parallel backward GEMMs that tp
                                                       // communication overlaps
};

// What a collective of duration `comm` costs when it runs concurrently with
// compute of duration `work` (Megatron's async tensor-parallel backward): the
// part that outlasts the compute, plus the compute slowed by the SMs the
// collective kernel occupies meanwhile.
Seconds overlapped(Seconds comm, Seconds work, double sm_fraction) {
  const Seconds hidden = std::min(comm, work);
  return (comm - hidden) + hidden * sm_fraction;
}

}  // namespace

std::string RecomputeModules::describe() const {
  std::string out;
  for (auto [on, name] : {std::pair{core_attn, "core_attn"}, {layernorm, "layernorm"}, {mla_up_proj, "mla_up_proj"},
                          {mlp, "mlp"}, {moe_act, "moe_act"}, {shared_experts, "shared_experts"}})
    if (on) out += (out.empty() ? "" : ",") + std::string(name);
  return out.empty() ? "none" : out;
}

Result<RecomputeModules> parseRecomputeModules(std::string_view text) {
  RecomputeModules r;
  r.core_attn = false;
  size_t n = 0, i = 0;
  while (i < text.size()) {
    const size_t j = text.find_first_of(", ", i);
    const std::string_view w = text.substr(i, j == std::string_view::npos ? std::string_view::npos : j - i);
    i = j == std::string_view::npos ? text.size() : j + 1;
    if (w.empty()) continue;
    ++n;
    if (w == "core_attn") r.core_attn = true;
    else if (w == "layernorm") r.layernorm = true;
    else if (w == "mla_up_proj") r.mla_up_proj = true;
    else if (w == "mlp") r.mlp = true;
    else if (w == "moe_act") r.moe_act = true;
    else if (w == "shared_experts") r.shared_experts = true;
    else if (w == "moe")
      return invalidArgument("--recompute-modules: 'moe' (recomputing the whole MoE layer, its dispatch and combine "
                             "included) is not modelled; moe_act and shared_experts are");
    else
      return invalidArgument("--recompute-modules: '{}' is not one of core_attn, layernorm, mla_up_proj, mlp, moe_act, "
                             "shared_experts", w);
  }
  if (n == 0) return invalidArgument("--recompute-modules '{}': name at least one module", text);
  return r;
}

namespace {
// Expands "(...)*N" and "x*N" in a pipeline layout; `pos` moves past what was read.
Result<std::string> expandLayout(std::string_view t, size_t& pos, int depth) {
  if (depth > 8) return invalidArgument("--pp-layout: parentheses nested deeper than 8");
  std::string out;
  while (pos < t.size() && t[pos] != ')') {
    std::string item;
    const size_t at = pos;
    const char ch = t[pos];
    if (ch == '(') {
      ++pos;
      CHORUS_ASSIGN_OR_RETURN(item, expandLayout(t, pos, depth + 1));
      if (pos >= t.size() || t[pos] != ')') return invalidArgument("--pp-layout: '(' at {} is not closed", at);
      ++pos;
    } else if (ch == 'E' || ch == 't' || ch == 'm' || ch == 'L' || ch == '|') {
      item = std::string(1, ch), ++pos;
    } else if (ch == ' ') {
      ++pos;
      continue;
    } else {
      return invalidArgument("--pp-layout: '{}' at {} is not one of E, t, m, L, |, (, ), *N", ch, at);
    }
    if (pos < t.size() && t[pos] == '*') {
      size_t end = ++pos;
      while (end < t.size() && t[end] >= '0' && t[end] <= '9') ++end;
      if (end == pos || end - pos > 6) return invalidArgument("--pp-layout: '*' at {} needs a count (1 to 999999)", pos - 1);
      const int n = std::stoi(std::string(t.substr(pos, end - pos)));
      pos = end;
      if (n < 1 || static_cast<double>(item.size()) * n + static_cast<double>(out.size()) > 1e6)
        return invalidArgument("--pp-layout: repeat count {} at {} must be >= 1 and keep the layout under 1e6 symbols", n,
                               pos);
      std::string rep;
      for (int i = 0; i < n; ++i) rep += item;
      item = std::move(rep);
    }
    out += item;
  }
  return out;
}
}  // namespace

Result<std::vector<LayoutStage>> parsePipelineLayout(std::string_view text) {
  size_t pos = 0;
  CHORUS_ASSIGN_OR_RETURN(std::string flat, expandLayout(text, pos, 0));
  if (pos != text.size()) return invalidArgument("--pp-layout: ')' at {} has no '('", pos);
  std::vector<LayoutStage> stages(1);
  for (char ch : flat) {
    LayoutStage& st = stages.back();
    switch (ch) {
      case '|': stages.emplace_back(); break;
      case 'E':
        if (stages.size() != 1 || st.layers > 0 || st.mtp > 0 || st.embedding)
          return invalidArgument("--pp-layout '{}': E (the embedding) must open the first stage, once", text);
        st.embedding = true;
        break;
      case 't':
        if (st.mtp > 0 || st.loss) return invalidArgument("--pp-layout '{}': a decoder layer after an MTP depth or the loss", text);
        ++st.layers;
        break;
      case 'm':
        if (st.loss) return invalidArgument("--pp-layout '{}': an MTP depth after the loss", text);
        ++st.mtp;
        break;
      case 'L':
        if (st.loss) return invalidArgument("--pp-layout '{}': L (the loss) twice", text);
        st.loss = true;
        break;
      default: break;
    }
  }
  for (size_t i = 0; i < stages.size(); ++i) {
    if (stages[i].loss && i + 1 != stages.size())
      return invalidArgument("--pp-layout '{}': L (the loss) must end the last stage (found in stage {} of {})", text, i,
                             stages.size());
    if (stages[i].mtp > 0 && i + 1 != stages.size())
      return invalidArgument("--pp-layout '{}': MTP depths (m) belong to the last stage (found in stage {} of {})", text, i,
                             stages.size());
  }
  if (!stages.front().embedding || !stages.back().loss)
    return invalidArgument("--pp-layout '{}': the first stage must start with E and the last end with L", text);
  return stages;
}

Result<TrainConfig::MoeDispatch> parseMoeDispatch(std::string_view text) {
  if (text == "alltoall") return TrainConfig::MoeDispatch::AllToAll;
  if (text == "hierarchical") return TrainConfig::MoeDispatch::Hierarchical;
  return invalidArgument("--moe-dispatch '{}': one of alltoall, hierarchical", text);
}

double modelFlopsPerIteration(const ModelSpec& m, int64_t global_batch, int64_t seq) {
  const double tokens = static_cast<double>(global_batch) * static_cast<double>(seq);
  double per_token = 2 * static_cast<double>(m.hidden) * static_cast<double>(m.vocab);  // logits
  for (int l = 0; l < m.layers; ++l) per_token += layerFlopsPerToken(m, l, static_cast<double>(seq));
  return 3 * tokens * per_token;  // forward + backward (2x)
}

Result<TrainReport> simulateTraining(const ModelSpec& m, const ClusterSpec& c, const TrainConfig& cfg,
                                     const plan::Registry& reg, NetMode mode) {
  CHORUS_ASSIGN_OR_RETURN(Topology topo, Topology::build(c));
  NetworkModel net(c, topo, reg, mode);
  return simulateTraining(m, cfg, net);
}

namespace {

// Expert parallelism: classic (--etp unset) inside dp x cp with the experts
// split over the layer's tp; folded (Megatron-Core's MoE parallel folding,
// --etp E) over all tp x cp x dp GPUs of a stage, the expert layers laid
// out as etp x ep x expert-data-parallel (etp fastest).
Status checkExpertLayout(const ModelSpec& m, const TrainConfig& cfg) {
  const int64_t t = cfg.tp, d = cfg.dp, cp = cfg.cp, ep = cfg.ep;
  if (cfg.etp < 0) return invalidArgument("--etp {} must be >= 1 (or unset: the experts split over tp)", cfg.etp);
  if (ep > 1 && m.moe.experts == 0)
    return invalidArgument("ep={}: model '{}' has no experts (moe.experts = 0)", ep, m.name);
  if (m.moe.experts > 0 && m.moe.experts % ep != 0)
    return invalidArgument("ep={} must divide the experts ({}) of model '{}'", ep, m.moe.experts, m.name);
  const int64_t etp = cfg.etp > 0 ? cfg.etp : t;
  if (cfg.etp > 0) {
    if (m.moe.experts == 0) return invalidArgument("--etp {}: model '{}' has no experts", cfg.etp, m.name);
    if ((t * cp * d) % etp != 0)
      return invalidArgument("--etp {} must divide tp x cp x dp = {} x {} x {} = {} (MoE parallel folding)", etp, t, cp, d,
                             t * cp * d);
    if ((t * cp * d) % (ep * etp) != 0) {
      int64_t near = ep;  // the largest valid ep below
      while (near > 1 && ((t * cp * d) % (near * etp) != 0 || m.moe.experts % near != 0)) --near;
      return invalidArgument("ep x etp = {} x {} = {} must divide tp x cp x dp = {} x {} x {} = {} (MoE parallel "
                             "folding: the expert layers use the same GPUs); e.g. --ep {} --etp {}",
                             ep, etp, ep * etp, t, cp, d, t * cp * d, near, etp);
    }
    if (m.moe.expert_ffn_hidden % etp != 0)
      return invalidArgument("--etp {} must divide the experts' ffn width moe.expert_ffn_hidden = {} (model '{}')", etp,
                             m.moe.expert_ffn_hidden, m.name);
  } else if (ep > 1 && (d * cp) % ep != 0) {
    return invalidArgument("ep={} must divide dp x cp = {} x {} = {} (experts split over tp; or fold expert parallelism "
                           "across tp with --etp: ep x etp must divide tp x cp x dp = {})",
                           ep, d, cp, d * cp, t * cp * d);
  }
  if (!(cfg.moe_imbalance >= 1) || !std::isfinite(cfg.moe_imbalance))
    return invalidArgument("--moe-imbalance {}: must be >= 1 (the busiest expert's tokens over the mean)", cfg.moe_imbalance);
  if (m.moe.experts > 0 && cfg.moe_imbalance > static_cast<double>(m.moe.experts) / m.moe.top_k)
    return invalidArgument("--moe-imbalance {}: at most experts / top_k = {} / {} = {} (every token on one expert)",
                           cfg.moe_imbalance, m.moe.experts, m.moe.top_k,
                           static_cast<double>(m.moe.experts) / m.moe.top_k);
  if (m.moe.experts == 0 && (cfg.moe_imbalance != 1 || cfg.fp8_dispatch ||
                             cfg.moe_dispatch != TrainConfig::MoeDispatch::AllToAll))
    return invalidArgument("--moe-imbalance, --fp8-dispatch and --moe-dispatch apply to MoE models; '{}' has no experts",
                           m.name);
  return {};
}

// The layout's degrees against the model and the cluster (before any pricing).
Status checkLayout(const ModelSpec& m, const ClusterSpec& c, const TrainConfig& cfg) {
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
  if (m.layers < p * v && cfg.pp_layout.empty())
    return invalidArgument("layers={} is fewer than pp x vpp = {} x {} stages (model '{}'); a --pp-layout may leave "
                           "stages without a layer", m.layers, p, v, m.name);
  CHORUS_RETURN_IF_ERROR(checkExpertLayout(m, cfg));
  if (cfg.seq % (cp * (cfg.sequence_parallel ? t : 1)) != 0)
    return invalidArgument("seq={} is not divisible by cp={} (x tp={} with sequence parallelism)", cfg.seq, cp, t);
  if (cfg.zero < 0 || cfg.zero > 3) return invalidArgument("--zero {} is not one of 0, 1, 2, 3", cfg.zero);
  if (!cfg.attention_kernel.empty() && !cfg.flash_attention)
    return invalidArgument("--attention-kernel {} prices a fused attention kernel; --no-flash-attention materialises the "
                           "scores instead: give one", cfg.attention_kernel);
  return checkAttentionKernel(c.gpu, cfg.attention_kernel);
}

// The compute and communication of a run of layers on one GPU per
// micro-batch: a pipeline stage or a virtual-stage chunk.
struct RangeCost {
  Seconds fwd = Seconds(0), bwd = Seconds(0), recompute = Seconds(0);
  Seconds wgrad = Seconds(0);  // the weight-gradient GEMMs within bwd
  Seconds tp_f = Seconds(0), tp_b = Seconds(0), cp = Seconds(0), ep = Seconds(0);
};

// One layer's running sums while it is priced (Trainer::layerTimes' parts add to them).
struct LayerSums {
  LayerTimes lt;
  Seconds f = Seconds(0), bw = Seconds(0), ew = Seconds(0);  // GEMMs forward, GEMMs backward, element-wise forward
  Seconds perm = Seconds(0);  // the token permutations within ew (their backward moves the bytes once)
  Seconds q8_fwd = Seconds(0), q8_bwd = Seconds(0);  // fp8 casts
};

// Per pipeline stage, what the physical bounds sum: the FLOPs and HBM bytes
// its kernels execute, its parameters, and the bytes its GPU puts on each link class.
struct StageLoad {
  std::vector<double> flops, bytes, params, expert;
  std::vector<LinkDemand> link;
};

// One training iteration on one layout, priced in phases (run() calls them in
// order; each reads what the earlier ones set).  The names follow the
// formulas of docs/simulator.md and Korthikanti et al. 2022: t, p, d, cp, ep,
// v the degrees, b the micro-batch, s the local sequence, h the hidden size,
// V the vocabulary, T = t as a double.
class Trainer {
 public:
  Trainer(const ModelSpec& model, const TrainConfig& config, NetworkModel& network);
  Result<TrainReport> run();

 private:
  // ---- phases, in run()'s order
  Status checkMicroBatch();
  Status placeLayers();
  Status checkSchedule();
  Status markRecompute();
  void findPacingStage();
  Status fitMemory();
  Status priceCollectives();
  Status priceExpertDispatch();
  Status estimatePipeline();
  Status priceDataParallel();
  void sumEstimate();
  void linkUnits();
  StageLoad stageLoads();
  void bounds();
  Status buildSchedule();
  void settle();
  void reportBlockAndStage();
  Status stageCosts();

  // ---- parameters and memory
  double paramsOf(int first, int count, bool vocab, double* widest) const;
  double expertParamsOf(int first, int count) const;
  double sharded(double per_param, double params, double expert, int stage) const;
  double layerAct(int l, const RecomputeModules& r) const;
  [[nodiscard]] bool fullAt(int l) const { return layer_full[static_cast<size_t>(l)] != 0; }

  // ---- collectives
  void note(const std::string& dim, const CollectiveCost& cc);
  Result<Seconds> coll(plan::Collective k, double bytes, const GroupSet& g, const char* dim);
  Result<Seconds> epOneWay(double bytes);
  void tpComm(const LayerTimes& lt, Seconds* fwd, Seconds* bwd) const;
  Seconds tpHidden(const LayerTimes& lt) const;
  [[nodiscard]] double wireBytes(plan::Collective k) const {
    return k == plan::Collective::ReduceScatter ? grad_wire : 2.0;
  }
  Result<Seconds> gradColl(plan::Collective k, double bytes, const GroupSet& g);
  Seconds quantizeTime(double params, int64_t n) const;
  Result<Seconds> dpColl(plan::Collective k);

  // ---- compute of one layer
  Seconds mm(LayerSums& x, double mm_m, double mm_n, double mm_k, double batch, Seconds* dg = nullptr,
             Seconds* wg = nullptr);
  void q8(LayerSums& x, double mm_m, double mm_n, double mm_k, double batch);
  Seconds attentionBlock(LayerSums& x);
  void denseFfn(LayerSums& x);
  void moeBlock(LayerSums& x);
  Seconds selectiveRecompute(bool dense, Seconds core, LayerTimes& lt) const;
  LayerTimes layerTimes(int layer);
  const LayerTimes& timesOf(int l);
  const Work& workOf(int l);
  RangeCost priceRange(int first, int count, bool embedding, bool logits);
  void priceLogits(RangeCost& rc);
  Seconds cpExposed(const RangeCost& rc) const;

  // ---- the schedule
  Status dpTransfers(double params, Transfer* ag_t, Transfer* rs_t, double expert = 0);
  LayerPlan planLayer(int l, const Transfer& tp_fwd_t, const Transfer& tp_bwd_t, const Transfer& tp_async_t);

  // ---- inputs and the layout
  const ModelSpec& m;
  const TrainConfig& cfg;
  NetworkModel& net;
  const ClusterSpec& c;
  const int64_t t, p, d, cp, ep, v, etp, b;
  int64_t mb = 0;  // micro-batches per iteration per pipeline
  const Gpu raw_gpu;
  Meter gpu{raw_gpu};  // every per-op cost goes through the meter
  const bool sp, moe;
  const double h, V;
  const double s;        // local sequence
  const double bs;       // local tokens
  const double heads_v;  // width of the attention output
  const double heads_local;
  const double T;
  const double mats;
  const double hsp;  // width of the replicated/sequence-split elementwise region
  const double smf;  // the SM share a collective kernel takes from concurrent compute
  const LinkLedger ledger;
  TrainReport rep;

  // ---- layers over (virtual) pipeline stages, recomputation
  int64_t vs_count = 0;
  std::vector<int> vs_layers, vs_first;
  int all_layers = 0;  // decoder layers and MTP depths
  std::vector<char> layer_full;
  bool any_full = false;
  int64_t layers_per_stage = 0;
  int first_layer = 0;
  double opt_state = 0, opt_step = 0;  // optimizer bytes per parameter: held, and moved by the step

  // ---- parameters and memory
  double stage_params = 0, dpc = 0, edp = 0;
  double gb = 2;  // bytes per saved GEMM-input element
  RecomputeModules keep_all;
  const RecomputeModules* rmods = &keep_all;
  double latents = 0, scores = 0;

  // ---- collectives of one layer and micro-batch
  GroupSet tpg, cpg, epg, ppg;
  int64_t pp_stride = 0, dp_stride = 0;
  // Per breakdown category, the link limiting its slowest collective (what
  // the bottleneck line names: the category's own binding link).
  std::map<std::string, std::pair<double, std::string>> dim_link;
  double act_bytes = 0;  // one layer boundary's activations
  Seconds tp_ag = Seconds(0), tp_rs = Seconds(0), tp_ar = Seconds(0);
  double cp_bytes = 0;
  Seconds cp_fwd = Seconds(0);  // ring attention: K and V blocks pass around the cp ring
  double imb = 1, a2a_bytes = 0, dispatch_bytes = 0;
  Seconds ep_fwd = Seconds(0), ep_dispatch = Seconds(0), ep_combine = Seconds(0);  // dispatch + combine, and each
  bool hier = false;
  GroupSet rail_g, node_g;
  double rail_share = 0, node_share = 0;
  double gpu_copies = 1;  // per routed copy, the copies DeepEP delivers (one per distinct GPU hit)
  Seconds ce = Seconds(0);  // the vocab-parallel cross-entropy's allreduce (3 fp32 values per token)

  // ---- layer costs, by kind (layerTimes depends on a layer only through it)
  std::optional<LayerTimes> dense_times, moe_times;
  Work dense_work, moe_work;
  std::optional<Work> logit_work;  // the logits + loss, metered once
  Seconds logit_fwd = Seconds(0), logit_bwd = Seconds(0), logit_wgrad_s = Seconds(0);  // per micro-batch

  // ---- the closed-form estimate
  RangeCost pace;
  Seconds stage_fwd = Seconds(0), stage_bwd = Seconds(0), stage_recompute = Seconds(0);
  Seconds tp_f = Seconds(0), tp_b = Seconds(0), ep_stage = Seconds(0), cp_exposed = Seconds(0);
  Seconds p2p = Seconds(0), tp_stage = Seconds(0), compute = Seconds(0), bubble = Seconds(0), pp_comm = Seconds(0);
  double mbf = 0;

  // ---- data parallelism, optimizer
  double stage_expert = 0;
  int64_t edp_n = 1;
  bool edp_own = false, dense_dp = false, any_dp = false;
  GroupSet edpg, dcg;
  double grad_data = 0, grad_wire = 0, expert_params = 0, dense_params = 0;
  Seconds dp_comm = Seconds(0), dp_rs = Seconds(0), dp_ag = Seconds(0), optimizer = Seconds(0);

  // ---- each group's collectives per byte on every link class (the ledger)
  LinkDemand u_tag, u_trs, u_tar, u_cp, u_ep, u_rail, u_node, u_dag, u_drs, u_eag, u_ers;
  LinkDemand ep_demand;  // one MoE layer's dispatch and combine per micro-batch and pass
};

Trainer::Trainer(const ModelSpec& model, const TrainConfig& config, NetworkModel& network)
    : m(model),
      cfg(config),
      net(network),
      c(network.cluster()),
      t(config.tp),
      p(config.pp),
      d(config.dp),
      cp(config.cp),
      ep(config.ep),
      v(config.vpp),
      etp(config.etp > 0 ? config.etp : config.tp),
      b(config.micro_batch),
      raw_gpu{c.gpu, config.fp8, config.attention_kernel},
      sp(config.sequence_parallel && config.tp > 1),
      moe(model.moe.experts > 0),
      h(static_cast<double>(model.hidden)),
      V(static_cast<double>(model.vocab)),
      s(static_cast<double>(config.seq) / static_cast<double>(config.cp)),
      bs(static_cast<double>(config.micro_batch) * s),
      heads_v(static_cast<double>(model.heads) * model.vHeadDim()),
      heads_local(static_cast<double>(model.heads) / static_cast<double>(config.tp)),
      T(static_cast<double>(config.tp)),
      mats(model.activation == Activation::SwiGlu ? 3 : 2),
      hsp(sp ? h / T : h),
      smf(c.gpu.comm_sm_fraction),
      ledger(c, config.gpus) {
  keep_all.core_attn = false;
}

Result<TrainReport> Trainer::run() {
  CHORUS_RETURN_IF_ERROR(checkMicroBatch());
  CHORUS_RETURN_IF_ERROR(placeLayers());
  CHORUS_RETURN_IF_ERROR(checkSchedule());
  CHORUS_RETURN_IF_ERROR(markRecompute());
  findPacingStage();
  CHORUS_RETURN_IF_ERROR(fitMemory());  // a layout that does not fit costs no pricing
  CHORUS_RETURN_IF_ERROR(priceCollectives());
  CHORUS_RETURN_IF_ERROR(estimatePipeline());
  CHORUS_RETURN_IF_ERROR(priceDataParallel());
  sumEstimate();
  linkUnits();
  bounds();
  if (cfg.schedule) {  // the iteration as a simulated schedule (src/sim/schedule.hpp)
    CHORUS_RETURN_IF_ERROR(buildSchedule());
    CHORUS_ASSIGN_OR_RETURN(ScheduleResult sr, simulateSchedule(rep.schedule_spec));
    rep.iteration_s = sr.makespan_s;
    rep.breakdown = sr.breakdown;
    rep.schedule_tasks = sr.tasks;
    rep.schedule_merged_layers = sr.merged_layers;
  }
  settle();
  reportBlockAndStage();
  if (cfg.stage_costs) CHORUS_RETURN_IF_ERROR(stageCosts());
  return std::move(rep);
}

Status Trainer::checkMicroBatch() {
  if (b < 1 || cfg.global_batch % (d * b) != 0)
    return invalidArgument("global batch {} is not divisible by dp x micro-batch = {} x {}", cfg.global_batch, d, b);
  mb = cfg.global_batch / (d * b);
  mbf = static_cast<double>(mb);
  if (v > 1 && mb % p != 0)
    return invalidArgument("interleaved schedule: micro-batches per pipeline ({}) must be a multiple of pp={}", mb, p);
  return {};
}

// The layers of each virtual stage k = chunk x p + stage, in order: the first
// L mod (p v) one more (DeepSpeed's uniform partition), or with
// --first-stage-layers / --last-stage-layers (Megatron's
// --decoder-first/last-pipeline-num-layers, what Llama 3 used to balance the
// first stage's in-flight activations and the last's logits) those counts on
// the first and last stage and the rest split uniformly, or Megatron's
// explicit --pp-layout.
Status Trainer::placeLayers() {
  vs_count = p * v;
  vs_layers.assign(static_cast<size_t>(vs_count), 0);
  vs_first.assign(static_cast<size_t>(vs_count), 0);
  if (cfg.mtp_layers < 0 || cfg.mtp_layers > 8)
    return invalidArgument("--mtp-layers {}: must be in [0, 8] (multi-token prediction depths; DeepSeek-V3 uses 1)",
                           cfg.mtp_layers);
  if (!cfg.pp_layout.empty()) {  // Megatron's explicit layout
    if (cfg.first_stage_layers > 0 || cfg.last_stage_layers > 0)
      return invalidArgument("--pp-layout and --first-stage-layers / --last-stage-layers both place layers; give one");
    CHORUS_ASSIGN_OR_RETURN(std::vector<LayoutStage> lay, parsePipelineLayout(cfg.pp_layout));
    int decoder = 0;
    for (const LayoutStage& st : lay) decoder += st.layers;
    if (static_cast<int64_t>(lay.size()) != vs_count || decoder != m.layers || lay.back().mtp != cfg.mtp_layers)
      return invalidArgument("--pp-layout '{}' has {} stages, {} decoder layers and {} MTP depths; the layout needs pp x vpp "
                             "= {} stages, the model's {} layers and --mtp-layers {}", cfg.pp_layout, lay.size(), decoder,
                             lay.back().mtp, vs_count, m.layers, cfg.mtp_layers);
    int next = 0;
    for (int64_t k = 0; k < vs_count; ++k) {
      const LayoutStage& st = lay[static_cast<size_t>(k)];
      vs_layers[static_cast<size_t>(k)] = st.layers + st.mtp, vs_first[static_cast<size_t>(k)] = next;
      next += st.layers + st.mtp;
    }
  } else {
    const int fl = cfg.first_stage_layers, ll = cfg.last_stage_layers;
    if (fl < 0 || ll < 0)
      return invalidArgument("--first-stage-layers {} / --last-stage-layers {}: must be >= 0 (0: the uniform split)", fl, ll);
    if ((fl > 0 || ll > 0) && v > 1)
      return invalidArgument("--first-stage-layers / --last-stage-layers need vpp = 1 (got vpp={})", v);
    if ((fl > 0 || ll > 0) && p < 2 + (fl > 0 && ll > 0 ? 1 : 0))
      return invalidArgument("--first-stage-layers {} / --last-stage-layers {} need pp >= {} (got pp={})", fl, ll,
                             2 + (fl > 0 && ll > 0 ? 1 : 0), p);
    const int64_t middle = vs_count - (fl > 0) - (ll > 0), rest = m.layers - fl - ll;
    if (rest < middle)
      return invalidArgument("--first-stage-layers {} + --last-stage-layers {} leave {} layers for {} other stages of "
                             "model '{}' ({} layers; each stage needs at least one)", fl, ll, rest, middle, m.name, m.layers);
    int next = 0;
    for (int64_t k = 0; k < vs_count; ++k) {
      int n = 0;
      if (k == 0 && fl > 0) n = fl;
      else if (k == vs_count - 1 && ll > 0) n = ll;
      else {
        const int64_t i = k - (fl > 0);  // index among the uniformly split stages
        n = static_cast<int>(rest / middle + (i < rest % middle ? 1 : 0));
      }
      vs_layers[static_cast<size_t>(k)] = n, vs_first[static_cast<size_t>(k)] = next;
      next += n;
    }
    // MTP depths run after the last decoder layer, on the last virtual stage
    // (Megatron places them there): layers L .. L + D - 1, shaped as the last.
    vs_layers[static_cast<size_t>(vs_count - 1)] += cfg.mtp_layers;
  }
  all_layers = m.layers + cfg.mtp_layers;
  return {};
}

// The pipeline order, the optimizer's and gradients' dtypes and the options
// that depend on them.
Status Trainer::checkSchedule() {
  if (cfg.zero_bubble && (v != 1 || p < 2))
    return invalidArgument("--pp-schedule zb-h1 needs pp >= 2 and vpp = 1 (ZB-H1 is a 1F1B schedule; got pp={} vpp={})", p, v);
  if (cfg.pp_before_dp && (ep > 1 || (cp > 1 && d > 1)))
    return invalidArgument("--rank-order tp-cp-ep-pp-dp is modelled without expert parallelism and with cp or dp of 1 "
                           "(got ep={} cp={} dp={}): its data-parallel and expert groups would not be one strided set of "
                           "ranks; use the default tp-cp-ep-dp-pp", ep, cp, d);
  if (cfg.dualpipe) {
    if (cfg.zero_bubble) return invalidArgument("--pp-schedule: DualPipe and ZB-H1 are two different orders");
    if (p < 2 || p % 2 != 0 || v != 1)
      return invalidArgument("--pp-schedule dualpipe needs an even pp >= 2 and vpp = 1 (each rank holds stages r and "
                             "pp-1-r; got pp={} vpp={})", p, v);
    if (mb % 2 != 0 || mb < 2 * p)
      return invalidArgument("--pp-schedule dualpipe needs an even number of micro-batches per pipeline, at least 2 x "
                             "pp = {} (half enter at each end; got {})", 2 * p, mb);
    if (cfg.moe_a2a_overlap)
      return invalidArgument("--pp-schedule dualpipe pairs forwards and backwards itself; drop --moe-a2a-overlap");
  }
  if (cfg.moment_bytes != 2 && cfg.moment_bytes != 4)
    return invalidArgument("Adam moments of {} bytes each: 2 (bf16) or 4 (fp32)", cfg.moment_bytes);
  // Optimizer state per parameter (fp32 master + the two moments) and the
  // step's HBM bytes per updated parameter (gradient-norm read 4, master
  // read and written 8, moments read and written 4 x moment, gradient read
  // 4, bf16 weight copy 6): 12 and 38 with fp32 moments.
  opt_state = 4 + 2.0 * cfg.moment_bytes, opt_step = 22 + 4.0 * cfg.moment_bytes;
  if (cfg.grad_bytes != 2 && cfg.grad_bytes != 4)
    return invalidArgument("gradient buffer of {} bytes per parameter: 2 (bf16) or 4 (fp32)", cfg.grad_bytes);
  CHORUS_RETURN_IF_ERROR(checkCompression(cfg.grad_compress, plan::Collective::ReduceScatter,
                                          static_cast<double>(cfg.grad_bytes), "--compress"));
  if (cfg.moe_a2a_overlap) {
    if (!moe || ep < 2)
      return invalidArgument("--moe-a2a-overlap needs expert parallelism (a MoE model and --ep >= 2; got {} with ep={})",
                             moe ? "a MoE model" : "a dense model", ep);
    if (cfg.zero_bubble)
      return invalidArgument("--moe-a2a-overlap and --pp-schedule zb-h1 are two different pipeline orders; pick one");
    if (p > 1 && v == 1)
      return invalidArgument("--moe-a2a-overlap with pp={} needs --vpp >= 2 (Megatron-Core combines a forward and a "
                             "backward only without pipelining or in the interleaved schedule)", p);
    if (cfg.recompute == Recompute::Full)
      return invalidArgument("--moe-a2a-overlap with --recompute full: Megatron-Core refuses full recomputation with "
                             "the combined 1F1B; use --recompute selective or none");
  }
  return {};
}

// Which layers recompute their forward in the backward: every layer under
// --recompute full, or with --recompute-layers N the first N of every
// virtual stage (Megatron's block method; the others keep everything).
Status Trainer::markRecompute() {
  if (cfg.recompute_layers < 0)
    return invalidArgument("--recompute-layers {}: must be >= 0 (0: every layer)", cfg.recompute_layers);
  if (cfg.recompute_layers > 0 && cfg.recompute != Recompute::Full)
    return invalidArgument("--recompute-layers {} needs --recompute full (Megatron's --recompute-num-layers applies to "
                           "full recomputation only; got --recompute {})",
                           cfg.recompute_layers, cfg.recompute == Recompute::None ? "none" : "selective");
  layer_full.assign(static_cast<size_t>(all_layers), cfg.recompute == Recompute::Full ? 1 : 0);
  if (cfg.recompute_layers > 0) {
    int longest = 0;
    for (int64_t k = 0; k < vs_count; ++k) {
      const int first = vs_first[static_cast<size_t>(k)], count = vs_layers[static_cast<size_t>(k)];
      longest = std::max(longest, count);
      for (int l = first; l < first + count; ++l) layer_full[static_cast<size_t>(l)] = l - first < cfg.recompute_layers;
    }
    if (cfg.recompute_layers > longest)
      return invalidArgument("--recompute-layers {}: more than the {} layers of the largest (virtual) pipeline stage "
                             "of this layout ({} layers over pp {} x vpp {})",
                             cfg.recompute_layers, longest, m.layers, p, v);
  }
  any_full = std::find(layer_full.begin(), layer_full.end(), 1) != layer_full.end();
  rmods = cfg.recompute == Recompute::Selective ? &cfg.recompute_modules : &keep_all;
  return {};
}

// The pacing stage of the closed-form estimate: the last, with the largest
// stage's layer count (an upper bound on the slowest stage) and the logits.
void Trainer::findPacingStage() {
  for (int64_t sd = 0; sd < p; ++sd) {
    int64_t n = 0;
    for (int64_t k = sd; k < vs_count; k += p) n += vs_layers[static_cast<size_t>(k)];
    layers_per_stage = std::max(layers_per_stage, n);
  }
  first_layer = static_cast<int>(all_layers - layers_per_stage);
  double widest_layer = 0;  // this GPU's share of its largest layer
  stage_params = paramsOf(first_layer, static_cast<int>(layers_per_stage), true, &widest_layer);
  dpc = static_cast<double>(d * cp);
  // Expert parameters are replicated only over the expert-data-parallel
  // group, the dp x cp / ep GPUs holding the same experts, so ZeRO shards
  // their state that many ways, not dp x cp (Megatron's expert data-parallel
  // group for the distributed optimizer).
  edp = T * dpc / static_cast<double>(ep * etp);
}

// This GPU's share of the parameters of layers [first, first + count) and,
// with `vocab`, of the embedding or logits shard; *widest: its largest layer.
double Trainer::paramsOf(int first, int count, bool vocab, double* widest) const {
  double params = vocab ? V * h / T : 0;
  for (int l = first; l < first + count; ++l) {
    double lp = m.layerParams(l);
    double share = lp / T;
    if (m.isMoeLayer(l)) {  // this GPU's experts: experts / ep of them, each split etp ways
      const double expert = mats * h * static_cast<double>(m.moe.expert_ffn_hidden);
      share = (lp - expert * m.moe.experts) / T +
              expert * m.moe.experts / static_cast<double>(ep) / static_cast<double>(etp);
    }
    params += share;
    *widest = std::max(*widest, share);
  }
  return params;
}

// This GPU's expert share of layers [first, first + count).
double Trainer::expertParamsOf(int first, int count) const {
  if (!moe) return 0.0;
  const double expert = mats * h * static_cast<double>(m.moe.expert_ffn_hidden);
  double e = 0;
  for (int l = first; l < first + count; ++l)
    if (m.isMoeLayer(l)) e += expert * m.moe.experts / static_cast<double>(ep) / static_cast<double>(etp);
  return e;
}

// Bytes of `per_param` per parameter of `params` (of which `expert` are
// expert parameters), sharded over the data-parallel group from ZeRO stage `stage`.
double Trainer::sharded(double per_param, double params, double expert, int stage) const {
  if (cfg.zero < stage) return per_param * params;
  return per_param * ((params - expert) / dpc + expert / edp);
}

// Activations per layer and micro-batch: Korthikanti et al. 2022's
// accounting (eqs. 1-6: s b h (34 + 5 a s / h) for a GPT), term by term so
// that it holds for GQA, MLA, SwiGLU, MoE, FlashAttention and no dropout.
// Bytes per token: kept whole on every tp rank without SP (R): the two
// layer-norm inputs and the two GEMM inputs they feed (8h), the two dropout
// masks (2h); split over tp (S): Q, K, V (2(h + 2 kv)), MLA's latents (the
// up-projections' inputs), the projection input (2h), the FC1 output
// (2 (mats-1) f), the activation output (2 f); an MoE layer keeps its
// routed copies (top_k h, the experts' FC1 input), its routed experts' and
// shared experts' FC1 and activation outputs (top_k f_e and f_s per token)
// and the router's fp32 probabilities (4 E); without FlashAttention the
// scores: softmax output 2 a s, with dropout also its mask and output (5 a s).
// Selective recomputation drops what its modules recompute (RecomputeModules).
// One layer's activations per micro-batch when it recomputes the modules of `r`.
double Trainer::layerAct(int l, const RecomputeModules& r) const {
  const int shape = std::min(l, m.layers - 1);  // MTP depths are shaped as the last layer
  const double Rl = 4 * h + (r.layernorm ? 0 : 2 * gb * h) + (m.dropout ? 2 * h : 0);
  double S = gb * heads_v + latents + (r.mla_up_proj && m.hasMla() ? 0 : 2 * m.qkvWidth());
  if (!m.isMoeLayer(shape)) {
    const double f = static_cast<double>(m.ffn_hidden);
    S += r.mlp ? 0 : 2 * (mats - 1) * f + gb * f;
  } else {
    const double k = static_cast<double>(m.moe.top_k), routed = k * static_cast<double>(m.moe.expert_ffn_hidden);
    const double sf = m.sharedFfn();
    S += gb * k * h + 2 * (mats - 1) * routed + (r.moe_act ? 0 : gb * routed);
    S += r.shared_experts ? 0 : 2 * (mats - 1) * sf + gb * sf;
    S += 4 * static_cast<double>(m.moe.experts);
  }
  const double sc = r.core_attn ? 0 : scores;
  return bs * (sp ? (Rl + S + sc) / T : Rl + (S + sc) / T);
}

// Every stage's memory from its own layers, its own in-flight micro-batches
// and its own vocabulary shard; the peak stage is reported, and a layout
// that exceeds the GPU's HBM is refused with what to change.
Status Trainer::fitMemory() {
  rep.config = cfg;
  rep.placement = describePlacement(c, cfg.gpus) + (cfg.pp_before_dp ? ", ranks in order tp-cp-ep-pp-dp" : "");
  const double a = static_cast<double>(m.heads);
  scores = cfg.flash_attention ? 0 : (m.dropout ? 5 : 2) * a * (s * cp);
  // Under fp8 (TransformerEngine) a GEMM keeps the fp8 cast of its input for
  // the weight gradient, 1 B per element: the two GEMM inputs of R (4h ->
  // 2h), MLA's latents, the projection input (2h -> h), the experts' routed
  // copies and the activation outputs that FC2 reads (2f -> f).  Layer-norm
  // inputs, Q, K, V and the FC1 outputs (the inputs of non-GEMM ops) stay 16-bit.
  gb = cfg.fp8 ? 1 : 2;
  latents = m.hasMla() ? gb * static_cast<double>(m.mla.q_lora_rank + m.mla.kv_lora_rank) +
                             2 * static_cast<double>(m.mla.qk_rope_head_dim)
                       : 0;
  const double checkpoint = 2 * bs * h / (sp ? T : 1);  // full recomputation keeps only the layer's input
  // 1F1B: stage s holds the activations of min(p - s, m) micro-batches;
  // interleaved: of its warm-up chunks plus one, (p - s - 1) 2 + (v - 1) p + 1
  // (Megatron's schedule; at s = 0 Korthikanti's x (1 + (p-1)/(p v))).  The
  // first stage holds the most micro-batches, the last the logits.
  // ZeRO-3 (FSDP) gathers each layer's bf16 weights before using it and
  // frees them after: the layer in use and the one prefetched are whole at
  // once, and the layer whose gradient is being reduce-scattered holds it
  // whole in fp32 (FSDP's default forward/backward prefetch of one layer).
  double full_layer = 0;  // the largest layer's activations, all kept
  for (int l = 0; l < all_layers; ++l) full_layer = std::max(full_layer, layerAct(l, keep_all));
  // Each stage's parameters and its layers' activations per micro-batch (all its chunks).
  struct StageMem {
    double params = 0, widest = 0, expert = 0, act = 0;
  };
  std::vector<StageMem> stm(static_cast<size_t>(p));
  for (int64_t sd = 0; sd < p; ++sd) {
    StageMem& x = stm[static_cast<size_t>(sd)];
    for (int64_t k = sd; k < vs_count; k += p) {
      const int first = vs_first[static_cast<size_t>(k)], count = vs_layers[static_cast<size_t>(k)];
      x.params += paramsOf(first, count, false, &x.widest);
      x.expert += expertParamsOf(first, count);
      for (int l = first; l < first + count; ++l)
        x.act += !fullAt(l) ? layerAct(l, *rmods) : checkpoint;  // block recomputation: the others keep everything
    }
    if (sd == 0 || sd == p - 1) x.params += V * h / T;  // the embedding or the logits shard (one when p = 1)
    if (sd == p - 1) x.params += cfg.mtp_layers * (2 * h * h / T + 2 * h);  // each MTP depth's projection and norms
  }
  const double logits_act = 4 * bs * V / T * (1 + cfg.mtp_layers);  // logits and their gradient (fp32 loss), per head
  rep.memory_gib_per_gpu = -1;
  for (int64_t sd = 0; sd < p; ++sd) {
    const StageMem& x = stm[static_cast<size_t>(sd)];
    double params = x.params, widest = x.widest, expert = x.expert, act = 0;
    if (cfg.dualpipe) {
      // Stages sd and p-1-sd, both copies whole; the activations of the
      // forwards whose backward (or, split, its W) has not run, at the
      // order's peak (DeepSeek's table: p + 1 micro-batches' worth).
      const StageMem& y = stm[static_cast<size_t>(p - 1 - sd)];
      params += y.params, expert += y.expert, widest = std::max(widest, y.widest);
      std::array<double, 2> open{0, 0};
      const std::array<double, 2> per{stm[static_cast<size_t>(stageOnRank(0, sd, p, true))].act,
                                      stm[static_cast<size_t>(stageOnRank(1, sd, p, true))].act};
      for (const PipelineOp& op : dualPipeOrder(sd, p, mb)) {
        open[static_cast<size_t>(op.chunk)] += op.fwd ? 1 : (op.wgrad || !op.split) ? -1 : 0;
        act = std::max(act, open[0] * per[0] + open[1] * per[1]);
      }
      if (sd == 0 || sd == p - 1) act += logits_act;  // each end rank holds a copy's last stage
    } else {
      // ZB-H1 (v = 1): every stage holds p micro-batches, its warm-up ones and
      // those whose W is still pending (the first stage's 1F1B count).
      // The combined 1F1B of --moe-a2a-overlap warms up one more.
      const int64_t extra = cfg.moe_a2a_overlap ? 1 : 0;
      const double chunks_in_flight =
          v == 1 ? static_cast<double>(std::min<int64_t>((cfg.zero_bubble ? p : p - sd) + extra, mb))
                 : static_cast<double>(std::min<int64_t>((p - sd - 1) * 2 + (v - 1) * p + 1 + extra, mb * v));
      act = x.act / static_cast<double>(v) * chunks_in_flight;
      if (sd == p - 1) act += logits_act;
    }
    if (any_full) act += full_layer;  // one layer's activations live again in its backward
    TrainReport::Memory mem;
    mem.weights_gib = toGib(Bytes(sharded(2, params, expert, 3) + (cfg.zero >= 3 ? 2 * 2 * widest : 0)));
    const double gbytes = static_cast<double>(cfg.grad_bytes);  // fp32 main gradients, or bf16 (--grad-dtype)
    mem.grads_gib = toGib(Bytes(sharded(gbytes, params, expert, 2) + (cfg.zero >= 3 ? gbytes * widest : 0)));
    mem.optimizer_gib = toGib(Bytes(sharded(opt_state, params, expert, 1)));
    mem.activations_gib = toGib(Bytes(act));
    const double total = mem.weights_gib + mem.grads_gib + mem.optimizer_gib + mem.activations_gib;
    if (total > rep.memory_gib_per_gpu) rep.memory_gib_per_gpu = total, rep.memory = mem, rep.memory_stage = sd;
  }
  if (rep.memory_gib_per_gpu > toGib(c.gpu.hbm))
    return invalidArgument(
        "layout tp={} pp={} dp={} cp={} ep={} micro-batch={} does not fit: {:.1f} GiB per GPU (stage {}) > {:.1f} GiB "
        "HBM of {} (weights {:.1f}, gradients {:.1f}, optimizer {:.1f}, activations {:.1f}); try --zero {}, --recompute "
        "selective/full, a smaller micro-batch or more tp/pp",
        t, p, d, cp, ep, b, rep.memory_gib_per_gpu, rep.memory_stage, toGib(c.gpu.hbm), c.gpu.name, rep.memory.weights_gib,
        rep.memory.grads_gib, rep.memory.optimizer_gib, rep.memory.activations_gib, std::min(cfg.zero + 1, 3));
  return {};
}

void Trainer::note(const std::string& dim, const CollectiveCost& cc) {
  auto& [worst, link] = dim_link[dim];
  if (link.empty() || cc.time.value() > worst) worst = cc.time.value(), link = cc.bottleneck;
}

Result<Seconds> Trainer::coll(plan::Collective k, double bytes, const GroupSet& g, const char* dim) {
  CHORUS_ASSIGN_OR_RETURN(CollectiveCost cc, net.collective(k, Bytes(bytes), g, cfg.algo));
  note(dim, cc);
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
  act_bytes = bs * h * kAct;
  if (t > 1) {
    if (sp) {
      CHORUS_ASSIGN_OR_RETURN(tp_ag, coll(plan::Collective::AllGather, act_bytes, tpg, "tp_comm_s"));
      CHORUS_ASSIGN_OR_RETURN(tp_rs, coll(plan::Collective::ReduceScatter, act_bytes, tpg, "tp_comm_s"));
    } else {
      CHORUS_ASSIGN_OR_RETURN(tp_ar, coll(plan::Collective::AllReduce, act_bytes, tpg, "tp_comm_s"));
    }
  }
  cp_bytes = static_cast<double>(b) * s * m.kvWidth() / m.kvSplit(T) * kAct * cp;
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
  a2a_bytes = copies_elems * kAct;                             // the combine, bf16
  dispatch_bytes = copies_elems * (cfg.fp8_dispatch ? 1 + 4.0 / 128 : kAct);
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
    core_ew += gpu.mem(9.0 * b * heads_local * s * s * cp);
    core_ew += gpu.mem(2 * kAct * bs * heads_v / T);  // the context's [b np s hn] -> [s b h] permute copy
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
  x.ew += gpu.mem((mats == 3 ? 6 : 4) * bs * ff * kAct / 2);  // activation function
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
  const double received = a2a_bytes, sent = a2a_bytes / imb, tokens = bs * h * kAct / T;
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
    lt.recompute_bytes += (cfg.fp8 ? 1 : kAct) * batch * (mm_m * mm_k + mm_k * mm_n + mm_m * mm_n);
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
  if (rm.layernorm) r += rmem(2 * 4 * bs * hsp);
  if (rm.mla_up_proj && m.hasMla()) {
    const double a_l = static_cast<double>(heads_local);
    if (m.mla.q_lora_rank > 0) r += rgemm(bs, a_l * m.qkHeadDim(), static_cast<double>(m.mla.q_lora_rank));
    r += rgemm(bs, a_l * static_cast<double>(m.mla.qk_nope_head_dim + m.mla.v_head_dim),
               static_cast<double>(m.mla.kv_lora_rank));
    r += rmem(kAct * 2 * bs * a_l * static_cast<double>(m.mla.qk_rope_head_dim));  // rotary on q and k
  }
  if (dense && rm.mlp) {
    const double ff = static_cast<double>(m.ffn_hidden) / T;
    r += rgemm(bs, (mats - 1) * ff, h) + rmem(act_bytes_per * bs * ff * kAct / 2);
  }
  if (!dense && rm.moe_act)
    r += rmem(act_bytes_per * bs * m.moe.top_k * static_cast<double>(m.moe.expert_ffn_hidden) / static_cast<double>(etp));
  if (!dense && rm.shared_experts && m.moe.shared_experts) {
    const double sf = m.sharedFfn() / T;
    r += rgemm(bs, (mats - 1) * sf, h) + rmem(act_bytes_per * bs * sf * kAct / 2);
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
  x.ew += gpu.mem(2 * 4 * bs * hsp) + gpu.mem(2 * (m.dropout ? 7 : 6) * bs * hsp);  // no dropout: no mask byte
  LayerTimes& lt = x.lt;
  lt.fwd = x.f + x.ew + x.q8_fwd;
  lt.attn_core_fwd = core;
  lt.recompute_sel = selectiveRecompute(dense, core, lt);
  lt.bwd = x.bw + x.ew * 2 - x.perm + x.q8_bwd;  // element-wise backward kernels move about twice the forward's bytes
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
  const Seconds head_f = logit_gemm + gpu.mem(12 * bs * V / T);
  const double fwd_ew = gpu.ew_bytes - before.ew_bytes;
  const Seconds head_b = gpu.dgrad(bs, V / T, h) + logit_wgrad + gpu.mem(8 * bs * V / T);
  const Work head{gpu.fwd_flops - before.fwd_flops, gpu.fwd_bytes - before.fwd_bytes + fwd_ew,
                  gpu.bwd_flops - before.bwd_flops,
                  gpu.bwd_bytes - before.bwd_bytes + (gpu.ew_bytes - before.ew_bytes - fwd_ew)};
  Seconds proj_f(0), proj_b(0), proj_raw_f(0), proj_raw_b(0);
  Work proj;
  if (cfg.mtp_layers > 0) {
    const Meter pb = gpu;
    proj_f = gpu.gemm(bs, h / T, 2 * h) + gpu.mem(2 * 2 * kAct * bs * hsp);  // + the two RMSNorms
    const double pew = gpu.ew_bytes - pb.ew_bytes;
    proj_b = gpu.dgrad(bs, h / T, 2 * h) + gpu.wgrad(bs, h / T, 2 * h) + gpu.mem(2 * 2 * 2 * kAct * bs * hsp);
    proj = Work{gpu.fwd_flops - pb.fwd_flops, gpu.fwd_bytes - pb.fwd_bytes + pew, gpu.bwd_flops - pb.bwd_flops,
                gpu.bwd_bytes - pb.bwd_bytes + (gpu.ew_bytes - pb.ew_bytes - pew)};
    proj_raw_f = raw_gpu.gemm(bs, h / T, 2 * h) + raw_gpu.mem(2 * 2 * kAct * bs * hsp);
    proj_raw_b = raw_gpu.dgrad(bs, h / T, 2 * h) + raw_gpu.wgrad(bs, h / T, 2 * h) +
                 raw_gpu.mem(2 * 2 * 2 * kAct * bs * hsp);
  }
  const double depth = cfg.mtp_layers;
  rc.fwd += head_f * heads + proj_f * depth;
  rc.bwd += head_b * heads + proj_b * depth;
  rc.wgrad += logit_wgrad * heads;
  logit_fwd = (logit_gemm + raw_gpu.mem(12 * bs * V / T)) * heads + proj_raw_f * depth;
  logit_bwd = (raw_gpu.dgrad(bs, V / T, h) + logit_wgrad + raw_gpu.mem(8 * bs * V / T)) * heads + proj_raw_b * depth;
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
    CHORUS_ASSIGN_OR_RETURN(CollectiveCost pc, net.sendRecv(Bytes(act_bytes / T), ppg));
    note("pp_comm_s", pc);
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
  CHORUS_ASSIGN_OR_RETURN(CollectiveCost cc, compressedCost(net, k, bytes, bytes / grad_wire * grad_data, g, cfg.algo));
  note("dp_comm_s", cc);
  return cc.time;
}

// The GPU's quantize and dequantize work around a compressed reduce-scatter
// of `params` gradients over `n` ranks.
Seconds Trainer::quantizeTime(double params, int64_t n) const {
  if (!cfg.grad_compress.on() || params <= 0) return Seconds(0);
  const double bytes = quantizeHbmBytes(plan::Collective::ReduceScatter, params * grad_data, grad_wire / grad_data, n);
  return raw_gpu.mem(bytes) + c.gpu.kernel_overhead * (quantizeKernels(plan::Collective::ReduceScatter) - 1);
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
  // weights (6 B); then every held fp32 gradient is zeroed (4 B).
  optimizer = gpu.mem(sharded(opt_step, stage_params, stage_expert, 1)) + gpu.mem(sharded(4, stage_params, stage_expert, 2));
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
    x.link[sd] += u_dag.scaled(2 * (x.params[sd] - ex) * dp_ag_runs) += u_eag.scaled(2 * ex * dp_ag_runs);
    x.link[sd] += u_drs.scaled(grad_wire * (x.params[sd] - ex) * dp_rs_runs) += u_ers.scaled(grad_wire * ex * dp_rs_runs);
    x.bytes[sd] += sharded(opt_step, x.params[sd], x.expert[sd], 1) + sharded(4, x.params[sd], x.expert[sd], 2);  // optimizer
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

Transfer transferOf(Seconds time, const LinkDemand& unit_demand, double bytes) {
  return Transfer{time.value(), unit_demand.scaled(bytes)};
}

// A data-parallel collective of `params` (this GPU's share) per layer, priced alone.
Status Trainer::dpTransfers(double params, Transfer* ag_t, Transfer* rs_t, double expert) {
  if (!any_dp || params <= 0) return {};
  if (!edp_own) expert = 0;
  auto add = [&](double n_params, const GroupSet& g, const LinkDemand& u_ag, const LinkDemand& u_rs) -> Status {
    CHORUS_ASSIGN_OR_RETURN(CollectiveCost a, net.collective(plan::Collective::AllGather, Bytes(2 * n_params), g, cfg.algo));
    CHORUS_ASSIGN_OR_RETURN(CollectiveCost r,
                            cfg.grad_compress.on()
                                ? compressedCost(net, plan::Collective::ReduceScatter, grad_wire * n_params,
                                                 grad_data * n_params, g, cfg.algo)
                                : net.collective(plan::Collective::ReduceScatter, Bytes(grad_wire * n_params), g, cfg.algo));
    *ag_t += transferOf(a.time, u_ag, 2 * n_params);
    *rs_t += transferOf(r.time + quantizeTime(n_params, g.size), u_rs, grad_wire * n_params);
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
  if (cp > 1) lp.cp = transferOf(cp_fwd, u_cp, cp_bytes);
  if (m.isMoeLayer(l) && ep > 1) lp.ep = transferOf(ep_fwd, ep_demand, 1);
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
      tp_fwd_t = transferOf((tp_ag + tp_rs) * 2, u_tag.scaled(2) += u_trs.scaled(2), act_bytes);
      tp_bwd_t = transferOf(tp_ag * 2, u_tag, 2 * act_bytes);
      tp_async_t = transferOf((tp_ag + tp_rs) * 2, u_tag.scaled(2) += u_trs.scaled(2), act_bytes);
    } else {
      tp_fwd_t = transferOf(tp_ar * 2, u_tar, 2 * act_bytes);
      tp_async_t = transferOf(tp_ar * 2, u_tar, 2 * act_bytes);
    }
  }
  spec.chunks.resize(static_cast<size_t>(vs_count));
  spec.optimizer_s.assign(static_cast<size_t>(p), 0);
  std::vector<double> params_of_stage(static_cast<size_t>(p), 0), expert_of_stage(static_cast<size_t>(p), 0);
  int next = 0;
  for (int64_t k = 0; k < vs_count; ++k) {
    const int count = vs_layers[static_cast<size_t>(k)];
    auto& layers = spec.chunks[static_cast<size_t>(k)];
    for (int l = next; l < next + count; ++l) {
      LayerPlan lp = planLayer(l, tp_fwd_t, tp_bwd_t, tp_async_t);
      double widest = 0;
      const double lparams = paramsOf(l, 1, false, &widest);
      params_of_stage[static_cast<size_t>(k % p)] += lparams;
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
    first.tp_fwd += transferOf(sp ? tp_rs : tp_ar, sp ? u_trs : u_tar, act_bytes);
    if (sp) first.tp_bwd += transferOf(tp_ag, u_tag, act_bytes);
    const double heads = 1.0 + cfg.mtp_layers;
    last.tp_fwd += transferOf((ce * 3 + (sp ? tp_ag : Seconds(0))) * heads,
                              u_tar.scaled(12 * bs) += (sp ? u_tag.scaled(act_bytes) : LinkDemand{}), heads);
    last.tp_async += transferOf((sp ? tp_rs : tp_ar) * heads, sp ? u_trs : u_tar, act_bytes * heads);
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
    const auto ps0 = params_of_stage, es0 = expert_of_stage;
    for (size_t r = 0; r < static_cast<size_t>(p); ++r) {
      params_of_stage[r] = ps0[r] + ps0[static_cast<size_t>(p) - 1 - r];
      expert_of_stage[r] = es0[r] + es0[static_cast<size_t>(p) - 1 - r];
    }
  }
  for (int64_t sd = 0; sd < p; ++sd) {
    const double ps = params_of_stage[static_cast<size_t>(sd)], es = expert_of_stage[static_cast<size_t>(sd)];
    spec.optimizer_s[static_cast<size_t>(sd)] =
        (raw_gpu.mem(sharded(opt_step, ps, es, 1)) + raw_gpu.mem(sharded(4, ps, es, 2))).value();
  }
  if (p > 1) {
    spec.p2p.s = p2p.value();
    spec.p2p.link = ledger.sendRecv(act_bytes / T, ppg, 1);
    if (!sp && t > 1) spec.p2p.link += u_tag.scaled(act_bytes);
  }
  return {};
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
      CHORUS_ASSIGN_OR_RETURN(CollectiveCost rs, net.collective(plan::Collective::ReduceScatter,
                                                                Bytes(tail.params * 2), dcg, cfg.algo));
      CHORUS_ASSIGN_OR_RETURN(CollectiveCost ag,
                              net.collective(plan::Collective::AllGather, Bytes(tail.params * 2), dcg, cfg.algo));
      tail.dp_rs_s = overlapped(rs.time, Seconds(stage_chunk_bwd[static_cast<size_t>(sd)]), smf).value();
      tail.dp_ag_s = overlapped(ag.time, Seconds(stage_chunk_fwd[static_cast<size_t>(sd)]), smf).value();
    }
    const double te = tail_expert[static_cast<size_t>(sd)];
    tail.optimizer_s = (gpu.mem(sharded(opt_step, tail.params, te, 1)) + gpu.mem(sharded(4, tail.params, te, 2))).value();
  }
  return {};
}

}  // namespace

Result<TrainReport> simulateTraining(const ModelSpec& m, const TrainConfig& cfg, NetworkModel& net) {
  CHORUS_RETURN_IF_ERROR(checkLayout(m, net.cluster(), cfg));
  if (cfg.micro_batch == 0) {  // auto: the fastest micro-batch that fits and divides the batch share
    Result<TrainReport> best = invalidArgument("no micro-batch fits (try more recomputation or parallelism)");
    for (int64_t b = 1; b <= 16; b *= 2) {
      if (cfg.global_batch % (cfg.dp * b) != 0) break;
      TrainConfig k = cfg;
      k.micro_batch = b;
      Result<TrainReport> r = simulateTraining(m, k, net);
      if (!r.isOk()) {
        if (!best.isOk()) best = std::move(r);  // keep the first error: it names what did not fit
        break;
      }
      if (!best.isOk() || r->iteration_s < best->iteration_s) best = std::move(r);
    }
    return best;
  }
  return Trainer(m, cfg, net).run();
}

}  // namespace chorus::sim

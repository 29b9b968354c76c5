#include "sim/train.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>

#include "sim/placement.hpp"
#include "sim/report.hpp"
#include "sim/topology.hpp"
#include "sim/train_detail.hpp"

namespace chorus::sim {
namespace {

using namespace detail;

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

double modelFlopsPerIteration(const ModelSpec& m, int64_t global_batch, int64_t seq, bool causal) {
  const double tokens = static_cast<double>(global_batch) * static_cast<double>(seq);
  double per_token = 2 * static_cast<double>(m.hidden) * static_cast<double>(m.vocab);  // logits
  for (int l = 0; l < m.layers; ++l) per_token += layerFlopsPerToken(m, l, static_cast<double>(seq));
  // Causal: a token attends to the keys before it, half the scores and AV on average.
  if (causal) per_token -= m.layers * static_cast<double>(seq) * static_cast<double>(m.heads) * (m.qkHeadDim() + m.vHeadDim());
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
}  // namespace

namespace detail {

// How much slower a rank runs than the calibration measured, on the busiest
// host (the job's ranks fill node.gpus per host): its ranks time-share the
// capacity the host gave the calibration, R times one thread's rate
// (node.cpu_capacity, measured; the cores when not), each getting R / ranks
// of a calibrated thread's rate when that is below one (processor sharing;
// docs/simulator.md, "A CPU training job and its calibration").  Every
// per-op time carries it (all the host's ranks computing at once: the
// closed-form estimate); the schedule divides it out again and charges each
// rank its share only while that many ranks are busy (Trainer::cpuSharing).
double coreCapacity(const ClusterSpec& c) {
  return c.node.cpu_capacity > 0 ? std::clamp(c.node.cpu_capacity, 1.0, double(c.node.cpu_cores))
                                 : static_cast<double>(c.node.cpu_cores);
}

double coreShare(const ClusterSpec& c, int64_t gpus) {
  if (c.node.cpu_cores <= 0) return 1;
  const double ranks = static_cast<double>(std::min<int64_t>(gpus, c.node.gpus));
  return std::max(1.0, ranks / coreCapacity(c));
}

GpuSpec sharedGpu(const GpuSpec& g, double share) {
  GpuSpec x = g;
  x.peak16 = g.peak16 / share, x.peak8 = g.peak8 / share, x.hbm_bw = g.hbm_bw / share;
  x.kernel_overhead = g.kernel_overhead * share;
  return x;
}

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
      share(coreShare(c, config.gpus)),
      cpu_spec(sharedGpu(c.gpu, share)),
      act(model.act_bytes),
      raw_gpu{cpu_spec, config.fp8, config.attention_kernel,
              config.burst_clock ? Compute::Load::Burst : Compute::Load::Sustained, model.act_bytes},
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
    if (rep.schedule_spec.cpu.on()) hostCoresBound();
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
  // SGD (without momentum, torch.optim.SGD's default): no state; the step
  // reads the parameter and its gradient and writes the parameter (12 B for
  // the fp32 job); a 16-bit model also keeps fp32 master weights, read and
  // written, and writes its 16-bit copy.
  if (cfg.optimizer == TrainConfig::Optimizer::Sgd)
    opt_state = act >= 4 ? 0 : 4, opt_step = act >= 4 ? 2 * act + cfg.grad_bytes : 8 + cfg.grad_bytes + act;
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
  gb = cfg.fp8 ? 1 : act;
  latents = m.hasMla() ? gb * static_cast<double>(m.mla.q_lora_rank + m.mla.kv_lora_rank) +
                             2 * static_cast<double>(m.mla.qk_rope_head_dim)
                       : 0;
  const double checkpoint = act * bs * h / (sp ? T : 1);  // full recomputation keeps only the layer's input
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
    const double wb = m.act_bytes;  // the weights in the job's dtype (`act` here is the stage's activations)
    mem.weights_gib = toGib(Bytes(sharded(wb, params, expert, 3) + (cfg.zero >= 3 ? 2 * wb * widest : 0)));
    const double gbytes = static_cast<double>(cfg.grad_bytes);  // fp32 main gradients, or bf16 (--grad-dtype)
    mem.grads_gib = toGib(Bytes(sharded(gbytes, params, expert, 2) + (cfg.zero >= 3 ? gbytes * widest : 0)));
    mem.optimizer_gib = toGib(Bytes(sharded(opt_state, params, expert, 1)));
    mem.activations_gib = toGib(Bytes(act));
    const double total = mem.weights_gib + mem.grads_gib + mem.optimizer_gib + mem.activations_gib;
    if (total > rep.memory_gib_per_gpu) rep.memory_gib_per_gpu = total, rep.memory = mem, rep.memory_stage = sd;
  }
  const double hbm = toGib(c.gpu.hbm);
  const MemoryReserve res = memoryReserve(cfg, hbm, rep.memory_gib_per_gpu);
  rep.memory.reserve_gib = res.total_gib, rep.memory.context_gib = res.context_gib;
  rep.memory.comm_buffers_gib = res.comm_gib, rep.memory.fragmentation_gib = res.fragmentation_gib;
  rep.memory.communicators = res.communicators;
  rep.memory.headroom_gib = hbm - rep.memory_gib_per_gpu - res.total_gib;
  if (rep.memory.headroom_gib < 0 && cfg.memory_check) {
    // Only what the run can still change: a higher ZeRO stage (with data
    // parallelism to shard over), more recomputation, a smaller micro-batch.
    std::vector<std::string> hints;
    if (cfg.zero < 3 && d * cp > 1) hints.push_back(fmt::format("--zero {}", cfg.zero + 1));
    if (cfg.recompute == Recompute::None) hints.push_back("--recompute selective/full");
    else if (cfg.recompute == Recompute::Selective) hints.push_back("--recompute full");
    if (b > 1) hints.push_back("a smaller micro-batch");
    hints.push_back("more tp/pp");
    if (rep.memory_gib_per_gpu <= hbm) hints.push_back("a smaller --memory-reserve");
    std::string hint;
    for (size_t i = 0; i < hints.size(); ++i) hint += (i == 0 ? "" : i + 1 == hints.size() ? " or " : ", ") + hints[i];
    return invalidArgument(
        "layout tp={} pp={} dp={} cp={} ep={} micro-batch={} does not fit: {:.1f} GiB per GPU (stage {}) + {:.1f} GiB "
        "reserve > {:.1f} GiB HBM of {} (weights {:.1f}, gradients {:.1f}, optimizer {:.1f}, activations {:.1f}); try {}",
        t, p, d, cp, ep, b, rep.memory_gib_per_gpu, rep.memory_stage, res.total_gib, hbm, c.gpu.name,
        rep.memory.weights_gib, rep.memory.grads_gib, rep.memory.optimizer_gib, rep.memory.activations_gib, hint);
  }
  return {};
}

}  // namespace detail

MemoryReserve memoryReserve(const TrainConfig& cfg, double hbm_gib, double used_gib) {
  MemoryReserve r;
  if (cfg.memory_reserve_fraction > 0) {
    r.total_gib = cfg.memory_reserve_fraction * hbm_gib;
    return r;
  }
  if (cfg.memory_reserve_gib >= 0) {
    r.total_gib = cfg.memory_reserve_gib;
    return r;
  }
  // Each process group of more than one GPU is an NCCL communicator with its own buffers.
  for (int n : {cfg.tp, cfg.pp, cfg.dp, cfg.cp, cfg.ep}) r.communicators += n > 1 ? 1 : 0;
  r.context_gib = kCudaContextGib;
  r.comm_gib = r.communicators * kReserveChannels * kReservePeers * kNcclBuffersMib / 1024;
  r.fragmentation_gib = kFragmentation * used_gib;
  r.total_gib = r.context_gib + r.comm_gib + r.fragmentation_gib;
  return r;
}

Status parseMemoryReserve(std::string_view text, double* gib, double* fraction) {
  *gib = -1, *fraction = 0;
  if (text == "default" || text.empty()) return {};
  std::string_view num = text;
  bool pct = false;
  if (num.ends_with("%")) pct = true, num.remove_suffix(1);
  else if (num.ends_with("GiB")) num.remove_suffix(3);
  double v = 0;
  auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
  if (num.empty() || ec != std::errc() || ptr != num.data() + num.size() || !(v >= 0))
    return invalidArgument("--memory-reserve '{}': give GiB per GPU (6 or 6GiB), a percentage of the HBM (8%) or default",
                           text);
  if (pct) {
    if (v >= 100) return invalidArgument("--memory-reserve '{}': a percentage below 100", text);
    *fraction = v / 100;
    if (v == 0) *gib = 0;
  } else {
    *gib = v;
  }
  return {};
}

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

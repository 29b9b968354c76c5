// Internal to the training model (train.cpp, train_layer.cpp, train_step.cpp): the
// per-operator cost sources, the work meter, one layer's times, and the Trainer that
// prices one iteration in phases (train.cpp: checks, placement, memory; train_layer.cpp:
// collectives and per-layer compute; train_step.cpp: the pipeline estimate, data
// parallelism, bounds, schedule and report).  Not part of the simulator's interface.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sim/bounds.hpp"
#include "sim/compute.hpp"
#include "sim/schedule.hpp"
#include "sim/train.hpp"

namespace chorus::sim::detail {

// CPU ranks (node.cpu_cores > 0): what a host's cores give the job, in
// calibrated threads (node.cpu_capacity clamped to [1, cpu_cores], else
// cpu_cores); and the uniform share, how many times slower than calibrated a
// rank runs when all the busiest host's ranks compute at once (>= 1; 1 on GPUs).
double coreCapacity(const ClusterSpec& c);
double coreShare(const ClusterSpec& c, int64_t gpus);


// A GEMM's time on one GPU and an element-wise kernel's: the per-operator
// compute model (sim/compute.hpp: tiles, waves, split-K, the K dimension and
// dtype from configs/gpus/*.json; the cluster's roofline curve for a GPU
// without a data file).
struct Gpu {
  const GpuSpec& g;
  bool fp8;
  std::string_view attention_kernel;  // "" = the generation's default
  Compute::Load load = Compute::Load::Sustained;
  double elem = 2;  // bytes per activation element (the model's dtype: 2, or 4 for the fp32 CPU job)
  Compute c{g, fp8, attention_kernel, load};
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
// through HBM once (1 B per element in fp8, else the model's element size), and every element-wise
// kernel's bytes; it forwards each call to the cost source unchanged.
struct Meter {
  const Gpu& g;
  double fwd_flops = 0, fwd_bytes = 0, bwd_flops = 0, bwd_bytes = 0, ew_bytes = 0;
  double perm_bytes = 0;  // the part of ew_bytes that permutes tokens: its backward moves the same bytes once
  void count(double m, double n, double k, double batch, double* flops, double* bytes) const {
    if (m <= 0 || n <= 0 || k <= 0) return;
    *flops += 2 * m * n * k * batch;
    *bytes += (g.fp8 ? 1 : g.elem) * batch * (m * k + k * n + m * n);
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
    const double bytes = g.elem * heads * (sq * (d_qk + d_v) + skv * (d_qk + d_v));
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
inline Seconds overlapped(Seconds comm, Seconds work, double sm_fraction) {
  const Seconds hidden = std::min(comm, work);
  return (comm - hidden) + hidden * sm_fraction;
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
  // A collective's time when `share` ranks time-share each core (its copies and reductions run on them).
  [[nodiscard]] CollectiveCost shared(CollectiveCost cc) const {
    cc.time = cc.time * share;
    return cc;
  }
  [[nodiscard]] Seconds host(Seconds x) const { return x * share; }  // host-side time of a rank
  // Bytes per parameter the gradients' zeroing writes: Megatron's fp32 main
  // gradients (4), or the SGD job's own gradient buffer.
  [[nodiscard]] double zeroed() const {
    return cfg.optimizer == TrainConfig::Optimizer::Sgd ? static_cast<double>(cfg.grad_bytes) : 4.0;
  }
  // The optimizer step over `params` (`expert` of them expert parameters) of
  // `layers` layers: its bytes at the memory rate, the gradients zeroed, the
  // framework's host time per layer.
  [[nodiscard]] Seconds optimizerTime(double params, double expert, double layers) const {
    return raw_gpu.mem(sharded(opt_step, params, expert, 1)) + raw_gpu.mem(sharded(zeroed(), params, expert, 2)) +
           host(c.host.step_layer) * layers;
  }
  // note(), and the call in rep.collectives (once per distinct call).
  void record(const std::string& dim, std::string_view what, double bytes, const GroupSet& g, const CollectiveCost& cc);
  Result<Seconds> coll(plan::Collective k, double bytes, const GroupSet& g, const char* dim);
  Result<Seconds> epOneWay(double bytes);
  void tpComm(const LayerTimes& lt, Seconds* fwd, Seconds* bwd) const;
  Seconds tpHidden(const LayerTimes& lt) const;
  [[nodiscard]] double wireBytes(plan::Collective k) const {
    return k == plan::Collective::ReduceScatter ? grad_wire : act;
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
  void cpuSharing(CpuSharing& cs) const;
  void hostCoresBound();
  LayerPlan planLayer(int l, const Transfer& tp_fwd_t, const Transfer& tp_bwd_t, const Transfer& tp_async_t);

  // ---- inputs and the layout
  const ModelSpec& m;
  const TrainConfig& cfg;
  NetworkModel& net;
  const ClusterSpec& c;
  const int64_t t, p, d, cp, ep, v, etp, b;
  int64_t mb = 0;  // micro-batches per iteration per pipeline
  // CPU ranks (node.cpu_cores > 0): how many ranks share each core when the
  // host runs more ranks than it has cores (>= 1; 1 on GPUs); every compute
  // and collective time of a rank is that many times longer (time-sharing).
  const double share;
  const GpuSpec cpu_spec;  // the cluster's GPU with its rates divided by `share`
  const double act;        // bytes per activation / gradient element (the model's dtype)
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

}  // namespace chorus::sim::detail

// The training-step model: one iteration of a transformer under a parallel
// layout (tp with optional sequence parallelism, pp with 1F1B or interleaved
// virtual stages, dp with ZeRO 0..3, cp ring attention, ep all-to-all),
// priced from a per-operator roofline and the library's collective plans on
// the modelled network.  Assumptions and their sources: docs/simulator.md.
#pragma once

#include "sim/compress.hpp"

#include <map>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "plan/plan.hpp"
#include "sim/bounds.hpp"
#include "sim/config.hpp"
#include "sim/network.hpp"
#include "sim/schedule.hpp"

namespace chorus::sim {

enum class Recompute { None, Selective, Full };

// What selective recomputation recomputes (Megatron-Core's
// --recompute-modules, with --recompute-granularity selective): each module
// drops activations from memory and repeats its forward in the backward.
//   core_attn       the attention core (without FlashAttention its s x s scores)
//   layernorm       the two layer norms (their outputs, the QKV and MLP inputs)
//   mla_up_proj     MLA's up-projections and rotary parts (Q, K, V; the latents stay)
//   mlp             a dense layer's MLP (FC1 and activation outputs)
//   moe_act         the experts' activation function (its outputs, FC2's input)
//   shared_experts  the shared experts' MLP
// Megatron's default is core_attn alone; its `moe` (the whole MoE layer) is
// not modelled.
struct RecomputeModules {
  bool core_attn = true, layernorm = false, mla_up_proj = false, mlp = false, moe_act = false, shared_experts = false;
  [[nodiscard]] std::string describe() const;
};
// "layernorm,moe_act" (commas or spaces); an unknown name is an error naming the valid ones.
Result<RecomputeModules> parseRecomputeModules(std::string_view text);

struct TrainConfig {
  int64_t gpus = 0;
  int tp = 1, pp = 1, dp = 1, cp = 1, ep = 1, vpp = 1;
  int64_t global_batch = 1;
  int64_t micro_batch = 1;  // 0 = auto: the largest that fits (at most 16)
  int64_t seq = 2048;
  Recompute recompute = Recompute::Selective;
  RecomputeModules recompute_modules;  // with Recompute::Selective (--recompute-modules)
  // With recompute Full: recompute only the first N layers of every virtual
  // stage (Megatron's --recompute-method block --recompute-num-layers N);
  // the rest keep all their activations.  0: every layer.
  int recompute_layers = 0;
  // Multi-token prediction depths trained with the model (Megatron's
  // --mtp-num-layers): each a layer shaped as the last, a 2h -> h projection
  // and its own logits and loss, on the last pipeline stage.  0: none.
  int mtp_layers = 0;
  // Pipeline order: false = Megatron's 1F1B (interleaved with vpp > 1);
  // true = ZB-H1 (zero-bubble, Qi et al. 2024; vpp 1): the backward split into
  // B and W passes, W deferred to fill the drain, the same peak memory.
  bool zero_bubble = false;
  // DualPipe (DeepSeek-V3 report sec. 3.2.1; pp even, vpp 1, an even number
  // of micro-batches >= 2 pp): every rank holds stage r and stage p-1-r,
  // half the micro-batches enter at each end, forward/backward pairs of the
  // two directions run combined (each one's collectives under the other's
  // compute), part of the backwards split off their weight gradients.  Two
  // copies of the parameters, their gradients and optimizer state.
  bool dualpipe = false;
  int zero = 1;              // 0..3 (ZeRO-1 = Megatron's distributed optimizer)
  // The gradient buffer's bytes per parameter: 4, fp32 main gradients
  // (Megatron's --accumulate-allreduce-grads-in-fp32, Megatron-Bridge's
  // grad_reduce_in_fp32, the default here), or 2, bf16 (what the
  // Megatron-Bridge performance recipes run).  --grad-dtype.
  int grad_bytes = 4;
  // How each micro-batch's weight gradients reach that buffer.  Fused (the
  // default; Megatron's --gradient-accumulation-fusion, on since 2022): the
  // weight-gradient GEMM accumulates into the buffer itself.  Unfused
  // (--no-gradient-accumulation-fusion): the GEMM writes a 16-bit gradient
  // and a separate kernel adds it in, reading it and reading and writing the
  // buffer (2 + 2 x grad_bytes B per parameter and micro-batch after the
  // first, whose gradient is stored: autograd's AccumulateGrad, which both of
  // Megatron-LM 2021's DDP implementations accumulated with).
  bool grad_accum_fusion = true;
  // The data-parallel gradient reduce-scatter on a narrower wire (--compress
  // bf16|fp8[:block], sim/compress.hpp): fp32 accumulation, one quantization.
  Compression grad_compress;
  // Adam's two moments: 4 B each (fp32) or 2 (bf16: DeepSeek-V3's
  // low-precision optimizer states, Megatron's --use-precision-aware-optimizer
  // --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16); the fp32 master weights
  // stay.  --optimizer-moments.
  int moment_bytes = 4;
  // The optimizer (--optimizer): Adam (Megatron's; the moments above) or
  // plain SGD without momentum (the CPU job of issue 35: torch.optim.SGD).
  enum class Optimizer { Adam, Sgd } optimizer = Optimizer::Adam;
  bool sequence_parallel = true;
  bool flash_attention = true;  // false: s x s scores materialised (Megatron 2022)
  // --attention-kernel: whose fused attention curves price the core (a name in
  // the GPU's data file, configs/gpus/*.json: fa3, fa2 on Hopper); "" = the
  // generation's default.
  std::string attention_kernel;
  // --clock: the tensor-core clock the GPUs run at.  A training run keeps
  // them power-saturated (sustained, the default); a benchmark of a few
  // iterations after idling runs at the boost clock of the kernel
  // microbenchmarks (burst), e.g. Megatron-LM's MoE layer test.
  bool burst_clock = false;
  bool fp8 = false;
  std::string algo;          // collective algorithm for every group ("" = auto)
  // Layers of the first / last pipeline stage (0: the uniform split, the
  // first L mod (pp vpp) virtual stages one more); Megatron's
  // --decoder-first/last-pipeline-num-layers.
  int first_stage_layers = 0, last_stage_layers = 0;
  // Megatron's --pipeline-model-parallel-layout: the virtual stages in order
  // (chunk x pp + stage), separated by '|', each a run of E (the embedding,
  // first stage only), t (a decoder layer), m (an MTP depth, last stage) and
  // L (the loss, last stage); "(...)*N" and "t*N" repeat.  DeepSeek-V3 on
  // H100: "Et|(tt|)*30mL".  Empty: the uniform split.
  std::string pp_layout;
  // Expert tensor parallelism (Megatron-Core's MoE parallel folding): 0, the
  // experts split over tp and ep inside dp x cp; E >= 1, the expert layers
  // laid out as etp E x ep x expert-data-parallel over tp x cp x dp.
  int etp = 0;
  // Rank order (Megatron's --order / --use-tp-pp-dp-mapping): false,
  // tp-cp-ep-dp-pp (Megatron's default: pipeline stages farthest apart);
  // true, tp-cp-ep-pp-dp (pipeline stages adjacent, data-parallel replicas
  // farthest apart).  The second is modelled where every group stays one
  // strided set of ranks: no expert parallelism, and cp or dp of 1.
  bool pp_before_dp = false;
  // MoE dispatch and combine (docs/simulator.md "Expert dispatch"):
  // AllToAll, one all-to-all of every routed copy each way (Megatron-Core's
  // all-to-all dispatcher); Hierarchical, each token sent once per
  // destination node over the NICs (to the GPU of the same local rank) and
  // fanned out to its experts' GPUs over NVLink (DeepEP's normal kernels),
  // with the model's node-limited routing (moe.n_group / topk_group).
  enum class MoeDispatch { AllToAll, Hierarchical } moe_dispatch = MoeDispatch::AllToAll;
  bool fp8_dispatch = false;   // dispatch in fp8 (1 B + a 4-byte scale per 128 elements), combine in bf16
  double moe_imbalance = 1;    // the busiest expert's tokens over the mean (>= 1)
  // Megatron-Core's --overlap-moe-expert-parallel-comm (batch-level overlap,
  // "combined 1F1B"): in the steady state a forward and a backward of two
  // micro-batches run as one step, their layers alternating, so each one's
  // expert dispatch and combine run under the other's compute; one more
  // micro-batch in flight per stage.  Needs ep > 1, pp 1 or vpp > 1, and not
  // full recomputation (Megatron's conditions).
  bool moe_a2a_overlap = false;
  bool stage_costs = true;   // also cost every (stage, chunk) for the trace (TrainReport::chunks, ::stages)
  // The iteration time from the simulated schedule (src/sim/schedule.hpp);
  // false: the closed-form estimate only (what the search ranks by).
  bool schedule = true;
  // HBM kept out of the layout's reach per GPU (--memory-reserve): < 0 the
  // default (memoryReserve: CUDA context, NCCL buffers per communicator,
  // allocator fragmentation); else `memory_reserve_gib` GiB, or with
  // `memory_reserve_fraction` > 0 that fraction of the HBM.
  double memory_reserve_gib = -1, memory_reserve_fraction = 0;
  // false: a layout over the HBM is reported (negative headroom) instead of
  // refused (the search, to say which layouts it dropped and why).
  bool memory_check = true;
  bool async_tp = true;    // schedule: column-parallel backward collectives under the GEMMs (Megatron)
  bool overlap_dp = true;  // schedule: ZeRO-0..2 gradient reduce / parameter gather overlapped per layer
};

// A --pp-layout, expanded and split into stages: each stage's decoder
// layers (t) and MTP depths (m); whether it holds the embedding (E) and the
// loss (L).  Errors name the position and the rule.
struct LayoutStage {
  int layers = 0, mtp = 0;
  bool embedding = false, loss = false;
};
Result<std::vector<LayoutStage>> parsePipelineLayout(std::string_view text);

// "alltoall" or "hierarchical" (--moe-dispatch).
Result<TrainConfig::MoeDispatch> parseMoeDispatch(std::string_view text);

struct TrainReport {
  TrainConfig config;
  // iteration_s: the schedule's makespan (config.schedule) or the estimate.
  double iteration_s = 0, tokens_per_s = 0, model_tflops_per_gpu = 0, hardware_tflops_per_gpu = 0, mfu = 0;
  // mfu counts the attention core over the whole s x s (Megatron's formula);
  // mfu_causal over its causal half (modelFlopsPerIteration's `causal`).
  double mfu_causal = 0;
  double memory_gib_per_gpu = 0;  // the peak stage's
  int64_t memory_stage = 0;       // which pipeline stage peaks
  struct Memory {
    double weights_gib = 0, grads_gib = 0, optimizer_gib = 0, activations_gib = 0;
    // The reserve and its parts (the default's; a --memory-reserve value has only its total).
    double reserve_gib = 0, context_gib = 0, comm_buffers_gib = 0, fragmentation_gib = 0;
    int communicators = 0;
    double headroom_gib = 0;  // HBM - the peak stage's memory - the reserve (< 0: does not fit)
  } memory;
  // Where the time goes; sums to iteration_s.
  std::map<std::string, double> breakdown;  // compute_s, bubble_s, tp_comm_s, pp_comm_s, dp_comm_s, ...
  // The closed-form estimate (per-phase overlap formulas) and its breakdown.
  double estimate_s = 0;
  std::map<std::string, double> estimate_breakdown;
  IterationSpec schedule_spec;  // what the schedule simulated (empty without config.schedule)
  int64_t schedule_tasks = 0;
  int schedule_merged_layers = 0;
  std::string placement;                    // where the job's GPUs sit (describePlacement)
  std::string bottleneck;                   // the largest non-compute entry
  std::string bottleneck_link;              // the resource limiting that category (its slowest collective's link)
  // Each resource's busy time over the iteration (src/sim/bounds.hpp): no
  // iteration can be shorter than the largest, `bounds.binding`.
  Bounds bounds;
  // Every distinct collective and point-to-point transfer the iteration
  // prices, in the order first priced: its category (tp_comm_s, ...), what it
  // is, bytes per call (nccl-tests convention), the group set (ranks per group
  // x groups at once), the time of one call, the algorithm and the binding
  // link with its tier and direction.
  struct CollectiveLine {
    std::string dim, collective, algo, link;
    double bytes = 0, time_s = 0;
    int64_t ranks = 0, groups = 0;
  };
  std::vector<CollectiveLine> collectives;
  // The pacing (last) pipeline stage's costs, what --trace lays out on a
  // timeline: per micro-batch and GPU (all its virtual stages together).
  struct Stage {
    double fwd_s = 0, bwd_s = 0, recompute_s = 0;  // compute
    double tp_fwd_s = 0, tp_bwd_s = 0;             // exposed tensor-parallel communication
    double other_comm_s = 0;                       // exposed ep + cp communication
    double p2p_s = 0;                              // one pipeline send (activation or gradient)
    double dp_rs_s = 0, dp_ag_s = 0;               // exposed gradient reduce-scatter, parameter all-gather
    double optimizer_s = 0;
    int64_t micro_batches = 0;
  } stage;
  // Every (stage, chunk) costed from its own content, what --trace lays out:
  // the layers of virtual stage k = chunk x pp + stage (L layers split in
  // order over the pp x vpp virtual stages, the first L mod (pp vpp) one layer
  // more), the embedding's tensor-parallel reduction on virtual stage 0 and
  // the logits + loss on the last.  Per micro-batch, priced as `stage` is.
  struct Chunk {
    int first_layer = 0, layers = 0;
    bool embedding = false, logits = false;
    double fwd_s = 0, bwd_s = 0, recompute_s = 0;  // compute
    double tp_fwd_s = 0, tp_bwd_s = 0;             // exposed tensor-parallel communication
    double other_comm_s = 0;                       // exposed ep + cp communication (both passes)
  };
  std::vector<Chunk> chunks;  // pp x vpp, indexed chunk x pp + stage; empty without config.stage_costs
  // Per pipeline stage: its parameters' exposed data-parallel collectives
  // and optimizer step (the first and last stage hold a vocabulary shard).
  struct StageTail {
    double params = 0;  // this GPU's share
    double dp_rs_s = 0, dp_ag_s = 0, optimizer_s = 0;
  };
  std::vector<StageTail> stages;  // pp
  // One MoE block (router, permutation, dispatch, the experts' grouped GEMMs
  // and activation, shared experts, combine: what Megatron-Core's MoELayer
  // runs, without the attention and norms around it) per micro-batch on the
  // GPU with the busiest expert, its collectives exposed: what Megatron-LM's
  // MoE layer benchmark (tests/functional_tests/.../moe_perf) times with CUDA
  // events.  Zero without MoE layers.
  struct MoeBlock {
    double forward_s = 0, backward_s = 0;
    double router_s = 0, permute_s = 0, experts_fwd_s = 0, experts_bwd_s = 0, shared_fwd_s = 0, shared_bwd_s = 0;
    double dispatch_s = 0, combine_s = 0;  // one way each (the backward runs both again)
  } moe_block;
};

// Validates the layout (products, divisibility) and simulates one iteration.
// A layout that does not fit in HBM is an error naming each memory term.
Result<TrainReport> simulateTraining(const ModelSpec& m, const ClusterSpec& c, const TrainConfig& cfg,
                                     const plan::Registry& reg, NetMode mode = NetMode::Analytical);
// The same with a caller-owned network model (its collective cache is reused
// across calls: the layout search).
Result<TrainReport> simulateTraining(const ModelSpec& m, const TrainConfig& cfg, NetworkModel& net);

// The default reserve per GPU (docs/simulator.md, "Memory headroom"): the
// CUDA context (kCudaContextGib), NCCL's buffers for each communicator the
// GPU is in (kReserveChannels channels x kReservePeers connections x the three
// protocols' default buffers), and the caching allocator's fragmentation
// (kFragmentation of what the layout allocates).
inline constexpr double kCudaContextGib = 0.5;
inline constexpr double kReserveChannels = 16, kReservePeers = 2;  // the channels sim/nccl.hpp prices with
inline constexpr double kNcclBuffersMib = 4 + 4.7 + 0.5;  // Simple 4 MiB, LL128 ~4.7 MiB, LL 512 KiB (NCCL_BUFFSIZE defaults)
inline constexpr double kFragmentation = 0.05;
struct MemoryReserve {
  double total_gib = 0, context_gib = 0, comm_gib = 0, fragmentation_gib = 0;
  int communicators = 0;
};
// The reserve of a layout whose largest stage allocates `used_gib`.
MemoryReserve memoryReserve(const TrainConfig& cfg, double hbm_gib, double used_gib);
// --memory-reserve: "default", GiB ("6", "6GiB") or a percentage of the HBM ("8%").
Status parseMemoryReserve(std::string_view text, double* gib, double* fraction);

// Model FLOPs of one iteration (no recomputation), counting every GEMM
// including attention scores (Narayanan et al. 2021, eq. 3 generalised to GQA,
// SwiGLU and MoE top-k).
// `causal`: the attention core counted over the causal half (each token
// attends to the keys before it), as FlashAttention and PaLM's MFU count it;
// default: over the whole s x s, Megatron's (Narayanan et al.) convention.
double modelFlopsPerIteration(const ModelSpec& m, int64_t global_batch, int64_t seq, bool causal = false);

}  // namespace chorus::sim

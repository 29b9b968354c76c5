// One training iteration as a simulated schedule (event-driven).
//
// A representative GPU of every pipeline stage runs a compute stream and
// communication channels (tensor parallel, context parallel, expert
// parallel, data-parallel gather, data-parallel reduce, pipeline send).
// Each stream runs its tasks in issue order; a task also waits for the tasks
// it depends on.  A compute task has a duration at full speed and runs at
// 1 - comm_sm_fraction of it while any collective of its GPU is in flight
// (NCCL's kernels take SMs); on CPU ranks every task of a rank also runs at
// its share of its host's cores (CpuSharing).  A communication task is a
// collective or a point-to-point transfer with its modelled time alone (the
// network model) and the seconds it keeps each link class of its GPU busy
// (the bounds' ledger): concurrent transfers of a GPU share its NVLink
// port, NIC ports and uplinks max-min fairly (progressive filling, as the
// flow model shares links), each at most at its own speed alone; a pipeline
// send loads the sender's and the receiver's links.
//
// Dependencies follow the frameworks (each switchable):
//  * per layer: forward compute, then its tensor-parallel collectives (on
//    the critical path); backward: the row-parallel conjugates exposed, the
//    column-parallel collectives asynchronous under the input- and
//    weight-gradient GEMMs (Megatron's async tp), or all exposed;
//  * ring attention's K/V exchange under the attention core; expert
//    dispatch + combine around the MoE layer (exposed, or under the compute
//    of another micro-batch's pass with a2a_overlap: Megatron's combined 1F1B);
//  * ZeRO-3 / FSDP: layer i+1's parameters gathered while layer i computes
//    (forward and backward, one layer ahead), layer i's gradients
//    reduce-scattered after its backward; ZeRO-1/2: gradients
//    reduce-scattered per layer as the backward produces them (ZeRO-2 in
//    every micro-batch, ZeRO-0/1 in the last), parameters gathered per layer
//    ahead of the first forward (Megatron's overlap-grad-reduce /
//    overlap-param-gather), or all after / before the compute;
//  * pipeline: Megatron's 1F1B or interleaved (vpp > 1) order per stage,
//    or zero-bubble ZB-H1 (the backward split into B, the input gradient,
//    and W, the weight gradients, each stage i deferring i W passes to fill
//    the cool-down: Qi et al. 2024), activations and gradients as send tasks;
//  * the optimizer step after the stage's last reduce-scatter.
// The makespan is the iteration time.  The breakdown is the pacing (last to
// finish) stage's timeline: its compute, the slowdown of its compute by
// overlapped collectives (charged to their dimension), and every wait of its
// compute stream charged to what it waited for, followed back along the
// critical chain (a collective: its dimension; another stage: the bubble,
// or pp_comm_s for the transfer itself).  Docs: docs/simulator.md.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "sim/bounds.hpp"

namespace chorus::sim {

// A collective or transfer as the schedule runs it.
struct Transfer {
  double s = 0;     // its modelled time alone
  LinkDemand link;  // link-seconds it puts on each class of its GPU
  Transfer& operator+=(const Transfer& o) {
    s += o.s;
    link += o.link;
    return *this;
  }
};

// One layer's work per micro-batch on one GPU (or several layers merged).
struct LayerPlan {
  double fwd = 0, bwd = 0, recompute = 0;  // compute seconds (bwd without recomputation)
  double attn_core_fwd = 0;                // the part of fwd (and half of the bwd's twice as much) ring attention overlaps
  double bwd_async = 0;                    // the backward GEMMs the asynchronous tp collectives run under
  double wgrad = 0;                        // the part of bwd that is weight-gradient GEMMs (zero-bubble's W pass)
  double wgrad_async = 0;                  // the part of bwd_async that is weight-gradient GEMMs
  Transfer tp_fwd, tp_bwd, tp_async;       // exposed forward, exposed backward, asynchronous backward
  Transfer tp_recompute;                   // the recomputed forward's collectives (full recomputation)
  Transfer cp, ep;                         // per pass: ring attention's K/V, dispatch + combine
  Transfer dp_ag, dp_rs;                   // its parameters' gather, its gradients' reduce-scatter
  LayerPlan& operator+=(const LayerPlan& o);
};

struct ScheduleOptions {
  bool async_tp = true;    // column-parallel backward collectives under the GEMMs (Megatron)
  bool overlap_dp = true;  // ZeRO-1/2 per-layer overlap of reduce-scatter and param gather
  int prefetch = 1;        // ZeRO-3: layers gathered ahead of the one computing
  bool zero_bubble = false;  // ZB-H1 order (vpp 1): W passes split off the backward and deferred
  // Megatron-Core's --overlap-moe-expert-parallel-comm: in the steady state a
  // forward and a backward of two micro-batches run as one step, their layers
  // alternating, so each one's expert all-to-all (and other collectives) runs
  // under the other's compute; one more micro-batch in flight.
  bool a2a_overlap = false;
  // DualPipe (DeepSeek-V3 report sec. 3.2.1): every rank holds two stages,
  // stage r of the model's first copy (micro-batches entering at rank 0) and
  // stage p-1-r of its second (entering at rank p-1); chunks are the two
  // copies (vpp 2, chunk c x pp + stage), half the micro-batches through
  // each; forward/backward pairs combined, some backwards split into B and W.
  bool dualpipe = false;
  int64_t max_tasks = 400'000;  // layers are merged per chunk above this many tasks
};

// CPU ranks (a cluster with node.cpu_cores; docs/simulator.md, "A CPU
// training job and its calibration"): the job's ranks on a host share what
// its cores give the job, `capacity` calibrated threads' worth.  While k of a
// host's ranks are busy, each runs at min(1, capacity / k) of a calibrated
// thread (processor sharing); a pipeline rank's representative stands for
// its tp x cp x dp ranks, all busy when it is, and runs at the rate of its
// slowest host.  A rank is busy while any task of its streams runs (compute,
// and collectives and sends: their copies and reductions run on its core);
// a rank that only waits (a blocked receive, the pipeline's fill and drain)
// yields its core.  A rank counts once however many of its streams run.
// Off (every task at its own speed: GPUs) when `ranks` is empty.
struct CpuSharing {
  double capacity = 0;    // node.cpu_capacity (else node.cpu_cores), in calibrated threads
  // The spec's task times are this many times their time alone (what the
  // training model charges without the schedule: every rank computing at
  // once, sim/train_detail.hpp Trainer::share); the schedule undoes it.
  double time_scale = 1;
  std::vector<std::vector<double>> ranks;  // [host][pipeline rank]: the job's ranks of that pipeline rank on that host
  [[nodiscard]] bool on() const { return !ranks.empty(); }
};

struct IterationSpec {
  int64_t pp = 1, vpp = 1, micro_batches = 1;
  int zero = 1;
  double comm_sm_fraction = 0.15;
  std::vector<std::vector<LayerPlan>> chunks;  // pp x vpp virtual stages (chunk x pp + stage), their layers in order
  std::vector<double> optimizer_s;             // per stage
  Transfer p2p;                                // one activation or gradient between neighbouring stages
  ScheduleOptions options;
  CpuSharing cpu;                              // CPU ranks time-sharing their hosts' cores (off: GPUs)
};

struct ScheduleResult {
  double makespan_s = 0;
  std::map<std::string, double> breakdown;  // sums to makespan_s
  int64_t tasks = 0;
  int merged_layers = 1;  // layers per task group (1: every layer its own)
  struct Slice {
    std::string name;
    int64_t stage = 0;
    int stream = 0;  // index into kStreamNames
    double ts = 0, dur = 0;
  };
  std::vector<Slice> slices;  // only when asked for
};

inline constexpr const char* kStreamNames[] = {"compute", "tp comm", "cp comm", "ep comm", "dp gather", "dp reduce", "pp send"};
inline constexpr int kStreams = 7;

// Megatron-LM's per-device order of forward and backward passes
// (schedules.py): 1F1B, interleaved when v > 1.
struct PipelineOp {
  bool fwd;
  int64_t micro, chunk;
  bool wgrad = false;  // zero-bubble: the W pass (weight gradients) of a backward
  bool combined = false;  // a forward run as one step with the backward after it (a2a overlap, DualPipe)
  bool split = false;     // a backward that leaves its weight gradients to a later W pass
};
// One stage's order: 1F1B (interleaved when v > 1), or with `zero_bubble`
// (v = 1) ZB-H1: the same F/B order with each B followed by the W of the
// micro-batch `rank` backwards earlier (stage i keeps i W passes pending, so
// every stage holds p micro-batches in flight, as 1F1B's first stage does),
// the pending ones after the last B.  With F, B and W of equal length this
// leaves a bubble of (p - 1) (F + B - W), a third of 1F1B's.
// With `combine` (Megatron-Core's --overlap-moe-expert-parallel-comm): one
// more warm-up forward, then every steady-state forward is `combined` with
// the backward after it (Megatron's combined 1F1B, without pipelining or
// interleaved).
std::vector<PipelineOp> pipelineOrder(int64_t rank, int64_t p, int64_t v, int64_t micro_batches, bool zero_bubble = false,
                                      bool combine = false);
// DualPipe's order on `rank` of p (even) for m micro-batches (even, >= 2p),
// m/2 through each copy: ops carry the copy as `chunk` and micro-batches
// copy x m/2 + j.  With q = min(rank, p-1-rank), h = p/2, and "chunk 0" the
// copy that enters nearest the rank (the first copy on the first half):
// 2(h-q-1) forwards of chunk 0; q+1 x (F0, F1); h-q-1 x (B1 split, W, F1);
// m/2-p+q+1 x (F0 with B1, F1 with B0, each pair combined); h-q-1 x (B1, F1
// with B0); q+1 x (B1, B0), split from the middle on; h-q-1 x (W, B0 split);
// q+1 x W.  W passes run their backwards' weight gradients oldest first.
std::vector<PipelineOp> dualPipeOrder(int64_t rank, int64_t p, int64_t micro_batches);
// The stage of `chunk` (copy) that `rank` holds, and the rank that holds
// `stage` of `chunk`, under DualPipe (else the interleaved layout).
inline int64_t stageOnRank(int64_t chunk, int64_t rank, int64_t p, bool dualpipe) {
  return dualpipe && chunk == 1 ? p - 1 - rank : rank;
}

Result<ScheduleResult> simulateSchedule(const IterationSpec& spec, bool keep_slices = false);

}  // namespace chorus::sim

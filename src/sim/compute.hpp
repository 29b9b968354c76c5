// Per-operator compute on one GPU: GEMMs (tile and wave quantisation, split-K,
// the K dimension, bf16 vs fp8, grouped GEMMs with small per-expert M), the
// fused attention core (efficiency by head dim, sequence length and mask:
// FlashAttention-2 on Ampere, -3 on Hopper), memory-bound kernels at the
// achievable HBM bandwidth, and a fixed cost per kernel.
//
// The coefficients of each GPU generation live in configs/gpus/<gen>.json
// (a100, h100 for H100/H800/H200, b200 for B200/GB200), compiled into the
// library; each value is from a public kernel microbenchmark cited in the
// file and in docs/simulator.md.  A GPU without a data file (or a file
// without GEMM data) uses the cluster's gpu.gemm_efficiency /
// gpu.gemm_half_size roofline for GEMMs.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.hpp"
#include "common/units.hpp"
#include "sim/config.hpp"

namespace chorus::sim {

struct AttentionPoint {
  double head_dim = 128;
  bool causal = false;
  double efficiency = 0;  // fraction of the 16-bit peak at long sequences
  double seq_half = 0;    // key length at which it is half that
};

// A fused attention kernel's efficiency curves on one generation.
struct AttentionKernel {
  std::string name;    // what --attention-kernel calls it: "fa2", "fa3"
  std::string kernel;  // the library, as its paper names it
  std::vector<AttentionPoint> fwd, bwd;
  Seconds fixed;
};

// One generation's coefficients (configs/gpus/*.json).
struct ComputeSpec {
  std::string arch, file;
  int sms = 0;
  bool has_gemm = false;  // a file without a "gemm" object keeps the cluster's roofline curve for GEMMs
  std::vector<std::pair<double, double>> tiles;  // CTA output tiles (m, n) the GEMM library picks among
  double split_k_min = 256;                      // smallest K slice of a split-K GEMM
  double eff16 = 0, eff8 = 0;                    // large-GEMM fraction of the bf16 / fp8 peak
  double k_half16 = 0, k_half8 = 0;              // K (per split) at which the main loop runs at half speed
  double cap16 = 1, cap8 = 1;                    // no bf16 / fp8 GEMM beyond this fraction of its peak (a measured maximum)
  double sustained = 1;                          // tensor-core rate under sustained load / in short benchmarks
  Seconds gemm_fixed;                            // per GEMM kernel: launch, prologue, epilogue
  // The attention kernels the file has curves for; the first is the
  // generation's default (the fastest public one).
  std::vector<AttentionKernel> attention;
  // The kernel called `name` ("" = the default), or nullptr.
  [[nodiscard]] const AttentionKernel* attentionKernel(std::string_view name) const;
  [[nodiscard]] std::string attentionKernelNames() const;  // "fa3, fa2"
};

// The compiled-in data files: (file name, JSON text).
const std::vector<std::pair<std::string_view, std::string_view>>& gpuDataFiles();
Result<ComputeSpec> parseComputeSpec(std::string_view json, std::string_view where);
// The data file for the cluster's GPU generation (gpu.arch or its name), or
// nullptr when there is none.
const ComputeSpec* computeSpecFor(const GpuSpec& g);
// `name` ("" = the default) names an attention kernel of the GPU's data file;
// the error lists the ones it has.
Status checkAttentionKernel(const GpuSpec& g, std::string_view name, std::string_view flag = "--attention-kernel");

class Compute {
 public:
  // `attention_kernel`: the fused attention kernel's name in the GPU's data
  // file ("" = its default; checkAttentionKernel validates a name first).
  // How long the GPU computes without a pause: a short burst after idling
  // (the kernel benchmarks the data files come from) runs at the boost
  // clock; a training step or a serving run keeps every GPU of the node
  // busy and power-saturated, at the lower clock it can sustain
  // (`sustained_clock_ratio`; train and infer price at it).
  enum class Load : uint8_t { Burst, Sustained };
  Compute(const GpuSpec& g, bool fp8, std::string_view attention_kernel = "", Load load = Load::Burst)
      : g_(g),
        s_(computeSpecFor(g)),
        fp8_(fp8),
        attn_(s_ ? s_->attentionKernel(attention_kernel) : nullptr),
        load_(load) {}
  [[nodiscard]] const ComputeSpec* spec() const { return s_; }

  // Output m x n, reduction k, `batch` independent problems of that shape
  // (a batched or grouped GEMM: all their tiles share the waves).
  [[nodiscard]] Seconds gemm(double m, double n, double k, double batch = 1) const;
  // MoE experts: `groups` GEMMs of m_per_group x n x k in one grouped kernel.
  [[nodiscard]] Seconds groupedGemm(double groups, double m_per_group, double n, double k) const {
    return gemm(m_per_group, n, k, groups);
  }
  // The fraction of the peak a GEMM of this shape reaches (without the fixed cost).
  [[nodiscard]] double gemmEfficiency(double m, double n, double k, double batch = 1) const;
  // The fused attention core of `heads` (batch x heads) problems, sq queries
  // against skv keys, head dims d_qk / d_v; causal masks the upper triangle;
  // window > 0 limits every query to that many keys (sliding window).
  [[nodiscard]] Seconds attention(double heads, double sq, double skv, double d_qk, double d_v, bool causal,
                                  double window = 0, bool backward = false) const;
  // A memory-bound kernel moving `bytes` through HBM.
  [[nodiscard]] Seconds mem(double bytes) const {
    return Bytes(bytes) / (g_.hbm_bw * g_.hbm_efficiency) + g_.kernel_overhead;
  }

 private:
  [[nodiscard]] double clock() const { return load_ == Load::Sustained && s_ ? s_->sustained : 1.0; }

  const GpuSpec& g_;
  const ComputeSpec* s_;
  bool fp8_;
  const AttentionKernel* attn_;
  Load load_;
};

}  // namespace chorus::sim

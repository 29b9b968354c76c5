// Cluster and model descriptions (configs/clusters/*.json,
// configs/models/*.json) parsed into validated structs.  Every error names the
// file, the key and the offending value; optional keys have the defaults
// written here and documented in docs/simulator.md.
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "common/status.hpp"
#include "sim/units.hpp"

namespace chorus::sim {

enum class TopologyKind { FatTree, RailOptimized, Torus2d, Torus3d, Dragonfly };
std::string_view topologyName(TopologyKind k);

struct GpuSpec {
  std::string name;
  FlopsPerSecond peak16;       // dense 16-bit tensor peak
  FlopsPerSecond peak8;        // dense fp8 peak (default 2 x peak16)
  Bytes hbm;
  BytesPerSecond hbm_bw;
  // Largest fraction of peak a large GEMM reaches (default 0.80, see docs).
  double gemm_efficiency = 0.80;
  // GEMM size (m*n*k FLOP/2) at which efficiency is half its maximum.
  double gemm_half_size = 4e9;
  // Fraction of HBM bandwidth that element-wise kernels reach (default 0.80).
  double hbm_efficiency = 0.80;
  Seconds kernel_overhead = us(4);  // launch + tail per kernel
  // Fraction of the GPU's SMs a collective kernel occupies while it runs
  // concurrently with compute (NCCL: one CTA per channel, 16 channels of a
  // 108-SM A100 ~ 0.15); overlapped compute slows by this much (docs).
  double comm_sm_fraction = 0.15;
  // Streaming multiprocessors (0 = no wave-quantisation model).  A GEMM's
  // output is cut into 128 x 256 tiles, one per SM at a time; the last,
  // partly filled wave and partial edge tiles waste their share (NVIDIA,
  // "Matrix Multiplication Background User's Guide": tile and wave quantization).
  int sms = 0;
  // GPU generation for the NCCL and compute models: ampere, hopper,
  // blackwell, volta or other ("" = from the name: A100, H100/H800/H200, B200/GB200).
  std::string arch;
};

struct NodeSpec {
  int gpus = 8;                 // GPUs in one scale-up (NVLink) domain
  BytesPerSecond nvlink_bw;     // per GPU, per direction
  Seconds nvlink_latency;
  double nvlink_efficiency = 0.80;  // achievable fraction (NCCL-measured busbw / peak)
  // NVLink SHARP (NVLS, in-switch reduction and multicast; docs/simulator.md
  // "Collectives as NCCL runs them"): -1 = by GPU generation (Hopper and
  // Blackwell NVSwitch nodes), 0 = off, 1 = on.  nvls_reduce_tflops: the
  // node's NVSwitch reduction throughput (fp32 adds/s; 0 = by generation).
  int nvls = -1;
  double nvls_reduce_tflops = 0;
};

struct NetworkSpec {
  TopologyKind topology = TopologyKind::FatTree;
  int nics_per_node = 8;
  BytesPerSecond nic_bw;        // per NIC, per direction
  Seconds latency;              // end to end (torus: per hop)
  double oversubscription = 1;  // leaf down : up bandwidth
  double efficiency = 0.90;     // achievable fraction of NIC line rate
  int leaf_nodes = 16;          // fat-tree/rail: nodes under one leaf (per rail)
  std::array<int, 3> dims{1, 1, 1};  // torus: nodes per dimension (product = nodes)
  int group_nodes = 32;         // dragonfly: nodes per group
  // Messages between nodes of at least this many bytes wait for the
  // receiver's clear-to-send (the flow model's program simulation); 0: all
  // go eagerly.
  double rendezvous_bytes = 0;
  // IB SHARP (NCCL's CollNet): the switches reduce in-network (docs).
  bool sharp = false;
};

struct ClusterSpec {
  std::string name;
  int nodes = 1;
  GpuSpec gpu;
  NodeSpec node;
  NetworkSpec network;
  [[nodiscard]] int64_t gpus() const { return int64_t{nodes} * node.gpus; }
};

enum class Activation { Gelu, SwiGlu };

struct MoeSpec {
  int experts = 0;  // 0 = dense model
  int top_k = 1;
  int64_t expert_ffn_hidden = 0;
  int shared_experts = 0;  // always-active experts (DeepSeek)
  int dense_layers = 0;    // leading layers with a dense FFN (DeepSeek: 3)
};

// Multi-head latent attention (DeepSeek-V2/V3): K and V come from one
// low-rank latent per token (kv_lora_rank) plus a shared rotary key part, Q
// optionally from its own low-rank latent; the KV cache holds the latent and
// the rotary key only.  kv_lora_rank 0: ordinary multi-head / grouped attention.
struct MlaSpec {
  int64_t q_lora_rank = 0;  // 0: Q is a full h x heads*qk projection
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
};

struct ModelSpec {
  std::string name;
  int layers = 0;
  int64_t hidden = 0;
  int heads = 0;
  int kv_heads = 0;
  int64_t ffn_hidden = 0;
  int64_t vocab = 0;
  Activation activation = Activation::Gelu;
  // Dropout after attention and MLP (GPT-3/Megatron: yes; Llama, Mixtral,
  // DeepSeek: no).  Decides the dropout masks kept for backward.
  bool dropout = true;
  MoeSpec moe;
  MlaSpec mla;
  [[nodiscard]] int64_t headDim() const { return hidden / heads; }
  [[nodiscard]] bool hasMla() const { return mla.kv_lora_rank > 0; }
  // Per head: the query/key width the scores use and the value width.
  [[nodiscard]] double qkHeadDim() const;
  [[nodiscard]] double vHeadDim() const;
  // Attention weights of one layer without its layer norms, and the part of
  // them before the attention core (all but the output projection).
  [[nodiscard]] double attnParams() const;
  [[nodiscard]] double attnInParams() const;
  // Per token, all heads: the K and V the core reads (MLA: the up-projected
  // ones), and Q, K and V together.
  [[nodiscard]] double kvWidth() const;
  [[nodiscard]] double qkvWidth() const;
  // Over how many of tp GPUs K and V are split (by KV head; MLA: by head).
  [[nodiscard]] double kvSplit(double tp) const;
  // KV-cache elements per token and layer, and over how many of tp GPUs the
  // cache is split (MLA caches the latent, replicated on every tp GPU).
  [[nodiscard]] double kvCacheElems() const;
  [[nodiscard]] double kvCacheSplit(double tp) const;
  // Parameters of one transformer layer (attention + FFN/experts + norms).
  [[nodiscard]] double layerParams(int layer) const;
  [[nodiscard]] double params() const;        // all parameters
  [[nodiscard]] double activeParams() const;  // touched per token (MoE: top_k experts)
};

// Parses JSON text; `where` names the source in errors (a file name).
Result<ClusterSpec> parseCluster(std::string_view json, std::string_view where);
Result<ModelSpec> parseModel(std::string_view json, std::string_view where);
Result<ClusterSpec> loadCluster(const std::string& path);
Result<ModelSpec> loadModel(const std::string& path);

}  // namespace chorus::sim

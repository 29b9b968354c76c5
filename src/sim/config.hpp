// Cluster and model descriptions (configs/clusters/*.json,
// configs/models/*.json) parsed into validated structs.  Every error names the
// file, the key and the offending value; optional keys have the defaults
// written here and documented in docs/simulator.md.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.hpp"
#include "common/units.hpp"

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
  // A full mesh of point-to-point links (AMD's xGMI, NVLink without an
  // NVSwitch) instead of a switch: each GPU pair has links of its own,
  // `peer_bw` per direction (0: nvlink_bw / (domain GPUs - 1)), and a GPU's
  // egress and ingress are bounded by the sum of its links and nvlink_bw
  // (docs/simulator.md, "Mesh nodes").  Keys "mesh", "peer_gbyte_s".
  bool mesh = false;
  BytesPerSecond peer_bw;
  [[nodiscard]] BytesPerSecond peerBw() const {
    if (peer_bw.value() > 0 || domainSize() < 2) return peer_bw;
    return nvlink_bw / static_cast<double>(domainSize() - 1);
  }
  // A partial or uneven mesh (AMD's MI250X, RCCL's 6-link MI100 model): the
  // links of each ordered pair of the domain's GPUs, row-major, domainSize()^2
  // entries, 0 for a pair without a direct link (routed over one GPU linked
  // to both).  Empty: every pair has one set of links at peerBw().  When
  // set, peer_bw is the rate of ONE link and a pair's rate is its count x
  // peer_bw.  Key "peer_links": [[a, b, count], ...] (both directions).
  std::vector<int> pair_links;
  static constexpr int kMaxPartialMeshGpus = 128;  // routes are searched in O(GPUs^3)
  [[nodiscard]] int pairLinks(int64_t a, int64_t b) const {
    return pair_links[static_cast<size_t>(a * domainSize() + b)];
  }
  // CPU ranks (chorus-sim calibrate): the cores one host has.  When more ranks
  // than cores share a host, their compute and the CPU-side copies of their
  // collectives time-share the cores (docs/simulator.md, "A CPU training job
  // and its calibration").  0: every rank has a processor of its own (GPUs).
  int cpu_cores = 0;
  // What the host's cores gave this job when the rates were measured: the
  // throughput of cpu_cores concurrent busy processes over one alone's
  // (chorus-sim calibrate measures it), in [1, cpu_cores]; lower than the
  // cores when other work shares them (the kernel's scheduler shares them
  // between sessions, not threads).  0: cpu_cores.
  double cpu_capacity = 0;
  // Set by placedCluster (sim/placement.hpp), not by cluster files: the
  // physical domain size when a job uses only `gpus` of each domain (0: all).
  int64_t domain_gpus = 0;
  // The physical NVLink domain's GPUs (the placed job's `gpus` or more).
  [[nodiscard]] int64_t domainSize() const { return domain_gpus > 0 ? domain_gpus : gpus; }
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
  // NCCL's PXN for point-to-point traffic (all-to-all, send/recv): -1 as
  // NCCL decides (on for NCCL's collectives when the node's GPUs share NVLink:
  // NCCL_PXN_DISABLE=0 and NCCL_P2P_PXN_LEVEL=2 by default since 2.12), 0 off
  // (NCCL_PXN_DISABLE=1 or NCCL_P2P_PXN_LEVEL=0), 1 on (docs/simulator.md, "PXN").
  int pxn = -1;
};

// The host-side time of a framework's layer pass that no kernel accounts for
// (Python, autograd's graph, the operator dispatch), measured by chorus-sim
// calibrate on the job's own layer at tiny shapes (issue 35).  Per micro-batch:
// one decoder layer's forward and backward, the embedding + head + loss's;
// per step: the optimizer's per-layer work (one call per parameter tensor).
// All zero: not priced (GPU clusters, whose host work overlaps the kernels).
struct HostSpec {
  Seconds layer_fwd, layer_bwd, head_fwd, head_bwd, step_layer;
};

struct ClusterSpec {
  std::string name;
  HostSpec host;
  int nodes = 1;
  GpuSpec gpu;
  NodeSpec node;
  NetworkSpec network;
  [[nodiscard]] int64_t gpus() const { return int64_t{nodes} * node.gpus; }
};

// Gelu: a plain two-matrix MLP (GPT).  SwiGlu: a gated three-matrix MLP
// (gate, up, down), whatever its non-linearity (SiLU for Llama, Qwen,
// DeepSeek, GPT-OSS; tanh-GELU for Gemma: ModelSpec::activation_name says which).
enum class Activation { Gelu, SwiGlu };

struct MoeSpec {
  int experts = 0;  // 0 = dense model
  int top_k = 1;
  int64_t expert_ffn_hidden = 0;
  int shared_experts = 0;  // always-active experts (DeepSeek)
  // Width of one shared expert (0: expert_ffn_hidden).  Qwen2-MoE's single
  // shared expert is 4 x its routed experts' width.
  int64_t shared_expert_ffn_hidden = 0;
  int dense_layers = 0;    // leading layers with a dense FFN (DeepSeek: 3)
  // Of the remaining layers, every sparse_step-th is MoE (Qwen2-MoE's
  // decoder_sparse_step: layer l is MoE if (l + 1) % step == 0; DeepSeek's
  // moe_layer_freq: if l % freq == 0); dense_list names further dense layers
  // (Qwen's mlp_only_layers).
  int sparse_step = 1;
  bool step_from_zero = false;  // DeepSeek's rule (l % freq) instead of Qwen's ((l + 1) % step)
  std::vector<int> dense_list;
  // Group-limited routing (DeepSeek): experts in n_group groups, a token's
  // top_k chosen inside its topk_group best groups.  0: unrestricted.
  int n_group = 0, topk_group = 0;
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
  int64_t head_dim = 0;  // 0: hidden / heads (Qwen3, Gemma, GPT-OSS set their own)
  int64_t ffn_hidden = 0;
  int64_t vocab = 0;
  Activation activation = Activation::Gelu;
  std::string activation_name;  // as the source file spelled it ("swiglu", "silu", "gelu_pytorch_tanh", ...)
  // Dropout after attention and MLP (GPT-3/Megatron: yes; Llama, Mixtral,
  // DeepSeek: no).  Decides the dropout masks kept for backward.
  bool dropout = true;
  bool tie_embeddings = false;  // the output head reuses the input embedding (Gemma)
  bool qkv_bias = false, o_bias = false;  // attention projection biases (Qwen2: q, k, v; GPT-OSS: all four)
  // Sliding-window attention: layers with window_layers[l] (all layers when
  // window_layers is empty) attend to the last `window` tokens only, and
  // cache only those.  0: every layer attends to the whole context.
  int64_t window = 0;
  std::vector<bool> window_layers;
  // Bytes per stored weight of the transformer layers' matrices (bf16 2, fp8
  // 1, MXFP4 4.25 / 8); expert_weight_bytes for the routed and shared experts
  // (0: weight_bytes).  Embeddings, head, norms and routers stay 16-bit.
  double weight_bytes = 2;
  double expert_weight_bytes = 0;
  // Bytes of one activation / gradient element of the training job ("dtype":
  // bf16 or fp16 2, fp32 4): every activation, gradient and element-wise byte
  // count of `train` (the fp32 CPU job of issue 35 is 4).
  double act_bytes = 2;
  std::string weight_format = "bf16";
  // Multi-token-prediction modules (DeepSeek-V3's num_nextn_predict_layers):
  // each one transformer layer + a 2h x h projection + 2 norms, sharing the
  // embedding and head; not counted in params() (the published totals leave
  // them out), available as mtpParams() for speculative decoding.
  int mtp_layers = 0;
  std::string source;  // "chorus" or the Hugging Face model_type it was read from
  std::vector<std::string> ignored_keys;  // keys of a Hugging Face config that do not matter here
  MoeSpec moe;
  MlaSpec mla;
  [[nodiscard]] int64_t headDim() const { return head_dim > 0 ? head_dim : hidden / heads; }
  [[nodiscard]] bool hasMla() const { return mla.kv_lora_rank > 0; }
  // Whether layer l routes its tokens to experts (else it has a dense FFN of ffn_hidden).
  [[nodiscard]] bool isMoeLayer(int layer) const;
  [[nodiscard]] int moeLayers() const;
  // Whether layer l attends within a sliding window.
  [[nodiscard]] bool isWindowLayer(int layer) const;
  // Context positions layer l attends to / caches at context length ctx.
  [[nodiscard]] double attendedTokens(int layer, double ctx) const;
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
  // Gated or plain MLP: matrices per FFN (3 or 2).
  [[nodiscard]] double ffnMats() const { return activation == Activation::SwiGlu ? 3 : 2; }
  // FFN width a token passes through in layer l (MoE: top_k routed + the shared experts).
  [[nodiscard]] double ffnPerToken(int layer) const;
  // Width of all shared experts together (shared_experts x their width).
  [[nodiscard]] double sharedFfn() const;
  [[nodiscard]] double expertParams() const;  // one routed expert
  // Parameters of one transformer layer (attention + FFN/experts + norms).
  [[nodiscard]] double layerParams(int layer) const;
  // Its parameters held as expert weights (routed + shared).
  [[nodiscard]] double layerExpertParams(int layer) const;
  [[nodiscard]] double embeddingParams() const;  // input embedding + output head (once if tied)
  [[nodiscard]] double params() const;        // all parameters (without MTP modules)
  // Touched per token (MoE: top_k experts), counting both embedding tables
  // (Mistral's, Qwen's convention) ...
  [[nodiscard]] double activeParams() const;
  // ... and without the input embedding, a lookup, not a matrix multiply
  // (OpenAI's gpt-oss and DeepSeek-V3's convention): what a token's GEMMs read.
  [[nodiscard]] double activeMatmulParams() const;
  [[nodiscard]] double mtpParams() const;  // the MTP modules' own parameters
  // Bytes of the stored weights (weight_bytes per layer matrix, expert_weight_bytes
  // per expert weight, 2 per embedding/head parameter).
  [[nodiscard]] double weightBytes() const;
  [[nodiscard]] double layerWeightBytes(int layer) const;
  [[nodiscard]] double expertWeightBytes() const { return expert_weight_bytes > 0 ? expert_weight_bytes : weight_bytes; }
};

// Parses JSON text; `where` names the source in errors (a file name).  A key
// the format does not have is an error naming the nearest valid key.
Result<ClusterSpec> parseCluster(std::string_view json, std::string_view where);
// chorus's own model format, or a Hugging Face config.json (detected by its
// "model_type" or "architectures"); `name` is used when the file has none.
// `allow_unknown_keys`: a Hugging Face key within a small edit distance of
// one the parser reads (a likely typo: num_key_value_head) is ignored
// instead of refused.
Result<ModelSpec> parseModel(std::string_view json, std::string_view where, std::string_view name = "",
                             bool allow_unknown_keys = false);
// A Hugging Face config.json (model_type llama, mistral, mixtral, qwen2,
// qwen2_moe, qwen3, qwen3_moe, deepseek_v2, deepseek_v3, gpt_oss, gemma2,
// gemma3 / gemma3_text); src/sim/hf_model.cpp.
// A model_type it does not know is read as architectures[0]'s family when
// that names one (kimi_k2 with DeepseekV3ForCausalLM).
Result<ModelSpec> parseHfModel(std::string_view json, std::string_view where, std::string_view name = "",
                               bool allow_unknown_keys = false);
std::string_view hfSupportedModelTypes();
Result<ClusterSpec> loadCluster(const std::string& path);
// A chorus model file, a Hugging Face config.json, or a directory holding one.
Result<ModelSpec> loadModel(const std::string& path, bool allow_unknown_keys = false);

// The key of `valid` nearest to `key` by edit distance ("" when none is
// within half the key's length).
std::string nearestKey(std::string_view key, const std::vector<std::string_view>& valid);
// Edit distance (case-insensitive) between two keys.
size_t keyDistance(std::string_view a, std::string_view b);

}  // namespace chorus::sim

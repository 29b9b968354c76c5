// What `chorus-sim model` prints: a model's parameter counts, FLOPs and
// KV-cache bytes per token, and its layers' shapes, all derived from the
// ModelSpec (no stored figures).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/config.hpp"

namespace chorus::sim {

struct Matrix {
  std::string name;
  int64_t rows = 0, cols = 0;  // input width x output width
  int64_t count = 1;           // e.g. routed experts
};

// The layers with the same shapes (in order; e.g. every other one).
struct LayerGroup {
  int first = 0, last = 0;  // inclusive
  std::vector<int> indices;
  std::string attention;    // "full", "sliding 4096", "mla"
  std::string ffn;          // "dense", "moe"
  double params = 0;        // per layer
  std::vector<Matrix> matrices;
};

struct ModelInfo {
  std::string name, source, weight_format;
  int64_t seq = 0;
  double params = 0, active_params = 0, active_matmul_params = 0, embedding_params = 0, mtp_params = 0;
  double weight_bytes = 0;
  // Forward FLOPs per token: averaged over a causal sequence of `seq` tokens
  // (prefill; token i attends to min(i + 1, window) positions), and for one
  // decoded token whose context is `seq` tokens.  Both 2 x the GEMM weights a
  // token reads plus 2 x heads x (qk + v) x attended positions per layer.
  double prefill_flops_per_token = 0, decode_flops_per_token = 0;
  // KV cache in 16-bit: bytes per token of context in the layers without a
  // window (what a longer context adds), and all layers' bytes for a
  // sequence of `seq` tokens.
  double kv_bytes_per_token = 0, kv_bytes_at_seq = 0;
  std::vector<LayerGroup> layers;
  std::vector<std::string> ignored_keys;
};

std::vector<Matrix> layerMatrices(const ModelSpec& m, int layer);
Result<ModelInfo> describeModel(const ModelSpec& m, int64_t seq);
nlohmann::json toJson(const ModelInfo& info);
// The human-readable form.
std::string formatModelInfo(const ModelInfo& info, bool verbose);

}  // namespace chorus::sim

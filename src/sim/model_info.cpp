#include "sim/model_info.hpp"

#include <fmt/format.h>

namespace chorus::sim {
namespace {

// Positions a causal token attends to, averaged over a sequence of n tokens,
// when at most w are kept (w = 0: no window).
double causalAverage(double n, double w) {
  if (w <= 0 || n <= w) return (n + 1) / 2;
  return (w * (w + 1) / 2 + (n - w) * w) / n;
}

std::string attentionKind(const ModelSpec& m, int l) {
  if (m.hasMla()) return "mla";
  if (m.isWindowLayer(l)) return fmt::format("sliding {}", m.window);
  return "full";
}

// "0-2", "3-60", or "0, 2, ..., 34" for an arithmetic progression, else a list.
std::string layerSet(const std::vector<int>& v) {
  if (v.size() == 1) return std::to_string(v[0]);
  const int step = v[1] - v[0];
  bool arith = true;
  for (size_t i = 2; i < v.size(); ++i) arith = arith && v[i] - v[i - 1] == step;
  if (arith && step == 1) return fmt::format("{}-{}", v.front(), v.back());
  if (arith && v.size() > 3) return fmt::format("{}, {}, ..., {} ({} layers)", v[0], v[1], v.back(), v.size());
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

std::string human(double x) {
  if (x >= 1e12) return fmt::format("{:.2f} T", x / 1e12);
  if (x >= 1e9) return fmt::format("{:.2f} B", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.2f} M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.2f} K", x / 1e3);
  return fmt::format("{:.0f}", x);
}

}  // namespace

std::vector<Matrix> layerMatrices(const ModelSpec& m, int l) {
  const int64_t h = m.hidden, a = m.heads, kv = m.kv_heads, d = m.headDim();
  std::vector<Matrix> v;
  if (m.hasMla()) {
    const int64_t qk = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim;
    if (m.mla.q_lora_rank > 0) {
      v.push_back({"q_a", h, m.mla.q_lora_rank});
      v.push_back({"q_b", m.mla.q_lora_rank, a * qk});
    } else {
      v.push_back({"q", h, a * qk});
    }
    v.push_back({"kv_a", h, m.mla.kv_lora_rank + m.mla.qk_rope_head_dim});
    v.push_back({"kv_b", m.mla.kv_lora_rank, a * (m.mla.qk_nope_head_dim + m.mla.v_head_dim)});
    v.push_back({"o", a * m.mla.v_head_dim, h});
  } else {
    v.push_back({"q", h, a * d});
    v.push_back({"k", h, kv * d});
    v.push_back({"v", h, kv * d});
    v.push_back({"o", a * d, h});
  }
  const bool gated = m.activation == Activation::SwiGlu;
  auto mlp = [&](const std::string& p, int64_t f, int64_t count) {
    if (gated) v.push_back({p + "gate", h, f, count});
    v.push_back({p + "up", h, f, count});
    v.push_back({p + "down", f, h, count});
  };
  if (!m.isMoeLayer(l)) {
    mlp("", m.ffn_hidden, 1);
  } else {
    v.push_back({"router", h, m.moe.experts});
    mlp("expert.", m.moe.expert_ffn_hidden, m.moe.experts);
    if (m.moe.shared_experts > 0)
      mlp("shared.", m.moe.shared_expert_ffn_hidden > 0 ? m.moe.shared_expert_ffn_hidden : m.moe.expert_ffn_hidden,
          m.moe.shared_experts);
  }
  return v;
}

Result<ModelInfo> describeModel(const ModelSpec& m, int64_t seq) {
  if (seq < 1) return invalidArgument("model: --seq {} must be at least 1 (tokens of context)", seq);
  ModelInfo r;
  r.name = m.name;
  r.source = m.source.empty() ? "chorus" : m.source;
  r.weight_format = m.weight_format;
  r.seq = seq;
  r.params = m.params();
  r.active_params = m.activeParams();
  r.active_matmul_params = m.activeMatmulParams();
  r.embedding_params = m.embeddingParams();
  r.mtp_params = m.mtpParams();
  r.weight_bytes = m.weightBytes();
  r.ignored_keys = m.ignored_keys;
  const double n = static_cast<double>(seq);
  double attn_prefill = 0, attn_decode = 0, kv_full = 0, kv_seq = 0;
  const double per_pos = 2.0 * m.heads * (m.qkHeadDim() + m.vHeadDim());  // scores + AV, per attended position
  for (int l = 0; l < m.layers; ++l) {
    const double w = m.isWindowLayer(l) ? static_cast<double>(m.window) : 0;
    attn_prefill += per_pos * causalAverage(n, w);
    attn_decode += per_pos * m.attendedTokens(l, n);
    const double bytes = m.kvCacheElems() * 2;
    if (!m.isWindowLayer(l)) kv_full += bytes;
    kv_seq += bytes * m.attendedTokens(l, n);
  }
  r.prefill_flops_per_token = 2 * r.active_matmul_params + attn_prefill;
  r.decode_flops_per_token = 2 * r.active_matmul_params + attn_decode;
  r.kv_bytes_per_token = kv_full;
  r.kv_bytes_at_seq = kv_seq;
  for (int l = 0; l < m.layers; ++l) {
    LayerGroup g{l, l, {l}, attentionKind(m, l), m.isMoeLayer(l) ? "moe" : "dense", m.layerParams(l), layerMatrices(m, l)};
    bool merged = false;
    for (LayerGroup& p : r.layers)
      if (p.attention == g.attention && p.ffn == g.ffn && p.params == g.params) {
        p.last = l, p.indices.push_back(l), merged = true;
        break;
      }
    if (!merged) r.layers.push_back(std::move(g));
  }
  return r;
}

nlohmann::json toJson(const ModelInfo& r) {
  nlohmann::json j = {{"name", r.name},
                      {"source", r.source},
                      {"weight_format", r.weight_format},
                      {"seq", r.seq},
                      {"params", r.params},
                      {"active_params", r.active_params},
                      {"active_matmul_params", r.active_matmul_params},
                      {"embedding_params", r.embedding_params},
                      {"mtp_params", r.mtp_params},
                      {"weight_bytes", r.weight_bytes},
                      {"prefill_flops_per_token", r.prefill_flops_per_token},
                      {"decode_flops_per_token", r.decode_flops_per_token},
                      {"kv_bytes_per_token", r.kv_bytes_per_token},
                      {"kv_bytes_at_seq", r.kv_bytes_at_seq},
                      {"ignored_keys", r.ignored_keys}};
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerGroup& g : r.layers) {
    nlohmann::json mats = nlohmann::json::array();
    for (const Matrix& x : g.matrices) mats.push_back({{"name", x.name}, {"rows", x.rows}, {"cols", x.cols}, {"count", x.count}});
    layers.push_back({{"first", g.first}, {"last", g.last}, {"layers", g.indices}, {"attention", g.attention}, {"ffn", g.ffn},
                      {"params_per_layer", g.params}, {"matrices", mats}});
  }
  j["layers"] = layers;
  return j;
}

std::string formatModelInfo(const ModelInfo& r, bool verbose) {
  std::string s = fmt::format("{} ({}, weights {})\n", r.name, r.source, r.weight_format);
  s += fmt::format("  parameters        {} total, {} active per token ({} without the input embedding)", human(r.params),
                   human(r.active_params), human(r.active_matmul_params));
  if (r.mtp_params > 0) s += fmt::format("; + {} in MTP modules", human(r.mtp_params));
  s += fmt::format("\n  weights           {:.1f} GB\n", r.weight_bytes / 1e9);
  s += fmt::format("  forward FLOPs     {} per token (prefill of {} tokens, causal), {} per decoded token at context {}\n",
                   human(r.prefill_flops_per_token), r.seq, human(r.decode_flops_per_token), r.seq);
  s += fmt::format("  KV cache (16-bit) {:.1f} KiB per token of context; {:.1f} MiB for {} tokens\n",
                   r.kv_bytes_per_token / 1024, r.kv_bytes_at_seq / 1048576, r.seq);
  for (const LayerGroup& g : r.layers) {
    s += fmt::format("  layers {}: attention {}, ffn {}, {} params each\n", layerSet(g.indices), g.attention, g.ffn,
                     human(g.params));
    for (const Matrix& x : g.matrices)
      s += fmt::format("      {:<14} {} x {}{}\n", x.name, x.rows, x.cols, x.count > 1 ? fmt::format("  (x{})", x.count) : "");
  }
  if (verbose && !r.ignored_keys.empty()) {
    s += "  ignored keys:";
    for (const std::string& k : r.ignored_keys) s += " " + k;
    s += "\n";
  }
  return s;
}

}  // namespace chorus::sim

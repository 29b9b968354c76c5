#include "sim/config.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace chorus::sim {
namespace {

using nlohmann::json;

// Walks a JSON object, collecting the first error with its full key path.
class Reader {
 public:
  Reader(const json& j, std::string where, std::string path = "")
      : j_(j), where_(std::move(where)), path_(std::move(path)) {}

  [[nodiscard]] std::string key(std::string_view k) const { return path_.empty() ? std::string(k) : path_ + "." + std::string(k); }

  Result<Reader> object(std::string_view k) const {
    if (!j_.contains(k)) return invalidArgument("{}: missing required object '{}'", where_, key(k));
    const json& v = j_.at(std::string(k));
    if (!v.is_object()) return invalidArgument("{}: key '{}' = {} must be an object", where_, key(k), v.dump());
    return Reader(v, where_, key(k));
  }
  [[nodiscard]] bool has(std::string_view k) const { return j_.contains(k); }

  Status str(std::string_view k, std::string* out, bool required = true) const {
    if (!j_.contains(k)) return required ? invalidArgument("{}: missing required key '{}'", where_, key(k)) : Status();
    const json& v = j_.at(std::string(k));
    if (!v.is_string()) return invalidArgument("{}: key '{}' = {} must be a string", where_, key(k), v.dump());
    *out = v.get<std::string>();
    return {};
  }
  // A number in [lo, hi]; optional keys leave *out untouched when absent.
  Status num(std::string_view k, double* out, double lo, double hi, bool required = true) const {
    if (!j_.contains(k)) return required ? invalidArgument("{}: missing required key '{}'", where_, key(k)) : Status();
    const json& v = j_.at(std::string(k));
    if (!v.is_number())
      return invalidArgument("{}: key '{}' = {} must be a number", where_, key(k), v.dump());
    const double d = v.get<double>();
    if (!(d >= lo && d <= hi))
      return invalidArgument("{}: key '{}' = {} is out of range [{}, {}]", where_, key(k), v.dump(), lo, hi);
    *out = d;
    return {};
  }
  template <typename I>
  Status integer(std::string_view k, I* out, double lo, double hi, bool required = true) const {
    if (!j_.contains(k)) return required ? invalidArgument("{}: missing required key '{}'", where_, key(k)) : Status();
    const json& v = j_.at(std::string(k));
    if (!v.is_number_integer())
      return invalidArgument("{}: key '{}' = {} must be an integer", where_, key(k), v.dump());
    double d = 0;
    CHORUS_RETURN_IF_ERROR(num(k, &d, lo, hi));
    *out = static_cast<I>(v.get<int64_t>());
    return {};
  }
  const json& raw() const { return j_; }
  const std::string& where() const { return where_; }

 private:
  const json& j_;
  std::string where_;
  std::string path_;
};

Result<json> parseJson(std::string_view text, std::string_view where) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (j.is_discarded()) return invalidArgument("{}: not valid JSON (check commas and quotes)", where);
  if (!j.is_object()) return invalidArgument("{}: the top level must be a JSON object", where);
  return j;
}

Result<std::string> readFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return invalidArgument("cannot open '{}' (is the path right? presets live in configs/)", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

std::string_view topologyName(TopologyKind k) {
  switch (k) {
    case TopologyKind::FatTree: return "fat-tree";
    case TopologyKind::RailOptimized: return "rail-optimized";
    case TopologyKind::Torus2d: return "torus2d";
    case TopologyKind::Torus3d: return "torus3d";
    case TopologyKind::Dragonfly: return "dragonfly";
  }
  return "?";
}

Result<ClusterSpec> parseCluster(std::string_view text, std::string_view where) {
  CHORUS_ASSIGN_OR_RETURN(json j, parseJson(text, where));
  Reader top(j, std::string(where));
  ClusterSpec c;
  double d = 0;
  CHORUS_RETURN_IF_ERROR(top.str("name", &c.name));
  CHORUS_RETURN_IF_ERROR(top.integer("nodes", &c.nodes, 1, 1 << 20));

  CHORUS_ASSIGN_OR_RETURN(Reader g, top.object("gpu"));
  CHORUS_RETURN_IF_ERROR(g.str("name", &c.gpu.name));
  CHORUS_RETURN_IF_ERROR(g.num("peak_tflops", &d, 1e-3, 1e6));
  c.gpu.peak16 = tflops(d);
  d *= 2;
  CHORUS_RETURN_IF_ERROR(g.num("fp8_tflops", &d, 1e-3, 1e6, false));
  c.gpu.peak8 = tflops(d);
  CHORUS_RETURN_IF_ERROR(g.num("hbm_gib", &d, 1e-3, 1e6));
  c.gpu.hbm = gib(d);
  CHORUS_RETURN_IF_ERROR(g.num("hbm_gbyte_s", &d, 1e-3, 1e6));
  c.gpu.hbm_bw = gbytePerS(d);
  CHORUS_RETURN_IF_ERROR(g.num("gemm_efficiency", &c.gpu.gemm_efficiency, 0.01, 1, false));
  CHORUS_RETURN_IF_ERROR(g.num("gemm_half_size", &c.gpu.gemm_half_size, 0, 1e15, false));
  CHORUS_RETURN_IF_ERROR(g.num("hbm_efficiency", &c.gpu.hbm_efficiency, 0.01, 1, false));
  d = toUs(c.gpu.kernel_overhead);
  CHORUS_RETURN_IF_ERROR(g.num("kernel_overhead_us", &d, 0, 1e6, false));
  c.gpu.kernel_overhead = us(d);
  CHORUS_RETURN_IF_ERROR(g.num("comm_sm_fraction", &c.gpu.comm_sm_fraction, 0, 1, false));
  CHORUS_RETURN_IF_ERROR(g.integer("sms", &c.gpu.sms, 0, 1e5, false));

  CHORUS_ASSIGN_OR_RETURN(Reader nd, top.object("node"));
  CHORUS_RETURN_IF_ERROR(nd.integer("gpus", &c.node.gpus, 1, 4096));
  CHORUS_RETURN_IF_ERROR(nd.num("nvlink_gbyte_s", &d, 1e-3, 1e6));
  c.node.nvlink_bw = gbytePerS(d);
  CHORUS_RETURN_IF_ERROR(nd.num("nvlink_latency_us", &d, 0, 1e6));
  c.node.nvlink_latency = us(d);
  CHORUS_RETURN_IF_ERROR(nd.num("nvlink_efficiency", &c.node.nvlink_efficiency, 0.01, 1, false));

  CHORUS_ASSIGN_OR_RETURN(Reader nw, top.object("network"));
  std::string topo;
  CHORUS_RETURN_IF_ERROR(nw.str("topology", &topo));
  bool found = false;
  for (TopologyKind k : {TopologyKind::FatTree, TopologyKind::RailOptimized, TopologyKind::Torus2d,
                         TopologyKind::Torus3d, TopologyKind::Dragonfly})
    if (topologyName(k) == topo) c.network.topology = k, found = true;
  if (!found)
    return invalidArgument("{}: key 'network.topology' = \"{}\" is not one of fat-tree, rail-optimized, torus2d, "
                           "torus3d, dragonfly", where, topo);
  CHORUS_RETURN_IF_ERROR(nw.integer("nics_per_node", &c.network.nics_per_node, 1, 4096));
  CHORUS_RETURN_IF_ERROR(nw.num("nic_gbit_s", &d, 1e-3, 1e7));
  c.network.nic_bw = gbitPerS(d);
  CHORUS_RETURN_IF_ERROR(nw.num("latency_us", &d, 0, 1e6));
  c.network.latency = us(d);
  CHORUS_RETURN_IF_ERROR(nw.num("oversubscription", &c.network.oversubscription, 1, 1024));
  CHORUS_RETURN_IF_ERROR(nw.num("efficiency", &c.network.efficiency, 0.01, 1, false));
  CHORUS_RETURN_IF_ERROR(nw.integer("leaf_nodes", &c.network.leaf_nodes, 1, 1 << 20, false));
  CHORUS_RETURN_IF_ERROR(nw.integer("group_nodes", &c.network.group_nodes, 1, 1 << 20, false));
  CHORUS_RETURN_IF_ERROR(nw.num("rendezvous_bytes", &c.network.rendezvous_bytes, 0, 1e15, false));
  // The collective model's optional keys (docs/simulator.md, "Collectives as NCCL runs them").
  if (nd.has("nvls")) {
    const json& v = nd.raw().at("nvls");
    if (!v.is_boolean()) return invalidArgument("{}: key 'node.nvls' = {} must be true or false", where, v.dump());
    c.node.nvls = v.get<bool>() ? 1 : 0;
  }
  if (nw.has("sharp")) {
    const json& v = nw.raw().at("sharp");
    if (!v.is_boolean()) return invalidArgument("{}: key 'network.sharp' = {} must be true or false", where, v.dump());
    c.network.sharp = v.get<bool>();
  }
  CHORUS_RETURN_IF_ERROR(nd.num("nvls_reduce_tflops", &c.node.nvls_reduce_tflops, 0, 1e6, false));
  CHORUS_RETURN_IF_ERROR(g.str("arch", &c.gpu.arch, false));
  if (!c.gpu.arch.empty() && c.gpu.arch != "volta" && c.gpu.arch != "ampere" && c.gpu.arch != "hopper" &&
      c.gpu.arch != "blackwell" && c.gpu.arch != "other")
    return invalidArgument("{}: key 'gpu.arch' = \"{}\" is not one of volta, ampere, hopper, blackwell, other", where,
                           c.gpu.arch);
  const bool torus = c.network.topology == TopologyKind::Torus2d || c.network.topology == TopologyKind::Torus3d;
  if (torus) {
    const size_t nd_want = c.network.topology == TopologyKind::Torus2d ? 2 : 3;
    if (!nw.has("dims") || !nw.raw().at("dims").is_array() || nw.raw().at("dims").size() != nd_want)
      return invalidArgument("{}: key 'network.dims' must be an array of {} node counts for a {}", where, nd_want, topo);
    int64_t prod = 1;
    for (size_t i = 0; i < nd_want; ++i) {
      const json& v = nw.raw().at("dims")[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 1)
        return invalidArgument("{}: key 'network.dims[{}]' = {} must be a positive integer", where, i, v.dump());
      c.network.dims[i] = v.get<int>();
      prod *= c.network.dims[i];
    }
    if (prod != c.nodes)
      return invalidArgument("{}: key 'network.dims' multiplies to {} but 'nodes' = {} (they must agree)", where, prod,
                             c.nodes);
  }
  if (c.network.topology == TopologyKind::Dragonfly && c.nodes % c.network.group_nodes != 0)
    return invalidArgument("{}: key 'nodes' = {} is not a multiple of 'network.group_nodes' = {}", where, c.nodes,
                           c.network.group_nodes);
  return c;
}

Result<ModelSpec> parseModel(std::string_view text, std::string_view where) {
  CHORUS_ASSIGN_OR_RETURN(json j, parseJson(text, where));
  Reader top(j, std::string(where));
  ModelSpec m;
  CHORUS_RETURN_IF_ERROR(top.str("name", &m.name));
  CHORUS_RETURN_IF_ERROR(top.integer("layers", &m.layers, 1, 1e5));
  CHORUS_RETURN_IF_ERROR(top.integer("hidden", &m.hidden, 1, 1e7));
  CHORUS_RETURN_IF_ERROR(top.integer("heads", &m.heads, 1, 1e5));
  m.kv_heads = m.heads;
  CHORUS_RETURN_IF_ERROR(top.integer("kv_heads", &m.kv_heads, 1, m.heads, false));
  CHORUS_RETURN_IF_ERROR(top.integer("ffn_hidden", &m.ffn_hidden, 1, 1e8));
  CHORUS_RETURN_IF_ERROR(top.integer("vocab", &m.vocab, 1, 1e8));
  std::string act = "gelu";
  CHORUS_RETURN_IF_ERROR(top.str("activation", &act, false));
  if (act == "gelu") m.activation = Activation::Gelu;
  else if (act == "swiglu") m.activation = Activation::SwiGlu;
  else return invalidArgument("{}: key 'activation' = \"{}\" is not one of gelu, swiglu", where, act);
  if (top.has("dropout")) {
    if (!top.raw().at("dropout").is_boolean())
      return invalidArgument("{}: key 'dropout' = {} must be true or false", where, top.raw().at("dropout").dump());
    m.dropout = top.raw().at("dropout").get<bool>();
  }
  if (m.hidden % m.heads != 0)
    return invalidArgument("{}: key 'hidden' = {} is not a multiple of 'heads' = {}", where, m.hidden, m.heads);
  if (m.heads % m.kv_heads != 0)
    return invalidArgument("{}: key 'heads' = {} is not a multiple of 'kv_heads' = {}", where, m.heads, m.kv_heads);
  if (top.has("mla")) {
    CHORUS_ASSIGN_OR_RETURN(Reader mla, top.object("mla"));
    CHORUS_RETURN_IF_ERROR(mla.integer("q_lora_rank", &m.mla.q_lora_rank, 0, 1e6, false));
    CHORUS_RETURN_IF_ERROR(mla.integer("kv_lora_rank", &m.mla.kv_lora_rank, 1, 1e6));
    CHORUS_RETURN_IF_ERROR(mla.integer("qk_nope_head_dim", &m.mla.qk_nope_head_dim, 1, 1e5));
    CHORUS_RETURN_IF_ERROR(mla.integer("qk_rope_head_dim", &m.mla.qk_rope_head_dim, 0, 1e5));
    CHORUS_RETURN_IF_ERROR(mla.integer("v_head_dim", &m.mla.v_head_dim, 1, 1e5));
    if (m.kv_heads != m.heads)
      return invalidArgument("{}: 'mla' needs kv_heads = heads (every head has its own K and V from the latent)", where);
  }
  if (top.has("moe")) {
    CHORUS_ASSIGN_OR_RETURN(Reader moe, top.object("moe"));
    CHORUS_RETURN_IF_ERROR(moe.integer("experts", &m.moe.experts, 1, 1e5));
    CHORUS_RETURN_IF_ERROR(moe.integer("top_k", &m.moe.top_k, 1, m.moe.experts));
    CHORUS_RETURN_IF_ERROR(moe.integer("expert_ffn_hidden", &m.moe.expert_ffn_hidden, 1, 1e8));
    CHORUS_RETURN_IF_ERROR(moe.integer("shared_experts", &m.moe.shared_experts, 0, 1e3, false));
    CHORUS_RETURN_IF_ERROR(moe.integer("dense_layers", &m.moe.dense_layers, 0, m.layers, false));
  }
  return m;
}

Result<ClusterSpec> loadCluster(const std::string& path) {
  CHORUS_ASSIGN_OR_RETURN(std::string text, readFile(path));
  return parseCluster(text, path);
}
Result<ModelSpec> loadModel(const std::string& path) {
  CHORUS_ASSIGN_OR_RETURN(std::string text, readFile(path));
  return parseModel(text, path);
}

double ModelSpec::qkHeadDim() const {
  return hasMla() ? static_cast<double>(mla.qk_nope_head_dim + mla.qk_rope_head_dim) : static_cast<double>(headDim());
}
double ModelSpec::vHeadDim() const {
  return hasMla() ? static_cast<double>(mla.v_head_dim) : static_cast<double>(headDim());
}

// MHA/GQA: Q and O are h x h; K and V are h x (kv_heads * head_dim).  MLA:
// Q = h x q_lora (+ its norm) then q_lora x heads*qk (or h x heads*qk); the
// KV latent and rotary key h x (kv_lora + rope) (+ the latent's norm), then
// kv_lora x heads*(nope + v); O is heads*v x h.
double ModelSpec::attnParams() const {
  return attnInParams() + static_cast<double>(heads) * vHeadDim() * static_cast<double>(hidden);
}
double ModelSpec::attnInParams() const {
  const double h = static_cast<double>(hidden), a = static_cast<double>(heads);
  if (!hasMla()) return h * h + 2 * h * static_cast<double>(kv_heads) * static_cast<double>(headDim());
  const double ql = static_cast<double>(mla.q_lora_rank), kl = static_cast<double>(mla.kv_lora_rank);
  const double q = ql > 0 ? h * ql + ql + ql * a * qkHeadDim() : h * a * qkHeadDim();
  const double kv = h * (kl + static_cast<double>(mla.qk_rope_head_dim)) + kl +
                    kl * a * static_cast<double>(mla.qk_nope_head_dim + mla.v_head_dim);
  return q + kv;
}
double ModelSpec::kvWidth() const {
  if (!hasMla()) return 2.0 * static_cast<double>(kv_heads) * static_cast<double>(headDim());
  return static_cast<double>(heads) * (qkHeadDim() + vHeadDim());
}
double ModelSpec::qkvWidth() const { return static_cast<double>(heads) * qkHeadDim() + kvWidth(); }
double ModelSpec::kvSplit(double tp) const { return hasMla() ? tp : std::min(tp, static_cast<double>(kv_heads)); }
double ModelSpec::kvCacheElems() const {
  return hasMla() ? static_cast<double>(mla.kv_lora_rank + mla.qk_rope_head_dim) : kvWidth();
}
double ModelSpec::kvCacheSplit(double tp) const { return hasMla() ? 1.0 : kvSplit(tp); }

// FFN: gelu has two h x f matrices, swiglu three.  Two layer norms of 2h each.
double ModelSpec::layerParams(int layer) const {
  const double h = static_cast<double>(hidden);
  const double attn = attnParams() + 4 * h;
  const double mats = activation == Activation::SwiGlu ? 3 : 2;
  if (moe.experts == 0 || layer < moe.dense_layers) return attn + mats * h * static_cast<double>(ffn_hidden);
  const double expert = mats * h * static_cast<double>(moe.expert_ffn_hidden);
  return attn + expert * (moe.experts + moe.shared_experts) + h * moe.experts;  // + router
}

double ModelSpec::params() const {
  double p = 2.0 * static_cast<double>(vocab) * static_cast<double>(hidden);  // untied input and output embeddings
  for (int l = 0; l < layers; ++l) p += layerParams(l);
  return p;
}

double ModelSpec::activeParams() const {
  if (moe.experts == 0) return params();
  const double h = static_cast<double>(hidden);
  const double mats = activation == Activation::SwiGlu ? 3 : 2;
  const double idle = mats * h * static_cast<double>(moe.expert_ffn_hidden) * (moe.experts - moe.top_k);
  return params() - idle * (layers - moe.dense_layers);
}

}  // namespace chorus::sim

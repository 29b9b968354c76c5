#include "sim/config.hpp"

#include "sim/nccl_topo.hpp"

#include <cctype>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace chorus::sim {
namespace {

using nlohmann::json;

size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) == std::tolower(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (same ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

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
  Status boolean(std::string_view k, bool* out) const {
    if (!j_.contains(k)) return {};
    const json& v = j_.at(std::string(k));
    if (!v.is_boolean()) return invalidArgument("{}: key '{}' = {} must be true or false", where_, key(k), v.dump());
    *out = v.get<bool>();
    return {};
  }
  // Every key of this object must be one of `valid`; an unknown one is an
  // error naming it and the nearest valid key (a misspelling would otherwise
  // leave a default in place without a word).
  Status onlyKeys(const std::vector<std::string_view>& valid) const {
    for (const auto& [k, v] : j_.items()) {
      if (std::find(valid.begin(), valid.end(), k) != valid.end()) continue;
      const std::string near = nearestKey(k, valid);
      std::string all;
      for (std::string_view x : valid) all += (all.empty() ? "" : ", ") + std::string(x);
      if (!near.empty())
        return invalidArgument("{}: unknown key '{}' (did you mean '{}'?)", where_, key(k), key(near));
      return invalidArgument("{}: unknown key '{}' (valid here: {})", where_, key(k), all);
    }
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

size_t keyDistance(std::string_view a, std::string_view b) { return editDistance(a, b); }

std::string nearestKey(std::string_view key, const std::vector<std::string_view>& valid) {
  std::string best;
  size_t best_d = std::max<size_t>(2, (key.size() + 1) / 2) + 1;  // farther than half the key: no suggestion
  for (std::string_view v : valid) {
    const size_t d = editDistance(key, v);
    if (d < best_d) best_d = d, best = std::string(v);
  }
  return best;
}

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
  // "calibration": the measurements a calibrated file was derived from (python -m chorus.examples.calibrate,
  // docs/simulator.md "Calibrating a CPU cluster"): provenance for its reader, not read here.
  CHORUS_RETURN_IF_ERROR(top.onlyKeys({"name", "nodes", "gpu", "node", "network", "node_topo", "calibration", "host"}));
  CHORUS_RETURN_IF_ERROR(top.str("name", &c.name));
  std::string node_topo;  // loadCluster applies it (it names a file relative to the cluster file)
  CHORUS_RETURN_IF_ERROR(top.str("node_topo", &node_topo, false));
  CHORUS_RETURN_IF_ERROR(top.integer("nodes", &c.nodes, 1, 1 << 20));

  CHORUS_ASSIGN_OR_RETURN(Reader g, top.object("gpu"));
  CHORUS_RETURN_IF_ERROR(g.onlyKeys({"name", "peak_tflops", "fp8_tflops", "hbm_gib", "hbm_gbyte_s", "gemm_efficiency",
                                     "gemm_half_size", "hbm_efficiency", "kernel_overhead_us", "comm_sm_fraction", "sms", "arch"}));
  CHORUS_RETURN_IF_ERROR(g.str("name", &c.gpu.name));
  CHORUS_RETURN_IF_ERROR(g.num("peak_tflops", &d, 1e-6, 1e6));  // a loaded CPU rank: below 1 GFLOP/s
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
  CHORUS_RETURN_IF_ERROR(nd.onlyKeys({"gpus", "nvlink_gbyte_s", "nvlink_latency_us", "nvlink_efficiency", "nvls",
                                      "nvls_reduce_tflops", "mesh", "peer_gbyte_s", "peer_links", "cpu_cores",
                                      "cpu_capacity"}));
  CHORUS_RETURN_IF_ERROR(nd.integer("gpus", &c.node.gpus, 1, 4096));
  CHORUS_RETURN_IF_ERROR(nd.num("nvlink_gbyte_s", &d, 1e-3, 1e6));
  c.node.nvlink_bw = gbytePerS(d);
  CHORUS_RETURN_IF_ERROR(nd.num("nvlink_latency_us", &d, 0, 1e6));
  c.node.nvlink_latency = us(d);
  CHORUS_RETURN_IF_ERROR(nd.num("nvlink_efficiency", &c.node.nvlink_efficiency, 0.01, 1, false));
  // CPU ranks (issue 35): the host's cores and the framework's host time per layer pass.
  CHORUS_RETURN_IF_ERROR(nd.integer("cpu_cores", &c.node.cpu_cores, 0, 1 << 20, false));
  CHORUS_RETURN_IF_ERROR(nd.num("cpu_capacity", &c.node.cpu_capacity, 0, 1 << 20, false));
  if (top.has("host")) {
    CHORUS_ASSIGN_OR_RETURN(Reader hs, top.object("host"));
    CHORUS_RETURN_IF_ERROR(hs.onlyKeys({"layer_fwd_us", "layer_bwd_us", "head_fwd_us", "head_bwd_us", "step_layer_us"}));
    for (auto [key, dst] : {std::pair{"layer_fwd_us", &c.host.layer_fwd}, {"layer_bwd_us", &c.host.layer_bwd},
                            {"head_fwd_us", &c.host.head_fwd}, {"head_bwd_us", &c.host.head_bwd},
                            {"step_layer_us", &c.host.step_layer}}) {
      d = 0;
      CHORUS_RETURN_IF_ERROR(hs.num(key, &d, 0, 1e7, false));
      *dst = us(d);
    }
  }

  CHORUS_ASSIGN_OR_RETURN(Reader nw, top.object("network"));
  CHORUS_RETURN_IF_ERROR(nw.onlyKeys({"topology", "nics_per_node", "nic_gbit_s", "latency_us", "oversubscription",
                                      "efficiency", "leaf_nodes", "group_nodes", "rendezvous_bytes", "dims", "sharp",
                                      "pxn"}));
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
  if (nw.has("pxn")) {
    const json& v = nw.raw().at("pxn");
    if (!v.is_boolean()) return invalidArgument("{}: key 'network.pxn' = {} must be true or false", where, v.dump());
    c.network.pxn = v.get<bool>() ? 1 : 0;
  }
  CHORUS_RETURN_IF_ERROR(nd.num("nvls_reduce_tflops", &c.node.nvls_reduce_tflops, 0, 1e6, false));
  // A mesh node (NodeSpec::mesh): "mesh": true, and/or the per-pair rate.
  CHORUS_RETURN_IF_ERROR(nd.boolean("mesh", &c.node.mesh));
  d = 0;
  CHORUS_RETURN_IF_ERROR(nd.num("peer_gbyte_s", &d, 1e-3, 1e6, false));
  if (nd.has("peer_gbyte_s")) {
    if (nd.has("mesh") && !c.node.mesh)
      return invalidArgument("{}: key 'node.peer_gbyte_s' is a mesh node's per-pair rate, but 'node.mesh' is false", where);
    c.node.mesh = true;
    c.node.peer_bw = gbytePerS(d);
  }
  // A partial or uneven mesh: "peer_links": [[a, b, count], ...], each entry
  // `count` links between local GPUs a and b (both directions), each at
  // peer_gbyte_s; pairs not listed have no direct link.
  if (nd.has("peer_links")) {
    const json& v = nd.raw().at("peer_links");
    if (!nd.has("peer_gbyte_s"))
      return invalidArgument("{}: key 'node.peer_links' needs 'node.peer_gbyte_s' (the rate of one link)", where);
    if (c.node.gpus > NodeSpec::kMaxPartialMeshGpus)
      return invalidArgument("{}: key 'node.peer_links' on a node of {} GPUs: at most {}", where, c.node.gpus,
                             NodeSpec::kMaxPartialMeshGpus);
    if (!v.is_array() || v.empty() || v.size() > 65536)
      return invalidArgument("{}: key 'node.peer_links' must be a list of 1 to 65536 [a, b, count] entries", where);
    const auto n = static_cast<size_t>(c.node.gpus);
    c.node.pair_links.assign(n * n, 0);
    for (size_t i = 0; i < v.size(); ++i) {
      const json& e = v[i];
      const bool ok = e.is_array() && e.size() == 3 && e[0].is_number_integer() && e[1].is_number_integer() &&
                      e[2].is_number_integer();
      const int64_t a = ok ? e[0].get<int64_t>() : -1, b = ok ? e[1].get<int64_t>() : -1,
                    k = ok ? e[2].get<int64_t>() : 0;
      if (!ok || a < 0 || b < 0 || a >= c.node.gpus || b >= c.node.gpus || a == b || k < 1 || k > 1024)
        return invalidArgument("{}: key 'node.peer_links' entry {} = {}: must be [a, b, count] with a != b in [0, {}) "
                               "and count in [1, 1024]", where, i, e.dump(), c.node.gpus);
      int& ab = c.node.pair_links[static_cast<size_t>(a) * n + static_cast<size_t>(b)];
      if (ab != 0)
        return invalidArgument("{}: key 'node.peer_links' entry {} = {}: GPUs {} and {} are listed twice", where, i,
                               e.dump(), a, b);
      ab = static_cast<int>(k);
      c.node.pair_links[static_cast<size_t>(b) * n + static_cast<size_t>(a)] = static_cast<int>(k);
    }
  }
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

Result<ModelSpec> parseModel(std::string_view text, std::string_view where, std::string_view name,
                             bool allow_unknown_keys) {
  CHORUS_ASSIGN_OR_RETURN(json j, parseJson(text, where));
  if (j.contains("model_type") || j.contains("architectures"))
    return parseHfModel(text, where, name, allow_unknown_keys);
  Reader top(j, std::string(where));
  ModelSpec m;
  m.source = "chorus";
  CHORUS_RETURN_IF_ERROR(top.onlyKeys({"name", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab",
                                       "activation", "dropout", "tie_embeddings", "qkv_bias", "o_bias", "window",
                                       "weight_bytes", "expert_weight_bytes", "mtp_layers", "mla", "moe", "dtype"}));
  CHORUS_RETURN_IF_ERROR(top.str("name", &m.name));
  CHORUS_RETURN_IF_ERROR(top.integer("layers", &m.layers, 1, 1e5));
  CHORUS_RETURN_IF_ERROR(top.integer("hidden", &m.hidden, 1, 1e7));
  CHORUS_RETURN_IF_ERROR(top.integer("heads", &m.heads, 1, 1e5));
  m.kv_heads = m.heads;
  CHORUS_RETURN_IF_ERROR(top.integer("kv_heads", &m.kv_heads, 1, m.heads, false));
  CHORUS_RETURN_IF_ERROR(top.integer("head_dim", &m.head_dim, 1, 1e5, false));
  CHORUS_RETURN_IF_ERROR(top.integer("ffn_hidden", &m.ffn_hidden, 1, 1e8));
  CHORUS_RETURN_IF_ERROR(top.integer("vocab", &m.vocab, 1, 1e8));
  std::string act = "gelu";
  CHORUS_RETURN_IF_ERROR(top.str("activation", &act, false));
  if (act == "gelu") m.activation = Activation::Gelu;
  else if (act == "swiglu" || act == "geglu") m.activation = Activation::SwiGlu;
  else return invalidArgument("{}: key 'activation' = \"{}\" is not one of gelu, swiglu, geglu", where, act);
  m.activation_name = act;
  CHORUS_RETURN_IF_ERROR(top.boolean("dropout", &m.dropout));
  CHORUS_RETURN_IF_ERROR(top.boolean("tie_embeddings", &m.tie_embeddings));
  CHORUS_RETURN_IF_ERROR(top.boolean("qkv_bias", &m.qkv_bias));
  CHORUS_RETURN_IF_ERROR(top.boolean("o_bias", &m.o_bias));
  CHORUS_RETURN_IF_ERROR(top.num("weight_bytes", &m.weight_bytes, 0.0625, 8, false));
  CHORUS_RETURN_IF_ERROR(top.num("expert_weight_bytes", &m.expert_weight_bytes, 0.0625, 8, false));
  m.weight_format = m.weight_bytes == 2 ? "bf16" : m.weight_bytes == 1 ? "fp8" : fmt::format("{} B/param", m.weight_bytes);
  CHORUS_RETURN_IF_ERROR(top.integer("mtp_layers", &m.mtp_layers, 0, 64, false));
  std::string dtype = "bf16";  // the training job's activation / gradient element (issue 35)
  CHORUS_RETURN_IF_ERROR(top.str("dtype", &dtype, false));
  if (dtype == "bf16" || dtype == "fp16") m.act_bytes = 2;
  else if (dtype == "fp32" || dtype == "float32") m.act_bytes = 4;
  else return invalidArgument("{}: key 'dtype' = \"{}\" is not one of bf16, fp16, fp32", where, dtype);
  if (m.head_dim == 0 && m.hidden % m.heads != 0)
    return invalidArgument("{}: key 'hidden' = {} is not a multiple of 'heads' = {} (set 'head_dim' if the heads are "
                           "not hidden / heads wide)", where, m.hidden, m.heads);
  if (m.heads % m.kv_heads != 0)
    return invalidArgument("{}: key 'heads' = {} is not a multiple of 'kv_heads' = {}", where, m.heads, m.kv_heads);
  if (top.has("window")) {
    CHORUS_ASSIGN_OR_RETURN(Reader w, top.object("window"));
    CHORUS_RETURN_IF_ERROR(w.onlyKeys({"size", "layers", "pattern"}));
    CHORUS_RETURN_IF_ERROR(w.integer("size", &m.window, 1, 1e9));
    if (w.has("layers") && w.has("pattern"))
      return invalidArgument("{}: 'window' takes 'layers' or 'pattern', not both", where);
    if (w.has("layers")) {
      const json& v = w.raw().at("layers");
      if (!v.is_array()) return invalidArgument("{}: key 'window.layers' = {} must be an array of layer indices", where, v.dump());
      m.window_layers.assign(static_cast<size_t>(m.layers), false);
      for (const json& e : v) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= m.layers)
          return invalidArgument("{}: key 'window.layers' has {}, not a layer index in [0, {}]", where, e.dump(), m.layers - 1);
        m.window_layers[e.get<size_t>()] = true;
      }
    }
    if (w.has("pattern")) {
      const json& v = w.raw().at("pattern");
      if (!v.is_array() || v.empty())
        return invalidArgument("{}: key 'window.pattern' = {} must be a non-empty array of \"sliding\" / \"full\", repeated over the layers",
                               where, v.dump());
      std::vector<bool> pat;
      for (const json& e : v) {
        if (!e.is_string() || (e.get<std::string>() != "sliding" && e.get<std::string>() != "full"))
          return invalidArgument("{}: key 'window.pattern' has {}, not \"sliding\" or \"full\"", where, e.dump());
        pat.push_back(e.get<std::string>() == "sliding");
      }
      for (int l = 0; l < m.layers; ++l) m.window_layers.push_back(pat[static_cast<size_t>(l) % pat.size()]);
    }
  }
  if (top.has("mla")) {
    CHORUS_ASSIGN_OR_RETURN(Reader mla, top.object("mla"));
    CHORUS_RETURN_IF_ERROR(mla.onlyKeys({"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"}));
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
    CHORUS_RETURN_IF_ERROR(moe.onlyKeys({"experts", "top_k", "expert_ffn_hidden", "shared_experts",
                                         "shared_expert_ffn_hidden", "dense_layers", "sparse_step", "dense_layer_list",
                                         "n_group", "topk_group"}));
    CHORUS_RETURN_IF_ERROR(moe.integer("experts", &m.moe.experts, 1, 1e5));
    CHORUS_RETURN_IF_ERROR(moe.integer("top_k", &m.moe.top_k, 1, m.moe.experts));
    CHORUS_RETURN_IF_ERROR(moe.integer("expert_ffn_hidden", &m.moe.expert_ffn_hidden, 1, 1e8));
    CHORUS_RETURN_IF_ERROR(moe.integer("shared_experts", &m.moe.shared_experts, 0, 1e3, false));
    CHORUS_RETURN_IF_ERROR(moe.integer("shared_expert_ffn_hidden", &m.moe.shared_expert_ffn_hidden, 1, 1e8, false));
    CHORUS_RETURN_IF_ERROR(moe.integer("dense_layers", &m.moe.dense_layers, 0, m.layers, false));
    CHORUS_RETURN_IF_ERROR(moe.integer("sparse_step", &m.moe.sparse_step, 1, m.layers, false));
    CHORUS_RETURN_IF_ERROR(moe.integer("n_group", &m.moe.n_group, 0, m.moe.experts, false));
    CHORUS_RETURN_IF_ERROR(moe.integer("topk_group", &m.moe.topk_group, 0, std::max(m.moe.n_group, 0), false));
    if (m.moe.n_group > 0 && m.moe.experts % m.moe.n_group != 0)
      return invalidArgument("{}: key 'moe.n_group' = {} does not divide 'moe.experts' = {}", where, m.moe.n_group, m.moe.experts);
    if (moe.has("dense_layer_list")) {
      const json& v = moe.raw().at("dense_layer_list");
      if (!v.is_array()) return invalidArgument("{}: key 'moe.dense_layer_list' = {} must be an array of layer indices", where, v.dump());
      for (const json& e : v) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= m.layers)
          return invalidArgument("{}: key 'moe.dense_layer_list' has {}, not a layer index in [0, {}]", where, e.dump(), m.layers - 1);
        m.moe.dense_list.push_back(e.get<int>());
      }
    }
    if (m.moeLayers() == 0)
      return invalidArgument("{}: 'moe' leaves no layer with experts (dense_layers = {}, sparse_step = {})", where,
                             m.moe.dense_layers, m.moe.sparse_step);
  }
  return m;
}

Result<ClusterSpec> loadCluster(const std::string& path) {
  CHORUS_ASSIGN_OR_RETURN(std::string text, readFile(path));
  CHORUS_ASSIGN_OR_RETURN(ClusterSpec c, parseCluster(text, path));
  // "node_topo": an NCCL topology file (relative to the cluster file's
  // directory) whose node replaces the fields it gives, as --node-topo does
  // (sim/nccl_topo.hpp); the cluster's name then says so.
  const json j = json::parse(text, nullptr, false);
  const auto it = j.is_object() ? j.find("node_topo") : j.end();
  if (!j.is_object() || it == j.end() || !it->is_string()) return c;  // parseCluster checked the type
  namespace fs = std::filesystem;
  fs::path topo(it->get<std::string>());
  if (topo.is_relative()) topo = fs::path(path).parent_path() / topo;
  auto t = loadNodeTopo(topo.string());
  if (!t.isOk()) return invalidArgument("{}: node_topo: {}", path, t.status().message());
  return applyNodeTopo(c, *t, topo.string());
}
Result<ModelSpec> loadModel(const std::string& path, bool allow_unknown_keys) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string file = path;
  std::string name;
  if (fs::is_directory(path, ec)) {
    file = (fs::path(path) / "config.json").string();
    if (!fs::exists(file, ec))
      return invalidArgument("--model '{}' is a directory without a config.json (a Hugging Face model directory "
                             "holds one)", path);
  }
  // A Hugging Face config has no name: use its directory's (the repository's) name.
  const fs::path parent = fs::absolute(fs::path(file), ec).parent_path();
  if (fs::path(file).filename() == "config.json" && !parent.filename().empty()) name = parent.filename().string();
  CHORUS_ASSIGN_OR_RETURN(std::string text, readFile(file));
  return parseModel(text, file, name, allow_unknown_keys);
}

bool ModelSpec::isMoeLayer(int layer) const {
  if (moe.experts == 0 || layer < moe.dense_layers) return false;
  if (std::find(moe.dense_list.begin(), moe.dense_list.end(), layer) != moe.dense_list.end()) return false;
  const int step = std::max(moe.sparse_step, 1);
  return moe.step_from_zero ? layer % step == 0 : (layer + 1) % step == 0;
}
int ModelSpec::moeLayers() const {
  int n = 0;
  for (int l = 0; l < layers; ++l) n += isMoeLayer(l) ? 1 : 0;
  return n;
}
bool ModelSpec::isWindowLayer(int layer) const {
  if (window <= 0) return false;
  if (window_layers.empty()) return true;
  return layer >= 0 && static_cast<size_t>(layer) < window_layers.size() && window_layers[static_cast<size_t>(layer)];
}
double ModelSpec::attendedTokens(int layer, double ctx) const {
  return isWindowLayer(layer) ? std::min(ctx, static_cast<double>(window)) : ctx;
}

double ModelSpec::qkHeadDim() const {
  return hasMla() ? static_cast<double>(mla.qk_nope_head_dim + mla.qk_rope_head_dim) : static_cast<double>(headDim());
}
double ModelSpec::vHeadDim() const {
  return hasMla() ? static_cast<double>(mla.v_head_dim) : static_cast<double>(headDim());
}

// MHA/GQA: Q is h x (heads * head_dim), K and V h x (kv_heads * head_dim), O
// (heads * head_dim) x h (+ their biases where the model has them).  MLA:
// Q = h x q_lora (+ its norm) then q_lora x heads*qk (or h x heads*qk); the
// KV latent and rotary key h x (kv_lora + rope) (+ the latent's norm), then
// kv_lora x heads*(nope + v); O is heads*v x h.
double ModelSpec::attnParams() const {
  return attnInParams() + static_cast<double>(heads) * vHeadDim() * static_cast<double>(hidden) +
         (o_bias ? static_cast<double>(hidden) : 0);
}
double ModelSpec::attnInParams() const {
  const double h = static_cast<double>(hidden), a = static_cast<double>(heads);
  if (!hasMla()) {
    const double q = a * static_cast<double>(headDim()), kv = 2.0 * static_cast<double>(kv_heads) * static_cast<double>(headDim());
    return h * (q + kv) + (qkv_bias ? q + kv : 0);
  }
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

double ModelSpec::sharedFfn() const {
  const int64_t w = moe.shared_expert_ffn_hidden > 0 ? moe.shared_expert_ffn_hidden : moe.expert_ffn_hidden;
  return static_cast<double>(moe.shared_experts) * static_cast<double>(w);
}
double ModelSpec::ffnPerToken(int layer) const {
  if (!isMoeLayer(layer)) return static_cast<double>(ffn_hidden);
  return static_cast<double>(moe.expert_ffn_hidden) * moe.top_k + sharedFfn();
}
double ModelSpec::expertParams() const { return ffnMats() * static_cast<double>(hidden) * static_cast<double>(moe.expert_ffn_hidden); }

// FFN: gelu has two h x f matrices, swiglu three.  Two layer norms of 2h each.
// An MoE layer: its routed experts, its shared experts and the h x experts router.
double ModelSpec::layerParams(int layer) const {
  const double h = static_cast<double>(hidden);
  const double attn = attnParams() + 4 * h;
  if (!isMoeLayer(layer)) return attn + ffnMats() * h * static_cast<double>(ffn_hidden);
  return attn + layerExpertParams(layer) + h * moe.experts;  // + router
}
double ModelSpec::layerExpertParams(int layer) const {
  if (!isMoeLayer(layer)) return 0;
  return expertParams() * moe.experts + ffnMats() * static_cast<double>(hidden) * sharedFfn();
}
double ModelSpec::embeddingParams() const {
  return (tie_embeddings ? 1.0 : 2.0) * static_cast<double>(vocab) * static_cast<double>(hidden);
}

double ModelSpec::params() const {
  double p = embeddingParams();  // input embedding and output head (once when tied)
  for (int l = 0; l < layers; ++l) p += layerParams(l);
  return p;
}

double ModelSpec::activeParams() const {
  if (moe.experts == 0) return params();
  const double idle = expertParams() * (moe.experts - moe.top_k);
  return params() - idle * moeLayers();
}
double ModelSpec::activeMatmulParams() const {
  return activeParams() - (tie_embeddings ? 0.0 : static_cast<double>(vocab) * static_cast<double>(hidden));
}
double ModelSpec::mtpParams() const {
  if (mtp_layers == 0) return 0;
  const double h = static_cast<double>(hidden);
  // One layer like the last (DeepSeek-V3: an MoE layer), the 2h -> h
  // projection of [embedding; hidden state] and its two input norms.
  return mtp_layers * (layerParams(layers) + 2 * h * h + 2 * h);
}
double ModelSpec::layerWeightBytes(int layer) const {
  const double e = layerExpertParams(layer);
  return (layerParams(layer) - e) * weight_bytes + e * expertWeightBytes();
}
double ModelSpec::weightBytes() const {
  double b = embeddingParams() * 2;
  for (int l = 0; l < layers; ++l) b += layerWeightBytes(l);
  return b;
}

}  // namespace chorus::sim

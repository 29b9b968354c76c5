#include "sim/compute.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

namespace chorus::sim {
namespace {

using nlohmann::json;

Status need(const json& j, std::string_view where, const char* key, double* out, double lo, double hi) {
  if (!j.contains(key)) return invalidArgument("{}: missing required key '{}'", where, key);
  const json& v = j.at(key);
  if (!v.is_number()) return invalidArgument("{}: key '{}' = {} must be a number", where, key, v.dump());
  const double d = v.get<double>();
  if (!(d >= lo && d <= hi)) return invalidArgument("{}: key '{}' = {} is out of range [{}, {}]", where, key, v.dump(), lo, hi);
  *out = d;
  return {};
}

Result<std::vector<AttentionPoint>> points(const json& a, std::string_view where, const char* key) {
  std::vector<AttentionPoint> out;
  if (!a.contains(key) || !a.at(key).is_array() || a.at(key).empty())
    return invalidArgument("{}: key 'attention.{}' must be a non-empty array of points", where, key);
  for (const json& p : a.at(key)) {
    AttentionPoint q;
    const std::string w = fmt::format("{} (attention.{}[{}])", where, key, out.size());
    CHORUS_RETURN_IF_ERROR(need(p, w, "head_dim", &q.head_dim, 1, 4096));
    CHORUS_RETURN_IF_ERROR(need(p, w, "efficiency", &q.efficiency, 1e-3, 1));
    CHORUS_RETURN_IF_ERROR(need(p, w, "seq_half", &q.seq_half, 0, 1e7));
    if (!p.contains("causal") || !p.at("causal").is_boolean())
      return invalidArgument("{}: key 'causal' must be true or false", w);
    q.causal = p.at("causal").get<bool>();
    out.push_back(q);
  }
  return out;
}

// Efficiency at head dim d: linear in log2(d) between the points of the
// mask (the other mask's points when it has none), clamped at the ends.
double attnEfficiency(const std::vector<AttentionPoint>& all, double d, bool causal, double keys) {
  std::vector<AttentionPoint> pts;
  for (const AttentionPoint& p : all)
    if (p.causal == causal) pts.push_back(p);
  if (pts.empty()) pts = all;
  std::sort(pts.begin(), pts.end(), [](const AttentionPoint& a, const AttentionPoint& b) { return a.head_dim < b.head_dim; });
  auto at = [&](const AttentionPoint& p) { return p.efficiency * keys / (keys + p.seq_half); };
  if (d <= pts.front().head_dim) return at(pts.front());
  if (d >= pts.back().head_dim) return at(pts.back());
  for (size_t i = 1; i < pts.size(); ++i)
    if (d <= pts[i].head_dim) {
      const double x = (std::log2(d) - std::log2(pts[i - 1].head_dim)) / (std::log2(pts[i].head_dim) - std::log2(pts[i - 1].head_dim));
      return at(pts[i - 1]) * (1 - x) + at(pts[i]) * x;
    }
  return at(pts.back());
}

Result<AttentionKernel> attentionKernel(const json& a, std::string_view where) {
  AttentionKernel k;
  for (auto [key, out] : {std::pair{"name", &k.name}, std::pair{"kernel", &k.kernel}}) {
    if (!a.contains(key) || !a.at(key).is_string() || a.at(key).get<std::string>().empty() ||
        a.at(key).get<std::string>().size() > 64)
      return invalidArgument("{}: key '{}' must be a string of 1..64 characters", where, key);
    *out = a.at(key).get<std::string>();
  }
  CHORUS_ASSIGN_OR_RETURN(k.fwd, points(a, where, "forward"));
  CHORUS_ASSIGN_OR_RETURN(k.bwd, points(a, where, "backward"));
  double d = 0;
  CHORUS_RETURN_IF_ERROR(need(a, fmt::format("{} (attention)", where), "fixed_us", &d, 0, 1e4));
  k.fixed = us(d);
  return k;
}

}  // namespace

Result<ComputeSpec> parseComputeSpec(std::string_view text, std::string_view where) {
  json j = json::parse(text, nullptr, false, true);
  if (j.is_discarded() || !j.is_object()) return invalidArgument("{}: not a JSON object", where);
  ComputeSpec s;
  s.file = std::string(where);
  if (!j.contains("arch") || !j.at("arch").is_string()) return invalidArgument("{}: key 'arch' must be a string", where);
  s.arch = j.at("arch").get<std::string>();
  double d = 0;
  CHORUS_RETURN_IF_ERROR(need(j, where, "sms", &d, 1, 1e5));
  s.sms = static_cast<int>(d);
  // Optional: the tensor-core rate a power-saturated GPU sustains over the
  // one its short benchmarks (the GEMM and attention fits) reach.
  if (j.contains("sustained_clock_ratio")) CHORUS_RETURN_IF_ERROR(need(j, where, "sustained_clock_ratio", &s.sustained, 0.1, 1));
  if (j.contains("gemm")) {
    if (!j.at("gemm").is_object()) return invalidArgument("{}: key 'gemm' must be an object", where);
    s.has_gemm = true;
    const json& g = j.at("gemm");
    const std::string gw = fmt::format("{} (gemm)", where);
    if (!g.contains("tiles") || !g.at("tiles").is_array() || g.at("tiles").empty())
      return invalidArgument("{}: key 'tiles' must be a non-empty array of [m, n]", gw);
    for (const json& t : g.at("tiles")) {
      if (!t.is_array() || t.size() != 2 || !t[0].is_number() || !t[1].is_number() || t[0].get<double>() < 1 ||
          t[1].get<double>() < 1)
        return invalidArgument("{}: tile {} must be [m, n] with positive sizes", gw, t.dump());
      s.tiles.emplace_back(t[0].get<double>(), t[1].get<double>());
    }
    CHORUS_RETURN_IF_ERROR(need(g, gw, "split_k_min", &s.split_k_min, 1, 1e6));
    CHORUS_RETURN_IF_ERROR(need(g, gw, "efficiency_bf16", &s.eff16, 1e-3, 1));
    CHORUS_RETURN_IF_ERROR(need(g, gw, "efficiency_fp8", &s.eff8, 0, 1));
    CHORUS_RETURN_IF_ERROR(need(g, gw, "k_half_bf16", &s.k_half16, 0, 1e6));
    CHORUS_RETURN_IF_ERROR(need(g, gw, "k_half_fp8", &s.k_half8, 0, 1e6));
    CHORUS_RETURN_IF_ERROR(need(g, gw, "fixed_us", &d, 0, 1e4));
    s.gemm_fixed = us(d);
    // Optional: the largest fraction of the bf16 peak any GEMM shape was
    // measured to reach (a search over shapes); the fitted curve may not
    // exceed it for shapes outside its fit's range.
    if (g.contains("max_efficiency_bf16")) CHORUS_RETURN_IF_ERROR(need(g, gw, "max_efficiency_bf16", &s.cap16, 1e-3, 1));
    if (g.contains("max_efficiency_fp8")) CHORUS_RETURN_IF_ERROR(need(g, gw, "max_efficiency_fp8", &s.cap8, 1e-3, 1));
  }
  if (!j.contains("attention") || !j.at("attention").is_object()) return invalidArgument("{}: missing object 'attention'", where);
  CHORUS_ASSIGN_OR_RETURN(AttentionKernel def, attentionKernel(j.at("attention"), where));
  s.attention.push_back(std::move(def));
  if (j.contains("attention_kernels")) {
    const json& alt = j.at("attention_kernels");
    if (!alt.is_object()) return invalidArgument("{}: key 'attention_kernels' must be an object of kernels by name", where);
    for (const auto& [key, k] : alt.items()) {
      if (!k.is_object()) return invalidArgument("{}: attention_kernels.{} must be an object", where, key);
      CHORUS_ASSIGN_OR_RETURN(AttentionKernel ak, attentionKernel(k, fmt::format("{} (attention_kernels.{})", where, key)));
      if (ak.name != key) return invalidArgument("{}: attention_kernels.{} is named '{}'", where, key, ak.name);
      if (s.attentionKernel(ak.name)) return invalidArgument("{}: attention kernel '{}' twice", where, ak.name);
      s.attention.push_back(std::move(ak));
    }
  }
  return s;
}

const AttentionKernel* ComputeSpec::attentionKernel(std::string_view name) const {
  if (attention.empty()) return nullptr;
  if (name.empty()) return &attention.front();
  for (const AttentionKernel& k : attention)
    if (k.name == name) return &k;
  return nullptr;
}

std::string ComputeSpec::attentionKernelNames() const {
  std::string out;
  for (const AttentionKernel& k : attention) out += (out.empty() ? "" : ", ") + k.name;
  return out;
}

Status checkAttentionKernel(const GpuSpec& g, std::string_view name, std::string_view flag) {
  if (name.empty()) return {};
  const ComputeSpec* s = computeSpecFor(g);
  if (!s) return invalidArgument("{} {}: GPU '{}' has no per-operator data file (configs/gpus/), so no attention kernels "
                                 "to choose from", flag, name, g.name);
  if (!s->attentionKernel(name))
    return invalidArgument("{} '{}': GPU '{}' ({}) has curves for {} (the first is its default)", flag, name, g.name,
                           s->file, s->attentionKernelNames());
  return {};
}

const ComputeSpec* computeSpecFor(const GpuSpec& g) {
  // Parsed once; the data files are part of the build, so a bad one is a
  // build defect (tests parse every file and fail on it).
  static const std::map<std::string, ComputeSpec> specs = [] {
    std::map<std::string, ComputeSpec> m;
    for (const auto& [name, text] : gpuDataFiles()) {
      Result<ComputeSpec> s = parseComputeSpec(text, name);
      if (s.isOk()) m.emplace(s->arch, std::move(*s));
    }
    return m;
  }();
  std::string key = g.arch;
  if (key.empty()) {
    std::string n = g.name;
    for (char& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (n.find("a100") != std::string::npos || n.find("a800") != std::string::npos) key = "ampere";
    else if (n.find("h100") != std::string::npos || n.find("h800") != std::string::npos ||
             n.find("h200") != std::string::npos)
      key = "hopper";
    else if (n.find("b200") != std::string::npos || n.find("b100") != std::string::npos) key = "blackwell";
  }
  auto it = specs.find(key);
  return it == specs.end() ? nullptr : &it->second;
}

double Compute::gemmEfficiency(double m, double n, double k, double batch) const {
  if (!s_ || !s_->has_gemm) {  // the cluster's single roofline curve
    const double size = m * n * k * batch;
    double wave = 1;
    if (g_.sms > 0) {
      wave = 0;
      for (auto [tm, tn] : {std::pair{128.0, 256.0}, std::pair{256.0, 128.0}}) {
        const double tiles = std::ceil(m / tm) * std::ceil(n / tn) * batch;
        wave = std::max(wave, m * n * batch / (std::ceil(tiles / g_.sms) * g_.sms * tm * tn));
      }
    }
    return g_.gemm_efficiency * size / (size + g_.gemm_half_size) * wave;
  }
  const bool f8 = fp8_ && s_->eff8 > 0;
  const double emax = f8 ? s_->eff8 : s_->eff16, kh = f8 ? s_->k_half8 : s_->k_half16;
  const double sms = s_->sms;
  double best = 0;
  for (auto [tm, tn] : s_->tiles) {
    // Output tiles of all problems; too few to fill the SMs once: split K
    // (each slice at least split_k_min deep) over the idle ones.
    const double tiles = std::ceil(m / tm) * std::ceil(n / tn) * batch;
    double split = 1;
    if (tiles < sms) split = std::max(1.0, std::min(std::floor(sms / tiles), std::floor(k / s_->split_k_min)));
    const double waves = std::ceil(tiles * split / sms);
    const double useful = m * n * batch / (tiles * tm * tn);  // partial edge tiles
    const double occupancy = tiles * split / (waves * sms);     // the last, partly filled wave
    const double kk = k / split;
    best = std::max(best, useful * occupancy * kk / (kk + kh));
  }
  return std::min(emax * best, f8 ? s_->cap8 : s_->cap16);
}

Seconds Compute::gemm(double m, double n, double k, double batch) const {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return Seconds(0);
  const bool data = s_ && s_->has_gemm;
  const bool f8 = fp8_ && (data ? s_->eff8 > 0 : true);
  const Flops fl(2 * m * n * k * batch);
  const Seconds tc = fl / ((f8 ? g_.peak8 : g_.peak16) * gemmEfficiency(m, n, k, batch) * clock());
  const double in_bytes = f8 ? 1 : 2;  // fp8 operands, 16-bit output
  const Seconds tm = Bytes(batch * (in_bytes * (m * k + k * n) + 2 * m * n)) / (g_.hbm_bw * g_.hbm_efficiency);
  return std::max(tc, tm) + (data ? s_->gemm_fixed : g_.kernel_overhead);
}

Seconds Compute::attention(double heads, double sq, double skv, double d_qk, double d_v, bool causal, double window,
                           bool backward) const {
  if (heads <= 0 || sq <= 0 || skv <= 0) return Seconds(0);
  if (!s_ || !attn_) {  // two batched GEMMs (scores, then scores x V), as before the compute model
    const Seconds f = gemm(sq, skv, d_qk, heads) + gemm(sq, d_v, skv, heads);
    return backward ? f * 2 : f;
  }
  // Keys each query attends to: a window limits them.
  const double keys = window > 0 ? std::min(window, skv) : skv;
  // A causal mask leaves half the (query, key) pairs (FlashAttention's
  // accounting; also a load-balanced context-parallel rank's share).
  const double frac = causal && window <= 0 ? 0.5 : 1.0;
  const double fwd_flops = 2 * heads * sq * keys * (d_qk + d_v) * frac;
  const double flops = backward ? 2.5 * fwd_flops : fwd_flops;  // FlashAttention's accounting (5 vs 2 matmuls)
  const double eff = attnEfficiency(backward ? attn_->bwd : attn_->fwd, 0.5 * (d_qk + d_v), causal && window <= 0, keys);
  const Seconds tc = Flops(flops) / (g_.peak16 * eff * clock());
  // Q, K, V and O (and their gradients backward) cross HBM once.
  const double bytes = 2 * heads * (sq * (d_qk + d_v) + skv * (d_qk + d_v)) * (backward ? 2 : 1);
  const Seconds tm = Bytes(bytes) / (g_.hbm_bw * g_.hbm_efficiency);
  return std::max(tc, tm) + attn_->fixed;
}

}  // namespace chorus::sim

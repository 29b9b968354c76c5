#include "tune/cost_model.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <unordered_map>

#include <unistd.h>

#include "kernels/dispatch.hpp"
#include "kernels/dtype.hpp"

namespace chorus::tune {

CostProfile::CostProfile() {
  links.emplace("shm", LinkCost{us(0.8), inverse(gbytePerS(6.0)), us(0.1), {}});
  links.emplace("tcp", LinkCost{us(12.0), inverse(gbytePerS(1.5)), us(1.5), {}});
  cores = std::max(1u, std::thread::hardware_concurrency());
  // The last-level cache, at most 32 MiB: virtual machines may report a whole
  // package's L3 (320 MiB here) where a core sees its complex's share; on this
  // VM allreduce throughput halves between 16 and 64 MiB of footprint.
  if (long l3 = ::sysconf(_SC_LEVEL3_CACHE_SIZE); l3 > 0) cache_size = std::min(cache_size, Bytes(static_cast<double>(l3)));
  // Reduction throughput per byte of one operand: fp32/fp64/int run at
  // memory speed; the narrow floats convert to fp32 and back.
  gamma.fill(inverse(gbytePerS(8.0)));
  gamma[chorusFloat16] = inverse(gbytePerS(4.0));
  gamma[chorusBfloat16] = inverse(gbytePerS(4.0));
  gamma[chorusFloat8e4m3] = inverse(gbytePerS(0.5));
  gamma[chorusFloat8e5m2] = inverse(gbytePerS(0.5));
}

namespace {

constexpr size_t kMaxCorrections = 4096;
constexpr size_t kMaxLinks = 64;

// A transport name as the registry takes them ([a-z0-9_]{1,16}).
bool validLinkName(std::string_view n) {
  return !n.empty() && n.size() <= 16 &&
         std::all_of(n.begin(), n.end(), [](char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_'; });
}
bool validRouteKey(std::string_view k) {
  if (k == "mixed") return true;
  const size_t plus = k.find('+');
  if (plus == std::string_view::npos) return validLinkName(k);
  return validLinkName(k.substr(0, plus)) && validLinkName(k.substr(plus + 1));
}
constexpr size_t kMaxPoints = 64;

Result<Correction> parseCorrection(const nlohmann::json& o) {
  if (!o.is_object()) return invalidArgument("not an object");
  Correction c;
  if (!o.contains("collective") || !o["collective"].is_string() ||
      !plan::parseCollective(o["collective"].get<std::string>(), &c.collective))
    return invalidArgument("'collective' must name a collective (allreduce, allgather, ...)");
  if (!o.contains("algo") || !o["algo"].is_string() || o["algo"].get<std::string>().empty() ||
      o["algo"].get<std::string>().size() > 64)
    return invalidArgument("'algo' must be an algorithm name of 1..64 characters");
  c.algo = o["algo"].get<std::string>();
  if (!o.contains("nranks") || !o["nranks"].is_number_integer() || o["nranks"].get<int64_t>() < 1 ||
      o["nranks"].get<int64_t>() > 65536)
    return invalidArgument("'nranks' must be an integer in [1, 65536]");
  c.nranks = o["nranks"].get<int>();
  const std::string link = o.contains("link") && o["link"].is_string() ? o["link"].get<std::string>() : "";
  if (!validRouteKey(link))
    return invalidArgument("'link' must be a transport name or two joined by '+' (\"shm\", \"tcp\", \"shm+tcp\"; \"mixed\")");
  c.link = link == "mixed" ? "shm+tcp" : link;
  if (!o.contains("points") || !o["points"].is_array() || o["points"].empty() || o["points"].size() > kMaxPoints)
    return invalidArgument("'points' must be an array of 1..{} [bytes, factor] pairs", kMaxPoints);
  for (const auto& pt : o["points"]) {
    if (!pt.is_array() || pt.size() != 2 || !pt[0].is_number() || !pt[1].is_number())
      return invalidArgument("every point must be a [bytes, factor] pair of numbers");
    const double bytes = pt[0].get<double>(), factor = pt[1].get<double>();
    if (!(bytes > 0 && bytes < 1e18) || !(factor > 0 && factor <= 1e6))
      return invalidArgument("point [{}, {}]: bytes must be in (0, 1e18) and factor in (0, 1e6]", bytes, factor);
    if (!c.points.empty() && bytes <= c.points.back().first)
      return invalidArgument("point sizes must be strictly ascending ({} after {})", bytes, c.points.back().first);
    c.points.emplace_back(bytes, factor);
  }
  return c;
}

}  // namespace

std::string routeKey(const std::vector<int>& host_of, const Links& links) {
  std::vector<int> ids = host_of;
  std::sort(ids.begin(), ids.end());
  const size_t hosts = static_cast<size_t>(std::unique(ids.begin(), ids.end()) - ids.begin());
  if (hosts <= 1) return links.intra;
  return hosts == host_of.size() ? links.inter : links.intra + "+" + links.inter;
}

const LinkCost& CostProfile::link(std::string_view name, bool host_local) const {
  if (auto it = links.find(name); it != links.end()) return it->second;
  if (auto it = links.find(host_local ? "shm" : "tcp"); it != links.end()) return it->second;
  static const CostProfile defaults;
  return defaults.links.at(host_local ? "shm" : "tcp");
}

double CostProfile::correctionFor(plan::Collective c, std::string_view algo, int nranks, std::string_view link,
                                  double bytes) const {
  for (const Correction& k : corrections) {
    if (k.collective != c || k.nranks != nranks || k.link != link || k.algo != algo) continue;
    const auto& pts = k.points;
    if (bytes <= pts.front().first) return pts.front().second;
    if (bytes >= pts.back().first) return pts.back().second;
    auto hi = std::upper_bound(pts.begin(), pts.end(), bytes, [](double b, const auto& pt) { return b < pt.first; });
    auto lo = hi - 1;
    const double t = std::log(bytes / lo->first) / std::log(hi->first / lo->first);
    return std::exp(std::log(lo->second) + t * (std::log(hi->second) - std::log(lo->second)));
  }
  return 1.0;
}

void CostProfile::setCorrection(Correction c) {
  for (Correction& k : corrections)
    if (k.collective == c.collective && k.nranks == c.nranks && k.link == c.link && k.algo == c.algo) {
      k = std::move(c);
      return;
    }
  corrections.push_back(std::move(c));
}

Result<CostProfile> CostProfile::fromJson(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalidArgument("tuning profile is not a JSON object");
  CostProfile p;
  auto num = [&](const nlohmann::json& o, const char* key, double* out) -> Status {
    if (!o.contains(key)) return {};
    if (!o[key].is_number() || o[key].get<double>() < 0)
      return invalidArgument("tuning profile: '{}' must be a non-negative number", key);
    *out = o[key].get<double>();
    return {};
  };
  // The file's units: microseconds and GB/s (its inverse per byte), a key
  // left out keeping the default.
  auto micros = [&](const nlohmann::json& o, const char* key, Seconds* out) -> Status {
    double x = toUs(*out);
    CHORUS_RETURN_IF_ERROR(num(o, key, &x));
    *out = us(x);
    return {};
  };
  auto perByte = [&](const nlohmann::json& o, const char* key, SecondsPerByte* out) -> Status {
    double gbps = 0;
    CHORUS_RETURN_IF_ERROR(num(o, key, &gbps));
    if (gbps > 0) *out = inverse(gbytePerS(gbps));
    return {};
  };
  // Each transport's figures: "links": {"<name>": {...}}; profiles written
  // before transports had names keep "shm" and "tcp" at the top level.
  auto readLink = [&](const std::string& name, const nlohmann::json& o) -> Status {
    if (!validLinkName(name)) return invalidArgument("tuning profile: link '{}': not a transport name ([a-z0-9_]{{1,16}})", name);
    if (!o.is_object()) return invalidArgument("tuning profile: link '{}' must be an object", name);
    auto [it, fresh] = p.links.try_emplace(name, p.link(name, name == "shm"));
    (void)fresh;
    LinkCost* link = &it->second;
    CHORUS_RETURN_IF_ERROR(micros(o, "alpha_us", &link->alpha));
    CHORUS_RETURN_IF_ERROR(micros(o, "overhead_us", &link->overhead));
    CHORUS_RETURN_IF_ERROR(perByte(o, "bandwidth_large_gbps", &link->beta_large));
    CHORUS_RETURN_IF_ERROR(perByte(o, "bandwidth_gbps", &link->beta));
    return {};
  };
  for (const char* legacy : {"shm", "tcp"})
    if (j.contains(legacy)) CHORUS_RETURN_IF_ERROR(readLink(legacy, j[legacy]));
  if (j.contains("links")) {
    if (!j["links"].is_object() || j["links"].size() > kMaxLinks)
      return invalidArgument("tuning profile: 'links' must be an object of at most {} transports", kMaxLinks);
    for (auto& [name, o] : j["links"].items()) CHORUS_RETURN_IF_ERROR(readLink(name, o));
  }
  if (j.contains("reduce_gbps")) {
    if (!j["reduce_gbps"].is_object()) return invalidArgument("tuning profile: 'reduce_gbps' must be an object");
    for (auto& [k, v] : j["reduce_gbps"].items()) {
      chorusDataType_t d;
      if (!kernels::parseDtype(k, &d)) return invalidArgument("tuning profile: unknown dtype '{}' in reduce_gbps", k);
      if (!v.is_number() || v.get<double>() <= 0) return invalidArgument("tuning profile: reduce_gbps.{} must be > 0", k);
      p.gamma[d] = inverse(gbytePerS(v.get<double>()));
    }
  }
  CHORUS_RETURN_IF_ERROR(micros(j, "op_overhead_us", &p.op_overhead));
  CHORUS_RETURN_IF_ERROR(micros(j, "board_call_us", &p.board_call));
  CHORUS_RETURN_IF_ERROR(perByte(j, "board_bandwidth_gbps", &p.board_beta));
  double cache = p.cache_size.value();
  CHORUS_RETURN_IF_ERROR(num(j, "cache_bytes", &cache));
  p.cache_size = Bytes(cache);
  CHORUS_RETURN_IF_ERROR(perByte(j, "reduce_mem_gbps", &p.reduce_mem));
  if (j.contains("corrections")) {
    const auto& cs = j["corrections"];
    if (!cs.is_array() || cs.size() > kMaxCorrections)
      return invalidArgument("tuning profile: 'corrections' must be an array of at most {} entries", kMaxCorrections);
    for (size_t i = 0; i < cs.size(); ++i) {
      auto c = parseCorrection(cs[i]);
      if (!c.isOk()) return c.status().withContext(fmt::format("tuning profile: corrections[{}]: ", i));
      p.setCorrection(std::move(c.value()));
    }
  }
  if (j.contains("cores")) {
    if (!j["cores"].is_number_integer() || j["cores"].get<int>() < 1)
      return invalidArgument("tuning profile: 'cores' must be a positive integer");
    p.cores = j["cores"].get<int>();
  }
  if (j.contains("measured_at")) {
    if (!j["measured_at"].is_string() || j["measured_at"].get<std::string>().size() > 64)
      return invalidArgument("tuning profile: 'measured_at' must be a string of at most 64 characters");
    p.measured_at = j["measured_at"].get<std::string>();
  }
  if (j.contains("passes")) {
    if (!j["passes"].is_number_integer() || j["passes"].get<int>() < 0 || j["passes"].get<int>() > 100)
      return invalidArgument("tuning profile: 'passes' must be an integer in [0, 100]");
    p.passes = j["passes"].get<int>();
  }
  if (j.contains("unstable")) {
    const auto& u = j["unstable"];
    if (!u.is_array() || u.size() > 64) return invalidArgument("tuning profile: 'unstable' must be an array of at most 64 strings");
    for (const auto& e : u) {
      if (!e.is_string() || e.get<std::string>().size() > 200)
        return invalidArgument("tuning profile: 'unstable' entries must be strings of at most 200 characters");
      p.unstable.push_back(e.get<std::string>());
    }
  }
  return p;
}

std::string CostProfile::toJson() const {
  nlohmann::json j;
  j["links"] = nlohmann::json::object();
  for (const auto& [name, l] : links) {
    j["links"][name] = {{"alpha_us", toUs(l.alpha)}, {"bandwidth_gbps", toGbytePerS(l.beta)}, {"overhead_us", toUs(l.overhead)}};
    if (l.beta_large > SecondsPerByte()) j["links"][name]["bandwidth_large_gbps"] = toGbytePerS(l.beta_large);
  }
  j["cache_bytes"] = cache_size.value();
  if (reduce_mem > SecondsPerByte()) j["reduce_mem_gbps"] = toGbytePerS(reduce_mem);
  for (int d = 0; d < chorusNumTypes; ++d)
    j["reduce_gbps"][std::string(kernels::dtypeName(static_cast<chorusDataType_t>(d)))] = toGbytePerS(gamma[d]);
  j["op_overhead_us"] = toUs(op_overhead);
  j["board_call_us"] = toUs(board_call);
  if (board_beta > SecondsPerByte()) j["board_bandwidth_gbps"] = toGbytePerS(board_beta);
  if (!corrections.empty()) {
    j["corrections"] = nlohmann::json::array();
    for (const Correction& c : corrections) {
      nlohmann::json pts = nlohmann::json::array();
      for (auto [b, f] : c.points) pts.push_back({b, f});
      j["corrections"].push_back({{"collective", std::string(plan::collectiveName(c.collective))},
                                  {"algo", c.algo},
                                  {"nranks", c.nranks},
                                  {"link", c.link},
                                  {"points", std::move(pts)}});
    }
  }
  j["cores"] = cores;
  if (!measured_at.empty()) j["measured_at"] = measured_at;
  if (passes > 0) j["passes"] = passes;
  if (passes > 0) j["unstable"] = unstable;
  return j.dump(2) + "\n";
}

Result<CostProfile> CostProfile::load(const std::string& path) {
  if (path.empty()) return CostProfile{};
  std::ifstream in(path);
  if (!in) return CostProfile{};
  std::stringstream ss;
  ss << in.rdbuf();
  auto p = fromJson(ss.str());
  if (!p.isOk()) return p.status().withContext(fmt::format("{}: ", path));
  p->source = path;
  return p;
}

namespace {
// A compressed plan's (de)quantize passes on the busiest rank (src/plan/
// compressed.cpp): its rounds carry the wire bytes (elements of the fp32 size,
// rounded up) and no reduction, and this adds the kernels' work, which
// includes the fp32 accumulation (dequantizeAdd).  Per rank, in fp32 bytes,
// with N the vector and c one rank's block:
//   allreduce       quantize N ((n-1)/n contributions + 1/n sum),
//                   dequantize (2n-1)/n N ((n-1)/n added in + the whole result)
//   reduce-scatter  quantize (n-1) c, dequantize-add (n-1) c
//   allgather       quantize c, dequantize n c
// priced at the kernels' rate per fp32 byte (kernels/quantize.cpp measured on
// the 2-core development VM, 4 MiB runs: bf16 quantize 28-30 GB/s, dequantize
// and dequantizeAdd 6-9; fp8 quantize 4.1-4.9, dequantize 10; the figures
// below are the passes' mix, rounded down; chorus-tune does not calibrate
// them yet); ranks beyond the host's cores take turns.
constexpr double kBf16PassBytesPerS = 8e9, kFp8PassBytesPerS = 6e9;
Seconds compressWork(const plan::Shape& sh, const CostProfile& prof, int ranks_per_host) {
  const double n = sh.nranks, e = static_cast<double>(sh.count) * sh.elem_size;
  if (sh.nranks < 2) return Seconds();
  double bytes = 0;
  switch (sh.coll) {
    case plan::Collective::AllReduce: bytes = e + (2 * n - 1) / n * e; break;
    case plan::Collective::ReduceScatter: bytes = 2 * (n - 1) * e; break;
    case plan::Collective::AllGather: bytes = (1 + n) * e; break;
    default: return Seconds();
  }
  const double rate = sh.wire->kind == kernels::WireFormat::Bf16 ? kBf16PassBytesPerS : kFp8PassBytesPerS;
  const double turns = std::max(1.0, static_cast<double>(ranks_per_host) / prof.cores);
  return Seconds(bytes / rate * turns);
}
// An exact plan's conversions on the busiest rank (src/plan/exact.cpp): its
// rounds carry the words and price their int64 additions (RecvReduce); this
// adds Encode over every input element and Decode over the rank's block,
// priced per byte of the call's type at the kernels' rates for the kernel
// table this process runs (bench/micro/exact_bench, one word per fp32, on
// the 2-core development VM: AVX-512 encode 32 GB/s from cache, 14 from
// memory, decode 25 and 10; AVX2 6.5 and 5.3; generic 1.8 and 1.3; the
// memory-bound figures are used, the input comes from memory; chorus-tune
// does not calibrate them yet); a layout of w words costs w times that.
struct ExactRates {
  double encode, decode;  // bytes of the call's type per second
};
ExactRates exactRates() {
  const std::string_view isa = kernels::activeKernels().isa;
  if (isa == "avx512") return {14e9, 10e9};
  if (isa == "avx2") return {6.5e9, 5.3e9};
  return {1.8e9, 1.3e9};
}
Seconds exactWork(const plan::Shape& sh, const CostProfile& prof, int ranks_per_host) {
  const double n = sh.nranks, w = sh.exact_words, e = static_cast<double>(sh.count) * sh.elem_size;
  double enc = 0, dec = 0;
  switch (sh.coll) {
    case plan::Collective::AllReduce: enc = e, dec = e / n; break;
    case plan::Collective::ReduceScatter: enc = n * e, dec = e; break;
    default: return Seconds();
  }
  const double turns = std::max(1.0, static_cast<double>(ranks_per_host) / prof.cores);
  static const ExactRates rate = exactRates();
  return Seconds(w * (enc / rate.encode + dec / rate.decode) * turns);
}
// The op's Scale or Divide pass (plan::Scaling) on the busiest rank: one
// read and one write of the region, priced like a reduction's pass over one
// operand (γ, out of the cache as the call's footprint says); ranks beyond
// the host's cores take turns.
Seconds scalingWork(const plan::Shape& sh, SecondsPerByte gamma, const CostProfile& prof, int ranks_per_host) {
  const uint64_t elems = std::max(plan::scalingElems(sh, 0), plan::scalingElems(sh, sh.root));
  if (elems == 0) return Seconds();
  const double turns = std::max(1.0, static_cast<double>(ranks_per_host) / prof.cores);
  return Bytes(static_cast<double>(elems) * sh.elem_size) * gamma * turns;
}
}  // namespace

Bytes effectiveCacheBytes(Bytes nominal, double rate_at_nominal, double rate_hot, double rate_cold) {
  if (!(rate_at_nominal > 0) || !(rate_hot > rate_cold) || !(rate_cold > 0)) return nominal;
  // Time per byte t = h / hot + (1 - h) / cold, solved for the hot share h.
  const double h = (1 / rate_at_nominal - 1 / rate_cold) / (1 / rate_hot - 1 / rate_cold);
  return nominal * std::clamp(h, 1.0 / 16, 1.0);
}

Result<Seconds> predictSeconds(const plan::Algorithm& algo, const plan::Shape& shape, chorusDataType_t dtype,
                               const CostProfile& prof, const std::vector<int>& host_of, const Links& links) {
  CHORUS_ASSIGN_OR_RETURN(Seconds t, modelSeconds(algo, shape, dtype, prof, host_of, links));
  if (prof.corrections.empty()) return t;
  const std::string link = host_of.size() == static_cast<size_t>(shape.nranks) ? routeKey(host_of, links) : links.intra;
  return t * prof.correctionFor(algo.collective(), algo.name(), shape.nranks, link,
                                static_cast<double>(shape.count) * shape.elem_size);
}

Result<Seconds> modelSeconds(const plan::Algorithm& algo, const plan::Shape& shape, chorusDataType_t dtype,
                             const CostProfile& prof, const std::vector<int>& host_of, const Links& links) {
  const LinkCost& intra = prof.link(links.intra, true);
  const LinkCost& inter = prof.link(links.inter, false);
  CHORUS_ASSIGN_OR_RETURN(std::vector<plan::Round> rounds, algo.rounds(shape));
  const int n = shape.nranks;
  const SecondsPerByte gamma = prof.gamma[dtype];
  // Through the board: every rank on one host, the input within what the
  // board takes (what a rank publishes: its input, a broadcast's root's).
  const uint64_t input_bytes = shape.inputElems(shape.root) * shape.elem_size;
  const bool board = algo.oneShot() && n > 1 && prof.board_bytes != 0 && input_bytes <= prof.board_bytes &&
                     (host_of.size() != static_cast<size_t>(n) || routeKey(host_of, links) == links.intra);
  Seconds total = board ? prof.board_call : prof.op_overhead;
  // Per rank: latency (max α in) and work (Σ o, β, γ) in the current round;
  // per host: ranks active in it.
  std::vector<Seconds> lat(static_cast<size_t>(n)), work(static_cast<size_t>(n));
  std::vector<int> active(static_cast<size_t>(n));
  std::vector<char> seen(static_cast<size_t>(n));
  // Hosts renumbered 0..: any ids will do.
  std::vector<int> host(static_cast<size_t>(n), 0);
  if (host_of.size() == static_cast<size_t>(n)) {
    std::unordered_map<int, int> index;
    for (int q = 0; q < n; ++q)
      host[static_cast<size_t>(q)] = index.try_emplace(host_of[static_cast<size_t>(q)], static_cast<int>(index.size())).first->second;
  }
  auto hostOf = [&](int r) { return host[static_cast<size_t>(r)]; };
  // The machine whose cores and cache a rank shares: its host group's, or
  // every rank's on one machine (Links::one_machine).
  auto machineOf = [&](int r) { return links.one_machine ? 0 : hostOf(r); };
  // Share of the call's bytes that stays in the cache: its footprint is the
  // input and output of every rank on the busiest host.
  std::vector<int> per_host(static_cast<size_t>(n), 0);
  int most = 1;
  for (int q = 0; q < n; ++q) most = std::max(most, ++per_host[static_cast<size_t>(machineOf(q))]);
  // An in-place call's input and output are the same bytes (the larger of the two: an allgather's output holds its input).
  const uint64_t per_rank_elems = shape.inplace ? std::max(shape.inputElems(0), shape.outputElems(0))
                                                : shape.inputElems(0) + shape.outputElems(0);
  const Bytes footprint(static_cast<double>(most) * static_cast<double>(per_rank_elems) * shape.elem_size);
  const double hot = footprint <= prof.cache_size ? 1.0 : prof.cache_size / footprint;
  auto beta = [&](const LinkCost& l) {
    return l.beta_large > SecondsPerByte() ? hot * l.beta + (1 - hot) * l.beta_large : l.beta;
  };
  const SecondsPerByte gamma_eff = hot * gamma + (1 - hot) * std::max(gamma, prof.reduce_mem);
  // Pipelined plans (plan.hpp: Algorithm::pipelineSlices): every round once
  // with a slice's bytes (the fill), then S - 1 steady-state steps in which
  // each rank does all rounds' work for a slice at once.
  const uint64_t S = std::max<uint64_t>(1, algo.pipelineSlices(shape));
  const double scale = 1.0 / static_cast<double>(S);
  std::vector<Seconds> all_lat(static_cast<size_t>(n)), all_work(static_cast<size_t>(n));
  std::vector<char> all_seen(static_cast<size_t>(n), 0);
  auto slowest = [&](const std::vector<Seconds>& l, const std::vector<Seconds>& w, const std::vector<char>& on) {
    std::fill(active.begin(), active.end(), 0);
    for (int q = 0; q < n; ++q)
      if (on[static_cast<size_t>(q)]) ++active[static_cast<size_t>(machineOf(q))];
    Seconds worst;
    for (int q = 0; q < n; ++q) {
      if (!on[static_cast<size_t>(q)]) continue;
      const double turns = std::max(1.0, static_cast<double>(active[static_cast<size_t>(machineOf(q))]) / prof.cores);
      worst = std::max(worst, (l[static_cast<size_t>(q)] + w[static_cast<size_t>(q)]) * turns);
    }
    return worst;
  };
  // A host's network link is shared by its ranks: the bytes leaving (or
  // entering) a host in a round cross one NIC, so a round takes at least
  // their sum at the TCP rate, however the ranks split them.  Without this a
  // plan whose ranks all talk across hosts at once (a direct reduce-scatter
  // on 2 x 2) looked as cheap as one that sends each byte across once
  // (hierarchical).
  std::vector<Bytes> nic_out(static_cast<size_t>(n)), nic_in(static_cast<size_t>(n));
  std::vector<Bytes> all_nic_out(static_cast<size_t>(n)), all_nic_in(static_cast<size_t>(n));
  auto nicBound = [&](const std::vector<Bytes>& out, const std::vector<Bytes>& in) {
    Bytes most_bytes;
    for (size_t h = 0; h < out.size(); ++h) most_bytes = std::max({most_bytes, out[h], in[h]});
    return most_bytes > Bytes() ? most_bytes * inter.beta : Seconds();
  };
  // The bytes of one message as the transport sees it: the executor cuts a
  // message into pipeline slices of shape.chunk_elems (0: whole), and a
  // pipelined plan's rounds carry S slices' worth.
  auto sliceBytes = [&](uint64_t elems) {
    uint64_t e = S > 1 ? (elems + S - 1) / S : elems;
    if (shape.chunk_elems > 0) e = std::min(e, shape.chunk_elems);
    return e * shape.elem_size;
  };
  for (const plan::Round& r : rounds) {
    std::fill(lat.begin(), lat.end(), Seconds());
    std::fill(work.begin(), work.end(), Seconds());
    std::fill(seen.begin(), seen.end(), 0);
    std::fill(nic_out.begin(), nic_out.end(), Bytes());
    std::fill(nic_in.begin(), nic_in.end(), Bytes());
    plan::forEachMessage(r, n, [&](int src, int dst, uint64_t elems) {
      const LinkCost& l = hostOf(src) != hostOf(dst) ? inter : intra;
      const Bytes bytes(static_cast<double>(elems) * shape.elem_size * scale);
      const auto d = static_cast<size_t>(dst);
      if (hostOf(src) != hostOf(dst)) {
        nic_out[static_cast<size_t>(hostOf(src))] += bytes;
        nic_in[static_cast<size_t>(hostOf(dst))] += bytes;
      }
      if (board) {  // read in place and reduced from the peer's slot; the sender wrote it once
        const SecondsPerByte b = prof.board_beta > SecondsPerByte() ? prof.board_beta : beta(l);
        work[d] += bytes * b + (r.reduce ? bytes * gamma_eff : Seconds());
        seen[static_cast<size_t>(src)] = seen[d] = 1;
        return;
      }
      lat[d] = std::max(lat[d], l.alpha);
      // Reduced straight out of the shared-memory ring: the copy in, not the copy out (shm_ring_bytes).
      const bool from_ring = r.reduce && !r.staged && hostOf(src) == hostOf(dst) && links.intra == "shm" &&
                             sliceBytes(elems) < prof.shm_ring_bytes;
      work[d] += l.overhead + bytes * beta(l) * (from_ring ? 0.5 : 1.0) +
                 (r.reduce ? bytes * gamma_eff * (r.staged ? 2.0 : 1.0) : Seconds());
      work[static_cast<size_t>(src)] += l.overhead;
      seen[static_cast<size_t>(src)] = seen[d] = 1;
    });
    total += static_cast<double>(r.repeat) * std::max(slowest(lat, work, seen), nicBound(nic_out, nic_in));
    if (S == 1) continue;
    for (int q = 0; q < n; ++q) {
      const auto uq = static_cast<size_t>(q);
      all_lat[uq] = std::max(all_lat[uq], lat[uq]);
      all_work[uq] += static_cast<double>(r.repeat) * work[uq];
      all_seen[uq] = all_seen[uq] || seen[uq];
      all_nic_out[uq] += static_cast<double>(r.repeat) * nic_out[uq];
      all_nic_in[uq] += static_cast<double>(r.repeat) * nic_in[uq];
    }
  }
  if (S > 1)
    total += static_cast<double>(S - 1) *
             std::max(slowest(all_lat, all_work, all_seen), nicBound(all_nic_out, all_nic_in));
  if (shape.wire) total += compressWork(shape, prof, most);
  if (shape.exact_words) total += exactWork(shape, prof, most);
  total += scalingWork(shape, gamma_eff, prof, most);
  return total;
}

}  // namespace chorus::tune

// CHORUS_* knobs -> chorus::Config, each knob read and validated here once.
//
// A value that is set (even to "") is parsed as given; an unset knob takes the
// default of the knob table (env.cpp), so the table stays the one place of
// names, defaults and meanings.  Messages say what is accepted.
#include "api/config.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>

#include "api/device_calls.hpp"
#include "bootstrap/wire_protect.hpp"
#include "device/cuda_driver.hpp"
#include "common/env.hpp"
#include "kernels/quantize.hpp"
#include "transport/registry.hpp"

namespace chorus::api {
namespace {

class Reader {
 public:
  explicit Reader(const Lookup& lookup) : lookup_(lookup) {}

  // Whether the variable is set at all.
  bool has(std::string_view name) const { return lookup_(name).has_value(); }

  // The value as set, else the table's default.
  std::string str(std::string_view name) const {
    if (auto v = lookup_(name)) return *v;
    const env::Knob* k = env::findKnob(name);
    return k ? std::string(k->default_value) : std::string();
  }

  // An integer in [lo, hi]; `accepted` describes the range for the message.
  Result<int64_t> integer(std::string_view name, int64_t lo, int64_t hi, std::string_view accepted) const {
    const std::string s = str(name);
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || p != s.data() + s.size())
      return invalidArgument("{}='{}' is not an integer (accepted: {})", name, s, accepted);
    if (v < lo || v > hi) return invalidArgument("{}={} is out of range (accepted: {})", name, v, accepted);
    return v;
  }

  // 1/true/yes/on or 0/false/no/off (any case); "" is false.
  Result<bool> boolean(std::string_view name) const {
    std::string s = str(name);
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
    if (s == "0" || s == "false" || s == "no" || s == "off" || s.empty()) return false;
    return invalidArgument("{}='{}' is not a boolean (accepted: 0, 1, false, true, no, yes, off, on)", name, s);
  }

 private:
  const Lookup& lookup_;
};

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kIntMax = std::numeric_limits<int>::max();

// The staging of OpenCL streams: not part of Config (a stream reads it when it
// is made, api/c_api.cpp), but validated with the rest at init.
Result<device::StagingOptions> parseDeviceStaging(const Reader& r) {
  device::StagingOptions o;
  const std::string mode = r.str("CHORUS_DEVICE_STAGING");
  auto m = device::parseStaging(mode);
  if (!m)
    return invalidArgument("CHORUS_DEVICE_STAGING='{}' is not a staging mode (accepted: auto, map, pipeline, whole)",
                           mode);
  o.mode = *m;
  CHORUS_ASSIGN_OR_RETURN(int64_t chunk,
                          r.integer("CHORUS_DEVICE_CHUNK_BYTES", 1, kInt64Max, "a positive number of bytes"));
  o.chunk_bytes = static_cast<uint64_t>(chunk);
  CHORUS_ASSIGN_OR_RETURN(o.async, r.boolean("CHORUS_DEVICE_ASYNC"));
  return o;
}

// Who drives a KV agent's transports: not part of Config (chorusKvAgentCreate
// reads it, api/c_api_kv.cpp), but validated with the rest at init.  True:
// a progress thread (prim::kv::Progress::Thread).
// CHORUS_CUDA_DRIVER: what the CUDA loader dlopens (a soname or a path).
Result<std::string> parseCudaDriver(const Reader& r) {
  std::string lib = r.str("CHORUS_CUDA_DRIVER");
  if (lib.empty())
    return invalidArgument("CHORUS_CUDA_DRIVER is empty (accepted: a library name or path, default libcuda.so.1)");
  return lib;
}

Result<bool> parseKvProgress(const Reader& r) {
  const std::string s = r.str("CHORUS_KV_PROGRESS");
  if (s == "thread" || s.empty()) return true;
  if (s == "caller") return false;
  return invalidArgument("CHORUS_KV_PROGRESS='{}' is not a progress mode (accepted: thread, caller)", s);
}

}  // namespace

Result<Config> parseConfig(const Lookup& lookup) {
  const Reader r(lookup);
  Config c;

  CHORUS_ASSIGN_OR_RETURN(int64_t timeout, r.integer("CHORUS_TIMEOUT_MS", 1, kInt64Max, "a positive number of ms"));
  c.timeout = std::chrono::milliseconds(timeout);
  CHORUS_ASSIGN_OR_RETURN(c.check, r.boolean("CHORUS_CHECK"));
  CHORUS_RETURN_IF_ERROR(parseDeviceStaging(r).status());
  CHORUS_RETURN_IF_ERROR(parseKvProgress(r).status());
  CHORUS_RETURN_IF_ERROR(parseCudaDriver(r).status());
  const std::string repro = r.str("CHORUS_REPRODUCIBLE");
  if (repro == "off" || repro.empty())
    c.reproducible = Reproducible::Off;
  else if (repro == "canonical")
    c.reproducible = Reproducible::Canonical;
  else if (repro == "exact")
    c.reproducible = Reproducible::Exact;
  else
    return invalidArgument("CHORUS_REPRODUCIBLE='{}' is not a reproducibility mode (accepted: off, canonical, exact)",
                           repro);

  // The format's own parser names the knob and the accepted spellings.
  if (const std::string comp = r.str("CHORUS_COMPRESS"); comp != "off" && !comp.empty()) {
    CHORUS_ASSIGN_OR_RETURN(const kernels::WireFormat f,
                            kernels::parseWireFormat(comp, "CHORUS_COMPRESS (accepted: off, bf16, fp8, fp8:BLOCK)"));
    c.compress.kind = f.kind == kernels::WireFormat::Bf16 ? CompressKind::Bf16 : CompressKind::Fp8;
    c.compress.block = f.block;
  }

  CHORUS_ASSIGN_OR_RETURN(c.net.wire_protect, auth::parseWireProtect(r.str("CHORUS_WIRE_PROTECT")));
  c.net.socket_ifname = r.str("CHORUS_SOCKET_IFNAME");
  c.net.host_id = r.str("CHORUS_HOST_ID");
  // Any registered transport (transport/registry.hpp): it serves every
  // peer it can reach, the others take their usual route.
  c.net.transport = r.str("CHORUS_TRANSPORT");
  CHORUS_RETURN_IF_ERROR(transport::registry().checkName(c.net.transport));

  CHORUS_ASSIGN_OR_RETURN(int64_t spin_us, r.integer("CHORUS_SPIN_US", 0, kIntMax, "an integer >= 0 (microseconds)"));
  c.spin = std::chrono::microseconds(spin_us);

  CHORUS_ASSIGN_OR_RETURN(int64_t ring, r.integer("CHORUS_SHM_RING_BYTES", 4096, int64_t{1} << 32,
                                                  "a power of two in 4096..4294967296"));
  if ((ring & (ring - 1)) != 0)
    return invalidArgument("CHORUS_SHM_RING_BYTES={} is not a power of two (accepted: a power of two in "
                           "4096..4294967296)", ring);
  c.shm.ring_bytes = static_cast<size_t>(ring);
  CHORUS_ASSIGN_OR_RETURN(c.shm.cma, r.boolean("CHORUS_SHM_CMA"));
  CHORUS_ASSIGN_OR_RETURN(c.shm.spread, r.boolean("CHORUS_SHM_SPREAD"));
  CHORUS_ASSIGN_OR_RETURN(int64_t cma_bytes, r.integer("CHORUS_SHM_CMA_BYTES", 0, kInt64Max, "an integer >= 0"));
  c.shm.cma_bytes = static_cast<size_t>(cma_bytes);

  CHORUS_ASSIGN_OR_RETURN(int64_t socks, r.integer("CHORUS_TCP_SOCKETS", 1, 16, "1..16"));
  c.tcp.sockets = static_cast<int>(socks);
  CHORUS_ASSIGN_OR_RETURN(int64_t rdv, r.integer("CHORUS_TCP_RENDEZVOUS_BYTES", 0, kInt64Max, "an integer >= 0"));
  c.tcp.rendezvous_bytes = static_cast<uint64_t>(rdv);
  CHORUS_ASSIGN_OR_RETURN(int64_t hb, r.integer("CHORUS_HEARTBEAT_MS", 0, 3600000, "0..3600000, 0: off"));
  c.tcp.heartbeat_ms = static_cast<int>(hb);
  CHORUS_ASSIGN_OR_RETURN(c.tcp.rma, r.boolean("CHORUS_TCP_RMA"));
  // Checked for its characters here (a UCX_TLS list: names, ',', '^' to
  // exclude, ':' as in ud:aux); UCX itself says at the transport's
  // setup whether it knows the names.
  c.ucx.tls = r.str("CHORUS_UCX_TLS");
  if (!std::all_of(c.ucx.tls.begin(), c.ucx.tls.end(), [](unsigned char ch) {
        return std::isalnum(ch) || ch == '_' || ch == ',' || ch == '^' || ch == ':' || ch == '-';
      }))
    return invalidArgument("CHORUS_UCX_TLS='{}' is not a UCX transport list (accepted: UCX_TLS's syntax, e.g. tcp, "
                           "sm,tcp, rc,sm,self or ^ib; empty: UCX's own choice)",
                           c.ucx.tls);

  for (const char* v : Config::Ucx::kDefaulted)
    if (r.has(v)) c.ucx.user_set.emplace_back(v);

  c.tune.algo_spec = r.str("CHORUS_ALGO");  // parsed by the tuner, which names the knob's entry at fault
  // Split as PATH is (empty entries skipped); read and proven at setup (plan/plan_file.hpp).
  const std::string plans = r.str("CHORUS_PLAN_PATH");
  for (size_t b = 0; b <= plans.size();) {
    const size_t e = std::min(plans.find(':', b), plans.size());
    if (e > b) c.tune.plan_paths.push_back(plans.substr(b, e - b));
    b = e + 1;
  }
  CHORUS_ASSIGN_OR_RETURN(int64_t chunk, r.integer("CHORUS_CHUNK_BYTES", 0, kInt64Max, "an integer >= 0, 0: the tuner's choice"));
  c.tune.chunk_bytes = static_cast<uint64_t>(chunk);
  if (std::string f = r.str("CHORUS_TUNE_FILE"); !f.empty()) {
    c.tune.profile_path = std::move(f);
  } else {
    const std::optional<std::string> home = lookup("HOME");
    c.tune.profile_path = (home ? *home : std::string("/tmp")) + "/.cache/chorus/profile.json";
  }

  c.flight.dir = r.str("CHORUS_FLIGHT_DIR");
  CHORUS_ASSIGN_OR_RETURN(int64_t window, r.integer("CHORUS_SHRINK_WINDOW_MS", 0, kIntMax, "an integer >= 0 (ms)"));
  c.shrink.window = std::chrono::milliseconds(window);

  c.trace.dir = r.str("CHORUS_TRACE");
  CHORUS_ASSIGN_OR_RETURN(int64_t sync_s, r.integer("CHORUS_CLOCK_SYNC_S", 0, 86400, "0..86400, 0: at init only"));
  c.trace.clock_sync_s = static_cast<int>(sync_s);
  CHORUS_ASSIGN_OR_RETURN(c.trace.clock_offset_ns, r.integer("CHORUS_CLOCK_OFFSET_NS",
                                                             std::numeric_limits<int64_t>::min(), kInt64Max,
                                                             "an integer (nanoseconds)"));

  // Unknown levels were (and are) the default: a logging knob does not fail
  // an init.
  const std::string level = r.str("CHORUS_DEBUG");
  c.log.level = level == "NONE"    ? log::Level::None
                : level == "INFO"  ? log::Level::Info
                : level == "TRACE" ? log::Level::Trace
                                   : log::Level::Warn;
  return c;
}

namespace {
std::optional<std::string> fromEnvironment(std::string_view name) {
  if (name.starts_with("CHORUS_")) return env::raw(name);  // asserts that the table has it
  return env::getAny(std::string(name).c_str());
}
}  // namespace

Result<Config> configFromEnv() { return parseConfig(fromEnvironment); }

Result<device::StagingOptions> deviceStagingFromEnv() {
  const Lookup lookup = fromEnvironment;
  return parseDeviceStaging(Reader(lookup));
}

// Declared where it is used (api/c_api.cpp): CHORUS_CUDA_DRIVER, once.
void configureCudaDriver() {
  static const bool done = [] {
    const Lookup lookup = fromEnvironment;
    auto lib = parseCudaDriver(Reader(lookup));
    if (lib.isOk()) device::setCudaDriverLibrary(*lib);  // else the default, and chorusCommInit names the error
    return true;
  }();
  (void)done;
}

// Declared where it is used (api/c_api_kv.cpp), like reportStatus.
Result<bool> kvProgressThreadFromEnv() {
  const Lookup lookup = fromEnvironment;
  return parseKvProgress(Reader(lookup));
}

std::string envSocketIfname() {
  const Lookup lookup = fromEnvironment;
  return Reader(lookup).str("CHORUS_SOCKET_IFNAME");
}

}  // namespace chorus::api

// Unique ids, environment-based job discovery and host identity.
//
// Unique id encoding details beyond bootstrap.hpp's layout: family is 4 for
// IPv4 and 6 for IPv6 (not the OS's AF_* values, so ids are portable);
// address holds the IPv4 address in its first 4 bytes (network order, the
// other 12 zero) or the 16-byte IPv6 address; the port is a host number
// stored little endian; flags bit 0 says the secret is present, and without
// it the secret bytes must be zero.  decode() rejects anything else, so a
// corrupted or foreign id fails at init instead of connecting somewhere odd.
#include "bootstrap/bootstrap.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <utility>

#include "bootstrap/job_secret.hpp"
#include "bootstrap/launcher_secret.hpp"
#include "common/env.hpp"

namespace chorus::bootstrap {
namespace {

static_assert(sizeof(chorusUniqueId) == 128, "the unique id layout assumes 128 bytes");

constexpr char kIdMagic[8] = {'C', 'H', 'O', 'R', 'U', 'S', 'I', 'D'};
constexpr uint16_t kIdVersion = 1;
constexpr uint16_t kFamily4 = 4, kFamily6 = 6;
constexpr uint32_t kFlagSecret = 1;
constexpr std::string_view kSecretFix =
    "anyone who can reach the job's ports can join it, read and change its data; give every rank the same secret: "
    "`export CHORUS_SECRET=$(openssl rand -hex 32)` passed on by the launcher (mpirun -x CHORUS_SECRET, srun "
    "--export=ALL), or CHORUS_SECRET_FILE naming a 0600 file of 64 hex digits on a shared file system, or launch with "
    "chorus-run, which makes one; CHORUS_REQUIRE_SECRET=1 refuses to run without a secret";
// Offsets in the 128 bytes.
constexpr size_t kOffVersion = 8, kOffFamily = 10, kOffPort = 12, kOffPad = 14, kOffAddr = 16, kOffSecret = 32,
                 kOffFlags = 64, kOffTail = 68;

void put16(unsigned char* p, uint16_t v) {
  p[0] = static_cast<unsigned char>(v);
  p[1] = static_cast<unsigned char>(v >> 8);
}
uint16_t get16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
void put32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint32_t get32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
bool allZero(const unsigned char* p, size_t n) {
  return std::all_of(p, p + n, [](unsigned char c) { return c == 0; });
}

// Listeners reserved by makeUniqueId until rank 0's init adopts them.
//
// This is process-wide state on purpose: the NCCL-shaped API passes only the
// 128-byte id from chorusGetUniqueId to chorusCommInitRank, so the open socket
// that keeps the port reserved cannot travel with it.  Only ids made by this
// process are found; an id used in another process (rank 0 elsewhere) simply
// finds nothing and binds the port itself.  Bounded: ids that are never used
// for init would otherwise hold an fd each forever.
struct ReservedListeners {
  static constexpr size_t kMax = 64;
  std::mutex mu;
  std::deque<std::pair<std::string, net::Fd>> entries;  // oldest first
};
ReservedListeners& reserved() {
  static ReservedListeners r;
  return r;
}

// The first address of an interface that is up, not loopback, IPv4; nullopt if none.
std::optional<net::SockAddr> firstUpIpv4() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return std::nullopt;
  std::optional<net::SockAddr> found;
  for (ifaddrs* i = list; i && !found; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    net::SockAddr a;
    std::memcpy(&a.ss, i->ifa_addr, sizeof(sockaddr_in));
    a.len = sizeof(sockaddr_in);
    found = a;
  }
  ::freeifaddrs(list);
  return found;
}

std::optional<std::string> nonEmpty(std::optional<std::string> v) {
  if (v && v->empty()) return std::nullopt;
  return v;
}
// A CHORUS_* knob (through the env table) or another variable, empty = unset.
std::optional<std::string> var(const char* name) {
  if (std::string_view(name).starts_with("CHORUS_")) return nonEmpty(env::raw(name));
  return nonEmpty(env::getAny(name));
}

Result<int64_t> parseIntVar(const char* name, const std::string& value) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || p != value.data() + value.size())
    return invalidArgument("environment variable {}='{}' is not an integer", name, value);
  return v;
}

// Open MPI without CHORUS_MASTER_ADDR: loopback when every rank runs on this
// host (OMPI_COMM_WORLD_LOCAL_SIZE equals the world size), else the IPv4
// address of mpirun's host from OMPI_MCA_orte_hnp_uri
// ("jobid.0;tcp://192.0.2.2:58645;tcp6://[..]:48863").
Result<std::string> openMpiMaster(int world_size) {
  if (auto local = var("OMPI_COMM_WORLD_LOCAL_SIZE")) {
    CHORUS_ASSIGN_OR_RETURN(int64_t n, parseIntVar("OMPI_COMM_WORLD_LOCAL_SIZE", *local));
    if (n == world_size) return std::string("127.0.0.1");
  }
  if (auto uri = var("OMPI_MCA_orte_hnp_uri")) {
    const size_t at = uri->find(";tcp://");
    if (at != std::string::npos) {
      const size_t begin = at + 7;
      const size_t colon = uri->find(':', begin);
      if (colon != std::string::npos && colon > begin) return uri->substr(begin, colon - begin);
    }
  }
  return invalidArgument(
      "Open MPI job over several hosts without CHORUS_MASTER_ADDR, and no mpirun address in OMPI_MCA_orte_hnp_uri "
      "(Open MPI 5 does not export it): set CHORUS_MASTER_ADDR to rank 0's host (mpirun -x CHORUS_MASTER_ADDR=...)");
}

// 20000 + FNV-1a(job id) % 12000: in 20000..31999, below the ephemeral ports.
uint16_t openMpiPort(std::string_view job_id) {
  uint64_t h = 1469598103934665603ull;
  for (char c : job_id) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return static_cast<uint16_t>(20000 + h % 12000);
}

Result<int64_t> requireInt(const char* name, const char* because) {
  auto v = var(name);
  if (!v) return invalidArgument("environment variable {} is not set ({} is)", name, because);
  return parseIntVar(name, *v);
}

}  // namespace

chorusUniqueId UniqueId::encode() const {
  chorusUniqueId id{};
  auto* p = reinterpret_cast<unsigned char*>(id.internal);
  std::memcpy(p, kIdMagic, sizeof kIdMagic);
  put16(p + kOffVersion, kIdVersion);
  put16(p + kOffPort, root.port());
  if (root.family() == AF_INET) {
    put16(p + kOffFamily, kFamily4);
    std::memcpy(p + kOffAddr, &reinterpret_cast<const sockaddr_in*>(&root.ss)->sin_addr, 4);
  } else if (root.family() == AF_INET6) {
    put16(p + kOffFamily, kFamily6);
    std::memcpy(p + kOffAddr, &reinterpret_cast<const sockaddr_in6*>(&root.ss)->sin6_addr, 16);
  }  // else: family 0, which decode() rejects
  if (secret.present) {
    std::memcpy(p + kOffSecret, secret.bytes.data(), auth::kSecretBytes);
    put32(p + kOffFlags, kFlagSecret);
  }
  return id;
}

Result<UniqueId> UniqueId::decode(const chorusUniqueId& id) {
  const auto* p = reinterpret_cast<const unsigned char*>(id.internal);
  constexpr std::string_view kHint = "(was it produced by chorusGetUniqueId of the same chorus version and copied intact?)";
  if (std::memcmp(p, kIdMagic, sizeof kIdMagic) != 0)
    return invalidArgument("unique id: bad magic {}", kHint);
  if (uint16_t v = get16(p + kOffVersion); v != kIdVersion)
    return invalidArgument("unique id: version {} but this chorus reads version {} {}", v, kIdVersion, kHint);
  if (get16(p + kOffPad) != 0) return invalidArgument("unique id: non-zero padding {}", kHint);
  if (!allZero(p + kOffTail, sizeof(chorusUniqueId) - kOffTail))
    return invalidArgument("unique id: non-zero bytes after the flags {}", kHint);
  uint32_t flags = get32(p + kOffFlags);
  if (flags & ~kFlagSecret) return invalidArgument("unique id: unknown flags 0x{:x} {}", flags, kHint);
  uint16_t port = get16(p + kOffPort);
  if (port == 0) return invalidArgument("unique id: port 0 {}", kHint);

  UniqueId out;
  uint16_t family = get16(p + kOffFamily);
  if (family == kFamily4) {
    if (!allZero(p + kOffAddr + 4, 12)) return invalidArgument("unique id: IPv4 address with non-zero padding {}", kHint);
    auto* in = reinterpret_cast<sockaddr_in*>(&out.root.ss);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr, p + kOffAddr, 4);
    out.root.len = sizeof(sockaddr_in);
  } else if (family == kFamily6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&out.root.ss);
    in6->sin6_family = AF_INET6;
    std::memcpy(&in6->sin6_addr, p + kOffAddr, 16);
    out.root.len = sizeof(sockaddr_in6);
  } else {
    return invalidArgument("unique id: address family {} (expected 4 or 6) {}", family, kHint);
  }
  out.root.setPort(port);
  if (flags & kFlagSecret) {
    std::memcpy(out.secret.bytes.data(), p + kOffSecret, auth::kSecretBytes);
    out.secret.present = true;
  } else if (!allZero(p + kOffSecret, auth::kSecretBytes)) {
    return invalidArgument("unique id: secret bytes without the secret flag {}", kHint);
  }
  return out;
}

Result<UniqueId> makeUniqueId(const std::string& ifname) {
  net::SockAddr addr;
  if (!ifname.empty()) {
    CHORUS_ASSIGN_OR_RETURN(addr, net::interfaceAddress(ifname));
  } else if (auto a = firstUpIpv4()) {
    addr = *a;
  } else {
    CHORUS_ASSIGN_OR_RETURN(addr, net::resolve("127.0.0.1", 0));
  }
  addr.setPort(0);
  auto listener = net::listenOn(addr, 1024);
  if (!listener.isOk())
    return listener.status().withContext("chorusGetUniqueId: cannot reserve a port for the rendezvous store: ");
  CHORUS_ASSIGN_OR_RETURN(net::SockAddr bound, net::boundAddress(listener->get()));

  UniqueId id;
  id.root = bound;
  id.secret = auth::Secret::random();
  if (!id.secret.present) return systemError("chorusGetUniqueId: the OS random generator failed; cannot draw a job secret");

  ReservedListeners& r = reserved();
  std::lock_guard lock(r.mu);
  if (r.entries.size() >= ReservedListeners::kMax) r.entries.pop_front();  // closes the oldest unused reservation
  r.entries.emplace_back(bound.toString(), std::move(*listener));
  return id;
}

std::optional<net::Fd> takeReservedListener(const net::SockAddr& addr) {
  ReservedListeners& r = reserved();
  std::string key = addr.toString();
  std::lock_guard lock(r.mu);
  for (auto it = r.entries.begin(); it != r.entries.end(); ++it)
    if (it->first == key) {
      net::Fd fd = std::move(it->second);
      r.entries.erase(it);
      return fd;
    }
  return std::nullopt;
}

Result<std::string> firstSlurmHost(const std::string& nodelist) {
  auto bad = [&](std::string_view why) {
    return invalidArgument("SLURM_JOB_NODELIST='{}' is not a Slurm host list: {}", nodelist, why);
  };
  // The first entry: up to the first comma outside brackets.
  size_t depth = 0, end = nodelist.size();
  for (size_t i = 0; i < nodelist.size(); ++i) {
    char ch = nodelist[i];
    if (ch == '[') {
      if (++depth > 1) return bad("nested '['");
    } else if (ch == ']') {
      if (depth == 0) return bad("']' without '['");
      --depth;
    } else if (ch == ',' && depth == 0) {
      end = i;
      break;
    }
  }
  if (depth != 0) return bad("unclosed '['");
  std::string_view entry(nodelist.data(), end);
  // Trim spaces Slurm never writes but users do when they set it by hand.
  while (!entry.empty() && entry.front() == ' ') entry.remove_prefix(1);
  while (!entry.empty() && entry.back() == ' ') entry.remove_suffix(1);
  if (entry.empty()) return bad("empty first host");

  // Each bracket group contributes the first item of its first range: "01-04" -> "01".
  std::string host;
  size_t i = 0;
  while (i < entry.size()) {
    size_t open = entry.find('[', i);
    if (open == std::string_view::npos) {
      host.append(entry.substr(i));
      break;
    }
    host.append(entry.substr(i, open - i));
    size_t close = entry.find(']', open);
    std::string_view group = entry.substr(open + 1, close - open - 1);
    std::string_view first = group.substr(0, group.find(','));
    std::string_view lo = first.substr(0, first.find('-'));
    if (lo.empty() || !std::all_of(lo.begin(), lo.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return bad(fmt::format("range '[{}]' does not start with a number", group));
    if (size_t dash = first.find('-'); dash != std::string_view::npos) {
      std::string_view hi = first.substr(dash + 1);
      if (hi.empty() || !std::all_of(hi.begin(), hi.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return bad(fmt::format("range '{}' has no upper bound", first));
    }
    host.append(lo);
    i = close + 1;
  }
  if (host.find_first_of(" \t") != std::string::npos) return bad("space inside a host name");
  return host;
}

namespace {

bool isLoopback(const std::string& host) {
  return host == "localhost" || host.starts_with("127.") || host == "::1" || host == "[::1]";
}

// Every rank of this launch runs on this host, and how we know ("" when not
// known): the launcher's local size equals the world size, or the store is
// on loopback.
std::string oneHostEvidence(const EnvJob& job) {
  auto equalsWorld = [&](const char* name) {
    auto v = var(name);
    return v && *v == std::to_string(job.world_size);
  };
  if (job.source == "torchrun" && equalsWorld("LOCAL_WORLD_SIZE")) return "LOCAL_WORLD_SIZE == WORLD_SIZE";
  if (job.source == "openmpi" && equalsWorld("OMPI_COMM_WORLD_LOCAL_SIZE"))
    return "OMPI_COMM_WORLD_LOCAL_SIZE == OMPI_COMM_WORLD_SIZE";
  if (job.source == "slurm" && (var("SLURM_STEP_NUM_NODES") == "1" || var("SLURM_NNODES") == "1"))
    return "a one-node Slurm step";
  if (isLoopback(job.master_addr)) return "the store address is loopback";
  return "";
}

// How long the launcher's exchange may wait for every rank to get there.
constexpr std::chrono::milliseconds kLauncherSecretTimeout{300000};

// The secret: CHORUS_SECRET, else CHORUS_SECRET_FILE, else (mpirun, srun) the
// launcher's PMIx exchange (launcher_secret.hpp), else (every rank on this
// host) the per-job file of job_secret.hpp.  Without any, the reason.
Status findJobSecret(EnvJob& job, const std::optional<std::string>& ompi_job) {
  if (auto hex = var("CHORUS_SECRET")) {
    auto s = auth::Secret::fromHex(*hex);
    if (!s.isOk()) return s.status().withContext("environment variable CHORUS_SECRET: ");
    job.secret = *s;
    job.secret_origin = "CHORUS_SECRET";
    return {};
  }
  if (auto file = var("CHORUS_SECRET_FILE")) {
    CHORUS_ASSIGN_OR_RETURN(job.secret, readSecretFile(*file));
    job.secret_origin = fmt::format("CHORUS_SECRET_FILE={}", *file);
    return {};
  }
  // How many times this process initialised from the environment (ranks do
  // so alike): it tells apart the secrets of successive inits.
  static std::atomic<int> inits{0};
  const int instance = inits.fetch_add(1);
  // mpirun and srun: their own PMIx exchange serves ranks on every host.
  std::string no_launcher;
  // A PMIx server advertises itself to the processes it starts (PMIx 2 to 4
  // name the variable by protocol version); without one PMIx_Init has nothing
  // to talk to.
  const bool pmix_server = var("PMIX_SERVER_URI4") || var("PMIX_SERVER_URI41") || var("PMIX_SERVER_URI3") ||
                           var("PMIX_SERVER_URI21") || var("PMIX_SERVER_URI2") || var("PMIX_SERVER_URI");
  if ((job.source == "openmpi" || job.source == "slurm") && (!var("PMIX_NAMESPACE") || !pmix_server)) {
    no_launcher = "no PMIx server in the environment (PMIX_NAMESPACE and PMIX_SERVER_URI*): not under a PMIx launcher";
  } else if (job.source == "openmpi" || job.source == "slurm") {
    CHORUS_ASSIGN_OR_RETURN(auto launched,
                            secretFromLauncher(job.world_size, instance, kLauncherSecretTimeout, &no_launcher));
    if (launched) {
      job.secret = launched->secret;
      job.secret_origin = launched->origin;
      return {};
    }
  }
  std::string evidence = oneHostEvidence(job);
  if (evidence.empty()) {
    job.no_secret_reason = fmt::format("CHORUS_SECRET and CHORUS_SECRET_FILE are not set{} and this {} job's ranks "
                                       "may be on several hosts, so no per-job file can serve them all",
                                       no_launcher.empty() ? "" : fmt::format(", no launcher exchange ({})", no_launcher),
                                       job.source);
    return {};
  }
  // What names this launch alike on every rank: the launcher's job id where
  // it has one, the store's address, the world size, and the instance.
  std::string launch;
  if (job.source == "torchrun") launch = var("TORCHELASTIC_RUN_ID").value_or("");
  if (job.source == "openmpi") launch = ompi_job.value_or("");
  if (job.source == "slurm")
    launch = fmt::format("{}.{}", var("SLURM_JOB_ID").value_or(""), var("SLURM_STEP_ID").value_or(""));
  std::string key = fmt::format("{}|{}|{}|{}|{}|{}", job.source, launch, job.master_addr, job.master_port,
                                job.world_size, instance);
  std::string preferred = var("CHORUS_SECRET_DIR").value_or("");
  if (preferred.empty())
    if (auto xdg = var("XDG_RUNTIME_DIR"); xdg && privateSecretDir(*xdg).isOk()) preferred = *xdg;
  auto dir = privateSecretDir(preferred);
  if (!dir.isOk())
    return dir.status().withContext(
        fmt::format("a per-job secret file (every rank is on this host: {}; set CHORUS_SECRET to bypass it): ",
                    evidence));
  auto shared = sharedJobSecret(*dir, key);
  if (!shared.isOk())
    return shared.status().withContext(fmt::format("the per-job secret file (every rank is on this host: {}; set "
                                                   "CHORUS_SECRET to bypass it): ",
                                                   evidence));
  job.secret = shared->secret;
  job.secret_file = shared->path;
  job.secret_origin = fmt::format("the per-job file {} (every rank is on this host: {})", shared->path, evidence);
  return {};
}

}  // namespace

std::string_view secretFix() { return kSecretFix; }

Result<EnvJob> readEnvJob() {
  EnvJob job;
  const char* rank_var = nullptr;
  const char* size_var = nullptr;
  if (var("CHORUS_RANK")) {
    job.source = "chorus", rank_var = "CHORUS_RANK", size_var = "CHORUS_WORLD_SIZE";
  } else if (var("RANK")) {
    job.source = "torchrun", rank_var = "RANK", size_var = "WORLD_SIZE";
  } else if (var("OMPI_COMM_WORLD_RANK")) {
    job.source = "openmpi", rank_var = "OMPI_COMM_WORLD_RANK", size_var = "OMPI_COMM_WORLD_SIZE";
  } else if (var("SLURM_PROCID")) {
    job.source = "slurm", rank_var = "SLURM_PROCID", size_var = "SLURM_NTASKS";
  } else {
    return invalidUsage(
        "cannot find this process's rank in the environment: none of CHORUS_RANK, RANK (torchrun), "
        "OMPI_COMM_WORLD_RANK (Open MPI) or SLURM_PROCID (Slurm) is set; launch with chorus-run, torchrun, mpirun or "
        "srun, or use chorusGetUniqueId + chorusCommInitRank");
  }
  CHORUS_ASSIGN_OR_RETURN(int64_t rank, parseIntVar(rank_var, *var(rank_var)));
  // CHORUS_WORLD_SIZE, like every CHORUS_* knob, overrides what the launcher says.
  if (var("CHORUS_WORLD_SIZE")) size_var = "CHORUS_WORLD_SIZE";
  CHORUS_ASSIGN_OR_RETURN(int64_t size, requireInt(size_var, rank_var));
  if (size < 1 || size > (int64_t{1} << 30))
    return invalidArgument("environment variable {}={} is not a valid number of ranks", size_var, size);
  if (rank < 0 || rank >= size)
    return invalidArgument("environment variable {}={} is outside 0..{} ({}={})", rank_var, rank, size - 1, size_var,
                           size);
  job.rank = static_cast<int>(rank);
  job.world_size = static_cast<int>(size);

  // Open MPI's mpirun: the job id (OMPI_MCA_ess_base_jobid in Open MPI 4,
  // PMIX_NAMESPACE in 5) names the job on every rank alike.
  std::optional<std::string> ompi_job;
  if (job.source == "openmpi") {
    ompi_job = var("OMPI_MCA_ess_base_jobid");
    if (!ompi_job) ompi_job = var("PMIX_NAMESPACE");
  }

  // The master: CHORUS_MASTER_ADDR, else MASTER_ADDR, else (Slurm) the first
  // host of the node list, else (Open MPI) loopback when every rank is on
  // this host, or mpirun's host.
  if (auto a = var("CHORUS_MASTER_ADDR")) {
    job.master_addr = *a;
    job.addr_origin = "CHORUS_MASTER_ADDR";
  } else if (auto m = var("MASTER_ADDR")) {
    job.master_addr = *m;
    job.addr_origin = "MASTER_ADDR";
  } else if (job.source == "openmpi") {
    CHORUS_ASSIGN_OR_RETURN(job.master_addr, openMpiMaster(job.world_size));
    job.addr_origin = job.master_addr == "127.0.0.1"
                          ? "loopback: OMPI_COMM_WORLD_LOCAL_SIZE says every rank is on this host"
                          : "mpirun's host, from OMPI_MCA_orte_hnp_uri: rank 0 must run there (Open MPI's default "
                            "mapping puts it on the first host)";
  } else if (job.source == "slurm") {
    auto list = var("SLURM_JOB_NODELIST");
    if (!list) list = var("SLURM_NODELIST");
    if (!list)
      return invalidArgument("Slurm job without SLURM_JOB_NODELIST: set CHORUS_MASTER_ADDR to rank 0's host");
    CHORUS_ASSIGN_OR_RETURN(job.master_addr, firstSlurmHost(*list));
    job.addr_origin = "the first host of the Slurm node list";
  } else {
    return invalidArgument("environment variable {} is not set ({} job, {}={}); set it to rank 0's host",
                           job.source == "torchrun" ? "MASTER_ADDR" : "CHORUS_MASTER_ADDR", job.source, rank_var,
                           rank);
  }

  const char* port_var = "CHORUS_MASTER_PORT";
  std::optional<std::string> port = var("CHORUS_MASTER_PORT");
  if (!port && (port = var("MASTER_PORT"))) port_var = "MASTER_PORT";
  if (port) {
    CHORUS_ASSIGN_OR_RETURN(int64_t p, parseIntVar(port_var, *port));
    if (p < 1 || p > 65535) return invalidArgument("environment variable {}={} is not a TCP port (1..65535)", port_var, p);
    job.master_port = static_cast<uint16_t>(p);
    job.port_origin = port_var;
    if (port_var == std::string_view("MASTER_PORT")) {
      // MASTER_PORT is torch's store: torchrun's agent listens there before
      // any worker starts, and torch's env:// init binds it on rank 0.
      // chorus's own store takes the next port.
      if (p == 65535)
        return invalidArgument("environment variable MASTER_PORT=65535: chorus's store listens on MASTER_PORT + 1 "
                               "(MASTER_PORT is torch's store), which is no TCP port; use a lower MASTER_PORT or set "
                               "CHORUS_MASTER_PORT");
      job.master_port = static_cast<uint16_t>(p + 1);
      job.port_origin = fmt::format("MASTER_PORT + 1 (MASTER_PORT={} is torch's store)", p);
    }
  } else if (auto jobid = var("SLURM_JOB_ID"); jobid && job.source == "slurm") {
    // Every rank derives the same port from the job id, so a plain srun needs
    // no extra variable; jobs sharing a node rarely collide in 20000 ports.
    CHORUS_ASSIGN_OR_RETURN(int64_t id, parseIntVar("SLURM_JOB_ID", *jobid));
    job.master_port = static_cast<uint16_t>(20000 + (id % 20000 + 20000) % 20000);
    job.port_origin = fmt::format("derived from SLURM_JOB_ID={}", id);
  } else if (ompi_job) {
    // The same for mpirun: every rank hashes the job id alike.  Below Linux's
    // ephemeral range (32768..), so no outgoing connection holds the port.
    job.master_port = openMpiPort(*ompi_job);
    job.port_origin = fmt::format("derived from Open MPI's job id {}", *ompi_job);
  } else {
    return invalidArgument("environment variable {} is not set ({} job); set it to a free port on rank 0's host",
                           job.source == "torchrun" ? "MASTER_PORT" : "CHORUS_MASTER_PORT", job.source);
  }

  CHORUS_RETURN_IF_ERROR(findJobSecret(job, ompi_job));
  CHORUS_ASSIGN_OR_RETURN(bool require, env::getBool("CHORUS_REQUIRE_SECRET"));
  if (require && !job.secret.present)
    return invalidUsage("CHORUS_REQUIRE_SECRET=1 but this job has no secret: {}; {}", job.no_secret_reason,
                        kSecretFix);
  return job;
}

bool HostIdentity::operator==(const HostIdentity& o) const {
  return std::strncmp(hostname, o.hostname, sizeof hostname) == 0 &&
         std::strncmp(boot_id, o.boot_id, sizeof boot_id) == 0 && netns_inode == o.netns_inode &&
         ipcns_inode == o.ipcns_inode;
}

std::vector<int> hostIndices(std::span<const HostIdentity> ids, bool apart) {
  std::vector<int> host_of(ids.size());
  for (size_t r = 0; r < ids.size(); ++r) {
    host_of[r] = static_cast<int>(r);
    for (size_t q = 0; q < r && !apart; ++q)
      if (ids[q] == ids[r]) {
        host_of[r] = host_of[q];
        break;
      }
  }
  return host_of;
}

HostIdentity localHostIdentity(std::string_view host_id) {
  HostIdentity id;
  // gethostname may not terminate a truncated name; the last byte stays 0.
  if (::gethostname(id.hostname, sizeof id.hostname - 1) != 0) id.hostname[0] = '\0';
  id.hostname[sizeof id.hostname - 1] = '\0';
  // CHORUS_HOST_ID splits one machine into several "hosts" (tests).
  if (!host_id.empty()) {
    const std::string named = fmt::format("{}#{}", host_id, id.hostname);  // the id first: never truncated away
    std::memset(id.hostname, 0, sizeof id.hostname);
    std::memcpy(id.hostname, named.data(), std::min(named.size(), sizeof id.hostname - 1));
  }
  // boot_id tells apart hosts (or containers) that share a host name.
  if (std::ifstream f("/proc/sys/kernel/random/boot_id"); f) {
    f.read(id.boot_id, sizeof id.boot_id - 1);
    for (char& c : id.boot_id)
      if (c == '\n') c = '\0';
  }
  id.boot_id[sizeof id.boot_id - 1] = '\0';
  // Namespaces: processes on one kernel but in different network/IPC
  // namespaces cannot use each other's shared memory the same way.
  struct stat st{};
  if (::stat("/proc/self/ns/net", &st) == 0) id.netns_inode = st.st_ino;
  if (::stat("/proc/self/ns/ipc", &st) == 0) id.ipcns_inode = st.st_ino;
  return id;
}

}  // namespace chorus::bootstrap

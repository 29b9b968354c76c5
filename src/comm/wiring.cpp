#include "comm/wiring.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>

#include "comm/call_signature.hpp"
#include "transport/registry.hpp"

namespace chorus::comm {

namespace {

// Serialises access to a store client shared by a communicator and the
// communicators split from it (their inits may run on different threads).
class LockedStore final : public bootstrap::Store {
 public:
  explicit LockedStore(std::shared_ptr<bootstrap::Store> s) : s_(std::move(s)) {}
  Status set(std::string_view k, std::span<const std::byte> v) override {
    std::lock_guard l(mu_);
    return s_->set(k, v);
  }
  Result<bootstrap::Bytes> get(std::string_view k, std::chrono::milliseconds t) override {
    std::lock_guard l(mu_);
    return s_->get(k, t);
  }
  Result<int64_t> add(std::string_view k, int64_t d) override {
    std::lock_guard l(mu_);
    return s_->add(k, d);
  }
  Result<int64_t> serverTimeNs() override {
    std::lock_guard l(mu_);
    return s_->serverTimeNs();
  }

 private:
  std::mutex mu_;
  std::shared_ptr<bootstrap::Store> s_;
};

// What each rank publishes at init.
struct RankInfo {
  uint32_t magic = 0x4348494e;  // "CHIN"
  int32_t nranks = 0;
  int32_t rank = 0;
  int32_t pid = 0;
  bootstrap::HostIdentity host;
};

uint64_t hash64(std::string_view s) { return std::hash<std::string_view>{}(s); }

// The store servers of environment inits, by address; never released, but
// stopped at the process's exit (stopSharedServers).
struct SharedServers {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<bootstrap::StoreServer>> by_addr;
  pid_t owner = 0;  // the process that started them
};
SharedServers& sharedServers();

// An atexit handler, registered before the first server starts: it runs
// before the teardown of everything set up earlier (static objects, OpenSSL,
// the log), so no server thread answers a late client or a stranger while
// the exit frees what that thread uses.  A forked child inherits the handler
// but not the threads, and leaves them alone; so does an exit while another
// thread holds the registry (an init in flight: its server keeps running, as
// every server did before).
void stopSharedServers() {
  SharedServers& ss = sharedServers();
  if (ss.owner != getpid()) return;
  std::unique_lock lock(ss.mu, std::try_to_lock);
  if (!lock.owns_lock()) return;
  for (auto& [addr, server] : ss.by_addr)
    if (server != nullptr) server->stop();
}

SharedServers& sharedServers() {
  static auto* s = [] {
    auto* ss = new SharedServers;
    ss->owner = getpid();
    std::atexit(stopSharedServers);
    return ss;
  }();
  return *s;
}

// Rank 0's store server: an environment init's (shared_server) outlives the
// communicator and serves every later one of the same address.
Result<std::shared_ptr<bootstrap::StoreServer>> rootServer(const bootstrap::UniqueId& id, bool shared_server,
                                                           auth::WireProtect protect) {
  std::shared_ptr<bootstrap::StoreServer> server;
  std::unique_lock<std::mutex> lock;
  std::shared_ptr<bootstrap::StoreServer>* slot = nullptr;
  if (shared_server) {
    SharedServers& ss = sharedServers();
    lock = std::unique_lock(ss.mu);
    slot = &ss.by_addr[id.root.toString()];
    server = *slot;
  }
  if (server == nullptr) {
    auto reserved = bootstrap::takeReservedListener(id.root);
    bootstrap::StoreServerOptions opts;
    opts.protect = protect;
    auto s = reserved ? bootstrap::StoreServer::start(std::move(*reserved), id.secret, opts)
                      : bootstrap::StoreServer::start(id.root, id.secret, opts);
    if (!s.isOk())
      return s.status().withContext(fmt::format("rank 0: starting the rendezvous store on {}: ", id.root.toString()));
    server = std::move(s.value());
    if (slot != nullptr) *slot = server;
  }
  return server;
}

// Publishes this rank's record and reads every rank's: a rank missing at
// the timeout is named, as is one that counts the ranks differently.
Result<std::vector<RankInfo>> exchangeRecords(int rank, int nranks, const Config& cfg, bootstrap::Store& store,
                                              const bootstrap::UniqueId& id, const bootstrap::StoreServer* server,
                                              const RankInfo& me) {
  CHORUS_RETURN_IF_ERROR(store.set(fmt::format("info/{}", rank), bootstrap::toBytes(me)));
  std::vector<RankInfo> infos(nranks);
  const auto join_start = std::chrono::steady_clock::now();
  for (int r = 0; r < nranks; ++r) {
    auto got = store.get(fmt::format("info/{}", r), cfg.timeout);
    if (!got.isOk() && got.status().code() == chorusTimeout) {
      // Say who is missing, not which store key: look at every rank's record.
      std::vector<int> missing;
      for (int q = 0; q < nranks; ++q)
        if (!store.get(fmt::format("info/{}", q), std::chrono::milliseconds(1)).isOk()) missing.push_back(q);
      std::string list;
      for (int q : missing) list += fmt::format("{}{}", list.empty() ? "" : ",", q);
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - join_start).count();
      return makeError(chorusTimeout,
                       "init: {} of {} ranks joined within {:.1f} s; rank(s) {} never reached the rendezvous store "
                       "({}) (did they start? do all ranks use the same unique id or CHORUS_MASTER_ADDR/PORT and "
                       "world size? can they reach that address?) [{}]",
                       nranks - static_cast<int>(missing.size()), nranks, waited, list.empty() ? "?" : list,
                       server ? server->address().toString() : id.root.toString(), got.status().message());
    }
    CHORUS_ASSIGN_OR_RETURN(bootstrap::Bytes b, std::move(got));
    if (b.size() != sizeof(RankInfo)) return remoteError("init: rank {} published a malformed record ({} bytes)", r, b.size());
    std::memcpy(&infos[r], b.data(), sizeof(RankInfo));
    if (infos[r].magic != me.magic || infos[r].rank != r)
      return remoteError("init: rank {} published a malformed record", r);
    if (infos[r].nranks != nranks)
      return invalidUsage(
          "init: rank {} was initialised with nranks={} but rank {} with nranks={} (do all ranks pass the same "
          "nranks to chorusCommInitRank / the same WORLD_SIZE?)",
          rank, nranks, r, infos[r].nranks);
  }
  return infos;
}

// Creates every transport the registry chose for at least one peer, in
// preference order (the same order on every rank: each creation is
// collective over the ranks it serves), and routes each peer to its own.
Status connectTransports(int nranks, const transport::WireView& view, const transport::RouteChoice& rc,
                         const bootstrap::UniqueId& id, const std::shared_ptr<bootstrap::Store>& base,
                         bootstrap::Store& store, const std::string& prefix, const std::string& job_tag, Wiring* w) {
  for (const transport::TransportInfo* t : rc.used) {
    transport::SetupContext c;
    c.view = view;
    c.nranks = nranks;
    for (int q = 0; q < nranks; ++q)
      if (rc.by_rank[static_cast<size_t>(q)] == t) c.peers.push_back(q);
    c.serves_all = static_cast<int>(c.peers.size()) == nranks - 1;
    c.id = &id;
    c.store = &store;
    c.base = base;
    c.prefix = prefix;
    c.job_tag = job_tag;
    CHORUS_ASSIGN_OR_RETURN(transport::Created made, t->create(c));
    if (made.transport == nullptr) return internalError("init: rank {}: transport '{}' created nothing", view.rank, t->name);
    for (int q : c.peers) w->routes[static_cast<size_t>(q)] = made.transport.get();
    if (made.board != nullptr && t->caps.board && c.serves_all) w->board = made.board;
    w->transport_names.push_back(t->name);
    w->transports.push_back(std::move(made.transport));
  }
  installWireMismatchText();
  return {};
}

// The topology the tuner plans for.  Host groups: ranks of one host that a
// host-local transport (shared memory) joins; the transports within and
// between groups name the profile's link figures.  Every rank works out
// every pair's route (the registry's choice is a function of the records and
// the config), so all ranks see the same groups.
tune::Topology topologyOf(int nranks, const transport::WireView& view, const Config& cfg) {
  const transport::TransportRegistry& reg = transport::registry();
  tune::Topology topo;
  topo.nranks = nranks;
  topo.host_of.assign(static_cast<size_t>(nranks), 0);
  std::string intra, inter;
  for (int r = 0; r < nranks; ++r) {
    topo.host_of[static_cast<size_t>(r)] = r;
    for (int q = 0; q < r; ++q) {
      if (!(view.ranks[static_cast<size_t>(q)].host == view.ranks[static_cast<size_t>(r)].host)) continue;
      const transport::TransportInfo* t = reg.routeFor(view, q, r, cfg.net.transport);
      if (t != nullptr && t->host_local) {
        topo.host_of[static_cast<size_t>(r)] = topo.host_of[static_cast<size_t>(q)];
        if (intra.empty()) intra = t->name;
      }
      break;  // q is the lowest rank of r's host: r joins its group or none
    }
  }
  // Between groups: the route of the first pair of ranks in different groups.
  for (int r = 1; r < nranks && inter.empty(); ++r)
    if (topo.host_of[static_cast<size_t>(r)] != topo.host_of[0])
      if (const transport::TransportInfo* t = reg.routeFor(view, 0, r, cfg.net.transport)) inter = t->name;
  if (!intra.empty()) topo.links.intra = intra;
  if (!inter.empty()) topo.links.inter = inter;
  const int mine = topo.host_of[static_cast<size_t>(view.rank)];
  topo.local_ranks = static_cast<int>(std::count(topo.host_of.begin(), topo.host_of.end(), mine));
  topo.all_local = topo.local_ranks == nranks;
  topo.one_machine = true;
  for (const transport::RankRecord& o : view.ranks)
    topo.one_machine = topo.one_machine && o.host == view.ranks[static_cast<size_t>(view.rank)].host;
  return topo;
}

// Ranks in different network namespaces of one machine are different hosts
// to chorus (TCP between them): their trace names the namespace.
std::string hostLabel(const std::vector<RankInfo>& infos, const RankInfo& me) {
  bool netns_apart = false;
  for (const RankInfo& o : infos)
    netns_apart = netns_apart || (std::strncmp(o.host.hostname, me.host.hostname, sizeof me.host.hostname) == 0 &&
                                  o.host.netns_inode != me.host.netns_inode);
  std::string host_label = me.host.hostname;
  if (netns_apart) host_label += fmt::format("/netns{}", me.host.netns_inode);
  return host_label;
}

}  // namespace

Result<Rendezvous> joinRendezvous(int rank, const bootstrap::UniqueId& id, const Config& cfg, bool shared_server) {
  Rendezvous rv;
  if (rank == 0) {
    CHORUS_ASSIGN_OR_RETURN(rv.server, rootServer(id, shared_server, cfg.net.wire_protect));
  }
  auto store = bootstrap::connectStore(id.root, id.secret, cfg.timeout, cfg.net.wire_protect);
  if (!store.isOk())
    return store.status().withContext(fmt::format("rank {}: connecting to the rendezvous store at {}: ", rank, id.root.toString()));
  rv.store = std::make_shared<LockedStore>(store.value());
  return rv;
}

Result<Wiring> wire(int rank, int nranks, const bootstrap::UniqueId& id, const Config& cfg,
                    const std::shared_ptr<bootstrap::Store>& base, bootstrap::Store& store, const std::string& prefix,
                    const bootstrap::StoreServer* server) {
  RankInfo me;
  me.nranks = nranks;
  me.rank = rank;
  me.pid = static_cast<int32_t>(getpid());
  me.host = bootstrap::localHostIdentity(cfg.net.host_id);
  CHORUS_ASSIGN_OR_RETURN(std::vector<RankInfo> infos, exchangeRecords(rank, nranks, cfg, store, id, server, me));

  std::vector<transport::RankRecord> records(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) records[static_cast<size_t>(r)] = {r, infos[static_cast<size_t>(r)].pid, infos[static_cast<size_t>(r)].host};
  const transport::WireView view{rank, records, &cfg};
  CHORUS_ASSIGN_OR_RETURN(transport::RouteChoice rc, transport::registry().choose(view, cfg.net.transport));
  Wiring w;
  w.routes.assign(nranks, nullptr);
  const std::string job_tag = fmt::format("{:016x}", hash64(id.secret.toHex() + id.root.toString() + prefix));
  CHORUS_RETURN_IF_ERROR(connectTransports(nranks, view, rc, id, base, store, prefix, job_tag, &w));
  w.topology = topologyOf(nranks, view, cfg);
  w.trace_id = hash64(job_tag + "trace");
  w.host_label = hostLabel(infos, me);
  return w;
}

}  // namespace chorus::comm

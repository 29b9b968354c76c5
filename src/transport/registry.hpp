// The transport registry: the one door through which a communicator finds
// its transports.
//
// Each transport states, in one TransportInfo: its name (what
// CHORUS_TRANSPORT, the cost model's profile and chorus-tune call it), the
// peers it can serve (from every rank's published record and the config),
// its preference among the transports that can serve a peer, its
// capabilities, and how to create it for the peers it was given.  The
// communicator's wiring (comm/wiring.cpp) asks the registry which transport
// serves each peer and creates each chosen one once; it never names a
// concrete transport.
//
// The built-in transports are the folders listed in CMakeLists.txt's
// CHORUS_TRANSPORTS (src/transport/<name>/, each defining
// chorus::transport::<name>::registerTransport); the build generates the
// function that registers them.  A program (a test, a plug-in) may add its
// own with registry().add() before it creates a communicator.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/store.hpp"
#include "common/config.hpp"
#include "common/status.hpp"
#include "transport/transport.hpp"

namespace chorus::transport {

// What a transport can do beyond two-sided messages.
struct Capabilities {
  bool board = false;              // hands out a Board when it serves every peer (one-shot calls in place)
  bool rma = false;                // one-sided put/get on registered regions (Transport::rma())
  bool registered_memory = false;  // long-lived registered regions (keys that travel through the store)
  bool device_memory = false;      // accelerator buffers
};

// What every rank published at init, as the registry sees it.
struct RankRecord {
  int rank = 0;
  int pid = 0;
  bootstrap::HostIdentity host;
};

// Where a communicator is being wired: this rank, every rank's record and
// the config.  What serves() reads.
struct WireView {
  int rank = 0;
  std::span<const RankRecord> ranks;  // every rank, by rank
  const Config* cfg = nullptr;
  [[nodiscard]] bool sameHost(int peer) const { return ranks[static_cast<size_t>(peer)].host == ranks[static_cast<size_t>(rank)].host; }
};

// What create() gets: the view, the peers this transport serves (the
// registry's choice, excluding this rank) and the stores.
struct SetupContext {
  WireView view;
  int nranks = 0;
  std::vector<int> peers;  // ascending
  bool serves_all = false;  // every other rank of the communicator
  const bootstrap::UniqueId* id = nullptr;
  // The communicator's store (keys are the communicator's own) and the root
  // store with the communicator's prefix, for keys that several
  // transport sets of one host share.
  bootstrap::Store* store = nullptr;
  std::shared_ptr<bootstrap::Store> base;
  std::string prefix;
  std::string job_tag;  // unique per job and communicator (segment and connection names)
};

struct Created {
  std::unique_ptr<Transport> transport;
  Board* board = nullptr;  // with Capabilities::board and serves_all: the transport's board
};

struct TransportInfo {
  std::string name;  // [a-z0-9_]{1,16}; "mixed" is reserved (cost model's route key)
  // Lower is tried first for a peer; CHORUS_TRANSPORT=<name> puts one transport first.
  int preference = 100;
  // Whether every rank it serves shares this rank's host (shared memory):
  // the tuner groups ranks joined by such a transport into one host.
  bool host_local = false;
  Capabilities caps;
  // Whether it can reach `peer` from view.rank.  Must give the same answer
  // on both ranks of the pair (it is asked on each).
  std::function<bool(const WireView& view, int peer)> serves;
  // Collective over view.rank and peers.  Errors name the transport.
  std::function<Result<Created>(const SetupContext& ctx)> create;
};

// The routes of one rank: which registered transport serves each peer.
struct RouteChoice {
  std::vector<const TransportInfo*> by_rank;  // nullptr for this rank
  // The transports chosen for at least one peer, in preference order.
  std::vector<const TransportInfo*> used;
};

class TransportRegistry {
 public:
  // Fails when the name is taken or malformed, or serves/create is missing.
  Status add(TransportInfo info);
  [[nodiscard]] const TransportInfo* find(std::string_view name) const;
  // Registered names in preference order ("shm, tcp").
  [[nodiscard]] std::vector<std::string> names() const;
  [[nodiscard]] std::string namesText() const;
  // The transport for every peer of view.rank: the most preferred one that
  // serves it, `forced` ("" or "auto": none) first.  Fails naming the peer
  // no transport serves, or an unknown forced name with the registered ones.
  [[nodiscard]] Result<RouteChoice> choose(const WireView& view, std::string_view forced) const;
  // The transport rank `from` takes to `to` (what choose() gives `from`),
  // nullptr when none serves the pair: any rank can work out any pair's route.
  [[nodiscard]] const TransportInfo* routeFor(const WireView& view, int from, int to, std::string_view forced) const;
  // Whether `name` is registered or "auto": for the config's check.
  [[nodiscard]] Status checkName(std::string_view name) const;

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<TransportInfo>> infos_;  // stable addresses; sorted by preference
};

// The process's registry, with the built-in transports registered.
TransportRegistry& registry();

// Generated by the build from CHORUS_TRANSPORTS (CMakeLists.txt).
void registerBuiltinTransports(TransportRegistry& r);

}  // namespace chorus::transport

// A communicator's set-up, from one validated Config: the rendezvous store
// (rank 0's server, every rank's client), the record each rank publishes
// there, and the routes to the peers (each peer's transport as the transport
// registry chooses it: shared memory on this host, TCP to the others, or any
// registered transport) with the topology the tuner plans for.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/store.hpp"
#include "common/config.hpp"
#include "common/status.hpp"
#include "transport/transport.hpp"
#include "tune/tuner.hpp"

namespace chorus::comm {

// The rendezvous of a root communicator.
struct Rendezvous {
  // Rank 0's store server: started for this communicator (adopting the
  // listener reserved by chorusGetUniqueId when there is one) or, shared,
  // the one an earlier environment init of the same address started.
  std::shared_ptr<bootstrap::StoreServer> server;
  // This rank's client, serialised: the communicators split from this one
  // share it, and their inits may run on different threads.
  std::shared_ptr<bootstrap::Store> store;
};
Result<Rendezvous> joinRendezvous(int rank, const bootstrap::UniqueId& id, const Config& cfg, bool shared_server);

// What the wiring of a communicator made.
struct Wiring {
  // The transports the registry chose (transport/registry.hpp), in
  // preference order, and their names.
  std::vector<std::unique_ptr<transport::Transport>> transports;
  std::vector<std::string> transport_names;
  // A transport's board when that transport serves every peer, else nullptr.
  transport::Board* board = nullptr;
  std::vector<transport::Transport*> routes;  // per rank; nullptr for this one
  tune::Topology topology;
  uint64_t trace_id = 0;   // the communicator's id in traces
  std::string host_label;  // this rank's host as traces name it
};

// Publishes this rank's record under store (prefixed with prefix on base),
// reads every rank's, and connects the transports.  server: rank 0's of the
// root communicator (a timeout names its address), else nullptr.
Result<Wiring> wire(int rank, int nranks, const bootstrap::UniqueId& id, const Config& cfg,
                    const std::shared_ptr<bootstrap::Store>& base, bootstrap::Store& store, const std::string& prefix,
                    const bootstrap::StoreServer* server);

}  // namespace chorus::comm

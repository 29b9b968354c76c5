// Private to the TCP transport: establishing the authenticated connections.
#pragma once

#include <string>
#include <vector>

#include "bootstrap/socket.hpp"
#include "bootstrap/store.hpp"
#include "transport/tcp/tcp.hpp"

namespace chorus::transport::tcp {

// The connections to one peer, in socket-index order, still in blocking mode.
struct PeerLink {
  int rank = -1;
  std::string addr;  // the peer's address, for error messages
  std::vector<net::Fd> socks;
  net::Fd rma;  // with TcpSetup::rma: the one-sided connection (hello index = sockets_per_peer)
  // This end's session keys of each connection (socks, then rma), for
  // TcpSetup::protect.
  std::vector<auth::SessionKeys> keys;
  auth::SessionKeys rma_keys;
};

// Collective over setup.rank and setup.peers (see tcp_setup.cpp for the
// protocol).  Returns one link per entry of setup.peers, in that order.
Result<std::vector<PeerLink>> establishLinks(const TcpSetup& setup, bootstrap::Store& store);

}  // namespace chorus::transport::tcp

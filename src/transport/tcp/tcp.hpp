// TCP transport between ranks on different hosts (or everywhere with
// CHORUS_TRANSPORT=tcp).
//
// Non-blocking sockets with TCP_NODELAY driven by epoll from the communicator's
// executor thread; optionally several sockets per peer, with large messages
// striped across them.  Every connection passes the job-secret handshake, its
// hello naming the communicator and the connecting rank; a connection that
// fails it is dropped and the listener keeps waiting for the real peer.
//
// Framing: every message starts with a 16-byte header {magic u32, flags u32,
// length u64} that the receiver validates (magic, length equal to the posted
// receive's, length <= 2^48) before a single payload byte lands in user
// memory.  Payload is read straight into the destination for copies and
// through a bounce buffer for reductions.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/wire_protect.hpp"
#include "bootstrap/socket.hpp"
#include "bootstrap/store.hpp"
#include "transport/transport.hpp"

namespace chorus::transport {

struct TcpSetup {
  int rank = 0;
  std::vector<int> peers;       // communicator ranks served by this transport, excluding rank
  uint64_t comm_id = 0;         // authenticated in each connection's hello
  auth::Secret secret;
  net::SockAddr bind_addr;      // interface to listen on (port ignored: ephemeral)
  int sockets_per_peer = 1;
  // Messages of at least this many bytes wait for the receiver's clear-to-send
  // before their payload goes on the wire (tcp_wire.hpp); 0: every message is
  // eager.  Values below tcp::kMinRendezvousBytes are raised to it.
  uint64_t rendezvous_bytes = 262144;
  int heartbeat_ms = 1000;  // keepalive period; a silent dead peer is noticed within ~3x (0: off)
  // One-sided operations (Transport::rma(), rma.hpp): one more connection per
  // pair, for their frames only (tcp_wire.hpp).  Both ends must agree.  Off:
  // rma() is nullptr and the connections are as before.
  bool rma = false;
  // Every connection's bytes after its handshake (bootstrap/wire_protect.hpp):
  // sealed in records with per-connection keys (mac, encrypt), or as they are.
  // Both ends must agree; anything but kOff needs secret.present.
  auth::WireProtect protect = auth::WireProtect::kOff;
  std::chrono::microseconds spin{50};  // a wait polls this long before it blocks (Config::spin)
  std::chrono::milliseconds timeout{600000};  // for connection setup
};

// Collective over rank and its peers.  Publishes this rank's listening address
// in the store ("tcp/<rank>"), connects to higher ranks' listeners and accepts
// lower ranks' connections.  With setup.rma the transport's rma() serves
// one-sided operations (rma.hpp).
Result<std::unique_ptr<Transport>> createTcpTransport(const TcpSetup& setup, bootstrap::Store& store);

}  // namespace chorus::transport

// UCX transport (CHORUS_TRANSPORT=ucx; docs/ucx.md): chorus's messages and
// one-sided operations over UCP, the engine that InfiniBand, RoCE and other
// RDMA fabrics are reached through (and, on a machine without them, TCP and
// shared memory).
//
// One UCP context and worker per transport (per communicator), woken through
// the worker's event fd.  Worker addresses travel through the bootstrap store;
// every pair then proves the job secret with an HMAC challenge-response over
// tagged messages before any data flows, and derives from it the token every
// header carries and the offsets that make every tag unguessable.  Endpoints
// run in UCP's peer error-handling mode: a peer that dies fails what is
// outstanding with it, naming the rank.
//
// Messages: a 32-byte header (length, call signature, token) with small
// payloads inline, large payloads as a second tagged message received
// straight into the destination only after the header was checked against
// the posted receive.  One-sided operations: the target checks every access
// in its region table and moves the bytes itself (ucx_wire.hpp).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <cstddef>
#include <functional>
#include <span>

#include "bootstrap/auth.hpp"
#include "bootstrap/store.hpp"
#include "bootstrap/wire_protect.hpp"
#include "transport/transport.hpp"

namespace chorus::transport {

struct UcxSetup {
  int rank = 0;
  std::vector<int> peers;  // communicator ranks served by this transport, excluding rank
  uint64_t comm_id = 0;    // bound into the handshake: a rank of another communicator is refused
  auth::Secret secret;
  // UCX_TLS for this transport's context (Config::ucx.tls, CHORUS_UCX_TLS);
  // "" leaves UCX's own choice, which honours UCX_TLS from the environment.
  std::string tls;
  // The UCX variables among Config::Ucx::kDefaulted the user set
  // (Config::ucx.user_set): the transport leaves them to UCX.
  std::vector<std::string> user_set;
  // The transport's heartbeat and UCP's keepalive period
  // (Config::tcp.heartbeat_ms, CHORUS_HEARTBEAT_MS): a peer that vanished
  // without closing its connections (its host cut off) is declared
  // unreachable after 3 periods of silence (ucx_heartbeat.cpp).  0: no
  // heartbeat, and UCX's default keepalive.
  int heartbeat_ms = 1000;
  std::chrono::microseconds spin{50};         // a wait polls this long before it sleeps (Config::spin)
  std::chrono::milliseconds timeout{600000};  // connection setup and the handshake
  // Every message after the handshake (Config::net.wire_protect,
  // CHORUS_WIRE_PROTECT; bootstrap/wire_protect.hpp, ucx_wire.hpp "sealing"):
  // as it is, sealed with a MAC, or encrypted.  All ranks must agree (the
  // handshake's proof carries it); a mode other than off needs a secret.
  auth::WireProtect protect = auth::WireProtect::kOff;
  // Tests only: called with every keyed message this rank receives (the
  // sending rank, the channel: ucx_wire.hpp's Channel), before anything reads
  // or opens it; it may change the bytes (an on-path attacker's flip).
  std::function<void(int peer, int channel, std::span<std::byte> bytes)> test_received;
  // Tests only: called with every message this rank sends to a peer (the
  // sequence of its header on the message channel); true drops it (its
  // header and its payload never leave, its send completes as if they had:
  // a message lost on the way).
  std::function<bool(int peer, uint64_t seq)> test_drop_send;
  // Tests only: as test_drop_send, for a large message's separate payload
  // alone (its header leaves, its payload never does).
  std::function<bool(int peer, uint64_t seq)> test_drop_payload;
};

// Collective over setup.rank and its peers: publishes this rank's worker
// address in the store ("ucx/<rank>"), connects to every peer and runs the
// handshake.  The transport's rma() serves one-sided operations (rma.hpp).
Result<std::unique_ptr<Transport>> createUcxTransport(const UcxSetup& setup, bootstrap::Store& store);

// The origin's registration cache of large one-sided accesses (docs/ucx.md):
// buffers mapped, accesses that reused a mapping, mappings dropped because
// their buffer left the address space.  All zero for another transport.
struct UcxRegistrationStats {
  uint64_t maps = 0;
  uint64_t hits = 0;
  uint64_t invalidated = 0;
};
UcxRegistrationStats ucxRegistrationStats(const Transport& t);

// What UCP says of this transport's endpoint to `peer` (ucp_ep_print_info:
// its lanes and, per operation, the protocol at each message size), for
// tests and diagnosis; "" for another transport or a rank it does not serve.
std::string ucxEndpointInfo(const Transport& t, int peer);
// The defaults the transport set in UCX's configuration ("RX_SEG_SIZE=1M":
// those the user's UCX_* variables did not set; docs/ucx.md), "" for another
// transport.
std::string ucxConfigChanges(const Transport& t);

// Whether the cache is built in: not under ASan or TSan, whose interceptors
// UCX's memory hooks (which the cache needs) would be patched beneath.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CHORUS_UCX_REG_CACHE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CHORUS_UCX_REG_CACHE 0
#endif
#endif
#ifndef CHORUS_UCX_REG_CACHE
#define CHORUS_UCX_REG_CACHE 1
#endif

}  // namespace chorus::transport

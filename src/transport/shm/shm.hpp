// Shared-memory transport between ranks of one host (and one IPC namespace).
//
// Each rank creates one POSIX shared-memory segment (mode 0600) holding its
// doorbell and one receive ring per local peer; peers map it, and the owner
// unlinks the name as soon as everyone has mapped it, so nothing is left in
// /dev/shm even if a process is killed later.
//
// Small messages travel through the lock-free single-producer/single-consumer
// rings (the receiver reduces straight out of the ring).  Large ones use
// cross-memory attach: the sender publishes (pid, address, length) and the
// receiver process_vm_readv's the bytes directly (one copy), falling back to
// pipelined copies through the ring where CMA is not permitted.
//
// Waiting: each rank has a futex doorbell in its own segment; anything a peer
// does that this rank may be waiting for (data written, ring space freed)
// bumps and, if the rank sleeps, wakes it.  Waiters spin CHORUS_SPIN_US first.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/store.hpp"
#include "transport/transport.hpp"

namespace chorus::transport {

struct ShmSetup {
  int rank = 0;                 // this rank in the communicator
  std::vector<int> peers;       // communicator ranks served by this transport (on this host), excluding rank
  std::string segment_prefix;   // unique per job and communicator, e.g. "/chorus-<jobhash>-c3"
  size_t ring_bytes = 1 << 20;  // per ordered pair; power of two in [4096, 4 GiB]
  bool allow_cma = true;
  // Smallest message sent by cross-memory attach instead of through the ring
  // (0 is taken as 1).
  size_t cma_bytes = 1 << 20;
  std::chrono::microseconds spin{50};  // a wait polls this long before it blocks (Config::spin)
  bool spread = true;  // move off a core another local rank shares (Config::Shm::spread; spreadFrom)
  std::chrono::milliseconds timeout{600000};  // for the setup exchange
};

// Collective over rank and its peers (each calls it); exchanges segment names
// through the store.  With `board`, also the transport's board (transport.hpp,
// Board), which lives as long as the transport: the communicator hands it to
// its board runner when this transport serves every peer.
Result<std::unique_ptr<Transport>> createShmTransport(const ShmSetup& setup, bootstrap::Store& store,
                                                      Board** board = nullptr);

}  // namespace chorus::transport

// "loop": a transport that lives in tests/ only, registered through the
// transport registry (transport/registry.hpp) without any edit to src/ —
// the proof that a transport is one folder plus one registration.
//
// It serves ranks of one process (threads as ranks, support/rank_threads):
// every rank's transport of one communicator shares a fabric, a set of FIFO
// queues per ordered pair of ranks behind one mutex.  A send copies its bytes
// into the queue and completes at once (eager); a receive matches the
// oldest queued message from its peer in post order, checks its length and
// its call's signature like every transport must, and copies or reduces it
// into place.  abort() fails the fabric for every rank, with the reason.
// It is deliberately simple (one lock, one copy): a correctness reference
// for the registry's doors, not a fast path.
#pragma once

#include "transport/registry.hpp"

namespace chorus::testing {

inline constexpr const char* kLoopTransport = "loop";

// Registers "loop" (preference 1000: only used when forced, CHORUS_TRANSPORT=loop
// or Config::net.transport = "loop") once per process; later calls do nothing.
void registerLoopTransport();

}  // namespace chorus::testing

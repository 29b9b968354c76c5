// The transport interface: how a communicator moves bytes to and from peers.
//
// Algorithms never see a socket or a shared-memory segment: the executor posts
// sends and receives of contiguous byte ranges to peers (communicator ranks)
// and polls for completion.  One Transport object serves a set of peers of one
// communicator (shm: the ranks on this host; tcp: the others).
//
// Ordering: messages from rank a to rank b are delivered in the order a posted
// its sends, and matched to b's receives from a in the order b posted them.
// Each message carries its length; a receive whose length differs from the
// arriving message's fails with chorusMismatch naming both lengths (never a
// silent truncation or overrun).  It also carries its call's signature
// (Request::sig): a receive matched with a message of another call fails with
// chorusMismatch naming both calls (signature.hpp).
//
// Threading: post*, poll and wait are called by one thread at a time (the
// communicator's executor).  wake() and abort() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.hpp"
#include "kernels/reduce.hpp"

namespace chorus::transport {

// What a collective call is, as every rank of it must agree, in the one
// 64-bit word a board slot carries next to its call number
// (comm/call_signature.cpp packs it: the kind, dtype and op exactly, count
// and root exactly up to what a board call can have, the low bits of the
// board call number, and a hash of the rest).  One word, so publishing a call
// is three stores to the line its readers poll: data, signature, call number.
struct CallSignature {
  uint64_t word = 0;
  bool operator==(const CallSignature&) const = default;
};

// The text for a message of call `got` matched with a receive of call `want`
// ("rank 1 sent ... while this rank is in ..."'s middle part).  The
// communicator installs one that names the calls (comm/call_signature.cpp);
// the default prints the words.
using WireMismatchText = std::string (*)(uint64_t want, uint64_t got);

// Bits 16..31 of a message's signature word carry the low bits of its call's
// sequence number (comm/call_signature.cpp); bit 63 marks point-to-point
// messages.  A transport that holds an arriving message no receive has
// claimed yet compares it with its latest posted call: a message of the same
// call number but another signature is a mismatch nobody would otherwise see
// (ranks that disagree on a root each send and none receives).
// The root cause in a relayed abort reason: peers that fail because a peer
// aborted relay its reason, which may itself be a relay ("... aborted its
// communicator: ... aborted its communicator: rank 0: collective mismatch:
// ..."); the innermost text is what every rank should see, and it must fit
// the reason's few hundred bytes.
[[nodiscard]] inline std::string_view abortRootCause(std::string_view reason) {
  constexpr std::string_view kRelay = "aborted its communicator: ";
  const size_t at = reason.rfind(kRelay);
  return at == std::string_view::npos ? reason : reason.substr(at + kRelay.size());
}

// The code a rank reports when a peer's abort reaches it: the peer's own for
// a mismatch (every rank of the call reports one) and a revoke (every rank
// of the communicator reports it), else chorusRemoteError.
[[nodiscard]] inline chorusResult_t relayedAbortCode(uint64_t code) {
  return code == chorusMismatch ? chorusMismatch : code == chorusRevoked ? chorusRevoked : chorusRemoteError;
}

inline constexpr uint64_t kWireSeqMask = uint64_t{0xffff} << 16;
inline constexpr uint64_t kWirePointToPoint = uint64_t{1} << 63;
[[nodiscard]] inline bool sameCallOtherSignature(uint64_t current, uint64_t arrived) {
  if (current == 0 || arrived == 0 || ((current | arrived) & kWirePointToPoint) != 0) return false;
  return current != arrived && (current & kWireSeqMask) == (arrived & kWireSeqMask);
}
void setWireMismatchText(WireMismatchText f);
// chorusMismatch for `rank`, which met a message of call `got` from `peer`
// where it is in call `want`.  Every transport reports it so.
Status signatureMismatch(int rank, int peer, uint64_t want, uint64_t got);

// Where and how a received message lands.
struct RecvTarget {
  std::byte* dst = nullptr;
  size_t bytes = 0;
  // Copy mode when reducer == nullptr.  Reduce mode: dst[i] = accum[i] (op)
  // incoming[i]; accum may equal dst.  The transport hands the reducer whole
  // elements only (it carries partial elements over between fragments).
  const std::byte* accum = nullptr;
  const kernels::Reducer* reducer = nullptr;
};

// One posted send or receive.  Owned by the caller; it must stay alive and at
// the same address from post until its state is Done or Failed.
struct Request {
  enum State : uint32_t { Idle = 0, Posted = 1, Done = 2, Failed = 3 };
  std::atomic<uint32_t> state{Idle};
  Status status;  // written before state becomes Failed
  // The call this message belongs to (signature.hpp's wire word), set by the
  // poster: a send carries it, a receive requires the matched message to
  // carry the same.  0 by default on both sides.
  uint64_t sig = 0;

  [[nodiscard]] bool finished() const {
    uint32_t s = state.load(std::memory_order_acquire);
    return s == Done || s == Failed;
  }
  void complete() { state.store(Done, std::memory_order_release); }
  void fail(Status why) {
    status = std::move(why);
    state.store(Failed, std::memory_order_release);
  }
};

// A one-shot exchange board (shared memory only; createShmTransport hands it
// out at setup): every rank of the transport's set owns kBoardSlots slots,
// used in turn by its calls, which it writes and every peer reads in place.
// The board runner runs the one-shot plans through it (src/exec/board_runner.hpp,
// src/plan/oneshot.cpp): call k (numbered 1, 2, ... alike
// on every rank of the set) writes slot(k), publish(k)es it, then await()s
// the peers whose data it needs and reads it straight from their slots.
//
// No separate acknowledgements.  Every rank publishes in every call (a
// broadcast's non-roots only the call number), and a rank writes slot
// k % kBoardSlots again in call k + kBoardSlots only once every peer has
// published k + 1, which a peer does only after it has finished reading call
// k.  In the symmetric calls (allreduce, allgather, ...) every rank awaits
// every peer anyway; a broadcast's root does not wait for its readers, so it
// may run up to kBoardSlots - 1 calls ahead of them, and a later call awaits
// them when it would otherwise overtake (comm::BoardCalls::publishCall).  Call
// numbers only grow, so await returns once the peer has published k *or
// later*; by the rule above a slot still holds call k's data while its
// reader has not published k + 1.
//
// Every call also publishes its CallSignature with the call number, and
// every rank publishes in every collective call of the communicator, also
// those that move their data elsewhere (comm::BoardCalls::publishCall): a reader
// compares the peers' signatures with its own, so ranks in different calls
// are told apart on every path, for one more word in a line the call writes
// anyway (measured: docs/architecture.md).
inline constexpr size_t kBoardSlots = 8;
inline constexpr size_t kBoardSlotBytes = 4096;

class Board {
 public:
  virtual ~Board() = default;
  // This rank's slot for call k: kBoardSlotBytes, 8-byte aligned.
  virtual std::byte* slot(uint64_t k) = 0;
  // Makes slot(k) and the call's signature visible to the peers.  Peers that
  // sleep waiting for it are woken by the next await() that has to wait, or
  // by settle().
  virtual void publish(uint64_t k, const CallSignature& sig) = 0;
  // Wakes the peers that sleep waiting for this rank's last publish (call it
  // once the call's awaits are done: the fence it needs is cheap by then,
  // while right after the publish it would stall on the slot's cache line).
  virtual void settle() = 0;
  // Peer's slot of call k once the peer has published k or later.  Fails when the peer died
  // or aborted, this transport was aborted, or `timeout` passed since the
  // wait began (chorusTimeout, naming the peer).  With `sig`, also the
  // signature the peer published with call k (what signature() reads, in
  // the same visit of the slot).
  virtual Result<const std::byte*> await(int peer, uint64_t k, std::chrono::milliseconds timeout,
                                         CallSignature* sig = nullptr) = 0;
  // The signature the peer published with call k, into *out: true when the
  // peer's slot holds call k (a slot the peer has begun to reuse gives false:
  // the word carries the call number's low bits).  Certain to succeed once
  // await(peer, k) has returned and until this rank publishes k + 1.
  virtual bool signature(int peer, uint64_t k, CallSignature* out) const = 0;
  // The call whose data the peer's slot of call k holds now (k, an earlier
  // call, or a later one that reused the slot; 0: none yet), without waiting.
  virtual uint64_t slotCall(int peer, uint64_t k) const = 0;
};

class Rma;  // one-sided operations (rma.hpp, included below)

class Transport {
 public:
  virtual ~Transport() = default;
  Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  [[nodiscard]] virtual std::string_view name() const = 0;

  // Queues a send of `bytes` from `src` to `peer`.  `src` must stay valid and
  // unchanged until req finishes.  bytes may be 0 (an empty message).
  virtual Status postSend(int peer, const void* src, size_t bytes, Request* req) = 0;
  // Queues a receive from `peer` into target.  target.dst (and accum) must stay
  // valid until req finishes.
  virtual Status postRecv(int peer, const RecvTarget& target, Request* req) = 0;

  // Moves whatever can move without blocking.  Returns true when anything
  // progressed (bytes moved or a request finished).  A broken connection fails
  // the affected requests and returns its error (chorusRemoteError naming the
  // peer).
  virtual Result<bool> poll() = 0;

  // Blocks until poll() may make progress, wake() is called, or `timeout`
  // passes.  No lost wake-ups: a change after the last poll() ends the wait.
  virtual void wait(std::chrono::microseconds timeout) = 0;

  // Ends a current or the next wait() early.  Any thread.
  virtual void wake() = 0;

  // Fails every posted request with `why` and makes later posts fail.  Any
  // thread; the executor's thread observes it at its next poll().
  virtual void abort(const Status& why) = 0;

  // The one-sided capability (put/get into peers' registered regions and
  // notifications, rma.hpp), or nullptr when this transport has none.  Lives
  // as long as the transport; its operations complete through this
  // transport's poll()/wait() (registry.hpp's Capabilities::rma says whether
  // a registered transport offers it).
  virtual Rma* rma() { return nullptr; }
};

}  // namespace chorus::transport

#include "transport/rma.hpp"  // NOLINT: after Transport, which rma.hpp's users see whole

// One-sided operations (RMA): a transport capability (Transport::rma()).
//
// A rank registers a region of its memory with the transport's Rma and packs
// its key into a blob that travels to peers (through the bootstrap store,
// say); a peer unpacks it and then puts bytes into the region or gets bytes
// out of it without the owner posting a receive.  A notification (a 64-bit
// value) tells the owner that the puts before it have landed.
//
// The owner (target) checks every access in its own table before a byte of
// its memory is written or read: the region must exist and carry the key's
// generation (a deregistered region's key, also one whose index was reused,
// is refused), the access must be within the region's bounds (offset +
// length computed without overflow) and the region must allow it (a put
// needs Access::Write, a get Access::Read).  A refused access fails the
// origin's request with chorusInvalidArgument naming the target rank, the
// region, the offset, the length and the reason; the target's memory is not
// touched and both transports keep working.  The key's own fields (length,
// access) are informational: the origin does not trust them and neither does
// the target, which only trusts its table.
//
// Completion: put, get and notify finish through the same Request objects
// and the same poll()/wait() loop as two-sided messages.  A put's request is
// done once its bytes have landed in the target's memory (the target
// acknowledged it); the origin buffer may then be reused.  A get's request is
// done once the bytes are in the local buffer.  A notify's request is done
// once the target holds the notification.
//
// Ordering: the operations one rank issues to one peer are executed by the
// peer in the order they were posted, so a notification is delivered after
// every put (and get) posted to that peer before it has been executed.  RMA
// operations are NOT ordered with two-sided messages (they use a separate
// channel, so that a message nobody has received yet cannot hold up a put).
//
// Progress: one-sided traffic moves when the transport is polled, on both
// ends: the target must keep calling poll() (a waiting wait() wakes up for
// incoming one-sided traffic, with or without receives posted).
//
// Threading: like post*/poll, every method is called by one thread at a time
// (the thread that polls the transport).
//
// docs/rma.md describes the interface and both transports' wire formats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.hpp"
#include "transport/transport.hpp"

namespace chorus::transport {

// What peers may do to a registered region.
enum class Access : uint32_t {
  Read = 1,       // peers may get from it
  Write = 2,      // peers may put into it
  ReadWrite = 3,
};
[[nodiscard]] constexpr Access operator|(Access a, Access b) {
  return static_cast<Access>(static_cast<uint32_t>(a) | static_cast<uint32_t>(b));
}
// Whether `have` allows every right of `want`.
[[nodiscard]] constexpr bool allows(Access have, Access want) {
  return (static_cast<uint32_t>(have) & static_cast<uint32_t>(want)) == static_cast<uint32_t>(want);
}
[[nodiscard]] std::string_view accessName(Access a);  // "read", "write", "read|write"

// A region registered on this rank.  The generation is unique per
// registration (never 0), so a RegionId of a deregistered region never
// names a later region that reuses its index.
struct RegionId {
  uint32_t index = 0;
  uint64_t generation = 0;
  bool operator==(const RegionId&) const = default;
};

// A peer's region, as its key blob describes it (unpackKey).
struct RemoteKey {
  int owner = -1;           // the rank that registered the region
  uint32_t region = 0;      // its index in the owner's table
  uint64_t generation = 0;  // its registration
  uint64_t bytes = 0;       // its length as registered (informational: the owner checks)
  Access access = Access::Read;  // its rights as registered (informational: the owner checks)
  uint64_t transport = 0;   // the tag of the transport that registered it (rmaTransportTag)
};

// A key blob: kKeyBlobBytes, little endian (docs/rma.md):
//   u32 magic "CRK1", u16 version 1, u16 access, u64 transport tag,
//   i32 owner rank, u32 region index, u64 generation, u64 region bytes,
//   u64 reserved (0), u64 check (a hash of the bytes before it).
inline constexpr size_t kKeyBlobBytes = 56;
inline constexpr uint32_t kKeyBlobMagic = 0x314b5243;  // "CRK1"
inline constexpr uint16_t kKeyBlobVersion = 1;

// The tag keys of a transport carry: its name's first 8 bytes.
[[nodiscard]] uint64_t rmaTransportTag(std::string_view transport_name);

class Rma {
 public:
  virtual ~Rma() = default;

  // Registers [base, base + bytes) for peers' access.  bytes may be 0; base
  // must not be null otherwise.  The memory must stay valid until
  // deregisterRegion returns.
  virtual Result<RegionId> registerRegion(void* base, size_t bytes, Access access) = 0;
  // Ends the registration: later accesses with its key are refused, and
  // once it returns the transport touches the memory no more (an access that
  // was landing in it is cut short and fails the origin's request; a get
  // being answered from it is answered from a copy).
  virtual Status deregisterRegion(RegionId id) = 0;
  // The key blob of a registered region (kKeyBlobBytes), for the peers.
  virtual Result<std::vector<std::byte>> packKey(RegionId id) = 0;
  // Validates a blob from `peer` (untrusted bytes: its size, magic, version,
  // check, transport and owner) and returns the key it describes.
  virtual Result<RemoteKey> unpackKey(int peer, std::span<const std::byte> blob) = 0;

  // Writes `bytes` from `local` into peer's region `key` at `offset`.
  // `local` must stay valid and unchanged until req finishes.  An error
  // return (a peer that is not one, a key of another rank or transport, a
  // null buffer, a broken or aborted transport) also fails req.
  virtual Status put(int peer, const void* local, size_t bytes, const RemoteKey& key, uint64_t offset,
                     Request* req) = 0;
  // Reads `bytes` at `offset` of peer's region `key` into `local`, which
  // must stay valid until req finishes.
  virtual Status get(int peer, void* local, size_t bytes, const RemoteKey& key, uint64_t offset, Request* req) = 0;
  // Sends `value` to peer; the peer's takeNotification returns it once
  // every put this rank posted to peer before has landed there.
  virtual Status notify(int peer, uint64_t value, Request* req) = 0;
  // The oldest notification that arrived (true), or none (false).  Does not
  // block and moves nothing: poll() receives them.  An aborted transport
  // returns its error once the notifications that arrived are taken.
  virtual Result<bool> takeNotification(int* peer, uint64_t* value) = 0;
};

// ---------------------------------------------------------------------------
// Building blocks the transports share (rma.cpp).

// Why a target refused an access (what travels back to the origin).
enum class RmaRefusal : uint16_t {
  None = 0,
  UnknownRegion = 1,     // no region with that index was ever registered
  Deregistered = 2,      // the index is free or registered anew (the key's generation is not current)
  NoAccess = 3,          // the region does not allow it (detail: the region's Access)
  Overflow = 4,          // offset + length overflows 64 bits
  OutOfBounds = 5,       // offset + length exceeds the region (detail: the region's bytes)
  DeregisteredDuring = 6,// deregistered while the access was landing
  CopyFailed = 7,        // the target could not read or write the origin's buffer (detail: errno)
  Last = CopyFailed,
};

enum class RmaOpKind : uint8_t { Put = 1, Get = 2, Notify = 3 };

// The one-sided operations of a transport that posts all three through one
// function (tcp, ucx: a record of kind, local buffer, remote key, offset and
// notification value).
class PostedRma : public Rma {
 public:
  Status put(int peer, const void* local, size_t bytes, const RemoteKey& key, uint64_t offset, Request* req) final {
    return postRma(peer, RmaOpKind::Put, local, bytes, &key, offset, 0, req);
  }
  Status get(int peer, void* local, size_t bytes, const RemoteKey& key, uint64_t offset, Request* req) final {
    return postRma(peer, RmaOpKind::Get, local, bytes, &key, offset, 0, req);
  }
  Status notify(int peer, uint64_t value, Request* req) final {
    return postRma(peer, RmaOpKind::Notify, nullptr, 0, nullptr, 0, value, req);
  }

 protected:
  virtual Status postRma(int peer, RmaOpKind kind, const void* local, size_t bytes, const RemoteKey* key,
                         uint64_t offset, uint64_t value, Request* req) = 0;
};

// The error an origin reports for a refusal: chorusInvalidArgument (a
// CopyFailed is chorusRemoteError), naming both ranks, the region, offset,
// length and the reason.
[[nodiscard]] Status rmaRefused(std::string_view transport, RmaOpKind kind, int origin, int target, uint32_t region,
                                uint64_t generation, uint64_t offset, uint64_t bytes, RmaRefusal why,
                                uint64_t detail);

// The regions of one transport and the target-side check.  Used by the
// transport's executor thread only.
class RegionTable {
 public:
  static constexpr uint32_t kMaxRegions = 1u << 20;

  // `tag`: the transport's rmaTransportTag; `rank`: this rank.
  RegionTable(uint64_t tag, int rank);

  Result<RegionId> add(void* base, size_t bytes, Access access);
  Status remove(RegionId id);
  Result<std::vector<std::byte>> pack(RegionId id) const;
  // unpackKey's checks; `peer_ok`: whether `peer` is a peer of the transport.
  Result<RemoteKey> unpack(int peer, bool peer_ok, std::span<const std::byte> blob) const;

  // The target-side check of an access [offset, offset + bytes) with `want`
  // to region (index, generation): the memory it may touch, or nullptr and
  // *why (and *detail) when it is refused.  bytes == 0 at offset == the
  // region's length is in bounds.
  std::byte* resolve(uint32_t index, uint64_t generation, uint64_t offset, uint64_t bytes, Access want,
                     RmaRefusal* why, uint64_t* detail) const;
  // Whether region (index, generation) is registered now.
  [[nodiscard]] bool live(uint32_t index, uint64_t generation) const;

 private:
  struct Slot {
    std::byte* base = nullptr;
    uint64_t bytes = 0;
    uint64_t generation = 0;  // 0: free
    Access access = Access::Read;
  };
  uint64_t tag_;
  int rank_;
  uint64_t next_generation_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;  // free indices, reused last-freed first
};

// Checks of a put/get/notify post that every transport makes: the key is
// the peer's and this transport's, and the buffer is not null.
[[nodiscard]] Status rmaCheckPost(std::string_view transport, int rank, RmaOpKind kind, int peer, const void* local,
                                  size_t bytes, const RemoteKey* key, uint64_t tag);

}  // namespace chorus::transport

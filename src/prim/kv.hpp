// A KV-cache transfer engine (issue 37, first step): agents that register
// memory, describe it to each other in a metadata blob, and move descriptor
// lists of bytes between their regions with one-sided writes and reads
// (transport/rma.hpp), a notification telling the target that a batch has
// landed.
//
// No global communicator: every pair of agents that load each other's
// metadata gets a 2-rank transport of its own, set up through the bootstrap
// store under a key prefix named after both agents (and their instance
// numbers), over the transport registry (shm on one host, tcp across hosts,
// ucx when built).  A decode agent can join later or leave; the prefill
// agents keep their other pairs.
//
// Threading: an Agent's calls are made by one thread at a time.  By default
// (Progress::Thread, CHORUS_KV_PROGRESS=thread) the agent runs a progress
// thread of its own that drives every pair's transport: transfers move,
// peers' writes and reads are served and notifications are taken while the
// caller computes or sleeps; test, wait and takeNotifications only read
// what it found.  Progress::Thread's thread blocks in the transports' waits
// (epoll, futex) when nothing moves.  With Progress::Caller
// (CHORUS_KV_PROGRESS=caller) there is no thread: the transports move only
// inside the agent's calls (progress, test, wait, takeNotifications), so a
// target agent must keep calling one of them for peers' accesses to be
// served.
//
// docs/kv.md describes the API, the metadata blob and the semantics.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/store.hpp"
#include "common/config.hpp"
#include "common/status.hpp"
#include "transport/rma.hpp"

namespace chorus::prim::kv {

using transport::Access;

// An agent's handle of one of its regions: its index and registration.
struct RegionHandle {
  uint32_t index = 0;
  uint64_t generation = 0;  // never 0 for a registered region
  bool operator==(const RegionHandle&) const = default;
};

// One piece of a batch: `bytes` from the local region at local_offset to
// the remote agent's region at remote_offset (a write), or back (a read).
struct Desc {
  uint32_t local_region = 0;
  uint64_t local_offset = 0;
  uint32_t remote_region = 0;
  uint64_t remote_offset = 0;
  uint64_t bytes = 0;
  bool operator==(const Desc&) const = default;
};

enum class XferState : uint8_t { Pending = 0, Done = 1, Failed = 2, Cancelled = 3 };
[[nodiscard]] std::string_view xferStateName(XferState s);

struct Notification {
  std::string agent;  // the agent that sent it
  uint64_t value = 0;
};

// Who drives an agent's transports (docs/kv.md "Progress").
enum class Progress : uint8_t {
  Thread = 0,  // a progress thread of the agent's own
  Caller = 1,  // the caller, inside the agent's calls
};
// "thread" or "caller" (CHORUS_KV_PROGRESS's values).
[[nodiscard]] Result<Progress> parseProgress(std::string_view s);
[[nodiscard]] std::string_view progressName(Progress p);

struct AgentOptions {
  // The agent's name: [A-Za-z0-9_.-]{1,64}, unique among the agents of one
  // store (a later agent of the same name replaces it: its instance differs).
  std::string name;
  // The bootstrap store the agents share (every pair's setup runs through it).
  std::shared_ptr<bootstrap::Store> store;
  // The store's address and job secret: tcp binds next to it and
  // authenticates its connections with the secret.
  bootstrap::UniqueId id;
  Config cfg;
  // "" or "auto": the registry's choice per pair; "shm", "tcp", ...: that one.
  std::string transport;
  // Who drives the transports (the C API: CHORUS_KV_PROGRESS).
  Progress progress = Progress::Thread;
};

// Metadata blob (little endian): u32 magic "CKV1", u16 version 1, u16 name
// length, u64 instance, u32 region count, u32 0, the name padded with zeros
// to 8 bytes, then per region u32 index, u32 access, u64 generation, u64
// bytes; then u64 check (a 64-bit mix of every byte before it).
inline constexpr uint32_t kMetadataMagic = 0x31564b43;  // "CKV1"
inline constexpr uint16_t kMetadataVersion = 1;
inline constexpr size_t kMaxNameBytes = 64;
inline constexpr uint32_t kMaxRegions = 1u << 16;

struct RegionInfo {
  uint32_t index = 0;
  uint64_t generation = 0;
  uint64_t bytes = 0;
  Access access = Access::Read;
};
struct Metadata {
  std::string name;
  uint64_t instance = 0;
  std::vector<RegionInfo> regions;
};
[[nodiscard]] std::vector<std::byte> packMetadata(const Metadata& md);
// Validates untrusted bytes: size, magic, version, name, count, access
// fields, unique indices and the check word.
[[nodiscard]] Result<Metadata> unpackMetadata(std::span<const std::byte> blob);

class Agent {
 public:
  static Result<std::unique_ptr<Agent>> create(AgentOptions opts);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  [[nodiscard]] const std::string& name() const { return opts_.name; }
  [[nodiscard]] uint64_t instance() const { return instance_; }

  // Registers [base, base + bytes) (valid until deregistered) with every
  // connected pair and later ones.  Peers see it in metadata packed after.
  Result<RegionHandle> registerRegion(void* base, size_t bytes, Access access);
  // Peers' later accesses with it are refused; transfers of this agent that
  // use it as their local region must have finished.
  Status deregisterRegion(RegionHandle h);

  // This agent's metadata blob (its name, instance and regions).
  [[nodiscard]] std::vector<std::byte> metadata() const;
  // Publishes metadata() in the store under kv/md/<name>.
  Status publishMetadata();

  // Loads a peer's metadata blob; the first load of an agent (or of a new
  // instance of a known name, which drops the old pair) sets up the pair's
  // transport: collective with the peer's loadRemote of this agent's
  // metadata, so both must call it (blocks until both did or the config's
  // timeout).  A later load of the same instance refreshes its regions.
  // Returns the peer's name.
  Result<std::string> loadRemote(std::span<const std::byte> blob);
  // loadRemote of the blob the peer published (waits for it up to timeout).
  Result<std::string> connect(const std::string& peer, std::chrono::milliseconds timeout);
  // Forgets the peer: its pair's transport is closed, its transfers fail.
  Status disconnect(const std::string& peer);

  // Posts a batch of writes (local -> remote) or reads (remote -> local) to
  // `peer`.  Every descriptor is checked first against this agent's regions
  // and the peer's metadata (unknown regions, lengths past a region, offset
  // overflow, a local region without the right access); nothing is posted
  // when one fails.  With `notify`, the peer receives `value` once every
  // descriptor of the batch completed (never for a batch that failed).
  // Returns the transfer's id.
  Result<uint64_t> postWrite(const std::string& peer, std::span<const Desc> descs, bool notify, uint64_t value);
  Result<uint64_t> postRead(const std::string& peer, std::span<const Desc> descs, bool notify, uint64_t value);

  // Progress::Caller: drives every pair's transport once (serves peers,
  // completes requests).  Progress::Thread: nothing (the thread does it).
  Status progress();
  // The transfer's state (Progress::Caller: after one progress); an unknown
  // id is an error.
  // A failed transfer's error is in *why (when given).
  Result<XferState> test(uint64_t xfer, Status* why = nullptr);
  // Until the transfer is no longer Pending or timeout passes (chorusTimeout):
  // Progress::Caller progresses, Progress::Thread sleeps until the thread
  // settles it.
  Result<XferState> wait(uint64_t xfer, std::chrono::milliseconds timeout, Status* why = nullptr);
  // Stops posting the transfer's remaining descriptors and its notification;
  // operations already on the wire still finish (bytes of a cancelled write
  // may or may not have landed).  Then the transfer is Cancelled.
  Status cancel(uint64_t xfer);
  // Forgets a finished transfer (Done, Failed, Cancelled).
  Status release(uint64_t xfer);
  // Notifications that arrived (Progress::Caller: after one progress), oldest
  // first.
  Result<std::vector<Notification>> takeNotifications();

  // The peers connected now.
  [[nodiscard]] std::vector<std::string> peers() const;
  [[nodiscard]] Progress progressMode() const { return opts_.progress; }

  struct Impl;

 private:
  explicit Agent(AgentOptions opts);
  Status disconnectLocked(const std::string& peer);
  AgentOptions opts_;
  uint64_t instance_ = 0;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------
// Paged KV layouts: the descriptor lists that move KV-cache blocks.
//
// A model's KV cache: `layers` layers, K and V (2 planes), `kv_heads` heads of
// `head_dim` elements of `elem_bytes`, in blocks of `block_tokens` tokens.
// A rank of a TP group of size tp holds heads [r*kv_heads/tp, (r+1)*kv_heads/tp).
// Inside a block the order is [token][head][dim] (vLLM's NHD).  The region
// holds `blocks` blocks, from `base_offset`, in one of two orders:
//   LayerMajor: [layer][kv][block][token][head][dim]
//   BlockMajor: [block][layer][kv][token][head][dim]
enum class KvOrder : uint8_t { LayerMajor = 0, BlockMajor = 1 };

struct KvModel {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t elem_bytes = 0;
  uint32_t block_tokens = 0;
};

struct KvSide {
  KvOrder order = KvOrder::LayerMajor;
  uint32_t tp = 1;       // the side's tensor-parallel degree (divides kv_heads)
  uint32_t tp_rank = 0;  // this rank of it
  uint64_t blocks = 0;   // blocks the region holds
  uint32_t region = 0;   // the agent's region index
  uint64_t base_offset = 0;
};

// Bytes of a side's region for the model (overflow: an error).
Result<uint64_t> kvRegionBytes(const KvModel& m, const KvSide& s);
// The byte offset of element (layer, kv, block, token, head, d) on side s,
// where head is the global head index (it must be one of s's heads).
Result<uint64_t> kvElementOffset(const KvModel& m, const KvSide& s, uint32_t layer, uint32_t kv, uint64_t block,
                                 uint32_t token, uint32_t head, uint32_t d);

// The descriptors that copy blocks src_blocks[i] of `src` to dst_blocks[i]
// of `dst` (equal lengths), the heads the two ranks share (none: an empty
// list), adjacent pieces merged.  local = src, remote = dst (a write from
// the prefill side); swap with swapSides for a read from the decode side.
Result<std::vector<Desc>> kvBlockDescs(const KvModel& m, const KvSide& src, const KvSide& dst,
                                       std::span<const uint64_t> src_blocks, std::span<const uint64_t> dst_blocks);
// local <-> remote of every descriptor.
[[nodiscard]] std::vector<Desc> swapSides(std::span<const Desc> descs);
// Merges each descriptor into the one before when both sides continue it.
[[nodiscard]] std::vector<Desc> coalesce(std::span<const Desc> descs);

}  // namespace chorus::prim::kv

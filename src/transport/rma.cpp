// The parts of the one-sided interface every transport shares (rma.hpp):
// the region table with the target-side check, key blobs, and the texts of
// refusals.
#include "transport/rma.hpp"

#include <cstring>
#include <random>

namespace chorus::transport {
namespace {

// The check word of a key blob: a 64-bit mix of its first 48 bytes.  Not a
// secret (the target's table is what protects memory): it catches a blob
// garbled on its way or cut from other bytes.
uint64_t blobCheck(const std::byte* p, size_t n) {
  uint64_t h = 0x6a09e667f3bcc909ULL;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, p + i, std::min<size_t>(8, n - i));
    h ^= w;
    h *= 0x9E3779B97F4A7C15ULL;
    h ^= h >> 31;
  }
  return h;
}

template <typename T>
void put(std::byte* blob, size_t at, T v) {
  std::memcpy(blob + at, &v, sizeof v);
}
template <typename T>
T take(const std::byte* blob, size_t at) {
  T v;
  std::memcpy(&v, blob + at, sizeof v);
  return v;
}

// Field offsets of a key blob (rma.hpp).
constexpr size_t kMagicAt = 0, kVersionAt = 4, kAccessAt = 6, kTagAt = 8, kOwnerAt = 16, kRegionAt = 20,
                 kGenerationAt = 24, kBytesAt = 32, kReservedAt = 40, kCheckAt = 48;
static_assert(kCheckAt + 8 == kKeyBlobBytes);

bool validAccess(uint32_t a) { return a >= 1 && a <= 3; }

std::string_view opName(RmaOpKind k) {
  switch (k) {
    case RmaOpKind::Put: return "put";
    case RmaOpKind::Get: return "get";
    case RmaOpKind::Notify: return "notify";
  }
  return "rma operation";
}

std::string tagName(uint64_t tag) {
  std::string s;
  for (int i = 0; i < 8; ++i) {
    const char c = static_cast<char>((tag >> (8 * i)) & 0xff);
    if (c == 0) break;
    s += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  return s.empty() ? std::string("none") : s;
}

}  // namespace

std::string_view accessName(Access a) {
  switch (a) {
    case Access::Read: return "read";
    case Access::Write: return "write";
    case Access::ReadWrite: return "read|write";
  }
  return "none";
}

uint64_t rmaTransportTag(std::string_view name) {
  uint64_t t = 0;
  std::memcpy(&t, name.data(), std::min<size_t>(name.size(), 8));
  return t;
}

Status rmaRefused(std::string_view transport, RmaOpKind kind, int origin, int target, uint32_t region,
                  uint64_t generation, uint64_t offset, uint64_t bytes, RmaRefusal why, uint64_t detail) {
  std::string reason;
  chorusResult_t code = chorusInvalidArgument;
  switch (why) {
    case RmaRefusal::UnknownRegion:
      reason = fmt::format("rank {} has no region {} (a forged key, or one of another transport or job?)", target,
                           region);
      break;
    case RmaRefusal::Deregistered:
      reason = fmt::format("the region was deregistered (the key's generation {:#x} is not registered there now; "
                           "a stale key)", generation);
      break;
    case RmaRefusal::NoAccess:
      reason = fmt::format("the region allows {} access only, a {} needs {} access",
                           accessName(static_cast<Access>(detail)), opName(kind),
                           kind == RmaOpKind::Put ? "write" : "read");
      break;
    case RmaRefusal::Overflow:
      reason = fmt::format("offset {} + length {} overflows 64 bits", offset, bytes);
      break;
    case RmaRefusal::OutOfBounds:
      reason = fmt::format("offset {} + length {} is out of bounds: the region has {} bytes", offset, bytes, detail);
      break;
    case RmaRefusal::DeregisteredDuring:
      reason = "the region was deregistered while the access was landing";
      break;
    case RmaRefusal::CopyFailed: {
      char buf[128];
      code = chorusRemoteError;
      reason = fmt::format("rank {} could not {} this rank's buffer by cross-memory attach: {}", target,
                           kind == RmaOpKind::Put ? "read" : "write", strerror_r(static_cast<int>(detail), buf, sizeof buf));
      break;
    }
    default:
      code = chorusRemoteError;
      reason = fmt::format("unknown refusal code {}", static_cast<unsigned>(why));
      break;
  }
  return makeError(code, "{} rma {} from rank {} to rank {}, region {}, offset {}, length {}: refused by rank {}: {}",
                   transport, opName(kind), origin, target, region, offset, bytes, target, reason);
}

RegionTable::RegionTable(uint64_t tag, int rank) : tag_(tag), rank_(rank) {
  // A random start, so that keys of another transport instance (another
  // communicator, an earlier run) name no generation of this one.
  std::random_device rd;
  next_generation_ = (uint64_t{rd()} << 32 | rd()) | 1;
}

Result<RegionId> RegionTable::add(void* base, size_t bytes, Access access) {
  if (!validAccess(static_cast<uint32_t>(access)))
    return invalidArgument("rma: rank {}: registering a region with access {:#x} (read, write or read|write)", rank_,
                           static_cast<uint32_t>(access));
  if (bytes > 0 && base == nullptr)
    return invalidArgument("rma: rank {}: registering a {}-byte region at a null address", rank_, bytes);
  if (reinterpret_cast<uintptr_t>(base) + bytes < reinterpret_cast<uintptr_t>(base))
    return invalidArgument("rma: rank {}: a {}-byte region at {} wraps around the address space", rank_, bytes, base);
  uint32_t index;
  if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
  } else {
    if (slots_.size() >= kMaxRegions)
      return invalidArgument("rma: rank {}: {} regions are registered, the most one transport holds", rank_,
                             slots_.size());
    index = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  uint64_t gen = next_generation_++;
  if (gen == 0) gen = next_generation_++;
  slots_[index] = Slot{static_cast<std::byte*>(base), bytes, gen, access};
  return RegionId{index, gen};
}

Status RegionTable::remove(RegionId id) {
  if (!live(id.index, id.generation))
    return invalidArgument("rma: rank {}: deregistering region {} (generation {:#x}), which is not registered "
                           "(deregistered twice?)", rank_, id.index, id.generation);
  slots_[id.index] = Slot{};
  free_.push_back(id.index);
  return {};
}

bool RegionTable::live(uint32_t index, uint64_t generation) const {
  return index < slots_.size() && generation != 0 && slots_[index].generation == generation;
}

Result<std::vector<std::byte>> RegionTable::pack(RegionId id) const {
  if (!live(id.index, id.generation))
    return invalidArgument("rma: rank {}: packing the key of region {} (generation {:#x}), which is not registered",
                           rank_, id.index, id.generation);
  const Slot& s = slots_[id.index];
  std::vector<std::byte> blob(kKeyBlobBytes);
  std::byte* b = blob.data();
  put<uint32_t>(b, kMagicAt, kKeyBlobMagic);
  put<uint16_t>(b, kVersionAt, kKeyBlobVersion);
  put<uint16_t>(b, kAccessAt, static_cast<uint16_t>(s.access));
  put<uint64_t>(b, kTagAt, tag_);
  put<int32_t>(b, kOwnerAt, rank_);
  put<uint32_t>(b, kRegionAt, id.index);
  put<uint64_t>(b, kGenerationAt, s.generation);
  put<uint64_t>(b, kBytesAt, s.bytes);
  put<uint64_t>(b, kReservedAt, 0);
  put<uint64_t>(b, kCheckAt, blobCheck(b, kCheckAt));
  return blob;
}

Result<RemoteKey> RegionTable::unpack(int peer, bool peer_ok, std::span<const std::byte> blob) const {
  if (!peer_ok)
    return invalidArgument("rma: rank {}: unpacking a key of rank {}, which is not a peer of this transport", rank_,
                           peer);
  if (blob.size() != kKeyBlobBytes)
    return invalidArgument("rma: rank {}: the key blob of rank {} has {} bytes, a key has {} (not a key, or cut "
                           "short?)", rank_, peer, blob.size(), kKeyBlobBytes);
  const std::byte* b = blob.data();
  const auto magic = take<uint32_t>(b, kMagicAt);
  if (magic != kKeyBlobMagic)
    return invalidArgument("rma: rank {}: the key blob of rank {} has magic {:#x}, not a key's {:#x}", rank_, peer,
                           magic, kKeyBlobMagic);
  const auto version = take<uint16_t>(b, kVersionAt);
  if (version != kKeyBlobVersion)
    return invalidArgument("rma: rank {}: the key blob of rank {} has version {}, this rank reads version {} (mixed "
                           "chorus versions?)", rank_, peer, version, kKeyBlobVersion);
  if (take<uint64_t>(b, kCheckAt) != blobCheck(b, kCheckAt))
    return invalidArgument("rma: rank {}: the key blob of rank {} fails its check (garbled on the way?)", rank_,
                           peer);
  const auto access = take<uint16_t>(b, kAccessAt);
  if (!validAccess(access) || take<uint64_t>(b, kReservedAt) != 0)
    return invalidArgument("rma: rank {}: the key blob of rank {} has an invalid access {:#x} or reserved field", rank_,
                           peer, access);
  const auto tag = take<uint64_t>(b, kTagAt);
  if (tag != tag_)
    return invalidArgument("rma: rank {}: the key blob of rank {} was made by the {} transport, this is {} (use the "
                           "key with the transport that registered the region)", rank_, peer, tagName(tag),
                           tagName(tag_));
  const auto owner = take<int32_t>(b, kOwnerAt);
  if (owner != peer)
    return invalidArgument("rma: rank {}: the key blob given for rank {} is a key of rank {}", rank_, peer, owner);
  RemoteKey k;
  k.owner = owner;
  k.region = take<uint32_t>(b, kRegionAt);
  k.generation = take<uint64_t>(b, kGenerationAt);
  k.bytes = take<uint64_t>(b, kBytesAt);
  k.access = static_cast<Access>(access);
  k.transport = tag;
  if (k.generation == 0)
    return invalidArgument("rma: rank {}: the key blob of rank {} has generation 0, which no registration has", rank_,
                           peer);
  return k;
}

std::byte* RegionTable::resolve(uint32_t index, uint64_t generation, uint64_t offset, uint64_t bytes, Access want,
                                RmaRefusal* why, uint64_t* detail) const {
  *detail = 0;
  if (index >= slots_.size()) {
    *why = RmaRefusal::UnknownRegion;
    return nullptr;
  }
  const Slot& s = slots_[index];
  if (s.generation == 0 || s.generation != generation) {
    *why = RmaRefusal::Deregistered;
    return nullptr;
  }
  if (!allows(s.access, want)) {
    *why = RmaRefusal::NoAccess;
    *detail = static_cast<uint64_t>(s.access);
    return nullptr;
  }
  if (offset > UINT64_MAX - bytes) {
    *why = RmaRefusal::Overflow;
    return nullptr;
  }
  if (offset + bytes > s.bytes) {
    *why = RmaRefusal::OutOfBounds;
    *detail = s.bytes;
    return nullptr;
  }
  *why = RmaRefusal::None;
  // offset <= s.bytes here, so base + offset stays within (or one past) the region.
  return s.base == nullptr ? reinterpret_cast<std::byte*>(alignof(std::max_align_t)) : s.base + offset;
}

Status rmaCheckPost(std::string_view transport, int rank, RmaOpKind kind, int peer, const void* local, size_t bytes,
                    const RemoteKey* key, uint64_t tag) {
  if (key != nullptr) {
    if (key->owner != peer)
      return invalidArgument("{} rma {} on rank {}: the key is a key of rank {}, not of rank {}", transport,
                             opName(kind), rank, key->owner, peer);
    if (key->transport != tag)
      return invalidArgument("{} rma {} on rank {}: the key of rank {} was made by the {} transport, this is {}",
                             transport, opName(kind), rank, peer, tagName(key->transport), tagName(tag));
  }
  if (bytes > 0 && local == nullptr)
    return invalidArgument("{} rma {} on rank {}: {} bytes {} rank {} with a null local buffer", transport,
                           opName(kind), rank, bytes, kind == RmaOpKind::Put ? "to" : "from", peer);
  return {};
}

}  // namespace chorus::transport

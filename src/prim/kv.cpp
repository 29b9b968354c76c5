// The KV-cache transfer engine (prim/kv.hpp): agents, their regions, the
// metadata blob, a 2-rank transport per pair of agents set up through the
// store, and batches of one-sided writes and reads.  docs/kv.md.
#include "prim/kv.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "common/log.hpp"
#include "transport/registry.hpp"

namespace chorus::prim::kv {
namespace {

using Clock = std::chrono::steady_clock;

// Operations of one transfer on the wire at once.
constexpr size_t kWindow = 64;

uint64_t mixCheck(std::span<const std::byte> bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (std::byte b : bytes) h = (h ^ static_cast<uint8_t>(b)) * 0x100000001b3ULL;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}

template <typename T>
void putLe(std::vector<std::byte>& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<std::byte>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff));
}
template <typename T>
T getLe(std::span<const std::byte> in, size_t at) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  return static_cast<T>(v);
}

Status checkName(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes)
    return invalidArgument("kv agent name '{}' must have 1 to {} characters", name, kMaxNameBytes);
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'))
      return invalidArgument("kv agent name '{}' has a character outside [A-Za-z0-9_.-]", name);
  return {};
}

struct RankBlob {
  int32_t pid = 0;
  int32_t pad = 0;
  bootstrap::HostIdentity host;
};

}  // namespace

Result<Progress> parseProgress(std::string_view s) {
  if (s == "thread") return Progress::Thread;
  if (s == "caller") return Progress::Caller;
  return invalidArgument("kv progress '{}' is not thread or caller", s);
}

std::string_view progressName(Progress p) { return p == Progress::Caller ? "caller" : "thread"; }

std::string_view xferStateName(XferState s) {
  switch (s) {
    case XferState::Pending: return "pending";
    case XferState::Done: return "done";
    case XferState::Failed: return "failed";
    case XferState::Cancelled: return "cancelled";
  }
  return "?";
}

// ---------------------------------------------------------------------------
// Metadata blob.

std::vector<std::byte> packMetadata(const Metadata& md) {
  std::vector<std::byte> out;
  putLe<uint32_t>(out, kMetadataMagic);
  putLe<uint16_t>(out, kMetadataVersion);
  putLe<uint16_t>(out, static_cast<uint16_t>(md.name.size()));
  putLe<uint64_t>(out, md.instance);
  putLe<uint32_t>(out, static_cast<uint32_t>(md.regions.size()));
  putLe<uint32_t>(out, 0);
  for (char c : md.name) out.push_back(static_cast<std::byte>(c));
  while (out.size() % 8 != 0) out.push_back(std::byte{0});
  for (const RegionInfo& r : md.regions) {
    putLe<uint32_t>(out, r.index);
    putLe<uint32_t>(out, static_cast<uint32_t>(r.access));
    putLe<uint64_t>(out, r.generation);
    putLe<uint64_t>(out, r.bytes);
  }
  putLe<uint64_t>(out, mixCheck(out));
  return out;
}

Result<Metadata> unpackMetadata(std::span<const std::byte> blob) {
  constexpr size_t kHead = 24;
  if (blob.size() < kHead + 8) return invalidArgument("kv metadata: {} bytes is too short (a blob has at least {})", blob.size(), kHead + 8);
  if (getLe<uint32_t>(blob, 0) != kMetadataMagic) return invalidArgument("kv metadata: bad magic (not a chorus kv metadata blob)");
  if (getLe<uint16_t>(blob, 4) != kMetadataVersion)
    return invalidArgument("kv metadata: version {} (this build reads {})", getLe<uint16_t>(blob, 4), kMetadataVersion);
  const size_t name_len = getLe<uint16_t>(blob, 6);
  const uint32_t count = getLe<uint32_t>(blob, 16);
  if (name_len == 0 || name_len > kMaxNameBytes) return invalidArgument("kv metadata: name length {} (1..{})", name_len, kMaxNameBytes);
  if (count > kMaxRegions) return invalidArgument("kv metadata: {} regions (at most {})", count, kMaxRegions);
  if (getLe<uint32_t>(blob, 20) != 0) return invalidArgument("kv metadata: a reserved field is not 0");
  const size_t name_pad = (name_len + 7) / 8 * 8;
  const size_t want = kHead + name_pad + size_t{count} * 24 + 8;
  if (blob.size() != want) return invalidArgument("kv metadata: {} bytes where its header says {}", blob.size(), want);
  if (getLe<uint64_t>(blob, want - 8) != mixCheck(blob.first(want - 8)))
    return invalidArgument("kv metadata: the check word does not match (a garbled or altered blob)");
  Metadata md;
  md.instance = getLe<uint64_t>(blob, 8);
  md.name.assign(reinterpret_cast<const char*>(blob.data() + kHead), name_len);
  CHORUS_RETURN_IF_ERROR(checkName(md.name).withContext("kv metadata: "));
  for (size_t i = name_len; i < name_pad; ++i)
    if (blob[kHead + i] != std::byte{0}) return invalidArgument("kv metadata: the name's padding is not 0");
  size_t at = kHead + name_pad;
  for (uint32_t i = 0; i < count; ++i, at += 24) {
    RegionInfo r;
    r.index = getLe<uint32_t>(blob, at);
    const uint32_t acc = getLe<uint32_t>(blob, at + 4);
    r.generation = getLe<uint64_t>(blob, at + 8);
    r.bytes = getLe<uint64_t>(blob, at + 16);
    if (acc < 1 || acc > 3) return invalidArgument("kv metadata: region {} has access {} (1..3)", r.index, acc);
    if (r.generation == 0) return invalidArgument("kv metadata: region {} has generation 0", r.index);
    r.access = static_cast<Access>(acc);
    for (const RegionInfo& o : md.regions)
      if (o.index == r.index) return invalidArgument("kv metadata: region {} is listed twice", r.index);
    md.regions.push_back(r);
  }
  return md;
}

// ---------------------------------------------------------------------------
// The agent.

namespace {

struct LocalRegion {
  std::byte* base = nullptr;
  uint64_t bytes = 0;
  Access access = Access::Read;
  uint64_t generation = 0;  // 0: free
};

struct Pair {
  std::string peer;
  uint64_t peer_instance = 0;
  int rank = 0, other = 1;
  std::string prefix;
  std::unique_ptr<bootstrap::PrefixStore> store;
  std::unique_ptr<transport::Transport> t;
  transport::Rma* rma = nullptr;
  std::string transport_name;
  std::map<uint32_t, transport::RegionId> mine;  // this agent's region index -> the pair transport's
  std::map<std::pair<uint32_t, uint64_t>, transport::RemoteKey> keys;  // the peer's (index, generation)
  Metadata md;
  Status broken;  // not ok: the pair failed
};

struct Xfer {
  uint64_t id = 0;
  std::string peer;
  bool write = true;
  std::vector<Desc> descs;
  size_t next = 0;      // the next descriptor to post
  std::deque<transport::Request> reqs;  // stable addresses
  size_t retired = 0;   // reqs finished and looked at
  bool notify = false;
  uint64_t value = 0;
  bool notify_posted = false;
  transport::Request notify_req;
  bool cancelled = false;
  Status error;
  XferState state = XferState::Pending;
};

}  // namespace

// Threads (Progress::Thread).  `mu` guards everything below it and every
// call into a pair's transport.  The progress thread holds it while it
// drives the transports (drive()), and lets go of it while it blocks in one
// transport's wait() (`in_wait`).  A caller that only reads state (test,
// wait, takeNotifications, release, peers) takes `mu`; one that calls into
// a transport or changes the pairs (post, cancel, register, connect, ...)
// is Exclusive: it counts itself in `callers`, wakes the transport the
// thread waits on and waits until the thread has left that wait; the thread
// starts no new wait while `callers` is not 0.  The transports' wake() and
// abort() are the only calls made from another thread than mu's holder
// (transport.hpp allows both from any thread).
struct Agent::Impl {
  std::string name;
  bool threaded = false;
  std::mutex mu;
  std::condition_variable cv;       // callers leaving / the thread leaving a wait / stop
  std::condition_variable changed;  // drive() ran: a transfer or the notifications may have changed
  std::atomic<int> callers{0};      // Exclusive callers waiting for or holding mu
  transport::Transport* in_wait = nullptr;  // the transport the thread waits in, without mu
  bool stop = false;
  uint64_t epoch = 0;  // bumped by every Exclusive caller: the pairs or the transfers may have changed
  size_t turn = 0;     // the thread's round robin over the pairs
  std::thread thread;

  std::vector<LocalRegion> regions;
  uint64_t next_generation = 0;
  std::map<std::string, std::unique_ptr<Pair>> pairs;
  std::map<uint64_t, std::unique_ptr<Xfer>> xfers;
  // Transfers of a dropped pair whose requests its aborted transport finished.
  uint64_t next_xfer = 1;
  std::deque<Notification> notes;
};

namespace {

// A caller that calls into the pairs' transports or changes the pairs or
// the transfers (Impl's comment): holds mu, with the progress thread out of
// its transport wait and starting no other until the guard ends.
class Exclusive {
 public:
  explicit Exclusive(Agent::Impl& impl) : impl_(impl) {
    impl_.callers.fetch_add(1, std::memory_order_seq_cst);
    lock_ = std::unique_lock(impl_.mu);
    while (impl_.in_wait != nullptr) {
      impl_.in_wait->wake();
      impl_.cv.wait(lock_);
    }
  }
  ~Exclusive() {
    impl_.callers.fetch_sub(1, std::memory_order_seq_cst);  // under mu: the thread's check cannot miss it
    ++impl_.epoch;
    lock_.unlock();
    impl_.cv.notify_all();
  }
  Exclusive(const Exclusive&) = delete;
  Exclusive& operator=(const Exclusive&) = delete;

 private:
  Agent::Impl& impl_;
  std::unique_lock<std::mutex> lock_;
};

void drive(Agent::Impl& impl);
bool driveOnce(Agent::Impl& impl);
void progressLoop(Agent::Impl& impl);

// A caller reading the agent's state: with Progress::Thread, under the mutex,
// what the thread found; with Progress::Caller, holding the agent
// (Exclusive) after driving it once.
class Reading {
 public:
  explicit Reading(Agent::Impl& impl) {
    if (impl.threaded) {
      lock_ = std::unique_lock(impl.mu);
    } else {
      guard_.emplace(impl);
      drive(impl);
    }
  }

 private:
  std::optional<Exclusive> guard_;
  std::unique_lock<std::mutex> lock_;
};

}  // namespace

Agent::Agent(AgentOptions opts) : opts_(std::move(opts)), impl_(std::make_unique<Impl>()) {
  std::random_device rd;
  instance_ = (uint64_t{rd()} << 32) ^ rd();
  if (instance_ == 0) instance_ = 1;
  impl_->next_generation = ((uint64_t{rd()} << 32) ^ rd()) | 1;
  impl_->name = opts_.name;
  impl_->threaded = opts_.progress == Progress::Thread;
}

Agent::~Agent() {
  if (impl_->thread.joinable()) {
    {
      std::lock_guard lock(impl_->mu);
      impl_->stop = true;
      if (impl_->in_wait != nullptr) impl_->in_wait->wake();
    }
    impl_->cv.notify_all();
    impl_->thread.join();
  }
  // Requests of transfers still on the wire belong to the transports: abort
  // those first so that no request outlives its transfer.
  for (auto& [name, p] : impl_->pairs)
    if (p->t) p->t->abort(makeError(chorusAborted, "kv agent '{}' was destroyed", opts_.name));
  impl_->pairs.clear();
  impl_->xfers.clear();
}

Result<std::unique_ptr<Agent>> Agent::create(AgentOptions opts) {
  CHORUS_RETURN_IF_ERROR(checkName(opts.name));
  if (opts.store == nullptr) return invalidArgument("kv agent '{}': no store", opts.name);
  std::unique_ptr<Agent> a(new Agent(std::move(opts)));
  if (a->impl_->threaded) {
    Impl* impl = a->impl_.get();
    a->impl_->thread = std::thread([impl] { progressLoop(*impl); });
  }
  return a;
}

namespace {

std::string keyName(int rank, uint32_t index, uint64_t generation) {
  return fmt::format("key/{}/{}.{:016x}", rank, index, generation);
}

Status publishRegion(Pair& p, uint32_t index, const LocalRegion& r) {
  CHORUS_ASSIGN_OR_RETURN(transport::RegionId id, p.rma->registerRegion(r.base, r.bytes, r.access));
  p.mine[index] = id;
  CHORUS_ASSIGN_OR_RETURN(auto blob, p.rma->packKey(id));
  return p.store->set(keyName(p.rank, index, r.generation), blob);
}

}  // namespace

Result<RegionHandle> Agent::registerRegion(void* base, size_t bytes, Access access) {
  if (base == nullptr && bytes != 0) return invalidArgument("kv agent '{}': register: base is null", opts_.name);
  if (!transport::allows(Access::ReadWrite, access) || static_cast<uint32_t>(access) == 0)
    return invalidArgument("kv agent '{}': register: access {} is not read, write or both", opts_.name,
                           static_cast<uint32_t>(access));
  Exclusive guard(*impl_);
  auto& regs = impl_->regions;
  uint32_t index = 0;
  while (index < regs.size() && regs[index].generation != 0) ++index;
  if (index == regs.size()) {
    if (regs.size() >= kMaxRegions) return invalidUsage("kv agent '{}': {} regions registered already", opts_.name, kMaxRegions);
    regs.emplace_back();
  }
  LocalRegion r{static_cast<std::byte*>(base), bytes, access, impl_->next_generation++};
  for (auto& [name, p] : impl_->pairs) {
    if (!p->broken.isOk()) continue;
    Status st = publishRegion(*p, index, r);
    if (!st.isOk()) {
      for (auto& [n2, q] : impl_->pairs)
        if (auto it = q->mine.find(index); it != q->mine.end()) {
          (void)q->rma->deregisterRegion(it->second);
          q->mine.erase(it);
        }
      return st.withContext(fmt::format("kv agent '{}': registering a region with the pair of '{}': ", opts_.name, name));
    }
  }
  regs[index] = r;
  return RegionHandle{index, r.generation};
}

Status Agent::deregisterRegion(RegionHandle h) {
  Exclusive guard(*impl_);
  auto& regs = impl_->regions;
  if (h.index >= regs.size() || regs[h.index].generation == 0 || regs[h.index].generation != h.generation)
    return invalidArgument("kv agent '{}': deregister: region {} (generation {:#x}) is not registered", opts_.name,
                           h.index, h.generation);
  for (auto& [name, x] : impl_->xfers)
    if (x->state == XferState::Pending)
      for (const Desc& d : x->descs)
        if (d.local_region == h.index)
          return invalidUsage("kv agent '{}': deregister: region {} is in use by transfer {} (still pending)",
                              opts_.name, h.index, x->id);
  Status first;
  for (auto& [name, p] : impl_->pairs)
    if (auto it = p->mine.find(h.index); p->rma != nullptr && it != p->mine.end()) {
      Status st = p->rma->deregisterRegion(it->second);
      if (!st.isOk() && first.isOk()) first = st;
      p->mine.erase(it);
    }
  regs[h.index] = LocalRegion{};
  return first;
}

std::vector<std::byte> Agent::metadata() const {
  std::lock_guard lock(impl_->mu);
  Metadata md;
  md.name = opts_.name;
  md.instance = instance_;
  for (uint32_t i = 0; i < impl_->regions.size(); ++i) {
    const LocalRegion& r = impl_->regions[i];
    if (r.generation != 0) md.regions.push_back({i, r.generation, r.bytes, r.access});
  }
  return packMetadata(md);
}

Status Agent::publishMetadata() { return opts_.store->set("kv/md/" + opts_.name, metadata()); }

Result<std::string> Agent::connect(const std::string& peer, std::chrono::milliseconds timeout) {
  CHORUS_RETURN_IF_ERROR(checkName(peer));
  CHORUS_ASSIGN_OR_RETURN(auto blob, opts_.store->get("kv/md/" + peer, timeout));
  return loadRemote(blob);
}

namespace {

bool advance(Agent::Impl& impl, const std::string& me, Xfer& x);

// Fails the pair and every pending transfer of it: the pair's transport is
// aborted and closed, and the requests it still held are failed here (no
// transport touches them afterwards).
void breakPair(Agent::Impl& impl, Pair& p, const Status& why) {
  if (p.broken.isOk()) p.broken = why;
  if (p.t) {
    p.t->abort(why);
    p.t.reset();
    p.rma = nullptr;
  }
  p.mine.clear();
  p.keys.clear();
  for (auto& [id, x] : impl.xfers) {
    if (x->peer != p.peer || x->state != XferState::Pending) continue;
    if (x->error.isOk() && !x->cancelled) x->error = why;
    for (transport::Request& r : x->reqs)
      if (!r.finished()) r.fail(why);
    if (x->notify_posted && !x->notify_req.finished()) x->notify_req.fail(why);
  }
}

}  // namespace

Status Agent::disconnect(const std::string& peer) {
  Exclusive guard(*impl_);
  return disconnectLocked(peer);
}

Status Agent::disconnectLocked(const std::string& peer) {
  auto it = impl_->pairs.find(peer);
  if (it == impl_->pairs.end()) return invalidArgument("kv agent '{}': '{}' is not a connected agent", opts_.name, peer);
  breakPair(*impl_, *it->second,
            makeError(chorusRemoteError, "kv agent '{}': the pair with agent '{}' was disconnected", opts_.name, peer));
  impl_->pairs.erase(it);
  for (auto& [id, x] : impl_->xfers)
    if (x->peer == peer) advance(*impl_, opts_.name, *x);
  return {};
}

Result<std::string> Agent::loadRemote(std::span<const std::byte> blob) {
  auto parsed = unpackMetadata(blob);
  if (!parsed.isOk()) return parsed.status().withContext(fmt::format("kv agent '{}': loading metadata: ", opts_.name));
  Metadata md = std::move(parsed.value());
  if (md.name == opts_.name)
    return invalidArgument("kv agent '{}': loading metadata: the blob is this agent's own name", opts_.name);
  const std::string peer = md.name;
  {
    Exclusive guard(*impl_);
    if (auto it = impl_->pairs.find(peer); it != impl_->pairs.end()) {
      if (it->second->peer_instance == md.instance) {
        if (!it->second->broken.isOk()) return it->second->broken;
        it->second->md = std::move(md);
        return peer;
      }
      log::info("kv agent '{}': agent '{}' came back as a new instance; dropping the old pair", opts_.name, peer);
      CHORUS_RETURN_IF_ERROR(disconnectLocked(peer));
    }
  }
  // The pair's setup waits for the peer (up to the timeout): without mu, so
  // that the progress thread keeps serving the other pairs.  The new pair is
  // this thread's until it joins `pairs`; `regions` changes only in this
  // (the caller's) thread.
  auto p = std::make_unique<Pair>();
  p->peer = peer;
  p->peer_instance = md.instance;
  const bool first = std::make_pair(opts_.name, instance_) < std::make_pair(peer, md.instance);
  p->rank = first ? 0 : 1;
  p->other = 1 - p->rank;
  const auto n0 = first ? opts_.name : peer;
  const auto n1 = first ? peer : opts_.name;
  const uint64_t i0 = first ? instance_ : md.instance, i1 = first ? md.instance : instance_;
  p->prefix = fmt::format("kv/p/{}.{:016x}/{}.{:016x}/", n0, i0, n1, i1);
  p->store = std::make_unique<bootstrap::PrefixStore>(opts_.store, p->prefix);
  auto ctx_err = [&](const Status& st) {
    return st.withContext(fmt::format("kv agent '{}': connecting to agent '{}': ", opts_.name, peer));
  };
  // Both ranks' records, for the registry's choice.
  RankBlob me;
  me.pid = static_cast<int32_t>(getpid());
  me.host = bootstrap::localHostIdentity(opts_.cfg.net.host_id);
  {
    std::vector<std::byte> b(sizeof me);
    std::memcpy(b.data(), &me, sizeof me);
    Status st = p->store->set(fmt::format("rec/{}", p->rank), b);
    if (!st.isOk()) return ctx_err(st);
  }
  auto other_blob = p->store->get(fmt::format("rec/{}", p->other), opts_.cfg.timeout);
  if (!other_blob.isOk()) return ctx_err(other_blob.status());
  if (other_blob->size() != sizeof(RankBlob))
    return ctx_err(invalidArgument("its record has {} bytes, not {}", other_blob->size(), sizeof(RankBlob)));
  RankBlob them;
  std::memcpy(&them, other_blob->data(), sizeof them);
  std::vector<transport::RankRecord> recs(2);
  recs[static_cast<size_t>(p->rank)] = {p->rank, me.pid, me.host};
  recs[static_cast<size_t>(p->other)] = {p->other, them.pid, them.host};
  transport::WireView view{p->rank, recs, &opts_.cfg};
  const std::string forced = opts_.transport.empty() ? opts_.cfg.net.transport : opts_.transport;
  auto route = transport::registry().choose(view, forced);
  if (!route.isOk()) return ctx_err(route.status());
  const transport::TransportInfo* info = route->by_rank[static_cast<size_t>(p->other)];
  if (info == nullptr) return ctx_err(invalidUsage("no transport serves the pair"));
  if (!info->caps.rma) return ctx_err(invalidUsage("transport {} has no one-sided operations", info->name));
  transport::SetupContext ctx;
  ctx.view = view;
  ctx.nranks = 2;
  ctx.peers = {p->other};
  ctx.serves_all = true;
  ctx.id = &opts_.id;
  ctx.store = p->store.get();
  ctx.base = opts_.store;
  ctx.prefix = p->prefix;
  ctx.job_tag = fmt::format("kv{:012x}", std::hash<std::string>{}(p->prefix) & 0xffffffffffffULL);
  auto created = info->create(ctx);
  if (!created.isOk()) return ctx_err(created.status());
  p->t = std::move(created->transport);
  p->rma = p->t->rma();
  p->transport_name = info->name;
  if (p->rma == nullptr) return ctx_err(invalidUsage("transport {} was created without one-sided operations", info->name));
  for (uint32_t i = 0; i < impl_->regions.size(); ++i)
    if (impl_->regions[i].generation != 0) {
      Status st = publishRegion(*p, i, impl_->regions[i]);
      if (!st.isOk()) return ctx_err(st);
    }
  // Every key of a region registered now is in the store once the peer's
  // ready mark is: a later lookup need not wait.
  if (Status st = p->store->set(fmt::format("ready/{}", p->rank), std::vector<std::byte>{std::byte{1}}); !st.isOk())
    return ctx_err(st);
  if (auto r = p->store->get(fmt::format("ready/{}", p->other), opts_.cfg.timeout); !r.isOk()) return ctx_err(r.status());
  p->md = std::move(md);
  log::info("kv agent '{}': connected to agent '{}' over {}", opts_.name, peer, p->transport_name);
  Exclusive guard(*impl_);
  impl_->pairs[peer] = std::move(p);
  return peer;
}

std::vector<std::string> Agent::peers() const {
  std::lock_guard lock(impl_->mu);
  std::vector<std::string> out;
  for (auto& [name, p] : impl_->pairs) out.push_back(name);
  return out;
}

namespace {

Status checkRange(std::string_view what, uint32_t region, uint64_t offset, uint64_t bytes, uint64_t region_bytes) {
  uint64_t end = 0;
  if (__builtin_add_overflow(offset, bytes, &end))
    return invalidArgument("{} region {}: offset {} + length {} overflows 64 bits", what, region, offset, bytes);
  if (end > region_bytes)
    return invalidArgument("{} region {}: offset {} + length {} is past its end ({} bytes)", what, region, offset,
                           bytes, region_bytes);
  return {};
}

}  // namespace

Result<uint64_t> postBatch(Agent& a, Agent::Impl& impl, const std::string& me, const std::string& peer, bool write,
                           std::span<const Desc> descs, bool notify, uint64_t value);

Result<uint64_t> Agent::postWrite(const std::string& peer, std::span<const Desc> descs, bool notify, uint64_t value) {
  Exclusive guard(*impl_);
  return postBatch(*this, *impl_, opts_.name, peer, true, descs, notify, value);
}
Result<uint64_t> Agent::postRead(const std::string& peer, std::span<const Desc> descs, bool notify, uint64_t value) {
  Exclusive guard(*impl_);
  return postBatch(*this, *impl_, opts_.name, peer, false, descs, notify, value);
}

Result<uint64_t> postBatch(Agent& a, Agent::Impl& impl, const std::string& me, const std::string& peer, bool write,
                           std::span<const Desc> descs, bool notify, uint64_t value) {
  (void)a;
  const char* verb = write ? "write" : "read";
  auto it = impl.pairs.find(peer);
  if (it == impl.pairs.end())
    return invalidArgument("kv agent '{}': {} to '{}': not a connected agent (load its metadata first)", me, verb, peer);
  Pair& p = *it->second;
  if (!p.broken.isOk()) return p.broken;
  for (size_t i = 0; i < descs.size(); ++i) {
    const Desc& d = descs[i];
    auto ctx = [&](const Status& st) {
      return st.withContext(fmt::format("kv agent '{}': {} to '{}': descriptor {}: ", me, verb, peer, i));
    };
    if (d.local_region >= impl.regions.size() || impl.regions[d.local_region].generation == 0)
      return ctx(invalidArgument("local region {} is not registered", d.local_region));
    if (Status st = checkRange("local", d.local_region, d.local_offset, d.bytes, impl.regions[d.local_region].bytes);
        !st.isOk())
      return ctx(st);
    auto r = std::find_if(p.md.regions.begin(), p.md.regions.end(),
                          [&](const RegionInfo& x) { return x.index == d.remote_region; });
    if (r == p.md.regions.end())
      return ctx(invalidArgument("agent '{}' has no region {} in its metadata", peer, d.remote_region));
    if (Status st = checkRange("remote", d.remote_region, d.remote_offset, d.bytes, r->bytes); !st.isOk()) return ctx(st);
    if (!transport::allows(r->access, write ? Access::Write : Access::Read))
      return ctx(invalidArgument("agent '{}''s region {} allows {} access only", peer, d.remote_region,
                                 transport::accessName(r->access)));
    // The pair transport's key of the remote region.
    const auto k = std::make_pair(r->index, r->generation);
    if (!p.keys.count(k)) {
      auto blob = p.store->get(keyName(p.other, r->index, r->generation), std::chrono::milliseconds(200));
      if (!blob.isOk())
        return ctx(invalidArgument("agent '{}' published no key for its region {} (generation {:#x}): deregistered "
                                   "before the pair was set up (stale metadata?)",
                                   peer, r->index, r->generation));
      CHORUS_ASSIGN_OR_RETURN(transport::RemoteKey key, p.rma->unpackKey(p.other, *blob));
      p.keys[k] = key;
    }
  }
  auto x = std::make_unique<Xfer>();
  x->id = impl.next_xfer++;
  x->peer = peer;
  x->write = write;
  x->descs.reserve(descs.size());
  for (const Desc& d : descs)
    if (d.bytes != 0) x->descs.push_back(d);
  x->notify = notify;
  x->value = value;
  const uint64_t id = x->id;
  impl.xfers[id] = std::move(x);
  return id;
}

namespace {

// Posts what the window allows, retires finished requests, and settles the
// transfer's state.  True when it posted an operation (a transport may send
// it only at its next poll).
bool advance(Agent::Impl& impl, const std::string& me, Xfer& x) {
  if (x.state != XferState::Pending) return false;
  const size_t posted_before = x.reqs.size();
  const bool notify_before = x.notify_posted;
  const auto posted = [&] { return x.reqs.size() != posted_before || x.notify_posted != notify_before; };
  auto pit = impl.pairs.find(x.peer);
  Pair* p = pit == impl.pairs.end() || !pit->second->broken.isOk() ? nullptr : pit->second.get();
  if (p == nullptr && x.error.isOk())
    x.error = makeError(chorusRemoteError, "kv agent '{}': the pair with agent '{}' is gone", me, x.peer);
  while (x.retired < x.reqs.size() && x.reqs[x.retired].finished()) {
    transport::Request& r = x.reqs[x.retired++];
    if (r.state.load() == transport::Request::Failed && x.error.isOk()) x.error = r.status;
  }
  const bool stop = !x.error.isOk() || x.cancelled;
  while (!stop && p != nullptr && x.next < x.descs.size() && x.reqs.size() - x.retired < kWindow) {
    const Desc& d = x.descs[x.next++];
    const LocalRegion& lr = impl.regions[d.local_region];
    const RegionInfo* ri = nullptr;
    for (const RegionInfo& r : p->md.regions)
      if (r.index == d.remote_region) ri = &r;
    transport::Request& req = x.reqs.emplace_back();
    Status st;
    if (ri == nullptr) {
      st = invalidArgument("agent '{}''s region {} is no longer in its metadata", x.peer, d.remote_region);
    } else {
      const transport::RemoteKey& key = p->keys.at({ri->index, ri->generation});
      st = x.write ? p->rma->put(p->other, lr.base + d.local_offset, d.bytes, key, d.remote_offset, &req)
                   : p->rma->get(p->other, lr.base + d.local_offset, d.bytes, key, d.remote_offset, &req);
    }
    if (!st.isOk()) {
      if (!req.finished()) req.fail(st);
      break;
    }
  }
  if (x.retired < x.reqs.size()) return posted();  // operations on the wire
  if (!x.error.isOk() || x.cancelled || (x.next < x.descs.size() && p == nullptr)) {
    if (x.notify_posted && !x.notify_req.finished()) return posted();
    x.state = x.cancelled && x.error.isOk() ? XferState::Cancelled : XferState::Failed;
    if (x.state == XferState::Failed) {
      const Status& e = x.error;
      x.error = Status(e.code() == chorusSuccess ? chorusInternalError : e.code(),
                       fmt::format("kv agent '{}': {} to agent '{}' (transfer {}) failed: {}", me,
                                   x.write ? "write" : "read", x.peer, x.id, e.message()));
    }
    return posted();
  }
  if (x.next < x.descs.size()) return posted();
  if (x.notify && !x.notify_posted) {
    x.notify_posted = true;
    Status st = p->rma->notify(p->other, x.value, &x.notify_req);
    if (!st.isOk() && !x.notify_req.finished()) x.notify_req.fail(st);
  }
  if (x.notify && !x.notify_req.finished()) return posted();
  if (x.notify && x.notify_req.state.load() == transport::Request::Failed) {
    x.error = x.notify_req.status;
    x.state = XferState::Failed;
    x.error = Status(x.error.code(), fmt::format("kv agent '{}': notification to agent '{}' (transfer {}) failed: {}",
                                                 me, x.peer, x.id, x.error.message()));
    return posted();
  }
  x.state = XferState::Done;
  return posted();
}

}  // namespace

namespace {

// One round over every pair: poll its transport (a broken one breaks the
// pair), take its notifications, then advance every transfer; again while
// that posted operations (a transport sends what was posted after its poll
// only at the next one, and a wait() does not count it as work to wake
// for: the tcp transport's one-sided link), a few rounds at most.  Under mu.
void drive(Agent::Impl& impl) {
  for (int round = 0; round < 4; ++round) {
    if (!driveOnce(impl)) return;
  }
}

bool driveOnce(Agent::Impl& impl) {
  for (auto& [name, p] : impl.pairs) {
    if (!p->broken.isOk()) continue;
    Result<bool> r = p->t->poll();
    if (!r.isOk()) {
      breakPair(impl, *p,
                Status(r.status().code(), fmt::format("peer agent '{}' failed or vanished: {}", name, r.status().message())));
      continue;
    }
    while (true) {
      int from = -1;
      uint64_t value = 0;
      Result<bool> got = p->rma->takeNotification(&from, &value);
      if (!got.isOk() || !*got) break;
      impl.notes.push_back({name, value});
    }
  }
  bool posted = false;
  for (auto& [id, x] : impl.xfers) posted |= advance(impl, impl.name, *x);
  return posted;
}

// How long the progress thread blocks in one transport's wait: the only
// pair's until something arrives, a caller wakes it or this passes (a
// bound, so that a transport's timers run); with several pairs it takes
// them in turn, each for a short slice (under a millisecond: the tcp
// transport does not spin before such a wait).
constexpr auto kWaitOne = std::chrono::milliseconds(20);
constexpr auto kWaitSlice = std::chrono::microseconds(500);

// Progress::Thread's loop (Impl's comment).
void progressLoop(Agent::Impl& impl) {
  std::unique_lock lock(impl.mu);
  while (true) {
    impl.cv.wait(lock, [&] { return impl.stop || impl.callers.load(std::memory_order_seq_cst) == 0; });
    if (impl.stop) return;
    drive(impl);
    impl.changed.notify_all();
    std::vector<transport::Transport*> live;
    for (auto& [name, p] : impl.pairs)
      if (p->broken.isOk() && p->t) live.push_back(p->t.get());
    if (live.empty()) {
      const uint64_t epoch = impl.epoch;
      impl.cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return impl.stop || impl.epoch != epoch; });
      continue;
    }
    transport::Transport* t = live[impl.turn++ % live.size()];
    impl.in_wait = t;
    // A caller counted in before this (it found in_wait empty) is served
    // first; one counted in after finds in_wait and wakes it.
    if (impl.callers.load(std::memory_order_seq_cst) == 0) {
      lock.unlock();
      t->wait(live.size() == 1 ? std::chrono::microseconds(kWaitOne) : kWaitSlice);
      lock.lock();
    }
    impl.in_wait = nullptr;
    impl.cv.notify_all();
  }
}

}  // namespace

Status Agent::progress() {
  if (impl_->threaded) return {};
  Exclusive guard(*impl_);
  drive(*impl_);
  return {};
}

Result<XferState> Agent::test(uint64_t xfer, Status* why) {
  Reading reading(*impl_);
  auto it = impl_->xfers.find(xfer);
  if (it == impl_->xfers.end()) return invalidArgument("kv agent '{}': transfer {} is unknown (released?)", opts_.name, xfer);
  if (why != nullptr) *why = it->second->state == XferState::Failed ? it->second->error : Status();
  return it->second->state;
}

Result<XferState> Agent::wait(uint64_t xfer, std::chrono::milliseconds timeout, Status* why) {
  const auto deadline = Clock::now() + timeout;
  auto timedOut = [&] {
    return makeError(chorusTimeout, "kv agent '{}': transfer {} not finished within {} ms", opts_.name, xfer,
                     timeout.count());
  };
  if (impl_->threaded) {
    std::unique_lock lock(impl_->mu);
    while (true) {
      auto it = impl_->xfers.find(xfer);
      if (it == impl_->xfers.end())
        return invalidArgument("kv agent '{}': transfer {} is unknown (released?)", opts_.name, xfer);
      if (it->second->state != XferState::Pending) {
        if (why != nullptr) *why = it->second->state == XferState::Failed ? it->second->error : Status();
        return it->second->state;
      }
      if (Clock::now() > deadline) return timedOut();
      impl_->changed.wait_until(lock, deadline);
    }
  }
  while (true) {
    CHORUS_ASSIGN_OR_RETURN(XferState s, test(xfer, why));
    if (s != XferState::Pending) return s;
    if (Clock::now() > deadline) return timedOut();
    if (impl_->pairs.size() == 1 && impl_->pairs.begin()->second->broken.isOk())
      impl_->pairs.begin()->second->t->wait(std::chrono::microseconds(500));
    else
      std::this_thread::yield();
  }
}

Status Agent::cancel(uint64_t xfer) {
  Exclusive guard(*impl_);
  auto it = impl_->xfers.find(xfer);
  if (it == impl_->xfers.end()) return invalidArgument("kv agent '{}': transfer {} is unknown (released?)", opts_.name, xfer);
  Xfer& x = *it->second;
  // Past its last post (descriptors and notification) there is nothing to stop.
  if (x.state == XferState::Pending && (x.next < x.descs.size() || (x.notify && !x.notify_posted))) x.cancelled = true;
  advance(*impl_, opts_.name, *it->second);
  return {};
}

Status Agent::release(uint64_t xfer) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->xfers.find(xfer);
  if (it == impl_->xfers.end()) return invalidArgument("kv agent '{}': transfer {} is unknown (released?)", opts_.name, xfer);
  if (it->second->state == XferState::Pending)
    return invalidUsage("kv agent '{}': transfer {} is still pending (cancel it and wait)", opts_.name, xfer);
  impl_->xfers.erase(it);
  return {};
}

Result<std::vector<Notification>> Agent::takeNotifications() {
  Reading reading(*impl_);
  std::vector<Notification> out(impl_->notes.begin(), impl_->notes.end());
  impl_->notes.clear();
  return out;
}

}  // namespace chorus::prim::kv

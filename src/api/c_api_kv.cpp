// The C ABI of the KV-cache transfer engine (include/chorus/chorus.h's
// chorusKv*, prim/kv.hpp, docs/kv.md).
#include <chorus/chorus.h>

#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_set>

#include "api/config.hpp"
#include "bootstrap/bootstrap.hpp"
#include "bootstrap/store.hpp"
#include "prim/kv.hpp"

#define CHORUS_EXPORT extern "C" __attribute__((visibility("default")))

struct chorusKvAgent {
  std::unique_ptr<chorus::bootstrap::StoreServer> server;  // when this agent serves the store
  std::unique_ptr<chorus::prim::kv::Agent> agent;
  std::deque<chorus::prim::kv::Notification> notes;
};

namespace chorus::api {
chorusResult_t reportStatus(const Status& st);
// CHORUS_KV_PROGRESS (api/config.cpp): true for a progress thread.
Result<bool> kvProgressThreadFromEnv();
namespace {

namespace kv = prim::kv;

std::mutex g_kv_mu;
std::unordered_set<chorusKvAgent*>& liveAgents() {
  static std::unordered_set<chorusKvAgent*> s;
  return s;
}

Status checkAgent(const char* fn, chorusKvAgent* a) {
  if (a == nullptr) return invalidArgument("{}: agent is NULL", fn);
  std::lock_guard l(g_kv_mu);
  if (!liveAgents().count(a)) return invalidUsage("{}: agent {} is not a live agent (destroyed?)", fn, static_cast<void*>(a));
  return {};
}

Status checkString(const char* fn, const char* what, const char* s) {
  if (s == nullptr) return invalidArgument("{}: {} is NULL", fn, what);
  if (strnlen(s, kv::kMaxNameBytes + 1) > kv::kMaxNameBytes)
    return invalidArgument("{}: {} is longer than {} characters", fn, what, kv::kMaxNameBytes);
  return {};
}

Status copyName(const char* fn, const std::string& name, char* out, size_t cap) {
  if (out == nullptr) return {};
  if (cap < name.size() + 1)
    return invalidArgument("{}: the name '{}' needs {} bytes, the buffer has {}", fn, name, name.size() + 1, cap);
  std::memcpy(out, name.c_str(), name.size() + 1);
  return {};
}

#define KV_CHECK(expr)                                   \
  do {                                                   \
    ::chorus::Status kv_st_ = (expr);                    \
    if (!kv_st_.isOk()) return ::chorus::api::reportStatus(kv_st_); \
  } while (0)

chorusResult_t post(const char* fn, bool write, chorusKvAgent* a, const char* peer, const chorusKvDesc_t* descs,
                    size_t n, int notify, uint64_t value, uint64_t* xfer) {
  KV_CHECK(checkAgent(fn, a));
  KV_CHECK(checkString(fn, "peer", peer));
  if (descs == nullptr && n > 0) KV_CHECK(invalidArgument("{}: descs is NULL but n is {}", fn, n));
  if (xfer == nullptr) KV_CHECK(invalidArgument("{}: xfer is NULL", fn));
  std::vector<kv::Desc> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = {descs[i].localRegion, descs[i].localOffset, descs[i].remoteRegion, descs[i].remoteOffset, descs[i].bytes};
  auto r = write ? a->agent->postWrite(peer, v, notify != 0, value) : a->agent->postRead(peer, v, notify != 0, value);
  if (!r.isOk()) return reportStatus(r.status());
  *xfer = *r;
  return chorusSuccess;
}

chorusResult_t stateResult(kv::XferState s, const Status& why) {
  switch (s) {
    case kv::XferState::Pending: return chorusInProgress;
    case kv::XferState::Done: return chorusSuccess;
    case kv::XferState::Cancelled: return chorusAborted;
    case kv::XferState::Failed: return reportStatus(why);
  }
  return chorusInternalError;
}

}  // namespace
}  // namespace chorus::api

using namespace chorus;
using chorus::api::reportStatus;

CHORUS_EXPORT chorusResult_t chorusKvAgentCreate(chorusKvAgent_t* agent, const char* name, chorusUniqueId storeId,
                                                 int serveStore) {
  const char* fn = "chorusKvAgentCreate";
  if (agent == nullptr) KV_CHECK(invalidArgument("{}: agent is NULL", fn));
  *agent = nullptr;
  KV_CHECK(api::checkString(fn, "name", name));
  auto id = bootstrap::UniqueId::decode(storeId);
  if (!id.isOk()) return reportStatus(id.status().withContext(std::string(fn) + ": storeId: "));
  auto cfg = api::configFromEnv();
  if (!cfg.isOk()) return reportStatus(cfg.status().withContext(std::string(fn) + ": "));
  auto h = std::make_unique<chorusKvAgent>();
  if (serveStore != 0) {
    auto reserved = bootstrap::takeReservedListener(id->root);
    bootstrap::StoreServerOptions opts;
    opts.protect = cfg->net.wire_protect;
    auto s = reserved ? bootstrap::StoreServer::start(std::move(*reserved), id->secret, opts)
                      : bootstrap::StoreServer::start(id->root, id->secret, opts);
    if (!s.isOk()) return reportStatus(s.status().withContext(fmt::format("{}: starting the store on {}: ", fn, id->root.toString())));
    h->server = std::move(s.value());
  }
  auto store = bootstrap::connectStore(id->root, id->secret, cfg->timeout, cfg->net.wire_protect);
  if (!store.isOk())
    return reportStatus(store.status().withContext(fmt::format("{}: connecting to the store at {}: ", fn, id->root.toString())));
  prim::kv::AgentOptions o;
  o.name = name;
  o.store = std::move(store.value());
  o.id = *id;
  o.cfg = *cfg;
  auto threaded = api::kvProgressThreadFromEnv();
  if (!threaded.isOk()) return reportStatus(threaded.status().withContext(std::string(fn) + ": "));
  o.progress = *threaded ? prim::kv::Progress::Thread : prim::kv::Progress::Caller;
  auto a = prim::kv::Agent::create(std::move(o));
  if (!a.isOk()) return reportStatus(a.status());
  h->agent = std::move(a.value());
  std::lock_guard l(api::g_kv_mu);
  api::liveAgents().insert(h.get());
  *agent = h.release();
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusKvAgentDestroy(chorusKvAgent_t agent) {
  KV_CHECK(api::checkAgent("chorusKvAgentDestroy", agent));
  {
    std::lock_guard l(api::g_kv_mu);
    api::liveAgents().erase(agent);
  }
  agent->agent.reset();
  delete agent;
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusKvRegister(chorusKvAgent_t agent, void* base, size_t bytes, int access,
                                              uint32_t* region) {
  const char* fn = "chorusKvRegister";
  KV_CHECK(api::checkAgent(fn, agent));
  if (region == nullptr) KV_CHECK(invalidArgument("{}: region is NULL", fn));
  if (access < 1 || access > 3) KV_CHECK(invalidArgument("{}: access {} is not CHORUS_KV_READ, _WRITE or both", fn, access));
  auto r = agent->agent->registerRegion(base, bytes, static_cast<transport::Access>(access));
  if (!r.isOk()) return reportStatus(r.status());
  *region = r->index;
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusKvDeregister(chorusKvAgent_t agent, uint32_t region) {
  const char* fn = "chorusKvDeregister";
  KV_CHECK(api::checkAgent(fn, agent));
  // The C API names regions by index: the current registration's.
  auto md = prim::kv::unpackMetadata(agent->agent->metadata());
  if (!md.isOk()) return reportStatus(md.status());
  for (const auto& r : md->regions)
    if (r.index == region) return reportStatus(agent->agent->deregisterRegion({r.index, r.generation}));
  KV_CHECK(invalidArgument("{}: region {} is not registered", fn, region));
  return chorusInternalError;
}

CHORUS_EXPORT chorusResult_t chorusKvGetMetadata(chorusKvAgent_t agent, void* blob, size_t capacity, size_t* size) {
  const char* fn = "chorusKvGetMetadata";
  KV_CHECK(api::checkAgent(fn, agent));
  if (size == nullptr) KV_CHECK(invalidArgument("{}: size is NULL", fn));
  auto md = agent->agent->metadata();
  *size = md.size();
  if (blob != nullptr && capacity >= md.size()) std::memcpy(blob, md.data(), md.size());
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusKvPublishMetadata(chorusKvAgent_t agent) {
  KV_CHECK(api::checkAgent("chorusKvPublishMetadata", agent));
  return reportStatus(agent->agent->publishMetadata());
}

CHORUS_EXPORT chorusResult_t chorusKvLoadRemote(chorusKvAgent_t agent, const void* blob, size_t size, char* peerName,
                                                size_t nameCapacity) {
  const char* fn = "chorusKvLoadRemote";
  KV_CHECK(api::checkAgent(fn, agent));
  if (blob == nullptr) KV_CHECK(invalidArgument("{}: blob is NULL", fn));
  auto r = agent->agent->loadRemote(std::span(static_cast<const std::byte*>(blob), size));
  if (!r.isOk()) return reportStatus(r.status());
  return reportStatus(api::copyName(fn, *r, peerName, nameCapacity));
}

CHORUS_EXPORT chorusResult_t chorusKvConnect(chorusKvAgent_t agent, const char* peer, int timeoutMs) {
  const char* fn = "chorusKvConnect";
  KV_CHECK(api::checkAgent(fn, agent));
  KV_CHECK(api::checkString(fn, "peer", peer));
  if (timeoutMs < 0) KV_CHECK(invalidArgument("{}: timeoutMs {} is negative", fn, timeoutMs));
  return reportStatus(agent->agent->connect(peer, std::chrono::milliseconds(timeoutMs)).status());
}

CHORUS_EXPORT chorusResult_t chorusKvDisconnect(chorusKvAgent_t agent, const char* peer) {
  const char* fn = "chorusKvDisconnect";
  KV_CHECK(api::checkAgent(fn, agent));
  KV_CHECK(api::checkString(fn, "peer", peer));
  return reportStatus(agent->agent->disconnect(peer));
}

CHORUS_EXPORT chorusResult_t chorusKvPostWrite(chorusKvAgent_t agent, const char* peer, const chorusKvDesc_t* descs,
                                               size_t n, int notify, uint64_t notifValue, uint64_t* xfer) {
  return api::post("chorusKvPostWrite", true, agent, peer, descs, n, notify, notifValue, xfer);
}

CHORUS_EXPORT chorusResult_t chorusKvPostRead(chorusKvAgent_t agent, const char* peer, const chorusKvDesc_t* descs,
                                              size_t n, int notify, uint64_t notifValue, uint64_t* xfer) {
  return api::post("chorusKvPostRead", false, agent, peer, descs, n, notify, notifValue, xfer);
}

CHORUS_EXPORT chorusResult_t chorusKvProgress(chorusKvAgent_t agent) {
  KV_CHECK(api::checkAgent("chorusKvProgress", agent));
  return reportStatus(agent->agent->progress());
}

CHORUS_EXPORT chorusResult_t chorusKvTest(chorusKvAgent_t agent, uint64_t xfer) {
  KV_CHECK(api::checkAgent("chorusKvTest", agent));
  Status why;
  auto s = agent->agent->test(xfer, &why);
  if (!s.isOk()) return reportStatus(s.status());
  return api::stateResult(*s, why);
}

CHORUS_EXPORT chorusResult_t chorusKvWait(chorusKvAgent_t agent, uint64_t xfer, int timeoutMs) {
  const char* fn = "chorusKvWait";
  KV_CHECK(api::checkAgent(fn, agent));
  if (timeoutMs < 0) KV_CHECK(invalidArgument("{}: timeoutMs {} is negative", fn, timeoutMs));
  Status why;
  auto s = agent->agent->wait(xfer, std::chrono::milliseconds(timeoutMs), &why);
  if (!s.isOk()) return reportStatus(s.status());
  return api::stateResult(*s, why);
}

CHORUS_EXPORT chorusResult_t chorusKvCancel(chorusKvAgent_t agent, uint64_t xfer) {
  KV_CHECK(api::checkAgent("chorusKvCancel", agent));
  return reportStatus(agent->agent->cancel(xfer));
}

CHORUS_EXPORT chorusResult_t chorusKvRelease(chorusKvAgent_t agent, uint64_t xfer) {
  KV_CHECK(api::checkAgent("chorusKvRelease", agent));
  return reportStatus(agent->agent->release(xfer));
}

CHORUS_EXPORT chorusResult_t chorusKvGetNotif(chorusKvAgent_t agent, char* peerName, size_t nameCapacity,
                                              uint64_t* value, int* got) {
  const char* fn = "chorusKvGetNotif";
  KV_CHECK(api::checkAgent(fn, agent));
  if (value == nullptr || got == nullptr) KV_CHECK(invalidArgument("{}: value or got is NULL", fn));
  *got = 0;
  if (agent->notes.empty()) {
    auto n = agent->agent->takeNotifications();
    if (!n.isOk()) return reportStatus(n.status());
    for (auto& x : *n) agent->notes.push_back(std::move(x));
  }
  if (agent->notes.empty()) return chorusSuccess;
  KV_CHECK(api::copyName(fn, agent->notes.front().agent, peerName, nameCapacity));
  *value = agent->notes.front().value;
  agent->notes.pop_front();
  *got = 1;
  return chorusSuccess;
}

// The C ABI (include/chorus/chorus.h) over the Communicator.
//
// This layer validates every argument before anything reaches the core, and
// keeps the two pieces of state the NCCL-shaped API needs per process: the
// set of live communicator handles (so a call on a destroyed or aborted
// communicator is an error, not a crash) and, per thread, the last error
// message and the open group.
#include <chorus/chorus.h>
#include <chorus/device.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "api/compress.hpp"
#include "api/config.hpp"
#include "api/device_calls.hpp"
#include "bootstrap/bootstrap.hpp"
#include "clock/offset.hpp"
#include "comm/communicator.hpp"
#include "common/log.hpp"
#include "kernels/dtype.hpp"
#include "prim/ep.hpp"
#include "prim/primitive.hpp"

#define CHORUS_EXPORT extern "C" __attribute__((visibility("default")))

struct chorusComm {
  std::unique_ptr<chorus::Communicator> impl;
  std::atomic<bool> aborted{false};
  std::atomic<bool> revoked{false};
  std::string last_error;
  // The host parts of its calls on device streams, run after the calls
  // returned (docs/device.md); made at the first such call.  Declared after
  // impl: destroyed first, it finishes its jobs while the communicator lives.
  std::unique_ptr<chorus::device::Worker> device_worker;
};

struct chorusStream {
  chorus::exec::Stream s;
  // A device stream's device side (chorusStreamCreateOpenCL); null: a host stream.
  std::unique_ptr<chorus::device::DeviceStream> cl;
};

namespace chorus::api {
namespace {

// Live handles.  Process-wide by necessity: a C handle may be passed to any
// call, including after chorusCommDestroy, and must be recognised as dead.
struct Handles {
  std::mutex mu;
  std::unordered_set<chorusComm*> live;
  // Bumped (under mu) by every destroy: a thread's memo of the last handle it
  // found live holds while the epoch it saw then is still current.
  std::atomic<uint64_t> epoch{0};
};
Handles& handles() {
  static Handles h;
  return h;
}

thread_local std::string t_last_error;
// The last handle this thread found live, and the destroy epoch then: a
// loop of calls on one communicator skips the registry's lock and lookup.
thread_local chorusComm* t_live_comm = nullptr;
thread_local uint64_t t_live_epoch = 0;

struct PendingOp {
  chorusComm* comm;
  chorus::exec::Stream* stream;
  OpDesc op;
};
thread_local int t_group_depth = 0;
thread_local std::vector<PendingOp> t_group;
// The group's calls on OpenCL streams: their mapped buffers, unmapped at
// chorusGroupEnd after the batch (docs/device.md).
struct PendingDevice {
  chorusComm* comm;
  chorus::device::DeviceStream* cl;
  chorus::device::MappedCall mapped;
};
thread_local std::vector<PendingDevice> t_group_device;

// A call on host memory keeps its place after the communicator's earlier
// device calls whose host parts are still queued on its device worker: it
// waits for them (every rank issues in the same order, so the engine sees the
// calls in that order too).
void drainDevice(chorusComm* c) {
  if (c != nullptr && c->device_worker && c->device_worker->busy()) c->device_worker->drain();
}

chorusResult_t report(const Status& st, chorusComm* comm = nullptr) {
  if (st.isOk()) return chorusSuccess;
  t_last_error = st.message();
  if (comm) comm->last_error = st.message();
  log::info("{}", st.message());
  return st.code();
}

// Pins a communicator handle for the duration of a call.
class CommRef {
 public:
  CommRef(chorusComm* c, const char* fn) : c_(nullptr) {
    if (c == nullptr) {
      st_ = invalidArgument("{}: comm is NULL (pass a communicator from chorusCommInitRank)", fn);
      return;
    }
    if (c != t_live_comm || t_live_epoch != handles().epoch.load(std::memory_order_acquire)) {
      std::lock_guard l(handles().mu);
      if (!handles().live.count(c)) {
        st_ = invalidUsage("{}: comm {} is not a live communicator (was it destroyed?)", fn, static_cast<void*>(c));
        return;
      }
      t_live_comm = c;
      t_live_epoch = handles().epoch.load(std::memory_order_relaxed);
    }
    if (c->aborted.load()) {
      st_ = invalidUsage("{}: the communicator was aborted (destroy it and create a new one)", fn);
      // Recorded on the handle too, or chorusGetLastError(comm) would keep
      // returning the communicator's previous, unrelated message.
      c->last_error = st_.message();
      return;
    }
    c_ = c;
  }
  CommRef(const CommRef&) = delete;
  CommRef& operator=(const CommRef&) = delete;
  [[nodiscard]] const Status& status() const { return st_; }
  Communicator* operator->() const { return c_->impl.get(); }
  [[nodiscard]] chorusComm* handle() const { return c_; }

 private:
  chorusComm* c_;
  Status st_;
};

// The int a C caller passed for an enum parameter, read as bits: a value
// outside the enumerators' range is undefined behaviour when loaded as a C++
// enum without a fixed type (UBSan's -fsanitize=enum), and any int may arrive.
template <typename E>
int rawEnum(const E& e) {
  static_assert(sizeof(E) == sizeof(int));
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

Status checkDtype(const char* fn, const chorusDataType_t& d) {
  if (!kernels::isValidDtype(rawEnum(d)))
    return invalidArgument("{}: datatype={} is not a chorusDataType_t (valid: 0..{})", fn, rawEnum(d),
                           chorusNumTypes - 1);
  return {};
}

Status checkRank(const char* fn, const char* what, int v, int n) {
  if (v < 0 || v >= n) return invalidArgument("{}: {}={} is out of range for a communicator of {} ranks (0..{})", fn, what, v, n, n - 1);
  return {};
}

// count elements of dtype times `mult` must fit in size_t and in 2^62 bytes.
Status checkBytes(const char* fn, size_t count, chorusDataType_t d, uint64_t mult) {
  const uint64_t es = kernels::dtypeSize(d);
  const uint64_t limit = uint64_t{1} << 62;
  if (count != 0 && (count > limit / es || count * es > limit / std::max<uint64_t>(mult, 1)))
    return invalidArgument("{}: count={} elements of {} ({} bytes each, x{}) overflows the byte size", fn, count,
                           kernels::dtypeName(d), es, mult);
  return {};
}

Status checkBuf(const char* fn, const char* what, const void* p, size_t count) {
  if (p == nullptr && count > 0)
    return invalidArgument("{}: {} is NULL but count is {} (pass a buffer, or count 0)", fn, what, count);
  return {};
}

// Queues op in the open group, or submits it.
chorusResult_t issue(CommRef& ref, chorusStream_t stream, OpDesc& op) {
  if (stream != nullptr && stream->cl) {
    // Device memory (docs/device.md): staged around a blocking host call.
    if (t_group_depth > 0) {
      // In a group: the maps of the buffers are enqueued now (in queue
      // order; non-blocking on an asynchronous stream), the host operation
      // joins the group's batch, and chorusGroupEnd unmaps them once the batch
      // ran (docs/device.md, "Groups").
      auto m = stream->cl->mapCall(describeOnDevice(op, ref->rank(), ref->size()), !stream->cl->async());
      if (!m.isOk()) return report(m.status(), ref.handle());
      op.send = m->send;
      op.recv = m->recv;
      t_group_device.push_back({ref.handle(), stream->cl.get(), std::move(m).value()});
      t_group.push_back({ref.handle(), nullptr, std::move(op)});
      return chorusSuccess;
    }
    chorusComm* c = ref.handle();
    if (stream->cl->async() && !c->device_worker) c->device_worker = std::make_unique<device::Worker>();
    Communicator* impl = ref.operator->();
    return report(runOnDevice(*stream->cl, std::move(op), ref->rank(), ref->size(),
                              [impl](OpDesc& host_op) { return impl->submitOne(host_op, nullptr); },
                              c->device_worker.get()),
                  c);
  }
  if (Status st = checkHostBuffers(op); !st.isOk()) return report(st, ref.handle());
  drainDevice(ref.handle());
  exec::Stream* s = stream ? &stream->s : nullptr;
  if (t_group_depth > 0) {
    t_group.push_back({ref.handle(), s, std::move(op)});
    return chorusSuccess;
  }
  return report(ref->submitOne(op, s), ref.handle());
}

// Primitives and the EP calls run on host memory only: an OpenCL stream is
// refused by name (its buffers would be device addresses).
Status refuseDevice(const char* fn, chorusStream_t stream) {
  if (stream != nullptr && stream->cl)
    return invalidUsage("{}: not supported on an {} stream (primitives and the EP calls take host memory; "
                        "docs/device.md)",
                        fn, stream->cl->space() == device::Space::Cuda ? "CUDA" : "OpenCL");
  return {};
}

#define CHORUS_CHECK(expr)                                 \
  do {                                                     \
    ::chorus::Status chorus_st_ = (expr);                  \
    if (!chorus_st_.isOk()) return report(chorus_st_, c); \
  } while (0)

// The common prologue of a collective.
// s with "fn: " in front of its message; formats only on error (hot path).
inline Status inFunction(const char* fn, Status s) {
  return s.isOk() ? s : s.withContext(fmt::format("{}: ", fn));
}

#define CHORUS_COMM_PROLOGUE(fn)                    \
  CommRef ref(comm, fn);                            \
  [[maybe_unused]] chorusComm* c = ref.handle();    \
  if (!ref.status().isOk()) return report(ref.status());

}  // namespace

// The C API's other files (c_api_kv.cpp) report through the same last error.
chorusResult_t reportStatus(const Status& st) { return report(st); }
}  // namespace chorus::api

using namespace chorus;
using namespace chorus::api;
using plan::Collective;

CHORUS_EXPORT chorusResult_t chorusGetVersion(int* version) {
  if (version == nullptr) return report(invalidArgument("chorusGetVersion: version is NULL"));
  *version = CHORUS_VERSION_CODE;
  return chorusSuccess;
}

CHORUS_EXPORT const char* chorusGetErrorString(chorusResult_t r) {
  switch (rawEnum(r)) {
    case chorusSuccess: return "no error";
    case chorusSystemError: return "system error (an OS call failed)";
    case chorusInternalError: return "internal error (a bug in chorus)";
    case chorusInvalidArgument: return "invalid argument";
    case chorusInvalidUsage: return "invalid usage";
    case chorusRemoteError: return "remote error (a peer failed or disconnected)";
    case chorusInProgress: return "operation in progress";
    case chorusTimeout: return "timeout";
    case chorusMismatch: return "mismatch between ranks";
    case chorusAborted: return "communicator aborted";
    case chorusRevoked: return "communicator revoked";
    default: return "unknown chorusResult_t";
  }
}

CHORUS_EXPORT const char* chorusGetLastError(chorusComm_t comm) {
  if (comm != nullptr) {
    std::lock_guard l(handles().mu);
    if (handles().live.count(comm) && !comm->last_error.empty()) return comm->last_error.c_str();
  }
  return t_last_error.c_str();
}

CHORUS_EXPORT chorusResult_t chorusGetUniqueId(chorusUniqueId* uniqueId) {
  if (uniqueId == nullptr) return report(invalidArgument("chorusGetUniqueId: uniqueId is NULL"));
  auto id = bootstrap::makeUniqueId(api::envSocketIfname());
  if (!id.isOk()) return report(id.status());
  *uniqueId = id->encode();
  return chorusSuccess;
}


namespace {
chorusResult_t registerComm(chorusComm_t* out, std::unique_ptr<Communicator> impl) {
  auto* h = new chorusComm();
  h->impl = std::move(impl);
  std::lock_guard l(handles().mu);
  handles().live.insert(h);
  *out = h;
  return chorusSuccess;
}

// hint: appended to a failure to start or reach the rendezvous store (what
// the environment init derived the address from, and how to override it).
// The process-wide parts of a configuration (the log level, the testing clock
// offset): each init applies its own, so the last init's hold.
void applyProcessWide(const Config& cfg) {
  log::setLevel(cfg.log.level);
  clock::setInjectedOffsetNs(cfg.trace.clock_offset_ns);
}

chorusResult_t initRank(chorusComm_t* comm, int nranks, const bootstrap::UniqueId& id, int rank, const Config& cfg,
                        bool from_env = false, std::string_view hint = {}) {
  applyProcessWide(cfg);
  // The n-th environment init of this process rendezvous under its own
  // prefix on rank 0's one store (Communicator::init).
  static std::atomic<int> env_inits{0};
  std::string prefix = "w/";
  if (from_env)
    if (int gen = env_inits.fetch_add(1); gen > 0) prefix = fmt::format("w{}/", gen);
  auto c = Communicator::init(nranks, rank, id, cfg, prefix, from_env);
  if (!c.isOk()) {
    if (!hint.empty() && c.status().message().find("rendezvous store") != std::string::npos)
      return report(Status(c.status().code(), fmt::format("{} ({})", c.status().message(), hint)));
    return report(c.status());
  }
  return registerComm(comm, std::move(c.value()));
}

// chorusConfig_t's fields over cfg (-1: cfg's, from the environment).
Status applyUserConfig(const chorusConfig_t& user, Config& cfg) {
  // The layout before `reproducible` was appended is accepted: its callers
  // get the environment's value for the fields their size does not cover.
  constexpr size_t kLayoutV0 = offsetof(chorusConfig_t, reproducible);
  constexpr size_t kLayoutV1 = offsetof(chorusConfig_t, compress);
  if ((user.size != sizeof(chorusConfig_t) && user.size != kLayoutV0 && user.size != kLayoutV1) ||
      user.magic != CHORUS_CONFIG_MAGIC)
    return invalidArgument("chorusCommInitRankConfig: config is not initialised (size={} magic={:#x}); "
                           "start from CHORUS_CONFIG_INITIALIZER",
                           user.size, user.magic);
  if (user.timeoutMs != -1) {
    if (user.timeoutMs <= 0)
      return invalidArgument("chorusCommInitRankConfig: config.timeoutMs={} must be > 0 (or -1)", user.timeoutMs);
    cfg.timeout = std::chrono::milliseconds(user.timeoutMs);
  }
  if (user.checkMode != -1) {
    if (user.checkMode != 0 && user.checkMode != 1)
      return invalidArgument("chorusCommInitRankConfig: config.checkMode={} must be 0, 1 or -1", user.checkMode);
    cfg.check = user.checkMode == 1;
  }
  if (user.size > kLayoutV0 && user.reproducible != -1) {
    if (user.reproducible < CHORUS_REPRODUCIBLE_OFF || user.reproducible > CHORUS_REPRODUCIBLE_EXACT)
      return invalidArgument("chorusCommInitRankConfig: config.reproducible={} is not a mode (accepted: "
                             "CHORUS_REPRODUCIBLE_OFF=0, CHORUS_REPRODUCIBLE_CANONICAL=1, CHORUS_REPRODUCIBLE_EXACT=2, "
                             "or -1: CHORUS_REPRODUCIBLE)",
                             user.reproducible);
    cfg.reproducible = static_cast<Reproducible>(user.reproducible);
  }
  if (user.size > kLayoutV1) CHORUS_RETURN_IF_ERROR(applyCompressConfig(user.compress, user.compressBlock, cfg));
  return {};
}

// The arguments of chorusCommInitRank[Config] (fn), checked; the decoded id.
Result<bootstrap::UniqueId> checkInitArgs(const char* fn, chorusComm_t* comm, int nranks, const chorusUniqueId& commId,
                                          int rank) {
  if (comm == nullptr) return invalidArgument("{}: comm is NULL", fn);
  *comm = nullptr;
  if (nranks < 1) return invalidArgument("{}: nranks={} must be >= 1", fn, nranks);
  if (rank < 0 || rank >= nranks)
    return invalidArgument("{}: rank={} is out of range for nranks={} (0..{})", fn, rank, nranks, nranks - 1);
  auto id = bootstrap::UniqueId::decode(commId);
  if (!id.isOk()) return id.status().withContext(fmt::format("{}: ", fn));
  return id;
}

// The job of the environment (readEnvJob), initialised with cfg.
chorusResult_t initFromEnv(chorusComm_t* comm, const Config& cfg) {
  if (comm == nullptr) return report(invalidArgument("chorusCommInitFromEnv: comm is NULL"));
  *comm = nullptr;
  applyProcessWide(cfg);  // before the warning below
  // readEnvJob also enforces CHORUS_REQUIRE_SECRET.
  auto job = bootstrap::readEnvJob();
  if (!job.isOk()) return report(job.status().withContext("chorusCommInitFromEnv: "));
  // Every rank says it (each one is exposed, and a rank's log may be all a
  // user reads).
  if (!job->secret.present)
    log::warn("rank {}: this {} job has no secret ({}): {}", job->rank, job->source, job->no_secret_reason,
              bootstrap::secretFix());
  else
    log::info("rank {}: job secret from {}", job->rank, job->secret_origin);
  auto addr = net::resolve(job->master_addr, job->master_port);
  if (!addr.isOk()) return report(addr.status().withContext("chorusCommInitFromEnv: master address: "));
  bootstrap::UniqueId id{addr.value(), job->secret};
  const std::string hint = fmt::format(
      "{} job: the store address {} is {}, its port {} is {}; set CHORUS_MASTER_ADDR and CHORUS_MASTER_PORT on every "
      "rank to a host and free port of rank 0",
      job->source, job->master_addr, job->addr_origin, job->master_port, job->port_origin);
  chorusResult_t r = initRank(comm, job->world_size, id, job->rank, cfg, /*from_env=*/true, hint);
  // Every rank read the per-job file before rank 0's init could finish (they
  // all proved the secret to its store); a failed init removes it too.
  if (job->rank == 0 && !job->secret_file.empty()) ::unlink(job->secret_file.c_str());
  return r;
}
}  // namespace

CHORUS_EXPORT chorusResult_t chorusCommInitRank(chorusComm_t* comm, int nranks, chorusUniqueId commId, int rank) {
  auto id = checkInitArgs("chorusCommInitRank", comm, nranks, commId, rank);
  if (!id.isOk()) return report(id.status());
  auto cfg = api::configFromEnv();
  if (!cfg.isOk()) return report(cfg.status());
  return initRank(comm, nranks, id.value(), rank, cfg.value());
}

chorusResult_t chorus::api::commInitRank(chorusComm_t* comm, int nranks, chorusUniqueId commId, int rank,
                                         const Config& cfg) {
  auto id = checkInitArgs("chorusCommInitRank", comm, nranks, commId, rank);
  if (!id.isOk()) return report(id.status());
  return initRank(comm, nranks, id.value(), rank, cfg);
}

CHORUS_EXPORT chorusResult_t chorusCommInitRankConfig(chorusComm_t* comm, int nranks, chorusUniqueId commId, int rank,
                                                      const chorusConfig_t* config) {
  if (comm == nullptr) return report(invalidArgument("chorusCommInitRankConfig: comm is NULL"));
  *comm = nullptr;
  if (config == nullptr) return report(invalidArgument("chorusCommInitRankConfig: config is NULL"));
  auto id = checkInitArgs("chorusCommInitRankConfig", comm, nranks, commId, rank);
  if (!id.isOk()) return report(id.status());
  auto cfg = api::configFromEnv();
  if (!cfg.isOk()) return report(cfg.status());
  if (Status st = applyUserConfig(*config, cfg.value()); !st.isOk()) return report(st);
  return initRank(comm, nranks, id.value(), rank, cfg.value());
}

CHORUS_EXPORT chorusResult_t chorusCommInitFromEnv(chorusComm_t* comm) {
  if (comm == nullptr) return report(invalidArgument("chorusCommInitFromEnv: comm is NULL"));
  *comm = nullptr;
  auto cfg = api::configFromEnv();
  if (!cfg.isOk()) return report(cfg.status());
  return initFromEnv(comm, cfg.value());
}

chorusResult_t chorus::api::commInitFromEnv(chorusComm_t* comm, const Config& cfg) { return initFromEnv(comm, cfg); }

namespace {
chorusResult_t split(chorusComm_t comm, int color, int key, const Config* cfg, chorusComm_t* newcomm) {
  CHORUS_COMM_PROLOGUE("chorusCommSplit");
  CHORUS_CHECK(newcomm ? Status() : invalidArgument("chorusCommSplit: newcomm is NULL"));
  *newcomm = nullptr;
  drainDevice(c);
  auto r = ref->split(color, key, cfg);
  if (!r.isOk()) return report(r.status(), c);
  if (!r.value()) return chorusSuccess;
  return registerComm(newcomm, std::move(r.value()));
}
}  // namespace

CHORUS_EXPORT chorusResult_t chorusCommSplit(chorusComm_t comm, int color, int key, chorusComm_t* newcomm) {
  return split(comm, color, key, nullptr, newcomm);
}

chorusResult_t chorus::api::commSplit(chorusComm_t comm, int color, int key, const Config& cfg,
                                      chorusComm_t* newcomm) {
  return split(comm, color, key, &cfg, newcomm);
}

std::string chorus::api::commRouteKey(chorusComm_t comm) {
  CommRef c(comm, "commRouteKey");
  return c.status().isOk() ? c->routeKey() : std::string();
}

std::vector<std::string> chorus::api::commTransports(chorusComm_t comm) {
  CommRef c(comm, "commTransports");
  return c.status().isOk() ? c->transportNames() : std::vector<std::string>{};
}

CHORUS_EXPORT chorusResult_t chorusCommShrink(chorusComm_t comm, int flags, chorusComm_t* newcomm) {
  if (newcomm == nullptr) return report(invalidArgument("chorusCommShrink: newcomm is NULL"));
  *newcomm = nullptr;
  if (flags != CHORUS_SHRINK_DEFAULT)
    return report(invalidArgument("chorusCommShrink: flags={} is not supported (pass CHORUS_SHRINK_DEFAULT)", flags));
  if (comm == nullptr) return report(invalidArgument("chorusCommShrink: comm is NULL"));
  {
    // An aborted or broken communicator may be shrunk: that is its purpose.
    std::lock_guard l(handles().mu);
    if (!handles().live.count(comm))
      return report(invalidUsage("chorusCommShrink: comm {} is not a live communicator", static_cast<void*>(comm)));
  }
  // The window of the communicator's configuration (CHORUS_SHRINK_WINDOW_MS
  // when it was made).
  auto r = comm->impl->shrink(comm->impl->config().shrink.window);
  if (!r.isOk()) return report(r.status(), comm);
  return registerComm(newcomm, std::move(r.value()));
}

CHORUS_EXPORT chorusResult_t chorusCommRevoke(chorusComm_t comm) {
  if (comm == nullptr) return report(invalidArgument("chorusCommRevoke: comm is NULL"));
  {
    std::lock_guard l(handles().mu);
    if (!handles().live.count(comm))
      return report(invalidUsage("chorusCommRevoke: comm {} is not a live communicator", static_cast<void*>(comm)));
    if (comm->revoked.exchange(true)) return chorusSuccess;
  }
  comm->impl->revoke();
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusCommGrow(chorusComm_t comm, int nnew, chorusComm_t* newcomm) {
  if (newcomm == nullptr) return report(invalidArgument("chorusCommGrow: newcomm is NULL"));
  *newcomm = nullptr;
  if (comm == nullptr) return report(invalidArgument("chorusCommGrow: comm is NULL"));
  {
    std::lock_guard l(handles().mu);
    if (!handles().live.count(comm))
      return report(invalidUsage("chorusCommGrow: comm {} is not a live communicator", static_cast<void*>(comm)));
  }
  if (nnew < 1) return report(invalidArgument("chorusCommGrow: nnew={} must be >= 1", nnew));
  if (Status st = comm->impl->asyncError(); !st.isOk())
    return report(invalidUsage("chorusCommGrow: comm is broken ({}); shrink it first", st.message()), comm);
  auto r = comm->impl->grow(nnew);
  if (!r.isOk()) return report(r.status(), comm);
  return registerComm(newcomm, std::move(r.value()));
}

CHORUS_EXPORT chorusResult_t chorusCommJoin(chorusUniqueId commId, chorusComm_t* newcomm) {
  if (newcomm == nullptr) return report(invalidArgument("chorusCommJoin: newcomm is NULL"));
  *newcomm = nullptr;
  auto id = bootstrap::UniqueId::decode(commId);
  if (!id.isOk()) return report(id.status().withContext("chorusCommJoin: "));
  auto cfg = api::configFromEnv();
  if (!cfg.isOk()) return report(cfg.status());
  applyProcessWide(cfg.value());
  auto r = Communicator::join(id.value(), cfg.value());
  if (!r.isOk()) return report(r.status().withContext("chorusCommJoin: "));
  return registerComm(newcomm, std::move(r.value()));
}

CHORUS_EXPORT chorusResult_t chorusCommDestroy(chorusComm_t comm) {
  if (comm == nullptr) return report(invalidArgument("chorusCommDestroy: comm is NULL"));
  {
    std::lock_guard l(handles().mu);
    if (!handles().live.erase(comm))
      return report(invalidUsage("chorusCommDestroy: comm {} is not a live communicator (destroyed twice?)",
                                 static_cast<void*>(comm)));
    handles().epoch.fetch_add(1, std::memory_order_acq_rel);
  }
  delete comm;  // drains queued work, stops the progress thread, closes transports
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusCommAbort(chorusComm_t comm) {
  if (comm == nullptr) return report(invalidArgument("chorusCommAbort: comm is NULL"));
  {
    std::lock_guard l(handles().mu);
    if (!handles().live.count(comm))
      return report(invalidUsage("chorusCommAbort: comm {} is not a live communicator", static_cast<void*>(comm)));
    if (comm->aborted.exchange(true)) return chorusSuccess;
  }
  comm->impl->abort(makeError(chorusAborted, "rank {}: the communicator was aborted (chorusCommAbort)", comm->impl->rank()));
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusCommGetAsyncError(chorusComm_t comm, chorusResult_t* asyncError) {
  if (asyncError == nullptr) return report(invalidArgument("chorusCommGetAsyncError: asyncError is NULL"));
  if (comm == nullptr) return report(invalidArgument("chorusCommGetAsyncError: comm is NULL"));
  std::lock_guard l(handles().mu);
  if (!handles().live.count(comm)) return report(invalidUsage("chorusCommGetAsyncError: comm is not a live communicator"));
  Status st = comm->impl->asyncError();
  if (!st.isOk()) comm->last_error = st.message();
  *asyncError = st.code();
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusCommCount(const chorusComm_t comm, int* count) {
  CHORUS_COMM_PROLOGUE("chorusCommCount");
  CHORUS_CHECK(count ? Status() : invalidArgument("chorusCommCount: count is NULL"));
  *count = ref->size();
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusCommUserRank(const chorusComm_t comm, int* rank) {
  CHORUS_COMM_PROLOGUE("chorusCommUserRank");
  CHORUS_CHECK(rank ? Status() : invalidArgument("chorusCommUserRank: rank is NULL"));
  *rank = ref->rank();
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusRedOpCreatePreMulSum(chorusRedOp_t* op, void* scalar, chorusDataType_t datatype,
                                                        chorusScalarResidence_t residence, chorusComm_t comm) {
  CHORUS_COMM_PROLOGUE("chorusRedOpCreatePreMulSum");
  CHORUS_CHECK(op ? Status() : invalidArgument("chorusRedOpCreatePreMulSum: op is NULL"));
  CHORUS_CHECK(scalar ? Status() : invalidArgument("chorusRedOpCreatePreMulSum: scalar is NULL"));
  CHORUS_CHECK(checkDtype("chorusRedOpCreatePreMulSum", datatype));
  if (const int rv = rawEnum(residence); rv != chorusScalarDevice && rv != chorusScalarHostImmediate)
    return report(invalidArgument("chorusRedOpCreatePreMulSum: residence={} is not a chorusScalarResidence_t", rv), c);
  kernels::Scalar s;
  s.dtype = datatype;
  std::memcpy(s.bytes, scalar, kernels::dtypeSize(datatype));
  auto r = ref->createPreMulSum(s, residence == chorusScalarDevice ? scalar : nullptr);
  if (!r.isOk()) return report(r.status(), c);
  *op = r.value();
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusRedOpDestroy(chorusRedOp_t op, chorusComm_t comm) {
  CHORUS_COMM_PROLOGUE("chorusRedOpDestroy");
  return report(ref->destroyRedOp(op).withContext("chorusRedOpDestroy: "), c);
}

// ---- collectives ----------------------------------------------------------------

namespace {
OpDesc makeOp(Collective coll, const void* send, void* recv, size_t count, chorusDataType_t dtype,
              chorusRedOp_t op = chorusSum, int root = 0) {
  OpDesc d;
  d.coll = coll;
  d.send = send;
  d.recv = recv;
  d.count = count;
  d.dtype = dtype;
  d.op = op;
  d.root = root;
  return d;
}
// One side of a point-to-point transfer with `peer`.
OpDesc makePointToPoint(OpKind kind, const void* send, void* recv, size_t count, chorusDataType_t dtype, int peer) {
  OpDesc d;
  d.kind = kind;
  d.send = send;
  d.recv = recv;
  d.count = count;
  d.dtype = dtype;
  d.peer = peer;
  return d;
}
}  // namespace

namespace {
// chorusAllReduce[Ex] (fn): options == nullptr takes the communicator's
// compression default.
chorusResult_t allReduce(const char* fn, const void* sendbuff, void* recvbuff, size_t count, chorusDataType_t datatype,
                         chorusRedOp_t op, chorusComm_t comm, chorusStream_t stream,
                         const chorusCallOptions_t* options) {
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkDtype(fn, datatype));
  CHORUS_CHECK(inFunction(fn, ref->validateOp(op, datatype)));
  CHORUS_CHECK(checkBytes(fn, count, datatype, 1));
  CHORUS_CHECK(checkBuf(fn, "sendbuff", sendbuff, count));
  CHORUS_CHECK(checkBuf(fn, "recvbuff", recvbuff, count));
  OpDesc d = makeOp(Collective::AllReduce, sendbuff, recvbuff, count, datatype, op);
  CHORUS_CHECK(resolveCompression(fn, options, ref->config(), d));
  return issue(ref, stream, d);
}
}  // namespace

CHORUS_EXPORT chorusResult_t chorusAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                             chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm,
                                             chorusStream_t stream) {
  return allReduce("chorusAllReduce", sendbuff, recvbuff, count, datatype, op, comm, stream, nullptr);
}

CHORUS_EXPORT chorusResult_t chorusAllReduceEx(const void* sendbuff, void* recvbuff, size_t count,
                                               chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm,
                                               chorusStream_t stream, const chorusCallOptions_t* options) {
  return allReduce("chorusAllReduceEx", sendbuff, recvbuff, count, datatype, op, comm, stream, options);
}

CHORUS_EXPORT chorusResult_t chorusBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                             chorusDataType_t datatype, int root, chorusComm_t comm,
                                             chorusStream_t stream) {
  const char* fn = "chorusBroadcast";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkDtype(fn, datatype));
  CHORUS_CHECK(checkRank(fn, "root", root, ref->size()));
  CHORUS_CHECK(checkBytes(fn, count, datatype, 1));
  if (ref->rank() == root) CHORUS_CHECK(checkBuf(fn, "sendbuff (at the root)", sendbuff, count));
  CHORUS_CHECK(checkBuf(fn, "recvbuff", recvbuff, count));
  OpDesc d = makeOp(Collective::Broadcast, sendbuff, recvbuff, count, datatype, chorusSum, root);
  return issue(ref, stream, d);
}

CHORUS_EXPORT chorusResult_t chorusReduce(const void* sendbuff, void* recvbuff, size_t count,
                                          chorusDataType_t datatype, chorusRedOp_t op, int root, chorusComm_t comm,
                                          chorusStream_t stream) {
  const char* fn = "chorusReduce";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkDtype(fn, datatype));
  CHORUS_CHECK(inFunction(fn, ref->validateOp(op, datatype)));
  CHORUS_CHECK(checkRank(fn, "root", root, ref->size()));
  CHORUS_CHECK(checkBytes(fn, count, datatype, 1));
  CHORUS_CHECK(checkBuf(fn, "sendbuff", sendbuff, count));
  if (ref->rank() == root) CHORUS_CHECK(checkBuf(fn, "recvbuff (at the root)", recvbuff, count));
  OpDesc d = makeOp(Collective::Reduce, sendbuff, recvbuff, count, datatype, op, root);
  return issue(ref, stream, d);
}

namespace {
chorusResult_t allGather(const char* fn, const void* sendbuff, void* recvbuff, size_t sendcount,
                         chorusDataType_t datatype, chorusComm_t comm, chorusStream_t stream,
                         const chorusCallOptions_t* options) {
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkDtype(fn, datatype));
  CHORUS_CHECK(checkBytes(fn, sendcount, datatype, ref->size()));
  CHORUS_CHECK(checkBuf(fn, "sendbuff", sendbuff, sendcount));
  CHORUS_CHECK(checkBuf(fn, "recvbuff", recvbuff, sendcount));
  OpDesc d = makeOp(Collective::AllGather, sendbuff, recvbuff, sendcount, datatype);
  CHORUS_CHECK(resolveCompression(fn, options, ref->config(), d));
  return issue(ref, stream, d);
}
}  // namespace

CHORUS_EXPORT chorusResult_t chorusAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                             chorusDataType_t datatype, chorusComm_t comm, chorusStream_t stream) {
  return allGather("chorusAllGather", sendbuff, recvbuff, sendcount, datatype, comm, stream, nullptr);
}

CHORUS_EXPORT chorusResult_t chorusAllGatherEx(const void* sendbuff, void* recvbuff, size_t sendcount,
                                               chorusDataType_t datatype, chorusComm_t comm, chorusStream_t stream,
                                               const chorusCallOptions_t* options) {
  return allGather("chorusAllGatherEx", sendbuff, recvbuff, sendcount, datatype, comm, stream, options);
}

namespace {
chorusResult_t reduceScatter(const char* fn, const void* sendbuff, void* recvbuff, size_t recvcount,
                             chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm, chorusStream_t stream,
                             const chorusCallOptions_t* options) {
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkDtype(fn, datatype));
  CHORUS_CHECK(inFunction(fn, ref->validateOp(op, datatype)));
  CHORUS_CHECK(checkBytes(fn, recvcount, datatype, ref->size()));
  CHORUS_CHECK(checkBuf(fn, "sendbuff", sendbuff, recvcount));
  CHORUS_CHECK(checkBuf(fn, "recvbuff", recvbuff, recvcount));
  OpDesc d = makeOp(Collective::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op);
  CHORUS_CHECK(resolveCompression(fn, options, ref->config(), d));
  return issue(ref, stream, d);
}
}  // namespace

CHORUS_EXPORT chorusResult_t chorusReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                 chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm,
                                                 chorusStream_t stream) {
  return reduceScatter("chorusReduceScatter", sendbuff, recvbuff, recvcount, datatype, op, comm, stream, nullptr);
}

CHORUS_EXPORT chorusResult_t chorusReduceScatterEx(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                   chorusDataType_t datatype, chorusRedOp_t op, chorusComm_t comm,
                                                   chorusStream_t stream, const chorusCallOptions_t* options) {
  return reduceScatter("chorusReduceScatterEx", sendbuff, recvbuff, recvcount, datatype, op, comm, stream, options);
}

CHORUS_EXPORT chorusResult_t chorusAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                                            chorusDataType_t datatype, chorusComm_t comm, chorusStream_t stream) {
  const char* fn = "chorusAllToAll";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkDtype(fn, datatype));
  CHORUS_CHECK(checkBytes(fn, count, datatype, ref->size()));
  CHORUS_CHECK(checkBuf(fn, "sendbuff", sendbuff, count));
  CHORUS_CHECK(checkBuf(fn, "recvbuff", recvbuff, count));
  OpDesc d = makeOp(Collective::AllToAll, sendbuff, recvbuff, count, datatype);
  return issue(ref, stream, d);
}

namespace {
Status checkVector(const char* fn, const char* what, const size_t* v, int n, chorusDataType_t dtype) {
  if (v == nullptr) return invalidArgument("{}: {} is NULL (pass an array of {} entries)", fn, what, n);
  for (int i = 0; i < n; ++i) CHORUS_RETURN_IF_ERROR(checkBytes(fn, v[i], dtype, 1));
  return {};
}
size_t total(const size_t* c, const size_t* d, int n) {
  size_t t = 0;
  for (int i = 0; i < n; ++i)
    if (c[i]) t = std::max(t, c[i] + d[i]);
  return t;
}
}  // namespace

CHORUS_EXPORT chorusResult_t chorusAllGatherV(const void* sendbuff, size_t sendcount, void* recvbuff,
                                              const size_t* recvcounts, const size_t* displs,
                                              chorusDataType_t datatype, chorusComm_t comm, chorusStream_t stream) {
  const char* fn = "chorusAllGatherV";
  CHORUS_COMM_PROLOGUE(fn);
  const int n = ref->size();
  CHORUS_CHECK(checkDtype(fn, datatype));
  CHORUS_CHECK(checkVector(fn, "recvcounts", recvcounts, n, datatype));
  CHORUS_CHECK(checkVector(fn, "displs", displs, n, datatype));
  if (recvcounts[ref->rank()] != sendcount)
    return report(invalidArgument("{}: sendcount={} but recvcounts[{}]={} (they must be equal)", fn, sendcount,
                                  ref->rank(), recvcounts[ref->rank()]), c);
  CHORUS_CHECK(checkBuf(fn, "sendbuff", sendbuff, sendcount));
  CHORUS_CHECK(checkBuf(fn, "recvbuff", recvbuff, total(recvcounts, displs, n)));
  OpDesc d = makeOp(Collective::AllGatherV, sendbuff, recvbuff, sendcount, datatype);
  d.counts.assign(recvcounts, recvcounts + n);
  d.displs.assign(displs, displs + n);
  return issue(ref, stream, d);
}

CHORUS_EXPORT chorusResult_t chorusAllToAllV(const void* sendbuff, const size_t* sendcounts, const size_t* sdispls,
                                             void* recvbuff, const size_t* recvcounts, const size_t* rdispls,
                                             chorusDataType_t datatype, chorusComm_t comm, chorusStream_t stream) {
  const char* fn = "chorusAllToAllV";
  CHORUS_COMM_PROLOGUE(fn);
  const int n = ref->size();
  CHORUS_CHECK(checkDtype(fn, datatype));
  CHORUS_CHECK(checkVector(fn, "sendcounts", sendcounts, n, datatype));
  CHORUS_CHECK(checkVector(fn, "sdispls", sdispls, n, datatype));
  CHORUS_CHECK(checkVector(fn, "recvcounts", recvcounts, n, datatype));
  CHORUS_CHECK(checkVector(fn, "rdispls", rdispls, n, datatype));
  const int me = ref->rank();
  if (sendcounts[me] != recvcounts[me])
    return report(invalidArgument("{}: sendcounts[{}]={} but recvcounts[{}]={} (a rank's block to itself must match)",
                                  fn, me, sendcounts[me], me, recvcounts[me]), c);
  CHORUS_CHECK(checkBuf(fn, "sendbuff", sendbuff, total(sendcounts, sdispls, n)));
  CHORUS_CHECK(checkBuf(fn, "recvbuff", recvbuff, total(recvcounts, rdispls, n)));
  if (sendbuff != nullptr && sendbuff == recvbuff)
    return report(invalidUsage("{}: in-place alltoallv is not supported (use separate buffers)", fn), c);
  OpDesc d = makeOp(Collective::AllToAllV, sendbuff, recvbuff, 0, datatype);
  d.counts.assign(sendcounts, sendcounts + n);
  d.displs.assign(sdispls, sdispls + n);
  d.counts2.assign(recvcounts, recvcounts + n);
  d.displs2.assign(rdispls, rdispls + n);
  return issue(ref, stream, d);
}

CHORUS_EXPORT chorusResult_t chorusGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                          chorusDataType_t datatype, int root, chorusComm_t comm,
                                          chorusStream_t stream) {
  const char* fn = "chorusGather";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkDtype(fn, datatype));
  CHORUS_CHECK(checkRank(fn, "root", root, ref->size()));
  CHORUS_CHECK(checkBytes(fn, sendcount, datatype, ref->size()));
  CHORUS_CHECK(checkBuf(fn, "sendbuff", sendbuff, sendcount));
  if (ref->rank() == root) CHORUS_CHECK(checkBuf(fn, "recvbuff (at the root)", recvbuff, sendcount));
  OpDesc d = makeOp(Collective::Gather, sendbuff, recvbuff, sendcount, datatype, chorusSum, root);
  return issue(ref, stream, d);
}

CHORUS_EXPORT chorusResult_t chorusScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           chorusDataType_t datatype, int root, chorusComm_t comm,
                                           chorusStream_t stream) {
  const char* fn = "chorusScatter";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkDtype(fn, datatype));
  CHORUS_CHECK(checkRank(fn, "root", root, ref->size()));
  CHORUS_CHECK(checkBytes(fn, recvcount, datatype, ref->size()));
  if (ref->rank() == root) CHORUS_CHECK(checkBuf(fn, "sendbuff (at the root)", sendbuff, recvcount));
  CHORUS_CHECK(checkBuf(fn, "recvbuff", recvbuff, recvcount));
  OpDesc d = makeOp(Collective::Scatter, sendbuff, recvbuff, recvcount, datatype, chorusSum, root);
  return issue(ref, stream, d);
}

CHORUS_EXPORT chorusResult_t chorusSend(const void* sendbuff, size_t count, chorusDataType_t datatype, int peer,
                                        chorusComm_t comm, chorusStream_t stream) {
  const char* fn = "chorusSend";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkDtype(fn, datatype));
  CHORUS_CHECK(checkRank(fn, "peer", peer, ref->size()));
  CHORUS_CHECK(checkBytes(fn, count, datatype, 1));
  CHORUS_CHECK(checkBuf(fn, "sendbuff", sendbuff, count));
  if (peer == ref->rank() && t_group_depth == 0)
    return report(invalidUsage("{}: a send to self (peer={}) must be inside chorusGroupStart/End with its receive", fn, peer), c);
  OpDesc d = makePointToPoint(OpKind::Send, sendbuff, nullptr, count, datatype, peer);
  return issue(ref, stream, d);
}

CHORUS_EXPORT chorusResult_t chorusRecv(void* recvbuff, size_t count, chorusDataType_t datatype, int peer,
                                        chorusComm_t comm, chorusStream_t stream) {
  const char* fn = "chorusRecv";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkDtype(fn, datatype));
  CHORUS_CHECK(checkRank(fn, "peer", peer, ref->size()));
  CHORUS_CHECK(checkBytes(fn, count, datatype, 1));
  CHORUS_CHECK(checkBuf(fn, "recvbuff", recvbuff, count));
  if (peer == ref->rank() && t_group_depth == 0)
    return report(invalidUsage("{}: a receive from self (peer={}) must be inside chorusGroupStart/End with its send", fn, peer), c);
  OpDesc d = makePointToPoint(OpKind::Recv, nullptr, recvbuff, count, datatype, peer);
  return issue(ref, stream, d);
}

CHORUS_EXPORT chorusResult_t chorusBarrier(chorusComm_t comm, chorusStream_t stream) {
  CHORUS_COMM_PROLOGUE("chorusBarrier");
  OpDesc d = makeOp(Collective::Barrier, nullptr, nullptr, 0, chorusUint8);
  return issue(ref, stream, d);
}

CHORUS_EXPORT chorusResult_t chorusCommPredict(chorusComm_t comm, const char* collective, size_t count,
                                               chorusDataType_t datatype, int inplace, char* algo, size_t algo_len,
                                               double* predicted_us) {
  const char* fn = "chorusCommPredict";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkDtype(fn, datatype));
  CHORUS_CHECK(collective ? Status() : invalidArgument("{}: collective is NULL", fn));
  CHORUS_CHECK(predicted_us ? Status() : invalidArgument("{}: predicted_us is NULL", fn));
  plan::Collective coll;
  if (!plan::parseCollective(collective, &coll))
    return report(invalidArgument("{}: collective='{}' is not a collective name ({})", fn, collective, plan::collectiveNamesText()), c);
  // The call as a plain call of it runs: the communicator's default
  // compression applies to the collectives and data it can serve.
  OpDesc plain;
  plain.coll = coll;
  plain.dtype = datatype;
  plain.op = chorusSum;
  if (plan::compressible(coll))
    CHORUS_CHECK(resolveCompression(fn, nullptr, ref->config(), plain));
  auto p = ref->predict(coll, count, datatype, inplace != 0, plain.wire);
  if (!p.isOk()) return report(p.status(), c);
  *predicted_us = p->seconds * 1e6;
  if (algo != nullptr && algo_len > 0) {
    size_t n = std::min(algo_len - 1, p->algo.size());
    std::memcpy(algo, p->algo.data(), n);
    algo[n] = '\0';
  }
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusCommSetAlgo(chorusComm_t comm, const char* spec) {
  const char* fn = "chorusCommSetAlgo";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(spec ? Status() : invalidArgument("{}: spec is NULL", fn));
  return report(ref->setAlgorithms(spec), c);
}

// ---- groups ----------------------------------------------------------------------

CHORUS_EXPORT chorusResult_t chorusGroupStart(void) {
  ++t_group_depth;
  return chorusSuccess;
}

namespace chorus::api {
namespace {
// A group's batch of device calls of one communicator, run by its device
// worker: each call's unmaps are enqueued now behind a gate of its own; the
// job waits for the maps, runs the batch, records an error on each stream,
// and opens the gates.  The calls it takes are marked (cl = nullptr).
Status postDeviceGroup(chorusComm* c, Communicator* impl, std::vector<OpDesc> batch,
                       std::vector<PendingDevice>& device_ops) {
  struct Item {
    device::DeviceStream* cl;
    device::MappedCall mapped;
    void* gate;
  };
  auto items = std::make_shared<std::vector<Item>>();
  Status first;
  for (PendingDevice& d : device_ops) {
    if (d.comm != c || d.cl == nullptr) continue;
    auto gate = d.cl->makeGate();
    if (!gate.isOk()) {
      if (first.isOk()) first = gate.status();
      continue;  // unmapped (ungated) by chorusGroupEnd
    }
    Item it{d.cl, std::move(d.mapped), *gate};
    device::MappedCall unmaps = it.mapped;  // the unmaps are enqueued now; the job keeps the pointers
    unmaps.ready = nullptr;
    Status st = d.cl->unmapCall(unmaps, *gate);
    if (!st.isOk() && first.isOk()) first = st;
    items->push_back(std::move(it));
    d.cl = nullptr;
  }
  if (!first.isOk()) {
    // The batch cannot run on every buffer: open what was gated; the
    // communicator's other ranks see this rank's error as a mismatch or timeout.
    for (Item& it : *items) {
      (void)it.cl->waitMapped(it.mapped);
      it.cl->openGate(it.gate);
    }
    return first;
  }
  if (!c->device_worker) c->device_worker = std::make_unique<device::Worker>();
  c->device_worker->post([impl, items, batch = std::move(batch)]() mutable {
    Status st;
    for (Item& it : *items) {
      Status w = it.cl->waitMapped(it.mapped);
      if (st.isOk()) st = w;
    }
    if (st.isOk()) st = impl->submit(std::move(batch), nullptr);
    for (Item& it : *items) {
      if (!st.isOk()) it.cl->recordError(st);
      it.cl->openGate(it.gate);
    }
  });
  return {};
}
}  // namespace
}  // namespace chorus::api

CHORUS_EXPORT chorusResult_t chorusGroupEnd(void) {
  if (t_group_depth == 0) return report(invalidUsage("chorusGroupEnd: no matching chorusGroupStart"));
  if (--t_group_depth > 0) return chorusSuccess;
  std::vector<PendingOp> ops = std::move(t_group);
  t_group.clear();
  std::vector<PendingDevice> device_ops = std::move(t_group_device);
  t_group_device.clear();
  // One batch per communicator, in issue order.
  std::vector<chorusComm*> comms;
  for (auto& p : ops)
    if (std::find(comms.begin(), comms.end(), p.comm) == comms.end()) comms.push_back(p.comm);
  const bool several = comms.size() > 1;
  std::vector<std::unique_ptr<exec::Stream>> waits;
  std::vector<exec::Stream*> used;  // the batches' streams
  Status first;
  for (chorusComm* c : comms) {
    CommRef ref(c, "chorusGroupEnd");
    if (!ref.status().isOk()) {
      if (first.isOk()) first = ref.status();
      continue;
    }
    std::vector<OpDesc> batch;
    exec::Stream* stream = nullptr;
    for (auto& p : ops)
      if (p.comm == c) {
        batch.push_back(std::move(p.op));
        if (stream == nullptr) stream = p.stream;
      }
    size_t ndev = 0;
    bool all_async = true;
    for (PendingDevice& d : device_ops)
      if (d.comm == c) {
        ++ndev;
        all_async = all_async && d.cl->async();
      }
    if (ndev == batch.size() && all_async) {
      // Only device calls, on asynchronous streams: the batch is this
      // communicator's device worker's (after its earlier device calls, in
      // issue order); the unmaps wait behind gates it opens once the batch
      // ran, and chorusGroupEnd returns at once.
      Status st = postDeviceGroup(c, ref.operator->(), std::move(batch), device_ops);
      if (!st.isOk()) {
        report(st, c);
        if (first.isOk()) first = st;
      }
      continue;
    }
    drainDevice(c);
    for (PendingDevice& d : device_ops)
      if (d.comm == c) {
        // The host operation reads the mapped buffers: their maps must be done.
        Status st = d.cl->waitMapped(d.mapped);
        if (!st.isOk() && first.isOk()) first = st;
      }
    if (stream == nullptr && several) {
      // Several communicators in one blocking group: run them concurrently
      // on their progress threads, then wait for all.
      waits.push_back(std::make_unique<exec::Stream>());
      stream = waits.back().get();
    }
    Status st = ref->submit(std::move(batch), stream);
    if (stream != nullptr) used.push_back(stream);
    if (!st.isOk()) {
      report(st, c);
      if (first.isOk()) first = st;
    }
  }
  for (auto& w : waits) {
    Status st = w->synchronize();
    if (!st.isOk() && first.isOk()) first = st;
  }
  // Device buffers are unmapped below: their host operations must be done.
  if (!device_ops.empty())
    for (exec::Stream* u : used) {
      Status st = u->synchronize();
      if (!st.isOk() && first.isOk()) first = st;
    }
  for (PendingDevice& d : device_ops) {
    if (d.cl == nullptr) continue;  // posted with its batch
    Status st = d.cl->unmapCall(d.mapped);
    if (!st.isOk() && first.isOk()) first = st;
  }
  return report(first);
}

// ---- primitives ------------------------------------------------------------------

CHORUS_EXPORT chorusResult_t chorusPrimitive(const char* name, const chorusPrimitiveArgs_t* args, chorusComm_t comm,
                                             chorusStream_t stream) {
  const char* fn = "chorusPrimitive";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(name ? Status() : invalidArgument("{}: name is NULL", fn));
  CHORUS_CHECK(args ? Status() : invalidArgument("{}: args is NULL (start from CHORUS_PRIMITIVE_ARGS_INITIALIZER)", fn));
  if (args->size != sizeof(chorusPrimitiveArgs_t))
    return report(invalidArgument("{}: args->size={} but this library's chorusPrimitiveArgs_t has {} bytes (start from "
                                  "CHORUS_PRIMITIVE_ARGS_INITIALIZER)", fn, args->size, sizeof(chorusPrimitiveArgs_t)), c);
  if (t_group_depth > 0)
    return report(invalidUsage("{}: primitives cannot be part of a group (call it outside chorusGroupStart/End)", fn), c);
  CHORUS_CHECK(refuseDevice(fn, stream));
  drainDevice(c);
  for (const auto& [arg, p] : {std::pair<const char*, const void*>{"args->sendbuff", args->sendbuff},
                               std::pair<const char*, const void*>{"args->recvbuff", args->recvbuff}})
    if (p != nullptr && device::anyRegistered() && device::find(p))
      return report(invalidUsage("{}: {}={} is {}: primitives run on host memory only (docs/device.md)", fn, arg, p,
                                 device::describe(p)),
                    c);
  if ((args->counts == nullptr) != (args->ncounts == 0))
    return report(invalidArgument("{}: counts and ncounts must be both set or both empty", fn), c);
  if ((args->outCounts == nullptr) != (args->nOutCounts == 0))
    return report(invalidArgument("{}: outCounts and nOutCounts must be both set or both empty", fn), c);
  if ((args->aux == nullptr) != (args->auxBytes == 0))
    return report(invalidArgument("{}: aux and auxBytes must be both set or both empty", fn), c);
  if (stream != nullptr) CHORUS_CHECK(stream->s.synchronize());
  prim::Args a;
  a.send = args->sendbuff;
  a.recv = args->recvbuff;
  a.count = args->count;
  a.dtype = args->datatype;
  a.op = args->op;
  a.root = args->root;
  a.counts = {args->counts, args->ncounts};
  a.out_counts = {args->outCounts, args->nOutCounts};
  a.aux = args->aux;
  a.aux_bytes = args->auxBytes;
  return report(prim::runPrimitive(*ref.operator->(), name, a).withContext(fmt::format("{}: ", fn)), c);
}

CHORUS_EXPORT chorusResult_t chorusPrimitiveList(char* list, size_t len, size_t* needed) {
  std::string text;
  for (const std::string& n : prim::registry().names())
    text += fmt::format("{}: {}\n", n, prim::registry().find(n)->summary());
  if (needed != nullptr) *needed = text.size() + 1;
  if (list != nullptr && len > 0) {
    const size_t k = std::min(len - 1, text.size());
    std::memcpy(list, text.data(), k);
    list[k] = '\0';
  }
  return chorusSuccess;
}

// ---- expert parallelism (MoE dispatch and combine) ----------------------------------

struct chorusEpHandle {
  std::unique_ptr<chorus::prim::ep::State> state;
  chorusComm* comm = nullptr;
};

namespace chorus::api {
namespace {
std::mutex g_ep_mu;
std::unordered_set<chorusEpHandle*>& liveEp() {
  static std::unordered_set<chorusEpHandle*> s;
  return s;
}
Status checkEp(const char* fn, chorusEpHandle* ep, chorusComm* c) {
  if (ep == nullptr) return invalidArgument("{}: ep is NULL (create it with chorusEpCreate)", fn);
  {
    std::lock_guard l(g_ep_mu);
    if (!liveEp().count(ep)) return invalidUsage("{}: ep {} is not a live handle (was it destroyed?)", fn, static_cast<void*>(ep));
  }
  if (ep->comm != c) return invalidArgument("{}: ep was created on another communicator than comm", fn);
  if (t_group_depth > 0) return invalidUsage("{}: expert-parallel calls cannot be part of a group", fn);
  return {};
}
// Runs the ep_* primitive `name` with the call block.
chorusResult_t runEp(CommRef& ref, chorusStream_t stream, const char* fn, const char* name, prim::ep::Call& call) {
  chorusComm* c = ref.handle();
  CHORUS_CHECK(refuseDevice(fn, stream));
  drainDevice(c);
  if (stream != nullptr) CHORUS_CHECK(stream->s.synchronize());
  prim::Args a;
  a.aux = &call;
  a.aux_bytes = sizeof call;
  return report(prim::runPrimitive(*ref.operator->(), name, a).withContext(fmt::format("{}: ", fn)), c);
}
}  // namespace
}  // namespace chorus::api

CHORUS_EXPORT chorusResult_t chorusEpCreate(chorusEpHandle_t* ep, const chorusEpConfig_t* config, chorusComm_t comm) {
  const char* fn = "chorusEpCreate";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(ep ? Status() : invalidArgument("{}: ep is NULL", fn));
  *ep = nullptr;
  CHORUS_CHECK(config ? Status() : invalidArgument("{}: config is NULL (start from CHORUS_EP_CONFIG_INITIALIZER)", fn));
  if (config->size != sizeof(chorusEpConfig_t))
    return report(invalidArgument("{}: config->size={} but this library's chorusEpConfig_t has {} bytes (start from "
                                  "CHORUS_EP_CONFIG_INITIALIZER)", fn, config->size, sizeof(chorusEpConfig_t)), c);
  if (t_group_depth > 0) return report(invalidUsage("{}: not allowed inside a group", fn), c);
  prim::ep::Config cfg;
  cfg.experts = config->numExperts;
  cfg.topk = config->topk;
  cfg.hidden = config->hidden;
  cfg.dtype = static_cast<chorusDataType_t>(rawEnum(config->datatype));
  cfg.index_type = static_cast<chorusDataType_t>(rawEnum(config->indexType));
  cfg.max_hosts = config->maxHostsPerToken;
  cfg.compress = config->dispatchCompress;
  cfg.fp8_block = config->fp8Block;
  cfg.ll_max_tokens = config->lowLatencyMaxTokens;
  auto st = prim::ep::create(*ref.operator->(), cfg, ref->hostOf());
  if (!st.isOk()) return report(st.status().withContext(fmt::format("{}: ", fn)), c);
  auto* h = new chorusEpHandle{std::move(st.value()), c};
  {
    std::lock_guard l(g_ep_mu);
    liveEp().insert(h);
  }
  *ep = h;
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusEpDestroy(chorusEpHandle_t ep) {
  if (ep == nullptr) return report(invalidArgument("chorusEpDestroy: ep is NULL"));
  {
    std::lock_guard l(g_ep_mu);
    if (liveEp().erase(ep) == 0)
      return report(invalidUsage("chorusEpDestroy: ep {} is not a live handle (destroyed twice?)", static_cast<void*>(ep)));
  }
  delete ep;
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusEpGetInfo(chorusEpHandle_t ep, int* numHosts, int* numLocalExperts) {
  if (ep == nullptr) return report(invalidArgument("chorusEpGetInfo: ep is NULL"));
  {
    std::lock_guard l(g_ep_mu);
    if (!liveEp().count(ep)) return report(invalidUsage("chorusEpGetInfo: ep is not a live handle"));
  }
  if (numHosts != nullptr) *numHosts = ep->state->nhosts;
  if (numLocalExperts != nullptr) *numLocalExperts = ep->state->localExperts();
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusEpLayout(chorusEpHandle_t ep, const void* topkIdx, size_t numTokens,
                                            size_t* tokensPerRank, size_t* tokensPerHost, size_t* tokensPerExpert,
                                            size_t* recvPerExpert, size_t* numRecv, chorusComm_t comm,
                                            chorusStream_t stream) {
  const char* fn = "chorusEpLayout";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkEp(fn, ep, c));
  prim::ep::Call call;
  call.state = ep->state.get();
  call.topk_idx = topkIdx, call.tokens = numTokens;
  call.tokens_per_rank = tokensPerRank, call.tokens_per_host = tokensPerHost, call.tokens_per_expert = tokensPerExpert;
  call.recv_per_expert = recvPerExpert, call.num_recv = numRecv;
  return runEp(ref, stream, fn, "ep_layout", call);
}

CHORUS_EXPORT chorusResult_t chorusEpSendOrder(chorusEpHandle_t ep, size_t* order, size_t len, size_t* needed) {
  const char* fn = "chorusEpSendOrder";
  if (ep == nullptr) return report(invalidArgument("{}: ep is NULL", fn));
  {
    std::lock_guard l(g_ep_mu);
    if (!liveEp().count(ep)) return report(invalidUsage("{}: ep is not a live handle", fn));
  }
  const auto& s = *ep->state;
  if (!s.laid_out) return report(invalidUsage("{}: no layout (call chorusEpLayout first)", fn));
  if (needed != nullptr) *needed = s.send_order.size();
  if (order != nullptr) {
    if (len < s.send_order.size())
      return report(invalidArgument("{}: len={} but the send order has {} entries", fn, len, s.send_order.size()));
    std::copy(s.send_order.begin(), s.send_order.end(), order);
  }
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusEpDispatch(chorusEpHandle_t ep, const void* x, const float* topkWeights, void* recvX,
                                              float* recvWeights, size_t recvCapacity, chorusComm_t comm,
                                              chorusStream_t stream) {
  const char* fn = "chorusEpDispatch";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkEp(fn, ep, c));
  prim::ep::Call call;
  call.state = ep->state.get();
  call.x = x, call.topk_weights = topkWeights, call.recv_x = recvX, call.recv_weights = recvWeights;
  call.recv_capacity = recvCapacity;
  return runEp(ref, stream, fn, "ep_dispatch", call);
}

CHORUS_EXPORT chorusResult_t chorusEpDispatchFp8(chorusEpHandle_t ep, const void* x, const float* topkWeights,
                                                 uint8_t* recvCodes, float* recvScales, size_t scalesCapacity,
                                                 float* recvWeights, size_t recvCapacity, chorusComm_t comm,
                                                 chorusStream_t stream) {
  const char* fn = "chorusEpDispatchFp8";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkEp(fn, ep, c));
  prim::ep::Call call;
  call.state = ep->state.get();
  call.x = x, call.topk_weights = topkWeights, call.recv_x = recvCodes, call.recv_weights = recvWeights;
  call.recv_capacity = recvCapacity;
  call.fp8_out = true, call.recv_scales = recvScales, call.scales_capacity = scalesCapacity;
  return runEp(ref, stream, fn, "ep_dispatch", call);
}

CHORUS_EXPORT chorusResult_t chorusEpCombine(chorusEpHandle_t ep, const void* expertOut, const float* weights, void* out,
                                             chorusComm_t comm, chorusStream_t stream) {
  const char* fn = "chorusEpCombine";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkEp(fn, ep, c));
  prim::ep::Call call;
  call.state = ep->state.get();
  call.expert_out = expertOut, call.weights = weights, call.out = out;
  return runEp(ref, stream, fn, "ep_combine", call);
}

CHORUS_EXPORT chorusResult_t chorusEpReturnTopk(chorusEpHandle_t ep, const float* rowValues, float* topkValues,
                                                chorusComm_t comm, chorusStream_t stream) {
  const char* fn = "chorusEpReturnTopk";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkEp(fn, ep, c));
  prim::ep::Call call;
  call.state = ep->state.get();
  call.row_values = rowValues, call.topk_values = topkValues;
  return runEp(ref, stream, fn, "ep_return_topk", call);
}

CHORUS_EXPORT chorusResult_t chorusEpLowLatencyDispatch(chorusEpHandle_t ep, const void* topkIdx, size_t numTokens,
                                                        const void* x, const float* topkWeights, void* recvX,
                                                        float* recvWeights, size_t* recvCount, chorusComm_t comm,
                                                        chorusStream_t stream) {
  const char* fn = "chorusEpLowLatencyDispatch";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkEp(fn, ep, c));
  prim::ep::Call call;
  call.state = ep->state.get();
  call.topk_idx = topkIdx, call.tokens = numTokens, call.x = x, call.topk_weights = topkWeights;
  call.recv_x = recvX, call.recv_weights = recvWeights, call.recv_count = recvCount;
  return runEp(ref, stream, fn, "ep_ll_dispatch", call);
}

CHORUS_EXPORT chorusResult_t chorusEpLowLatencyCombine(chorusEpHandle_t ep, const void* expertOut, const float* weights,
                                                       void* out, chorusComm_t comm, chorusStream_t stream) {
  const char* fn = "chorusEpLowLatencyCombine";
  CHORUS_COMM_PROLOGUE(fn);
  CHORUS_CHECK(checkEp(fn, ep, c));
  prim::ep::Call call;
  call.state = ep->state.get();
  call.expert_out = expertOut, call.weights = weights, call.out = out;
  return runEp(ref, stream, fn, "ep_ll_combine", call);
}

// ---- streams ---------------------------------------------------------------------

CHORUS_EXPORT chorusResult_t chorusStreamCreate(chorusStream_t* stream) {
  if (stream == nullptr) return report(invalidArgument("chorusStreamCreate: stream is NULL"));
  *stream = new chorusStream();
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusStreamSynchronize(chorusStream_t stream) {
  if (stream == nullptr) return chorusSuccess;  // the NULL stream is always synchronous
  if (stream->cl) return report(stream->cl->synchronize());
  return report(stream->s.synchronize());
}

CHORUS_EXPORT chorusResult_t chorusStreamQuery(chorusStream_t stream) {
  if (stream == nullptr) return chorusSuccess;
  Status st = stream->cl ? stream->cl->query() : stream->s.query();
  if (st.code() == chorusInProgress) return chorusInProgress;
  return report(st);
}

CHORUS_EXPORT chorusResult_t chorusStreamDestroy(chorusStream_t stream) {
  if (stream == nullptr) return report(invalidArgument("chorusStreamDestroy: stream is NULL"));
  Status st = stream->s.synchronize();  // queued work refers to it
  delete stream;
  return report(st);
}

// ---- memory spaces (docs/device.md) ------------------------------------------

namespace {
Status checkSpace(const char* fn, const chorusMemSpace_t& space) {
  const int v = rawEnum(space);
  if (v < 0 || v >= chorusNumMemSpaces)
    return invalidArgument("{}: space={} is not a chorusMemSpace_t (0..{})", fn, v, chorusNumMemSpaces - 1);
  return {};
}
}  // namespace

CHORUS_EXPORT chorusResult_t chorusMemSpaceQuery(chorusMemSpace_t space, int* available, char* why, size_t len) {
  const char* fn = "chorusMemSpaceQuery";
  if (Status st = checkSpace(fn, space); !st.isOk()) return report(st);
  if (available == nullptr) return report(invalidArgument("{}: available is NULL", fn));
  configureCudaDriver();
  const Status st = device::spaceAvailable(static_cast<device::Space>(rawEnum(space)));
  *available = st.isOk() ? 1 : 0;
  if (why != nullptr && len > 0) {
    const std::string msg = st.isOk() ? std::string() : st.message();
    const size_t n = std::min(msg.size(), len - 1);
    std::memcpy(why, msg.data(), n);
    why[n] = '\0';
  }
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusMemRegisterOpenCL(void* clMem, void** devPtr) {
  if (devPtr == nullptr) return report(invalidArgument("chorusMemRegisterOpenCL: devPtr is NULL"));
  auto r = device::registerOpenCL(clMem);
  if (!r.isOk()) return report(r.status());
  *devPtr = r.value();
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusMemDeregister(void* devPtr) { return report(device::deregister(devPtr)); }

CHORUS_EXPORT chorusResult_t chorusStreamCreateOpenCL(chorusStream_t* stream, void* clQueue) {
  if (stream == nullptr) return report(invalidArgument("chorusStreamCreateOpenCL: stream is NULL"));
  auto staging = deviceStagingFromEnv();
  if (!staging.isOk()) return report(staging.status().withContext("chorusStreamCreateOpenCL: "));
  auto cl = device::makeClStream(clQueue, *staging);
  if (!cl.isOk()) return report(cl.status());
  auto* s = new chorusStream();
  s->cl = std::move(cl).value();
  *stream = s;
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusStreamCreateCuda(chorusStream_t* stream, void* cuStream) {
  if (stream == nullptr) return report(invalidArgument("chorusStreamCreateCuda: stream is NULL"));
  configureCudaDriver();
  auto staging = deviceStagingFromEnv();
  if (!staging.isOk()) return report(staging.status().withContext("chorusStreamCreateCuda: "));
  auto dev = device::makeCudaStream(cuStream, *staging);
  if (!dev.isOk()) return report(dev.status());
  auto* s = new chorusStream();
  s->cl = std::move(dev).value();
  *stream = s;
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusStreamGetMemSpace(chorusStream_t stream, chorusMemSpace_t* space) {
  if (space == nullptr) return report(invalidArgument("chorusStreamGetMemSpace: space is NULL"));
  *space = stream == nullptr || !stream->cl                         ? chorusMemHost
           : stream->cl->space() == device::Space::Cuda ? chorusMemCuda
                                                          : chorusMemOpenCL;
  return chorusSuccess;
}

CHORUS_EXPORT chorusResult_t chorusStreamGetEventOpenCL(chorusStream_t stream, void** clEvent) {
  const char* fn = "chorusStreamGetEventOpenCL";
  if (clEvent == nullptr) return report(invalidArgument("{}: clEvent is NULL", fn));
  if (stream == nullptr || !stream->cl || stream->cl->space() != device::Space::OpenCL)
    return report(invalidArgument("{}: stream is not an OpenCL stream (chorusStreamCreateOpenCL)", fn));
  *clEvent = stream->cl->lastEvent();
  return chorusSuccess;
}

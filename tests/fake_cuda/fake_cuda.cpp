// A test double of the CUDA driver API (a stand-in for libcuda.so.1) for
// machines without a GPU.  chorus loads the driver at run time (dlopen, then
// dlsym by name); pointed at this library instead, its CUDA data path runs
// end to end on host memory and host threads.
//
// What it implements is the documented behaviour of the entry points below,
// nothing more: contexts current per thread, streams that run their work
// asynchronously and strictly in order (one host thread per stream), events
// that capture a stream's work so far, waits on a 32-bit word in memory, and
// copies bounds-checked against their allocation.  Device pointers are
// address ranges reserved with PROT_NONE, so a caller that dereferences one
// on the host faults at once; the bytes live in a separate shadow buffer.
//
// It proves chorus's use of the driver API (stream order, staging, the
// gates, the error paths), not a GPU: bench/device_check.sh exercises the
// real driver on a GPU machine.  The types are declared here (no CUDA header
// is needed); the error codes and flag values are the driver's.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

typedef int CUresult;
typedef int CUdevice;
// The handles' struct tags are cuda.h's (global), so that a caller that
// declares them as the driver's header does calls these functions through
// pointers of the very same types.
typedef struct CUctx_st* CUcontext;
typedef struct CUstream_st* CUstream;
typedef struct CUevent_st* CUevent;
typedef unsigned long long CUdeviceptr;

#define FAKE_CUDA_API extern "C" __attribute__((visibility("default")))

namespace {

enum : CUresult {
  kSuccess = 0, kInvalidValue = 1, kOutOfMemory = 2, kNotInitialized = 3, kNoDevice = 100, kInvalidDevice = 101,
  kInvalidContext = 201, kInvalidHandle = 400, kNotFound = 500, kNotReady = 600, kNotSupported = 801,
};
constexpr std::pair<CUresult, const char*> kErrorNames[] = {
    {kSuccess, "CUDA_SUCCESS"}, {kInvalidValue, "CUDA_ERROR_INVALID_VALUE"},
    {kOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY"}, {kNotInitialized, "CUDA_ERROR_NOT_INITIALIZED"},
    {kNoDevice, "CUDA_ERROR_NO_DEVICE"}, {kInvalidDevice, "CUDA_ERROR_INVALID_DEVICE"},
    {kInvalidContext, "CUDA_ERROR_INVALID_CONTEXT"}, {kInvalidHandle, "CUDA_ERROR_INVALID_HANDLE"},
    {kNotFound, "CUDA_ERROR_NOT_FOUND"}, {kNotReady, "CUDA_ERROR_NOT_READY"},
    {kNotSupported, "CUDA_ERROR_NOT_SUPPORTED"},
};

constexpr int kMaxDevices = 4;
constexpr int kDriverVersion = 12040;
constexpr const char* kDeviceName = "chorus fake CUDA device (host memory)";
constexpr unsigned char kFreshDeviceByte = 0xCB;  // cuMemAlloc does not zero: a recognisable fill instead

// cuStreamWaitValue32's conditions and flag.
constexpr unsigned kWaitGeq = 0, kWaitEq = 1, kWaitAnd = 2, kWaitNor = 3;
constexpr unsigned kWaitFlush = 1u << 30;

// cuPointerGetAttribute's attributes and memory types.
constexpr int kAttrContext = 1, kAttrMemoryType = 2, kAttrDevicePointer = 3, kAttrHostPointer = 4;
constexpr unsigned kMemoryTypeHost = 1, kMemoryTypeDevice = 2;

std::atomic<long long> g_ops_run{0};

}  // namespace

// A stream: its operations in FIFO order, run one after another by a thread
// of its own.  Operations are counted: `enqueued` pushed, `done` finished
// (always the first `done` of them), so "the work so far" is a number.
struct CUstream_st {
  CUctx_st* ctx;
  std::mutex mu;
  std::condition_variable cv;  // queue changes (for the worker), progress (for waiters)
  std::deque<std::function<void()>> queue;
  uint64_t enqueued = 0;
  uint64_t done = 0;
  bool stopping = false;
  std::thread worker;

  explicit CUstream_st(CUctx_st* c) : ctx(c) { worker = std::thread([this] { run(); }); }
  ~CUstream_st() { stop(); }

  // False once the stream is being destroyed (nothing more runs).
  bool push(std::function<void()> op) {
    std::lock_guard l(mu);
    if (stopping) return false;
    queue.push_back(std::move(op));
    ++enqueued;
    cv.notify_all();
    return true;
  }
  uint64_t mark() {
    std::lock_guard l(mu);
    return enqueued;
  }
  bool reached(uint64_t seq) {
    std::lock_guard l(mu);
    return done >= seq;
  }
  void waitFor(uint64_t seq) {
    std::unique_lock l(mu);
    cv.wait(l, [&] { return done >= seq; });
  }
  // Drains the queue, then joins the worker.  (Never from a host function
  // of the stream: as in CUDA, those must not call the API.)
  void stop() {
    {
      std::lock_guard l(mu);
      stopping = true;
      cv.notify_all();
    }
    if (worker.joinable()) worker.join();
  }

 private:
  void run() {
    std::unique_lock l(mu);
    for (;;) {
      cv.wait(l, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;
      std::function<void()> op = std::move(queue.front());
      queue.pop_front();
      l.unlock();
      op();
      op = nullptr;  // what it captured goes before the stream moves on
      g_ops_run.fetch_add(1, std::memory_order_relaxed);
      l.lock();
      ++done;
      cv.notify_all();
    }
  }
};

// A context: its device and its NULL stream (made on first use).  Context
// objects are never freed, so a stale handle is detected, not dereferenced
// after free; a destroyed (or, for a primary one, fully released) context
// is no longer `alive`.
struct CUctx_st {
  CUdevice dev;
  bool primary;
  std::atomic<bool> alive{true};
  std::mutex mu;  // alive's changes, null_stream
  std::shared_ptr<CUstream_st> null_stream;

  CUctx_st(CUdevice d, bool p) : dev(d), primary(p) {}
  std::shared_ptr<CUstream_st> nullStream() {
    std::lock_guard l(mu);
    if (!alive) return nullptr;
    if (!null_stream) null_stream = std::make_shared<CUstream_st>(this);
    return null_stream;
  }
  // Destroyed or released: its NULL stream drains and goes.
  void retire() {
    std::shared_ptr<CUstream_st> s;
    {
      std::lock_guard l(mu);
      alive = false;
      s.swap(null_stream);
    }
    if (s) s->stop();
  }
};

// An event: the stream and position of its latest record.  The stream holds
// nothing of the event, so destroying an event with a record pending is
// harmless.
struct CUevent_st {
  struct Record {
    std::shared_ptr<CUstream_st> stream;  // null: never recorded
    uint64_t seq = 0;
  };
  CUctx_st* ctx;
  std::mutex mu;
  Record rec;

  explicit CUevent_st(CUctx_st* c) : ctx(c) {}
  Record latest() {
    std::lock_guard l(mu);
    return rec;
  }
};

namespace {

// An allocation: device memory (cuMemAlloc: a PROT_NONE reservation at
// `base`, its bytes in `bytes`, the shadow) or pinned host memory
// (cuMemHostAlloc: `bytes` is the memory, at `base`).  Held by shared_ptr,
// so work already enqueued on it finishes on live memory after a free.
struct Alloc {
  bool device = false;
  uintptr_t base = 0;
  size_t size = 0;
  size_t reserved = 0;  // device: the reservation's length
  CUctx_st* ctx = nullptr;
  std::byte* bytes = nullptr;
  // Device memory: every access to the shadow holds it, so copies on other
  // streams and a wait polling the same word are ordered (no data race).
  std::mutex mu;

  ~Alloc() { std::free(bytes); }
};

// The process's state, leaked on purpose: no destructor joins threads at exit.
struct Global {
  std::mutex mu;
  std::atomic<bool> initialized{false};
  std::atomic<int> devices{0};
  std::set<CUctx_st*> contexts;  // every context ever made
  std::mutex primary_mu;    // retain and release, each whole
  CUctx_st* primary[kMaxDevices] = {};
  int primary_refs[kMaxDevices] = {};
  std::map<CUstream_st*, std::shared_ptr<CUstream_st>> streams;
  std::map<CUevent_st*, std::shared_ptr<CUevent_st>> events;
  std::map<uintptr_t, std::shared_ptr<Alloc>> allocs;  // by base
};
Global& G() {
  static Global* g = new Global;
  return *g;
}

thread_local CUctx_st* t_current = nullptr;

bool initialized() { return G().initialized.load(std::memory_order_acquire); }
// An entry point's first check: NOT_INITIALIZED before cuInit, then
// INVALID_VALUE unless the arguments are valid.
CUresult entry(bool args_valid = true) {
  return !initialized() ? kNotInitialized : args_valid ? kSuccess : kInvalidValue;
}
bool validDevice(CUdevice d) { return d >= 0 && d < G().devices.load(); }

CUctx_st* newContext(CUdevice dev, bool primary) {
  auto* c = new CUctx_st(dev, primary);
  std::lock_guard l(G().mu);
  G().contexts.insert(c);
  return c;
}
bool known(CUctx_st* c) {
  std::lock_guard l(G().mu);
  return G().contexts.count(c) == 1;
}

// The calling thread's context, when it is current and alive.
CUctx_st* current() {
  CUctx_st* c = t_current;
  return c != nullptr && c->alive ? c : nullptr;
}

// NULL (and the legacy and per-thread handles, 1 and 2) is the current
// context's NULL stream; anything else must be a live stream.
bool isNullStream(CUstream h) { return reinterpret_cast<uintptr_t>(h) <= 2; }
template <typename T>
CUresult lookup(const std::map<T*, std::shared_ptr<T>>& live, T* h, std::shared_ptr<T>& out) {
  if (CUresult r = entry()) return r;
  std::lock_guard l(G().mu);
  auto it = live.find(h);
  if (it == live.end()) return kInvalidHandle;
  out = it->second;
  return kSuccess;
}
CUresult streamOf(CUstream h, std::shared_ptr<CUstream_st>& out) {
  if (!initialized() || !isNullStream(h)) return lookup(G().streams, h, out);
  CUctx_st* c = current();
  if (c != nullptr) out = c->nullStream();
  return out ? kSuccess : kInvalidContext;
}
CUresult eventOf(CUevent h, std::shared_ptr<CUevent_st>& out) { return lookup(G().events, h, out); }
CUresult enqueue(CUstream h, std::function<void()> op) {
  std::shared_ptr<CUstream_st> s;
  if (CUresult r = streamOf(h, s); r != kSuccess) return r;
  return s->push(std::move(op)) ? kSuccess : kInvalidHandle;
}

// The allocation containing p, or null.
std::shared_ptr<Alloc> find(uintptr_t p) {
  std::lock_guard l(G().mu);
  auto it = G().allocs.upper_bound(p);
  if (it == G().allocs.begin()) return nullptr;
  --it;
  return p - it->first < it->second->size ? it->second : nullptr;
}

CUresult track(const std::shared_ptr<Alloc>& a) {
  std::lock_guard l(G().mu);
  G().allocs.emplace(a->base, a);
  return kSuccess;
}
// The allocation of that kind starting at base, out of the map (null if none).
std::shared_ptr<Alloc> untrack(uintptr_t base, bool device) {
  std::lock_guard l(G().mu);
  auto it = G().allocs.find(base);
  if (base == 0 || it == G().allocs.end() || it->second->device != device) return nullptr;
  std::shared_ptr<Alloc> a = std::move(it->second);
  G().allocs.erase(it);
  return a;
}

// One side of a copy or set, translated: where its bytes are, and the
// allocation (kept alive by the enqueued operation) when it is one.
struct Loc {
  std::shared_ptr<Alloc> alloc;
  std::byte* p = nullptr;
  std::mutex* guard() const { return alloc && alloc->device ? &alloc->mu : nullptr; }
};

// A device address (device memory, or pinned host memory through UVA):
// [p, p + n) must lie inside one allocation.  A host address: any memory
// but device memory (the host cannot reach it), and within its allocation
// where it is pinned memory.
CUresult translate(bool device, uintptr_t p, size_t n, Loc& out) {
  if (p == 0) return kInvalidValue;
  std::shared_ptr<Alloc> a = find(p);
  out.p = reinterpret_cast<std::byte*>(p);
  if (!a) return device ? kInvalidValue : kSuccess;
  if (!device && a->device) return kInvalidValue;
  const size_t off = p - a->base;
  if (n > a->size - off) return kInvalidValue;
  out.p = a->bytes + off;
  out.alloc = std::move(a);
  return kSuccess;
}

// Runs f on the bytes of the locations, holding their shadows' locks (two
// in address order).
template <typename F>
void withLocks(const Loc& x, const Loc* y, F f) {
  std::mutex* a = x.guard();
  std::mutex* b = y != nullptr && y->guard() != a ? y->guard() : nullptr;
  if (a != nullptr && b != nullptr && std::less<>()(b, a)) std::swap(a, b);
  std::unique_lock<std::mutex> la, lb;
  if (a != nullptr) la = std::unique_lock(*a);
  if (b != nullptr) lb = std::unique_lock(*b);
  f();
}

uint32_t loadWord(const Loc& w) {
  if (w.guard() == nullptr) return __atomic_load_n(reinterpret_cast<const uint32_t*>(w.p), __ATOMIC_ACQUIRE);
  uint32_t v = 0;
  withLocks(w, nullptr, [&] { std::memcpy(&v, w.p, sizeof v); });
  return v;
}

bool satisfied(uint32_t word, uint32_t value, unsigned cond) {
  switch (cond) {
    case kWaitGeq: return static_cast<int32_t>(word - value) >= 0;
    case kWaitEq: return word == value;
    case kWaitAnd: return (word & value) != 0;
    default: return ~(word | value) != 0;  // kWaitNor
  }
}

bool envSet(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

// A copy or a set, checked now; on a stream (async) run in its order, else
// at once on the calling thread (the synchronous calls).
CUresult submit(bool async, CUstream s, size_t n, std::function<void()> op) {
  if (async && n == 0) {
    std::shared_ptr<CUstream_st> st;
    return streamOf(s, st);
  }
  if (async) return enqueue(s, std::move(op));
  if (n > 0) op();
  return kSuccess;
}
CUresult copy(bool async, CUstream s, bool dst_dev, uintptr_t dst, bool src_dev, uintptr_t src, size_t n) {
  if (CUresult r = entry()) return r;
  Loc d, f;
  CUresult r = translate(dst_dev, dst, n, d);
  if (r == kSuccess) r = translate(src_dev, src, n, f);
  if (r != kSuccess) return r;
  return submit(async, s, n, [d = std::move(d), f = std::move(f), n] {
    withLocks(d, &f, [&] { std::memmove(d.p, f.p, n); });
  });
}
CUresult set(bool async, CUstream s, CUdeviceptr dst, unsigned char v, size_t n) {
  if (CUresult r = entry()) return r;
  Loc d;
  if (CUresult r = translate(true, dst, n, d); r != kSuccess) return r;
  return submit(async, s, n, [d = std::move(d), v, n] { withLocks(d, nullptr, [&] { std::memset(d.p, v, n); }); });
}
uintptr_t asInt(const void* p) { return reinterpret_cast<uintptr_t>(p); }

}  // namespace

// ---- Initialization, devices, errors ----------------------------------------

FAKE_CUDA_API CUresult cuInit(unsigned int flags) {
  if (flags != 0) return kInvalidValue;
  int devices = 1;
  if (const char* v = std::getenv("FAKE_CUDA_DEVICES"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 0 || n > kMaxDevices) return kInvalidValue;
    devices = static_cast<int>(n);
  }
  if (devices == 0) return kNoDevice;
  std::lock_guard l(G().mu);
  if (!G().initialized.load()) {
    G().devices.store(devices);
    G().initialized.store(true, std::memory_order_release);
  }
  return kSuccess;
}

FAKE_CUDA_API CUresult cuDriverGetVersion(int* version) {
  if (version == nullptr) return kInvalidValue;
  *version = kDriverVersion;
  return kSuccess;
}

FAKE_CUDA_API CUresult cuDeviceGetCount(int* count) {
  if (CUresult r = entry(count != nullptr)) return r;
  *count = G().devices.load();
  return kSuccess;
}

FAKE_CUDA_API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (CUresult r = entry(device != nullptr)) return r;
  if (!validDevice(ordinal)) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

FAKE_CUDA_API CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (CUresult r = entry(name != nullptr && len > 0)) return r;
  if (!validDevice(dev)) return kInvalidDevice;
  const size_t n = std::min(std::strlen(kDeviceName), static_cast<size_t>(len) - 1);
  std::memcpy(name, kDeviceName, n);
  name[n] = '\0';
  return kSuccess;
}

FAKE_CUDA_API CUresult cuGetErrorName(CUresult error, const char** name) {
  if (name == nullptr) return kInvalidValue;
  for (const auto& [code, text] : kErrorNames) {
    if (code != error) continue;
    *name = text;
    return kSuccess;
  }
  return kInvalidValue;
}

// ---- Contexts ---------------------------------------------------------------

FAKE_CUDA_API CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  if (CUresult r = entry(pctx != nullptr)) return r;
  if (!validDevice(dev)) return kInvalidDevice;
  std::lock_guard l(G().primary_mu);
  CUctx_st*& p = G().primary[dev];
  if (p == nullptr) p = newContext(dev, /*primary=*/true);
  p->alive = true;
  ++G().primary_refs[dev];
  *pctx = p;
  return kSuccess;
}

// The last release resets the primary context: its NULL stream drains, and
// it is no longer usable until retained again.
FAKE_CUDA_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  if (CUresult r = entry()) return r;
  if (!validDevice(dev)) return kInvalidDevice;
  std::lock_guard l(G().primary_mu);
  if (G().primary_refs[dev] == 0) return kInvalidContext;
  if (--G().primary_refs[dev] == 0) G().primary[dev]->retire();
  return kSuccess;
}

FAKE_CUDA_API CUresult cuCtxCreate(CUcontext* pctx, unsigned int /*flags*/, CUdevice dev) {
  if (CUresult r = entry(pctx != nullptr)) return r;
  if (!validDevice(dev)) return kInvalidDevice;
  *pctx = t_current = newContext(dev, /*primary=*/false);
  return kSuccess;
}

FAKE_CUDA_API CUresult cuCtxDestroy(CUcontext ctx) {
  if (CUresult r = entry()) return r;
  if (!known(ctx) || ctx->primary || !ctx->alive) return kInvalidContext;
  ctx->retire();
  if (t_current == ctx) t_current = nullptr;
  return kSuccess;
}

FAKE_CUDA_API CUresult cuCtxSetCurrent(CUcontext ctx) {
  if (CUresult r = entry()) return r;
  // A released primary context may be set current (as with the real
  // driver); calls that need a context then fail until it is retained.
  if (ctx != nullptr && (!known(ctx) || (!ctx->primary && !ctx->alive))) return kInvalidContext;
  t_current = ctx;
  return kSuccess;
}

FAKE_CUDA_API CUresult cuCtxGetCurrent(CUcontext* pctx) {
  if (CUresult r = entry(pctx != nullptr)) return r;
  *pctx = t_current;
  return kSuccess;
}

// ---- Streams ----------------------------------------------------------------

FAKE_CUDA_API CUresult cuStreamCreate(CUstream* ps, unsigned int flags) {
  if (CUresult r = entry(ps != nullptr && (flags & ~1u) == 0)) return r;  // CU_STREAM_NON_BLOCKING = 1
  CUctx_st* c = current();
  if (c == nullptr) return kInvalidContext;
  auto s = std::make_shared<CUstream_st>(c);
  std::lock_guard l(G().mu);
  G().streams.emplace(s.get(), s);
  *ps = s.get();
  return kSuccess;
}

// Drains the stream's work, then joins its thread.
FAKE_CUDA_API CUresult cuStreamDestroy(CUstream h) {
  if (CUresult r = entry()) return r;
  std::shared_ptr<CUstream_st> s;
  {
    std::lock_guard l(G().mu);
    auto it = G().streams.find(h);
    if (it == G().streams.end()) return kInvalidHandle;
    s = std::move(it->second);
    G().streams.erase(it);
  }
  s->stop();
  return kSuccess;
}

FAKE_CUDA_API CUresult cuStreamGetCtx(CUstream h, CUcontext* pctx) {
  if (CUresult r = entry(pctx != nullptr)) return r;
  std::shared_ptr<CUstream_st> s;
  if (CUresult r = streamOf(h, s); r != kSuccess) return r;
  *pctx = s->ctx;
  return kSuccess;
}

FAKE_CUDA_API CUresult cuStreamSynchronize(CUstream h) {
  std::shared_ptr<CUstream_st> s;
  if (CUresult r = streamOf(h, s); r != kSuccess) return r;
  s->waitFor(s->mark());
  return kSuccess;
}

FAKE_CUDA_API CUresult cuStreamQuery(CUstream h) {
  std::shared_ptr<CUstream_st> s;
  if (CUresult r = streamOf(h, s); r != kSuccess) return r;
  return s->reached(s->mark()) ? kSuccess : kNotReady;
}

FAKE_CUDA_API CUresult cuStreamWaitValue32(CUstream h, CUdeviceptr addr, unsigned int value, unsigned int flags) {
  if (CUresult r = entry()) return r;
  if (envSet("FAKE_CUDA_NO_STREAM_MEMOPS")) return kNotSupported;
  const unsigned cond = flags & ~kWaitFlush;
  if (cond > kWaitNor || addr % 4 != 0) return kInvalidValue;
  Loc word;
  if (CUresult r = translate(true, addr, sizeof(uint32_t), word); r != kSuccess) return r;
  return enqueue(h, [word = std::move(word), value, cond] {
    // Poll: a short burst of yields, then sleeps (never a core forever).
    for (unsigned spins = 0; !satisfied(loadWord(word), value, cond); ++spins) {
      if (spins < 256)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(30));
    }
  });
}

FAKE_CUDA_API CUresult cuLaunchHostFunc(CUstream h, void (*fn)(void*), void* user_data) {
  if (CUresult r = entry(fn != nullptr)) return r;
  return enqueue(h, [fn, user_data] { fn(user_data); });
}

// ---- Events -----------------------------------------------------------------

FAKE_CUDA_API CUresult cuEventCreate(CUevent* pe, unsigned int flags) {
  // Flags: BLOCKING_SYNC 1, DISABLE_TIMING 2, INTERPROCESS 4 (no timing is kept either way).
  if (CUresult r = entry(pe != nullptr && (flags & ~7u) == 0)) return r;
  CUctx_st* c = current();
  if (c == nullptr) return kInvalidContext;
  auto e = std::make_shared<CUevent_st>(c);
  std::lock_guard l(G().mu);
  G().events.emplace(e.get(), e);
  *pe = e.get();
  return kSuccess;
}

FAKE_CUDA_API CUresult cuEventDestroy(CUevent h) {
  if (CUresult r = entry()) return r;
  std::lock_guard l(G().mu);
  return G().events.erase(h) == 1 ? kSuccess : kInvalidHandle;
}

// The event and the stream must be of the same context.
FAKE_CUDA_API CUresult cuEventRecord(CUevent he, CUstream hs) {
  std::shared_ptr<CUevent_st> e;
  if (CUresult r = eventOf(he, e); r != kSuccess) return r;
  std::shared_ptr<CUstream_st> s;
  if (CUresult r = streamOf(hs, s); r != kSuccess) return r;
  if (s->ctx != e->ctx) return kInvalidHandle;
  const uint64_t seq = s->mark();
  std::lock_guard l(e->mu);
  e->rec = CUevent_st::Record{std::move(s), seq};
  return kSuccess;
}

FAKE_CUDA_API CUresult cuEventSynchronize(CUevent he) {
  std::shared_ptr<CUevent_st> e;
  if (CUresult r = eventOf(he, e); r != kSuccess) return r;
  if (CUevent_st::Record rec = e->latest(); rec.stream) rec.stream->waitFor(rec.seq);
  return kSuccess;
}

FAKE_CUDA_API CUresult cuEventQuery(CUevent he) {
  std::shared_ptr<CUevent_st> e;
  if (CUresult r = eventOf(he, e); r != kSuccess) return r;
  const CUevent_st::Record rec = e->latest();
  return !rec.stream || rec.stream->reached(rec.seq) ? kSuccess : kNotReady;
}

FAKE_CUDA_API CUresult cuStreamWaitEvent(CUstream hs, CUevent he, unsigned int flags) {
  std::shared_ptr<CUevent_st> e;
  if (CUresult r = eventOf(he, e); r != kSuccess) return r;
  if ((flags & ~1u) != 0) return kInvalidValue;  // CU_EVENT_WAIT_EXTERNAL = 1
  std::shared_ptr<CUstream_st> s;
  if (CUresult r = streamOf(hs, s); r != kSuccess) return r;
  CUevent_st::Record rec = e->latest();
  if (!rec.stream || rec.stream == s) return kSuccess;  // nothing to wait for, or behind it already
  return s->push([rec = std::move(rec)] { rec.stream->waitFor(rec.seq); }) ? kSuccess : kInvalidHandle;
}

// ---- Memory -----------------------------------------------------------------

FAKE_CUDA_API CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytes) {
  if (CUresult r = entry(dptr != nullptr && bytes != 0)) return r;
  CUctx_st* c = current();
  if (c == nullptr) return kInvalidContext;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (bytes > SIZE_MAX - page) return kOutOfMemory;
  auto a = std::make_shared<Alloc>();
  a->device = true;
  a->size = bytes;
  a->reserved = (bytes + page - 1) / page * page;
  a->ctx = c;
  a->bytes = static_cast<std::byte*>(std::malloc(bytes));
  if (a->bytes == nullptr) return kOutOfMemory;
  std::memset(a->bytes, kFreshDeviceByte, bytes);
  void* addr = ::mmap(nullptr, a->reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (addr == MAP_FAILED) return kOutOfMemory;
  *dptr = a->base = asInt(addr);
  return track(a);
}

FAKE_CUDA_API CUresult cuMemFree(CUdeviceptr dptr) {
  if (CUresult r = entry()) return r;
  std::shared_ptr<Alloc> a = untrack(static_cast<uintptr_t>(dptr), /*device=*/true);
  if (!a) return kInvalidValue;
  ::munmap(reinterpret_cast<void*>(a->base), a->reserved);  // the shadow lives on while enqueued work holds it
  return kSuccess;
}

FAKE_CUDA_API CUresult cuMemHostAlloc(void** pp, size_t bytes, unsigned int flags) {
  // Flags: PORTABLE 1, DEVICEMAP 2, WRITECOMBINED 4 (all memory is portable and mapped here, as with UVA).
  if (CUresult r = entry(pp != nullptr && bytes != 0 && (flags & ~7u) == 0)) return r;
  CUctx_st* c = current();
  if (c == nullptr) return kInvalidContext;
  if (bytes > SIZE_MAX - 64) return kOutOfMemory;
  const size_t rounded = (bytes + 63) / 64 * 64;
  auto a = std::make_shared<Alloc>();
  a->size = bytes;
  a->ctx = c;
  a->bytes = static_cast<std::byte*>(std::aligned_alloc(64, rounded));
  if (a->bytes == nullptr) return kOutOfMemory;
  std::memset(a->bytes, 0, rounded);
  a->base = asInt(a->bytes);
  *pp = a->bytes;
  return track(a);
}

// The memory itself is freed once no enqueued work holds it.
FAKE_CUDA_API CUresult cuMemFreeHost(void* p) {
  if (CUresult r = entry()) return r;
  return untrack(asInt(p), /*device=*/false) ? kSuccess : kInvalidValue;
}

// UVA: the device pointer of pinned memory is its host address.
FAKE_CUDA_API CUresult cuMemHostGetDevicePointer(CUdeviceptr* pd, void* p, unsigned int flags) {
  if (CUresult r = entry(pd != nullptr && p != nullptr && flags == 0)) return r;
  std::shared_ptr<Alloc> a = find(asInt(p));
  if (!a || a->device) return kInvalidValue;
  *pd = static_cast<CUdeviceptr>(asInt(p));
  return kSuccess;
}

FAKE_CUDA_API CUresult cuMemGetAddressRange(CUdeviceptr* pbase, size_t* psize, CUdeviceptr ptr) {
  if (CUresult r = entry()) return r;
  std::shared_ptr<Alloc> a = find(static_cast<uintptr_t>(ptr));
  if (!a) return kNotFound;
  if (pbase != nullptr) *pbase = a->base;
  if (psize != nullptr) *psize = a->size;
  return kSuccess;
}

FAKE_CUDA_API CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr ptr) {
  if (CUresult r = entry(data != nullptr && attribute >= kAttrContext && attribute <= kAttrHostPointer)) return r;
  std::shared_ptr<Alloc> a = find(static_cast<uintptr_t>(ptr));
  if (!a) return kInvalidValue;  // unregistered host memory, as the real driver answers
  switch (attribute) {
    case kAttrContext: *static_cast<CUcontext*>(data) = a->ctx; break;
    case kAttrMemoryType: *static_cast<unsigned*>(data) = a->device ? kMemoryTypeDevice : kMemoryTypeHost; break;
    case kAttrDevicePointer: *static_cast<CUdeviceptr*>(data) = ptr; break;
    default:  // kAttrHostPointer
      if (a->device) return kInvalidValue;
      *static_cast<void**>(data) = reinterpret_cast<void*>(static_cast<uintptr_t>(ptr));
      break;
  }
  return kSuccess;
}

// ---- Copies and sets --------------------------------------------------------

FAKE_CUDA_API CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  return copy(true, s, false, asInt(dst), true, src, n);
}
FAKE_CUDA_API CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  return copy(true, s, true, dst, false, asInt(src), n);
}
FAKE_CUDA_API CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return copy(true, s, true, dst, true, src, n);
}
FAKE_CUDA_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
  return set(true, s, dst, v, n);
}

// The synchronous ones run on the calling thread, at once.
FAKE_CUDA_API CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
  return copy(false, nullptr, false, asInt(dst), true, src, n);
}
FAKE_CUDA_API CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) {
  return copy(false, nullptr, true, dst, false, asInt(src), n);
}
FAKE_CUDA_API CUresult cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n) { return set(false, nullptr, dst, v, n); }

// ---- For tests: the double's own bookkeeping --------------------------------

FAKE_CUDA_API int fakeCudaLiveAllocations(void) {
  std::lock_guard l(G().mu);
  return static_cast<int>(G().allocs.size());
}

FAKE_CUDA_API long long fakeCudaOpsRun(void) { return g_ops_run.load(std::memory_order_relaxed); }

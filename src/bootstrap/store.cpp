// The rendezvous store: server (one thread, poll loop) and client.
//
// Wire format, after the job-secret handshake (auth.hpp; the client's hello is
// "store"), all integers little endian:
//
//   request:  op u8 | keylen u32 | vallen u64 | key[keylen] | value[vallen]
//     op 1 SET  value = the bytes to store
//     op 2 GET  value = timeout_ms u64 (vallen 8): wait up to that long for the key
//     op 3 ADD  value = delta i64 (vallen 8): the key holds a decimal integer
//     op 4 TIME value empty (vallen 0), key ignored: the server's trace clock
//               (clock::traceNowNs) when it serves the request
//   response: status u8 | vallen u64 | value[vallen]
//     status 0 OK       SET: empty; GET: the value; ADD: the new value, i64;
//                       TIME: nanoseconds, i64
//     status 1 TIMEOUT  GET: the key did not appear in time; empty
//     status 2 ERROR    value = a message (ADD on a non-integer, store full)
//
// Limits: 1 <= keylen <= 1 KiB, vallen <= 16 MiB, all entries together
// <= 1 GiB (StoreServerOptions::max_total_bytes), an entry counting its key,
// its value and kEntryOverhead (the map node), so that many empty-valued
// keys cannot grow the server without bound either.  A frame outside the format or the limits closes that connection
// (the peer is broken or hostile); a request the store cannot satisfy gets an
// ERROR response and the connection stays usable.
//
// One client connection carries one request at a time (the client is
// thread-compatible and waits for each answer), so responses are in request
// order: a GET that must wait is parked, and that connection's later input is
// not parsed until it is answered.
#include "bootstrap/store.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "bootstrap/gate.hpp"
#include "clock/offset.hpp"
#include "common/log.hpp"

namespace chorus::bootstrap {
namespace {

using net::Clock;

constexpr uint8_t kOpSet = 1, kOpGet = 2, kOpAdd = 3, kOpTime = 4;
constexpr uint8_t kStatusOk = 0, kStatusTimeout = 1, kStatusError = 2;
constexpr size_t kRequestHeader = 1 + 4 + 8;
constexpr size_t kResponseHeader = 1 + 8;
constexpr size_t kMaxKey = 1024;
constexpr size_t kMaxValue = size_t{16} << 20;
// What one entry costs beyond its key and value: a std::map node (three
// pointers, colour, the key's and value's headers) and the allocator's rounding.
constexpr size_t kEntryOverhead = 128;
constexpr size_t kReadChunk = 64 * 1024;
// Input buffered per connection before the server stops reading from it: one
// maximal frame plus one read chunk.
constexpr size_t kMaxBufferedInput = kRequestHeader + kMaxKey + kMaxValue + kReadChunk;
constexpr std::string_view kHello = "store";
// The client's hello names the protection it wants for the frames after the
// handshake: "store" (off), "store/mac", "store/encrypt".  Authenticated, so
// an attacker on the path cannot downgrade it.
std::string helloFor(auth::WireProtect p) {
  return p == auth::WireProtect::kOff ? std::string(kHello) : fmt::format("{}/{}", kHello, auth::wireProtectName(p));
}

size_t entryBytes(std::string_view key, size_t value_bytes) { return key.size() + value_bytes + kEntryOverhead; }

uint64_t loadLe(const std::byte* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | std::to_integer<uint64_t>(p[i]);
  return v;
}
void appendLe(std::vector<std::byte>& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
}

std::vector<std::byte> encodeRequest(uint8_t op, std::string_view key, std::span<const std::byte> value) {
  std::vector<std::byte> f;
  f.reserve(kRequestHeader + key.size() + value.size());
  f.push_back(std::byte{op});
  appendLe(f, key.size(), 4);
  appendLe(f, value.size(), 8);
  auto k = std::as_bytes(std::span(key.data(), key.size()));
  f.insert(f.end(), k.begin(), k.end());
  f.insert(f.end(), value.begin(), value.end());
  return f;
}

void appendResponse(std::vector<std::byte>& out, uint8_t status, std::span<const std::byte> value) {
  out.push_back(std::byte{status});
  appendLe(out, value.size(), 8);
  out.insert(out.end(), value.begin(), value.end());
}

std::array<std::byte, 8> le64(uint64_t v) {
  std::array<std::byte, 8> b;
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::byte>(v >> (8 * i));
  return b;
}

// A millisecond count from the wire or a caller, as a deadline that cannot overflow.
Clock::time_point deadlineAfter(uint64_t ms) {
  constexpr uint64_t kYear = 365ull * 24 * 3600 * 1000;
  if (ms >= kYear) return Clock::time_point::max();
  return Clock::now() + std::chrono::milliseconds(ms);
}

std::optional<int64_t> parseDecimal(std::span<const std::byte> b) {
  std::string_view s(reinterpret_cast<const char*>(b.data()), b.size());
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// ---------------------------------------------------------------- server

class StoreServerImpl final : public StoreServer {
 public:
  StoreServerImpl(net::Fd listener, net::SockAddr addr, const auth::Secret& secret, const Options& options,
                  net::Fd wake)
      : listener_(std::move(listener)),
        addr_(addr),
        options_(options),
        wake_(std::move(wake)),
        gate_(listener_.get(), secret, fmt::format("store server {}", addr.toString()),
              auth::GateOptions{options.handshake_timeout, options.max_pending}) {
    thread_ = std::thread([this] { run(); });
  }

  ~StoreServerImpl() override { stop(); }

  // Prompt: the eventfd wakes the loop out of poll() at once.
  void stop() override {
    std::lock_guard lock(stop_mu_);
    if (!thread_.joinable()) return;
    stop_.store(true, std::memory_order_release);
    uint64_t one = 1;
    // The eventfd counter cannot overflow with a handful of writes; a failed
    // write would only delay the stop until the loop's next wakeup.
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
    thread_.join();
  }

  [[nodiscard]] net::SockAddr address() const override { return addr_; }

 private:
  // An authenticated client (auth::Gate admits them).
  struct Conn {
    uint64_t id = 0;
    net::Fd fd;
    std::unique_ptr<auth::SealedStream> sealed;  // StoreServerOptions::protect
    std::string peer;
    std::vector<std::byte> in;
    std::vector<std::byte> out;
    size_t out_off = 0;
    bool parked = false;  // a GET waits for parked_key
    std::string parked_key;
    Clock::time_point parked_deadline;
    bool dead = false;  // closed at the end of this loop iteration
  };

  // Everything below runs on the server thread only.
  void run();
  void admit(auth::Admitted a);
  // A sealed client's plaintext waits in its record layer and would be read
  // now (not parked, input room, no answer pending: the poll rules above).
  static bool readAhead(const Conn& c) {
    return c.sealed && !c.dead && !c.parked && c.sealed->inBuffered() && c.in.size() < kMaxBufferedInput &&
           c.out_off >= c.out.size() && !c.sealed->outPending();
  }
  void onReadable(uint64_t id, Conn& c);
  void process(uint64_t id, Conn& c);
  void execute(uint64_t id, Conn& c, const StoreRequest& r);
  void answerWaiters(const std::string& key);
  void flush(Conn& c);
  void kill(Conn& c, std::string_view why, bool warn);
  void expireDeadlines();
  int pollTimeoutMs() const;

  net::Fd listener_;
  net::SockAddr addr_;
  Options options_;
  net::Fd wake_;
  std::atomic<bool> stop_{false};
  std::mutex stop_mu_;  // stop() from two threads: one joins, the other waits for it
  auth::Gate gate_;

  std::map<uint64_t, Conn> conns_;
  uint64_t next_id_ = 1;
  std::map<std::string, Bytes, std::less<>> data_;
  size_t total_bytes_ = 0;
  std::unordered_map<std::string, std::vector<uint64_t>> waiters_;

  std::thread thread_;  // last: starts after every member above is constructed
};

int StoreServerImpl::pollTimeoutMs() const {
  auto next = gate_.nextDeadline();
  for (const auto& [id, c] : conns_)
    if (c.parked) next = std::min(next, c.parked_deadline);
  if (next == Clock::time_point::max()) return -1;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, INT_MAX));
}

void StoreServerImpl::run() {
  std::vector<pollfd> pfds;
  std::vector<uint64_t> ids;
  while (!stop_.load(std::memory_order_acquire)) {
    pfds.clear();
    ids.clear();
    pfds.push_back({wake_.get(), POLLIN, 0});
    const size_t gate_fds = gate_.appendPollFds(pfds);
    for (auto& [id, c] : conns_) {
      short ev = POLLRDHUP;
      bool pending_out = c.out_off < c.out.size() || (c.sealed && c.sealed->outPending());
      // Backpressure: a client that does not read its answers is not read from.
      if (!pending_out && c.in.size() < kMaxBufferedInput) ev |= POLLIN;
      if (pending_out) ev |= POLLOUT;
      pfds.push_back({c.fd.get(), ev, 0});
      ids.push_back(id);
    }
    // Plaintext a sealed stream read ahead is readable without the socket.
    bool buffered = false;
    for (auto& [id, c] : conns_) buffered |= readAhead(c);
    int r = ::poll(pfds.data(), pfds.size(), buffered ? 0 : pollTimeoutMs());
    if (r < 0 && errno != EINTR) {
      log::warn("store server {}: poll failed: {}; retrying", addr_.toString(), std::strerror(errno));
      continue;
    }
    if (stop_.load(std::memory_order_acquire)) break;
    for (auth::Admitted& a : gate_.onPoll(std::span(pfds).subspan(1, gate_fds))) admit(std::move(a));
    if (r > 0 || buffered) {
      for (size_t i = 0; i < ids.size(); ++i) {
        short rev = pfds[i + 1 + gate_fds].revents;
        auto it = conns_.find(ids[i]);
        if (it == conns_.end() || it->second.dead) continue;
        Conn& c = it->second;
        if (readAhead(c)) rev |= POLLIN;
        if (rev == 0) continue;
        if (rev & POLLOUT) flush(c);
        if (!c.dead && (rev & (POLLIN | POLLRDHUP | POLLHUP | POLLERR))) onReadable(ids[i], c);
      }
    }
    expireDeadlines();
    for (auto it = conns_.begin(); it != conns_.end();) it = it->second.dead ? conns_.erase(it) : std::next(it);
  }
}

void StoreServerImpl::admit(auth::Admitted a) {
  const std::string want = helloFor(options_.protect);
  const std::string_view got(reinterpret_cast<const char*>(a.hello.data()), a.hello.size());
  if (got != want) {
    // An authenticated rank of this job configured differently: say so
    // (the client only sees the connection close).
    log::warn("store server {}: refused client {}: it asks for '{}' but this store runs '{}' (set "
              "CHORUS_WIRE_PROTECT alike on all ranks)",
              addr_.toString(), a.peer, got.substr(0, 32), want);
    return;
  }
  uint64_t id = next_id_++;
  Conn& c = conns_[id];
  c.id = id;
  c.fd = std::move(a.fd);
  c.peer = std::move(a.peer);
  if (options_.protect != auth::WireProtect::kOff)
    c.sealed = std::make_unique<auth::SealedStream>(options_.protect, a.keys);
  log::trace("store server {}: client {} authenticated", addr_.toString(), c.peer);
}

void StoreServerImpl::flush(Conn& c) {
  if (c.sealed && c.sealed->outPending()) {
    int f = c.sealed->flush(c.fd.get());
    if (f < 0) {
      kill(c, fmt::format("send failed: {}", std::strerror(errno)), false);
      return;
    }
    if (f == 0) return;
  }
  while (c.out_off < c.out.size()) {
    iovec iov{c.out.data() + c.out_off, c.out.size() - c.out_off};
    ssize_t n = c.sealed ? c.sealed->writev(c.fd.get(), &iov, 1)
                         : ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off,
                                  MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    kill(c, fmt::format("send failed: {}", std::strerror(errno)), false);
    return;
  }
  c.out.clear();
  c.out_off = 0;
}

void StoreServerImpl::onReadable(uint64_t id, Conn& c) {
  std::byte chunk[kReadChunk];
  // Reads until EAGAIN or the input bound; the bound keeps a fast sender from
  // growing the buffer without limit (it resumes once the frame is consumed).
  while (c.in.size() < kMaxBufferedInput) {
    const size_t room = std::min(sizeof chunk, kMaxBufferedInput - c.in.size());
    ssize_t n;
    if (c.sealed) {
      iovec iov{chunk, room};
      n = c.sealed->readv(c.fd.get(), &iov, 1);
    } else {
      n = ::recv(c.fd.get(), chunk, room, MSG_DONTWAIT);
    }
    if (n > 0) {
      c.in.insert(c.in.end(), chunk, chunk + n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // EOF or a reset: the client went away.  Finish what it already sent
    // (a SET followed by close must still land), then close.  A sealed
    // stream's broken record: what came before it was verified.
    const int err = errno;
    const bool tampered = n < 0 && c.sealed && (err == EBADMSG || err == EPROTO);
    process(id, c);
    kill(c, n == 0 ? "closed by peer" : tampered ? c.sealed->error() : std::string(std::strerror(err)), tampered);
    return;
  }
  process(id, c);
}

void StoreServerImpl::process(uint64_t id, Conn& c) {
  size_t off = 0;
  while (!c.parked && !c.dead && off < c.in.size()) {
    auto parsed = parseStoreRequest(std::span(c.in).subspan(off));
    if (!parsed.isOk()) {
      kill(c, parsed.status().message(), true);
      return;
    }
    if (!parsed->has_value()) break;
    const StoreRequest& req = **parsed;
    execute(id, c, req);
    off += req.frame_bytes;
  }
  c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(off));
  if (!c.dead) flush(c);
}

void StoreServerImpl::execute(uint64_t id, Conn& c, const StoreRequest& r) {
  std::string key(r.key);
  switch (r.op) {
    case kOpSet: {
      auto it = data_.find(key);
      size_t old = it == data_.end() ? 0 : entryBytes(key, it->second.size());
      size_t now = entryBytes(key, r.value.size());
      if (total_bytes_ - old + now > options_.max_total_bytes) {
        auto msg = fmt::format("store full: setting '{}' ({} bytes with its key) would exceed the {} byte limit", key,
                               now, options_.max_total_bytes);
        appendResponse(c.out, kStatusError, std::as_bytes(std::span(msg)));
        return;
      }
      total_bytes_ = total_bytes_ - old + now;
      data_[key].assign(r.value.begin(), r.value.end());
      appendResponse(c.out, kStatusOk, {});
      answerWaiters(key);
      return;
    }
    case kOpGet: {
      auto it = data_.find(key);
      if (it != data_.end()) {
        appendResponse(c.out, kStatusOk, it->second);
        return;
      }
      uint64_t ms = loadLe(r.value.data(), 8);
      if (ms == 0) {
        appendResponse(c.out, kStatusTimeout, {});
        return;
      }
      c.parked = true;
      c.parked_key = key;
      c.parked_deadline = deadlineAfter(ms);
      waiters_[key].push_back(id);
      return;
    }
    case kOpAdd: {
      auto delta = static_cast<int64_t>(loadLe(r.value.data(), 8));
      int64_t cur = 0;
      auto it = data_.find(key);
      if (it != data_.end()) {
        auto v = parseDecimal(it->second);
        if (!v) {
          auto msg = fmt::format("add on store key '{}', which holds a non-integer value of {} bytes", key,
                                 it->second.size());
          appendResponse(c.out, kStatusError, std::as_bytes(std::span(msg)));
          return;
        }
        cur = *v;
      }
      int64_t next = 0;
      if (__builtin_add_overflow(cur, delta, &next)) {
        auto msg = fmt::format("add on store key '{}' overflows: {} + {}", key, cur, delta);
        appendResponse(c.out, kStatusError, std::as_bytes(std::span(msg)));
        return;
      }
      std::string s = std::to_string(next);
      size_t old = it == data_.end() ? 0 : entryBytes(key, it->second.size());
      if (total_bytes_ - old + entryBytes(key, s.size()) > options_.max_total_bytes) {
        auto msg = fmt::format("store full: adding to '{}' would exceed the {} byte limit", key,
                               options_.max_total_bytes);
        appendResponse(c.out, kStatusError, std::as_bytes(std::span(msg)));
        return;
      }
      total_bytes_ = total_bytes_ - old + entryBytes(key, s.size());
      data_[key] = toBytes(std::string_view(s));
      appendResponse(c.out, kStatusOk, le64(static_cast<uint64_t>(next)));
      answerWaiters(key);
      return;
    }
    case kOpTime:
      appendResponse(c.out, kStatusOk, le64(static_cast<uint64_t>(clock::traceNowNs())));
      return;
    default:
      break;  // parseStoreRequest admits only the ops above
  }
}

void StoreServerImpl::answerWaiters(const std::string& key) {
  auto w = waiters_.find(key);
  if (w == waiters_.end()) return;
  std::vector<uint64_t> ids = std::move(w->second);
  waiters_.erase(w);
  const Bytes& value = data_[key];
  for (uint64_t id : ids) {
    auto it = conns_.find(id);
    if (it == conns_.end() || it->second.dead || !it->second.parked) continue;
    Conn& c = it->second;
    c.parked = false;
    appendResponse(c.out, kStatusOk, value);
    // The waiter may have pipelined input behind its GET (not our client, but
    // allowed by the format); process() also flushes the answer.  Its
    // requests cannot re-enter this waiter list: it is no longer parked.
    process(id, c);
  }
}

void StoreServerImpl::expireDeadlines() {
  auto now = Clock::now();
  for (auto& [id, c] : conns_) {
    if (c.dead) continue;
    if (c.parked && now >= c.parked_deadline) {
      auto w = waiters_.find(c.parked_key);
      if (w != waiters_.end()) {
        std::erase(w->second, id);
        if (w->second.empty()) waiters_.erase(w);
      }
      c.parked = false;
      appendResponse(c.out, kStatusTimeout, {});
      process(id, c);
    }
  }
}

void StoreServerImpl::kill(Conn& c, std::string_view why, bool warn) {
  if (c.dead) return;
  if (warn)
    log::warn("store server {}: closing connection from {}: {}", addr_.toString(), c.peer, why);
  else
    log::trace("store server {}: connection from {} closed: {}", addr_.toString(), c.peer, why);
  if (c.parked) {
    auto w = waiters_.find(c.parked_key);
    if (w != waiters_.end()) {
      std::erase(w->second, c.id);
      if (w->second.empty()) waiters_.erase(w);
    }
  }
  c.dead = true;
  c.parked = false;
  c.fd.reset();
}

// ---------------------------------------------------------------- client

// Waits (bounded) for fd to become ready for `events`.
Status waitReady(int fd, short events, Clock::time_point deadline, std::string_view what) {
  for (;;) {
    auto now = Clock::now();
    if (now >= deadline) return makeError(chorusTimeout, "store connection: {} did not complete in time", what);
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, INT_MAX)));
    if (r > 0) return {};
    if (r < 0 && errno != EINTR) return errnoError("poll (store connection)", errno);
  }
}

Status sealedError(const auth::SealedStream& s, int err) {
  if (err == EBADMSG || err == EPROTO)
    return remoteError("store connection broken: {} (CHORUS_WIRE_PROTECT={}: an attacker on the path?)", s.error(),
                       auth::wireProtectName(s.mode()));
  if (err == EPIPE || err == ECONNRESET || err == ENOTCONN) return remoteError("the store closed the connection");
  return errnoError("store connection", err);
}

// net::writeAll / readAll through a record layer.
Status sealedWriteAll(auth::SealedStream& s, int fd, std::span<const std::byte> data, Clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size() || s.outPending()) {
    if (done < data.size()) {
      iovec iov{const_cast<std::byte*>(data.data() + done), data.size() - done};
      ssize_t n = s.writev(fd, &iov, 1);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
    } else if (int f = s.flush(fd); f > 0) {
      break;
    } else if (f == 0) {
      errno = EAGAIN;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return sealedError(s, errno);
    CHORUS_RETURN_IF_ERROR(waitReady(fd, POLLOUT, deadline, "a send"));
  }
  return {};
}

Status sealedReadAll(auth::SealedStream& s, int fd, std::span<std::byte> out, Clock::time_point deadline) {
  size_t done = 0;
  while (done < out.size()) {
    iovec iov{out.data() + done, out.size() - done};
    ssize_t n = s.readv(fd, &iov, 1);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return remoteError("the store closed the connection");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return sealedError(s, errno);
    CHORUS_RETURN_IF_ERROR(waitReady(fd, POLLIN, deadline, "a receive"));
  }
  return {};
}

class StoreClient final : public Store {
 public:
  StoreClient(net::Fd fd, net::SockAddr server, std::chrono::milliseconds op_timeout,
              std::unique_ptr<auth::SealedStream> sealed)
      : fd_(std::move(fd)), server_(server), op_timeout_(op_timeout), sealed_(std::move(sealed)) {}

  Status set(std::string_view key, std::span<const std::byte> value) override {
    std::lock_guard lock(mu_);
    CHORUS_ASSIGN_OR_RETURN(auto reply, roundTrip(kOpSet, key, value, deadlineAfter(op_timeout_.count())));
    return replyStatus(reply, key, "set");
  }

  Result<Bytes> get(std::string_view key, std::chrono::milliseconds timeout) override {
    std::lock_guard lock(mu_);
    uint64_t ms = static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0));
    // The server enforces the timeout; our own deadline adds slack for its
    // answer to arrive, and trips only if the server itself is stuck.
    auto deadline = deadlineAfter(ms > UINT64_MAX / 2 ? ms : ms + static_cast<uint64_t>(op_timeout_.count()));
    CHORUS_ASSIGN_OR_RETURN(auto reply, roundTrip(kOpGet, key, le64(ms), deadline));
    if (reply.status == kStatusTimeout)
      return makeError(chorusTimeout,
                       "store key '{}' did not appear within {} ms (store {}); is the rank that sets it alive and at "
                       "the same step?",
                       key, timeout.count(), server_.toString());
    CHORUS_RETURN_IF_ERROR(replyStatus(reply, key, "get"));
    return std::move(reply.value);
  }

  // shutdown() (not close: the descriptor stays ours until destruction) makes
  // a read blocked on another thread return at once.
  void interrupt() override { ::shutdown(fd_.get(), SHUT_RDWR); }

  Result<int64_t> add(std::string_view key, int64_t delta) override {
    std::lock_guard lock(mu_);
    CHORUS_ASSIGN_OR_RETURN(auto reply,
                            roundTrip(kOpAdd, key, le64(static_cast<uint64_t>(delta)), deadlineAfter(op_timeout_.count())));
    CHORUS_RETURN_IF_ERROR(replyStatus(reply, key, "add"));
    if (reply.value.size() != 8)
      return remoteError("store {}: add on '{}' answered {} bytes instead of 8", server_.toString(), key,
                         reply.value.size());
    return static_cast<int64_t>(loadLe(reply.value.data(), 8));
  }

  Result<int64_t> serverTimeNs() override {
    std::lock_guard lock(mu_);
    CHORUS_ASSIGN_OR_RETURN(auto reply, roundTrip(kOpTime, "t", {}, deadlineAfter(op_timeout_.count())));
    CHORUS_RETURN_IF_ERROR(replyStatus(reply, "t", "time"));
    if (reply.value.size() != 8)
      return remoteError("store {}: time answered {} bytes instead of 8", server_.toString(), reply.value.size());
    return static_cast<int64_t>(loadLe(reply.value.data(), 8));
  }

 private:
  struct Reply {
    uint8_t status = 0;
    Bytes value;
  };

  Status replyStatus(const Reply& r, std::string_view key, std::string_view op) const {
    if (r.status == kStatusOk) return {};
    if (r.status == kStatusError)
      return invalidUsage("store {}: {} '{}' refused: {}", server_.toString(), op, key, toString(r.value));
    return remoteError("store {}: {} '{}' got unexpected status {}", server_.toString(), op, key, r.status);
  }

  Result<Reply> roundTrip(uint8_t op, std::string_view key, std::span<const std::byte> value,
                          Clock::time_point deadline) {
    if (key.empty() || key.size() > kMaxKey)
      return invalidArgument("store key of {} bytes: keys must have 1..{} bytes", key.size(), kMaxKey);
    if (value.size() > kMaxValue)
      return invalidArgument("store value of {} bytes for '{}' exceeds the limit of {} bytes", value.size(), key,
                             kMaxValue);
    // After any I/O failure the stream position is unknown (a late answer
    // could be read as the next one's), so the connection is unusable.
    if (!broken_.isOk()) return broken_;
    auto fail = [&](const Status& s) {
      broken_ = s.withContext(fmt::format("store {} (request on '{}'): ", server_.toString(), key));
      return broken_;
    };
    auto frame = encodeRequest(op, key, value);
    if (Status s = writeAll(frame, deadline); !s.isOk()) return fail(s);
    std::array<std::byte, kResponseHeader> head;
    if (Status s = readAll(head, deadline); !s.isOk()) return fail(s);
    Reply r;
    r.status = std::to_integer<uint8_t>(head[0]);
    uint64_t len = loadLe(head.data() + 1, 8);
    if (r.status > kStatusError || len > kMaxValue + 4096)
      return fail(remoteError("malformed response (status {}, length {}); is this a chorus store?", r.status, len));
    r.value.resize(len);
    if (Status s = readAll(r.value, deadline); !s.isOk()) return fail(s);
    return r;
  }

  Status writeAll(std::span<const std::byte> data, Clock::time_point deadline) {
    return sealed_ ? sealedWriteAll(*sealed_, fd_.get(), data, deadline) : net::writeAll(fd_.get(), data, deadline);
  }
  Status readAll(std::span<std::byte> data, Clock::time_point deadline) {
    return sealed_ ? sealedReadAll(*sealed_, fd_.get(), data, deadline) : net::readAll(fd_.get(), data, deadline);
  }

  std::mutex mu_;  // Store is thread-compatible; the lock makes misuse safe, not fast
  net::Fd fd_;
  net::SockAddr server_;
  std::chrono::milliseconds op_timeout_;
  std::unique_ptr<auth::SealedStream> sealed_;  // CHORUS_WIRE_PROTECT
  Status broken_;
};

}  // namespace

Result<std::optional<StoreRequest>> parseStoreRequest(std::span<const std::byte> buf) {
  if (buf.size() < kRequestHeader) return std::optional<StoreRequest>();
  StoreRequest r;
  r.op = std::to_integer<uint8_t>(buf[0]);
  uint64_t keylen = loadLe(buf.data() + 1, 4);
  uint64_t vallen = loadLe(buf.data() + 5, 8);
  if (r.op != kOpSet && r.op != kOpGet && r.op != kOpAdd && r.op != kOpTime)
    return invalidArgument("store request: unknown op {}", r.op);
  if (keylen == 0 || keylen > kMaxKey)
    return invalidArgument("store request: key length {} outside 1..{}", keylen, kMaxKey);
  if (vallen > kMaxValue) return invalidArgument("store request: value length {} exceeds {}", vallen, kMaxValue);
  if ((r.op == kOpGet || r.op == kOpAdd) && vallen != 8)
    return invalidArgument("store request: op {} needs an 8-byte value, got {}", r.op, vallen);
  if (r.op == kOpTime && vallen != 0) return invalidArgument("store request: TIME takes no value, got {} bytes", vallen);
  size_t total = kRequestHeader + keylen + vallen;
  if (buf.size() < total) return std::optional<StoreRequest>();
  r.key = std::string_view(reinterpret_cast<const char*>(buf.data() + kRequestHeader), keylen);
  r.value = buf.subspan(kRequestHeader + keylen, vallen);
  r.frame_bytes = total;
  return std::optional<StoreRequest>(r);
}

Result<std::unique_ptr<StoreServer>> StoreServer::start(const net::SockAddr& bind_addr, const auth::Secret& secret) {
  return start(bind_addr, secret, Options{});
}

Result<std::unique_ptr<StoreServer>> StoreServer::start(const net::SockAddr& bind_addr, const auth::Secret& secret,
                                                        const Options& options) {
  CHORUS_ASSIGN_OR_RETURN(net::Fd listener, net::listenOn(bind_addr, 1024));
  return start(std::move(listener), secret, options);
}

Result<std::unique_ptr<StoreServer>> StoreServer::start(net::Fd listener, const auth::Secret& secret,
                                                        const Options& options) {
  if (!listener.valid()) return invalidArgument("StoreServer::start: invalid listening socket");
  CHORUS_ASSIGN_OR_RETURN(net::SockAddr addr, net::boundAddress(listener.get()));
  CHORUS_RETURN_IF_ERROR(net::setNonBlocking(listener.get(), true));
  net::Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return errnoError("eventfd (store server wakeup)", errno);
  return std::unique_ptr<StoreServer>(
      std::make_unique<StoreServerImpl>(std::move(listener), addr, secret, options, std::move(wake)));
}

Result<std::shared_ptr<Store>> connectStore(const net::SockAddr& server, const auth::Secret& secret,
                                            std::chrono::milliseconds timeout, auth::WireProtect protect) {
  if (protect != auth::WireProtect::kOff && !secret.present)
    return invalidArgument("CHORUS_WIRE_PROTECT={} needs a job secret (its keys derive from it); set CHORUS_SECRET or "
                           "launch with chorus-run",
                           auth::wireProtectName(protect));
  auto deadline = deadlineAfter(static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0)));
  auth::SessionKeys keys;
  const std::string hello = helloFor(protect);
  net::Fd fd;
  // A store flooded by strangers may drop our connection before the
  // handshake ends (auth::serverBusy): connect again, with a growing pause.
  bool connected = false;
  Status hs = auth::retryWhileBusy(deadline, [&]() -> Status {
    Result<net::Fd> c = net::connectTo(server, deadline);
    connected = c.isOk();
    if (!connected) return c.status();
    fd = std::move(*c);
    return auth::clientHandshake(fd.get(), secret, toBytes(std::string_view(hello)), deadline, &keys);
  });
  if (!connected) return hs.withContext("connecting to the rendezvous store: ");
  if (hs.code() == chorusRemoteError)
    return hs.withContext(fmt::format(
        "rendezvous store {}: whoever listens there is not this job's store, or does not know this job's secret (a "
        "stranger bound the port first, a store of another job, or ranks given different secrets): ",
        server.toString()));
  CHORUS_RETURN_IF_ERROR(hs.withContext(fmt::format("rendezvous store {}: ", server.toString())));
  std::unique_ptr<auth::SealedStream> sealed;
  if (protect != auth::WireProtect::kOff) sealed = std::make_unique<auth::SealedStream>(protect, keys);
  return std::shared_ptr<Store>(std::make_shared<StoreClient>(std::move(fd), server, timeout, std::move(sealed)));
}

Status storeBarrier(Store& store, std::string_view name, int nranks, std::chrono::milliseconds timeout) {
  // Each barrier name is single-use: the counter is never reset, so callers
  // put a sequence number in the name.
  auto deadline = Clock::now() + timeout;
  std::string count_key = fmt::format("{}/count", name), done_key = fmt::format("{}/done", name);
  CHORUS_ASSIGN_OR_RETURN(int64_t arrived, store.add(count_key, 1));
  if (arrived == nranks) CHORUS_RETURN_IF_ERROR(store.set(done_key, toBytes(std::string_view("1"))));
  if (arrived > nranks)
    return invalidUsage("barrier '{}': {} ranks arrived but the barrier is for {} (barrier name reused, or "
                        "ranks disagree on the world size?)",
                        name, arrived, nranks);
  auto left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                       std::chrono::milliseconds(0));
  auto got = store.get(done_key, left);
  if (got.isOk()) return {};
  if (got.status().code() != chorusTimeout) return got.status();
  auto now_arrived = store.add(count_key, 0);
  return makeError(chorusTimeout, "barrier '{}' timed out after {} ms: {} of {} ranks arrived (is a rank dead or stuck "
                   "before this point?)",
                   name, timeout.count(), now_arrived.isOk() ? fmt::format("{}", *now_arrived) : std::string("?"),
                   nranks);
}

Status PrefixStore::set(std::string_view key, std::span<const std::byte> value) {
  return base_->set(prefix_ + std::string(key), value);
}
Result<Bytes> PrefixStore::get(std::string_view key, std::chrono::milliseconds timeout) {
  return base_->get(prefix_ + std::string(key), timeout);
}
Result<int64_t> PrefixStore::add(std::string_view key, int64_t delta) {
  return base_->add(prefix_ + std::string(key), delta);
}

}  // namespace chorus::bootstrap

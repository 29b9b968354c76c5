// The rendezvous store: a small key-value service run by rank 0 over TCP.
//
// Ranks exchange addresses and segment names through it and use it for the
// barriers of init.  Every connection to it passes the job-secret handshake
// (auth.hpp) before any request is read; a connection that does not is closed
// without disturbing the others.  Requests are framed and bounds-checked
// (store.cpp documents the wire format).
#pragma once

#include <chrono>
#include <cstring>
#include <type_traits>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/wire_protect.hpp"
#include "bootstrap/socket.hpp"
#include "common/status.hpp"

namespace chorus::bootstrap {

using Bytes = std::vector<std::byte>;

// The store seen by a rank.  Thread-compatible: one thread at a time.
class Store {
 public:
  virtual ~Store() = default;
  virtual Status set(std::string_view key, std::span<const std::byte> value) = 0;
  // Waits until `key` exists (or timeout: chorusTimeout naming the key).
  virtual Result<Bytes> get(std::string_view key, std::chrono::milliseconds timeout) = 0;
  // Atomically adds delta to the integer at key (absent = 0); returns the new value.
  virtual Result<int64_t> add(std::string_view key, int64_t delta) = 0;
  // The server's trace clock (clock::traceNowNs of the process that runs
  // it: rank 0's) when it answered; the clock alignment's exchange.  The
  // default: a store without a clock (chorusInvalidUsage).
  virtual Result<int64_t> serverTimeNs() { return makeError(chorusInvalidUsage, "this store has no clock"); }
  // Ends a blocked call on another thread (it returns an error) and every
  // later call.  Any thread.  The default does nothing.
  virtual void interrupt() {}
};

// A view of a store that prefixes every key ("comm3/"), so communicators and
// splits share one server without colliding.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, std::string prefix) : base_(std::move(base)), prefix_(std::move(prefix)) {}
  Status set(std::string_view key, std::span<const std::byte> value) override;
  Result<Bytes> get(std::string_view key, std::chrono::milliseconds timeout) override;
  Result<int64_t> add(std::string_view key, int64_t delta) override;
  Result<int64_t> serverTimeNs() override { return base_->serverTimeNs(); }
  void interrupt() override { base_->interrupt(); }

 private:
  std::shared_ptr<Store> base_;
  std::string prefix_;
};

// The server: a thread that accepts authenticated clients and serves
// set/get/add until destroyed.  Limits (key <= 1 KiB, value <= 16 MiB, total
// bounded) protect it from a misbehaving client.
struct StoreServerOptions {
  // A connection that has not completed the job-secret handshake by then is
  // closed (a silent or slow client cannot hold a slot forever); handshakes
  // run concurrently (auth::Gate), so this bounds a stranger's descriptor,
  // not anyone's wait.
  std::chrono::milliseconds handshake_timeout{5000};
  // Unauthenticated connections held at once (the oldest silent one is
  // dropped for a new one); 0: auth::defaultMaxPending().
  size_t max_pending = 0;
  // All entries together (keys, values and a per-entry overhead) at most.
  size_t max_total_bytes = size_t{1} << 30;
  // Every client's frames after the handshake (CHORUS_WIRE_PROTECT,
  // wire_protect.hpp); a client that asks for another mode is refused.
  auth::WireProtect protect = auth::WireProtect::kOff;
};

class StoreServer {
 public:
  using Options = StoreServerOptions;
  // Listens on bind_addr (port 0 = ephemeral).
  static Result<std::unique_ptr<StoreServer>> start(const net::SockAddr& bind_addr, const auth::Secret& secret);
  static Result<std::unique_ptr<StoreServer>> start(const net::SockAddr& bind_addr, const auth::Secret& secret,
                                                    const Options& options);
  // Adopts an already-listening socket (the one chorusGetUniqueId reserved).
  static Result<std::unique_ptr<StoreServer>> start(net::Fd listener, const auth::Secret& secret,
                                                    const Options& options = {});
  virtual ~StoreServer() = default;
  [[nodiscard]] virtual net::SockAddr address() const = 0;  // with the real port
  // Stops serving: the server's thread ends (joined here); its clients are
  // answered no more, and their calls time out.  Idempotent, any thread but
  // the server's; the destructor does it too.  For a process's exit: a server
  // kept to the end (comm/wiring.cpp's shared servers) must not answer
  // strangers while the exit tears down what its thread uses.
  virtual void stop() = 0;
};

// Connects to a server and authenticates; retries while it is not up yet.
// `timeout` bounds the connection and, later, each set/add round trip (a get
// waits for its own timeout plus this much).  After an I/O failure the store
// answers every call with that failure (the stream can no longer be trusted).
// `protect` seals the frames after the handshake (the server must run the
// same mode; it says so in its hello check).
Result<std::shared_ptr<Store>> connectStore(const net::SockAddr& server, const auth::Secret& secret,
                                            std::chrono::milliseconds timeout,
                                            auth::WireProtect protect = auth::WireProtect::kOff);

// Every one of nranks ranks calls it with the same name; returns when all have.
Status storeBarrier(Store& store, std::string_view name, int nranks, std::chrono::milliseconds timeout);

// One decoded store request frame (store.cpp documents the wire format).
// key and value point into the parsed buffer.
struct StoreRequest {
  uint8_t op = 0;
  std::string_view key;
  std::span<const std::byte> value;
  size_t frame_bytes = 0;  // bytes of the buffer this frame used
};
// Pure parser of the first frame in buf: the request, nullopt when buf holds
// only part of a frame, or chorusInvalidArgument for a frame that breaks the
// format or the limits (the server closes such a connection).  Exposed for
// the fuzzer.
Result<std::optional<StoreRequest>> parseStoreRequest(std::span<const std::byte> buf);

// Serialisation helpers for small records put in the store.
template <typename T>
Bytes toBytes(const T& pod) {
  static_assert(std::is_trivially_copyable_v<T>);
  Bytes b(sizeof(T));
  std::memcpy(b.data(), &pod, sizeof(T));
  return b;
}
inline Bytes toBytes(std::string_view s) {
  return Bytes(reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size());
}
// Strings by content (not as an object, which the template would try).
inline Bytes toBytes(const std::string& s) { return toBytes(std::string_view(s)); }
inline Bytes toBytes(const char* s) { return toBytes(std::string_view(s)); }
inline std::string toString(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

}  // namespace chorus::bootstrap

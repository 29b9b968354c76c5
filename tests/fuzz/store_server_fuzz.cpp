// libFuzzer target: the rendezvous store server (bootstrap/store.cpp) fed a
// hostile client's byte stream over loopback, before or after the job-secret
// handshake.
//
// Each input starts a fresh StoreServer (no state carries over between
// inputs), connects a raw client and writes the input to it, reading and
// discarding whatever the server answers; then closes, and checks with a real
// client that the server still serves: set, get and add on keys of its own.
//
// Input: u8 mode (bit 0: authenticate first with the store's hello "store",
// then the rest is request frames; otherwise the rest is what a stranger
// sends in place of the handshake), then the bytes.  store_frame_fuzz covers
// the frame parser alone; this one covers the server loop around it:
// partial frames, several frames per read, parked GETs, ADD on arbitrary
// values, responses to a client that closes, and the handshake state machine
// driven by a non-blocking event loop.
//
// Properties checked: no memory error or UB (ASan/UBSan); the server thread
// survives (no crash, no SIGPIPE) and answers a well-behaved client promptly
// afterwards; its destructor returns.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string_view>

#include "bootstrap/auth.hpp"
#include "bootstrap/store.hpp"
#include "common/log.hpp"

namespace {

using namespace std::chrono_literals;
using chorus::net::Clock;

chorus::auth::Secret secret() {
  chorus::auth::Secret s;
  for (size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = std::byte(0x3c ^ i);
  s.present = true;
  return s;
}

void drain(int fd) {
  char sink[4096];
  while (::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  chorus::log::setLevel(chorus::log::Level::None);  // refused connections are logged as warnings otherwise
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool authenticate = (data[0] & 1) != 0;
  std::span<const uint8_t> body(data + 1, size - 1);

  chorus::bootstrap::StoreServerOptions options;
  options.handshake_timeout = 2s;
  auto server = chorus::bootstrap::StoreServer::start(*chorus::net::resolve("127.0.0.1", 0), secret(), options);
  if (!server.isOk()) std::abort();
  const chorus::net::SockAddr addr = (*server)->address();

  {
    auto fd = chorus::net::connectTo(addr, Clock::now() + 5s);
    if (!fd.isOk()) std::abort();
    bool go = true;
    if (authenticate) {
      constexpr std::string_view kHello = "store";
      go = chorus::auth::clientHandshake(fd->get(), secret(), std::as_bytes(std::span(kHello)), Clock::now() + 5s)
               .isOk();
      if (!go) std::abort();  // the right secret must get in
    }
    ::fcntl(fd->get(), F_SETFL, ::fcntl(fd->get(), F_GETFL) | O_NONBLOCK);
    size_t off = 0;
    auto deadline = Clock::now() + 5s;
    while (go && off < body.size() && Clock::now() < deadline) {
      ssize_t n = ::send(fd->get(), body.data() + off, body.size() - off, MSG_NOSIGNAL);
      if (n > 0) off += static_cast<size_t>(n);
      else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) break;  // the server closed on us: fine
      drain(fd->get());
      if (n <= 0) {
        pollfd p{fd->get(), POLLOUT | POLLIN, 0};
        ::poll(&p, 1, 10);
      }
    }
    drain(fd->get());
  }  // closes the connection, possibly with requests unanswered or parked

  // The server must still serve a real client.
  auto store = chorus::bootstrap::connectStore(addr, secret(), 5000ms);
  if (!store.isOk()) std::abort();
  const std::byte value[] = {std::byte{'o'}, std::byte{'k'}};
  if (!(*store)->set("fuzz/health", value).isOk()) std::abort();
  auto got = (*store)->get("fuzz/health", 2000ms);
  if (!got.isOk() || got->size() != 2 || std::memcmp(got->data(), value, 2) != 0) std::abort();
  // The stranger may have written these keys too: set overwrites, so the
  // checks hold whatever it did.
  const std::byte zero[] = {std::byte{'0'}};
  if (!(*store)->set("fuzz/counter", zero).isOk()) std::abort();
  auto sum = (*store)->add("fuzz/counter", 41);
  if (!sum.isOk() || *sum != 41) std::abort();
  return 0;  // the server stops and joins its thread here
}

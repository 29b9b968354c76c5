// The text of a message-signature mismatch (transport.hpp): the communicator
// installs a describer that names the calls; until then the words are printed.
#include <atomic>

#include <fmt/format.h>

#include "transport/transport.hpp"

namespace chorus::transport {
namespace {
std::atomic<WireMismatchText> g_text{nullptr};
}  // namespace

void setWireMismatchText(WireMismatchText f) { g_text.store(f, std::memory_order_release); }

Status signatureMismatch(int rank, int peer, uint64_t want, uint64_t got) {
  WireMismatchText f = g_text.load(std::memory_order_acquire);
  const std::string text =
      f ? f(want, got) : fmt::format("a message of call signature {:#018x} where the receive expects {:#018x}", got, want);
  return makeError(chorusMismatch, "rank {}: collective mismatch: rank {} sent {}", rank, peer, text);
}

}  // namespace chorus::transport

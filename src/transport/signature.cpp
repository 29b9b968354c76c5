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

std::string wireMismatchText(uint64_t want, uint64_t got) {
  if (WireMismatchText f = g_text.load(std::memory_order_acquire)) return f(want, got);
  return fmt::format("a message of call signature {:#018x} where the receive expects {:#018x}", got, want);
}

}  // namespace chorus::transport

// libFuzzer target: the PTP message parser on arbitrary bytes.
//
// Properties checked: the parser never reads outside the buffer (ASan); a
// parsed message's messageLength lies within the buffer and covers its
// type's fixed size; a Management TLV's data lies inside messageLength; and
// rebuilding a parsed message (other than ignored types) and parsing it again
// gives the same header fields and the same bytes (build o parse is a fixed
// point).
//
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address -Isrc -Iinclude \
//     tests/fuzz/ptp_message_fuzz.cpp src/clock/ptp/message.cpp src/common/status.cpp -lfmt
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "clock/ptp/message.hpp"

using namespace chorus::clock::ptp;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> buf(data, size);
  auto m = parseMessage(buf);
  if (!m.isOk()) return 0;
  const Header& h = m->header;
  if (h.length > size || h.length < kHeaderBytes) std::abort();
  if (h.version != 2) std::abort();
  if (const auto* mb = std::get_if<ManagementBody>(&m->body)) {
    if (kManagementBytes + 6 + mb->data.size() > h.length) std::abort();
  }
  if (std::holds_alternative<IgnoredBody>(m->body)) return 0;
  auto built = buildMessage(*m);
  if (!built.isOk()) std::abort();
  auto again = parseMessage(*built);
  if (!again.isOk()) std::abort();
  const Header& g = again->header;
  if (g.type != h.type || g.domain != h.domain || g.flags != h.flags || g.correction != h.correction ||
      g.source != h.source || g.sequence_id != h.sequence_id || g.log_message_interval != h.log_message_interval)
    std::abort();
  auto rebuilt = buildMessage(*again);
  if (!rebuilt.isOk() || *rebuilt != *built) std::abort();
  return 0;
}

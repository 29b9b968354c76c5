// libFuzzer target: the store's request frame parser on arbitrary bytes.
//
// Properties checked: the parser never reads outside the buffer (ASan), a
// parsed frame lies inside the buffer and respects the documented limits,
// and parsing a buffer then re-parsing the bytes that follow one frame makes
// progress (no frame of zero length).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "bootstrap/store.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> buf(reinterpret_cast<const std::byte*>(data), size);
  // Walk the buffer frame by frame, as the server does with its input.
  while (!buf.empty()) {
    auto r = chorus::bootstrap::parseStoreRequest(buf);
    if (!r.isOk() || !r->has_value()) break;
    const auto& req = **r;
    if (req.frame_bytes == 0 || req.frame_bytes > buf.size()) std::abort();
    if (req.key.empty() || req.key.size() > 1024 || req.value.size() > (size_t{16} << 20)) std::abort();
    auto* kb = reinterpret_cast<const std::byte*>(req.key.data());
    if (kb < buf.data() || kb + req.key.size() > buf.data() + buf.size()) std::abort();
    if (req.value.data() < buf.data() || req.value.data() + req.value.size() > buf.data() + buf.size()) std::abort();
    if (req.op < 1 || req.op > 4) std::abort();           // SET, GET, ADD, TIME
    if (req.op == 4 && !req.value.empty()) std::abort();  // TIME carries no value
    buf = buf.subspan(req.frame_bytes);
  }
  return 0;
}

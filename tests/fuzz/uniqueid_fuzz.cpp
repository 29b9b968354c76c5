// libFuzzer target: decoding arbitrary 128-byte unique ids.
//
// Properties checked: decode never crashes; whatever it accepts re-encodes to
// exactly the same 128 bytes (the encoding is canonical, so there is no second
// spelling of an id that could pass validation).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "bootstrap/bootstrap.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  chorusUniqueId id{};
  std::memcpy(id.internal, data, size < sizeof id ? size : sizeof id);
  auto decoded = chorus::bootstrap::UniqueId::decode(id);
  if (!decoded.isOk()) return 0;
  chorusUniqueId again = decoded->encode();
  if (std::memcmp(again.internal, id.internal, sizeof id) != 0) std::abort();
  return 0;
}
